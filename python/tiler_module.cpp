// The Python module `tiler`: the command's subcommands from Python, over the same libraries. infer() and
// finetune() turn keywords into the command's flags and run the command's own function of its argv
// (cli_commands.hpp), so the flags, their checks, their words and the outputs are the command's; predict()
// runs infer on a NumPy array registered as an in-memory input (readers.hpp's MemoryPixels, read where it
// lies) into an output directory in memory (writers/memory_output.hpp) and hands its arrays to NumPy as they
// are: no file is written. The GIL is released while the engine runs; between its set-up phases and after
// each step the engine's thread takes it to run Python's signal handlers (Ctrl-C: KeyboardInterrupt) and,
// after a step, the progress callback. tiler's log lines go to Python's `logging` (logger "tiler").
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_commands.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/readers/readers.hpp"
#include "tiler/model/model.hpp"
#include "tiler/writers/memory_output.hpp"

namespace py = pybind11;

namespace {

// tiler's log lines as records of Python's logger "tiler", at their level.
class PythonLogSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (!Py_IsInitialized()) return;
    const std::string text = tiler::redactSecrets(std::string(msg.payload.data(), msg.payload.size()));
    int level = 20;
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        level = 10;
        break;
      case spdlog::level::warn:
        level = 30;
        break;
      case spdlog::level::err:
        level = 40;
        break;
      case spdlog::level::critical:
        level = 50;
        break;
      default:
        break;
    }
    py::gil_scoped_acquire gil;
    try {
      py::module_::import("logging").attr("getLogger")("tiler").attr("log")(level, text);
    } catch (py::error_already_set& e) {
      // Python ran its signal handlers in the logging call: a Ctrl-C is raised again at the engine's next
      // check (PyErr_SetInterrupt), not lost as an unraisable error here.
      if (e.matches(PyExc_KeyboardInterrupt))
        PyErr_SetInterrupt();
      else
        e.discard_as_unraisable("tiler's log sink");
    }
  }
  void flush_() override {}
};

// The Python types of tiler's errors (created at import).
struct ErrorTypes {
  PyObject* error = nullptr;
  PyObject* config = nullptr;
  PyObject* io = nullptr;
  PyObject* model = nullptr;
  PyObject* dist = nullptr;
  PyObject* timeout = nullptr;
  PyObject* peer_lost = nullptr;
};
ErrorTypes g_errors;

PyObject* newErrorType(py::module_& m, const char* name, py::tuple bases, const char* doc) {
  const std::string qualified = std::string("tiler.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (!type) throw py::error_already_set();
  m.add_object(name, py::handle(type));
  return type;
}

// The command's message of `e` (what follows "tiler: error: "), without its [file:line].
std::string messageOf(const tiler::Error& e) {
  return tiler::redactSecrets(tiler::errorRankPrefix() + e.message());
}

void translateErrors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const tiler::ConfigError& e) {
    PyErr_SetString(g_errors.config, messageOf(e).c_str());
  } catch (const tiler::IoError& e) {
    PyErr_SetString(g_errors.io, messageOf(e).c_str());
  } catch (const tiler::ModelError& e) {
    PyErr_SetString(g_errors.model, messageOf(e).c_str());
  } catch (const tiler::TimeoutError& e) {
    PyErr_SetString(g_errors.timeout, messageOf(e).c_str());
  } catch (const tiler::PeerLostError& e) {
    PyErr_SetString(g_errors.peer_lost, messageOf(e).c_str());
  } catch (const tiler::DistError& e) {
    PyErr_SetString(g_errors.dist, messageOf(e).c_str());
  } catch (const tiler::Error& e) {
    PyErr_SetString(g_errors.error, messageOf(e).c_str());
  }
}

// A keyword's flag: `name` with its underscores, as the command spells it.
std::string flagOf(const std::string& name) {
  return "--" + name;
}

// Keywords to the command's flags: None left out, a bool a switch (given when true), `save` a list joined
// with commas, any other list its flag once per item, everything else its str().
void appendFlags(std::vector<std::string>& args, const py::dict& flags) {
  for (const auto& [key, value] : flags) {
    const std::string name = py::str(key);
    if (value.is_none()) continue;
    if (py::isinstance<py::bool_>(value)) {
      if (value.cast<bool>()) args.push_back(flagOf(name));
      continue;
    }
    if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
      std::vector<std::string> items;
      for (const auto& item : value) items.push_back(py::str(item));
      if (name == "save" || name == "mean" || name == "std" || name == "channels") {
        std::string joined;
        for (const auto& item : items) joined += (joined.empty() ? "" : ",") + item;
        args.push_back(flagOf(name));
        args.push_back(joined);
      } else {
        for (const auto& item : items) {
          args.push_back(flagOf(name));
          args.push_back(item);
        }
      }
      continue;
    }
    args.push_back(flagOf(name));
    args.push_back(py::str(value));
  }
}

std::vector<std::string> pathsOf(const py::object& paths) {
  std::vector<std::string> out;
  if (py::isinstance<py::str>(paths) || py::hasattr(paths, "__fspath__")) {
    out.push_back(py::str(py::module_::import("os").attr("fspath")(paths)));
    return out;
  }
  for (const auto& p : paths) out.push_back(py::str(py::module_::import("os").attr("fspath")(p)));
  return out;
}

// A Model's engine model, kept between its runs: the one loaded for the last options and window, made anew
// when they change (a predict's own device, precision, threads, window, ...).
class ModelCache {
 public:
  tiler::ModelLoader loader() {
    return [this](const tiler::ModelOptions& o, int64_t window_w, int64_t window_h) {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::optional<std::string> key = keyOf(o, window_w, window_h);
      if (key && runner_ && *key == key_) return runner_;
      ++loads_;
      runner_ = std::make_shared<tiler::ModelRunner>(o);
      key_ = key.value_or("");
      if (!key) {
        auto made = runner_;
        runner_.reset();
        return made;
      }
      return runner_;
    };
  }
  int loads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return loads_;
  }

 private:
  // Everything of the options the model is made from; none (not kept) for a card's processing steps or
  // several heads, which are not compared here.
  static std::optional<std::string> keyOf(const tiler::ModelOptions& o, int64_t window_w, int64_t window_h) {
    if (!o.input_steps.empty() || !o.output_steps.empty() || !o.heads.empty()) return std::nullopt;
    std::ostringstream key;
    key.precision(17);
    key << o.path << '\n'
        << o.device << '\n'
        << o.precision << '\n'
        << o.threads << '\n'
        << o.output_key << '\n';
    for (double v : o.mean) key << v << ',';
    key << '\n';
    for (double v : o.std) key << v << ',';
    key << '\n'
        << int(o.activation) << ' ' << o.jit_optimize << ' ' << int(o.tta) << ' ' << o.local_rank << ' '
        << static_cast<const void*>(o.task) << ' ' << o.classes_named << ' ' << o.batch_size << ' '
        << o.preferred_input_channels << ' ' << window_w << ' ' << window_h;
    return key.str();
  }
  mutable std::mutex mutex_;
  std::string key_;
  std::shared_ptr<tiler::ModelRunner> runner_;
  int loads_ = 0;
};

enum class Command { kInfer, kFinetune };

// Runs `command` on `args` (after the program name) with the GIL released. Python's signal handlers and
// `progress` run after each step (infer); an exception they raise ends the run and is raised here. Returns
// the report as a dict (None where this rank writes none, or after --help).
py::object runCommand(Command command, const std::vector<std::string>& args, const py::object& progress,
                      ModelCache* models = nullptr) {
  tiler::tools::CommandHooks hooks;
  if (models) hooks.load_model = models->loader();
  hooks.throw_parse_errors = true;
  std::string report_path;
  hooks.report_path = &report_path;
  std::shared_ptr<py::error_already_set> raised;  // what Python raised in a hook
  int64_t reported = 0;                           // windows a tqdm-like bar was told of
  const bool bar = !progress.is_none() && py::hasattr(progress, "update");
  hooks.check_interrupt = [&] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return;
    raised = std::make_shared<py::error_already_set>();
    throw std::runtime_error("stopped by Python: " + std::string(raised->what()));
  };
  hooks.after_step = [&](int64_t done, int64_t total) {
    py::gil_scoped_acquire gil;
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (bar) {
        if (py::hasattr(progress, "total") && progress.attr("total").is_none())
          progress.attr("total") = total;
        progress.attr("update")(done - reported);
        reported = done;
      } else if (!progress.is_none()) {
        progress(done, total);
      }
    } catch (py::error_already_set& e) {
      raised = std::make_shared<py::error_already_set>(std::move(e));
      throw std::runtime_error("stopped by Python: " + std::string(raised->what()));
    }
  };
  std::vector<std::string> argv_text{"tiler"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  int code = 0;
  try {
    py::gil_scoped_release release;
    code = command == Command::kInfer
               ? tiler::tools::runInferCli(int(argv.size()) - 1, argv.data(), hooks)
               : tiler::tools::runFinetuneCli(int(argv.size()) - 1, argv.data(), hooks);
  } catch (...) {
    if (raised) throw *raised;
    throw;
  }
  std::string report_text;
  if (tiler::isMemoryOutput(report_path)) {
    std::optional<std::string> kept = tiler::takeMemoryText(report_path);
    if (!kept) return py::none();
    report_text = std::move(*kept);
  } else {
    if (report_path.empty() || access(report_path.c_str(), R_OK) != 0) return py::none();
    const char* rank = std::getenv("RANK");
    if (rank && std::strcmp(rank, "0") != 0) return py::none();
    report_text = tiler::readWholeFile(report_path);
  }
  py::dict report = py::module_::import("json").attr("loads")(report_text);
  report["exit_code"] = code;
  return report;
}

py::object infer(const py::object& inputs, const py::object& output, const py::object& model,
                 const py::object& progress, const py::kwargs& flags) {
  std::vector<std::string> args;
  for (const std::string& p : pathsOf(inputs)) args.insert(args.end(), {"-i", p});
  args.insert(args.end(), {"-o", pathsOf(output).at(0)});
  if (!model.is_none()) args.insert(args.end(), {"-m", pathsOf(model).at(0)});
  if (!progress.is_none() && !flags.contains("no_progress")) args.push_back("--no_progress");
  appendFlags(args, flags);
  return runCommand(Command::kInfer, args, progress);
}

py::object finetune(const py::object& images, const py::object& output, const py::object& model,
                    const py::kwargs& flags) {
  std::vector<std::string> args{"--images", pathsOf(images).at(0), "-o", pathsOf(output).at(0)};
  if (!model.is_none()) args.insert(args.end(), {"-m", pathsOf(model).at(0)});
  appendFlags(args, flags);
  return runCommand(Command::kFinetune, args, py::none());
}

// An output directory in memory (writers/memory_output) for one predict's outputs, dropped with what is left.
class MemoryOutputDir {
 public:
  MemoryOutputDir() : name_(tiler::registerMemoryOutput()) {}
  ~MemoryOutputDir() { tiler::unregisterMemoryOutput(name_); }
  MemoryOutputDir(const MemoryOutputDir&) = delete;
  MemoryOutputDir& operator=(const MemoryOutputDir&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// An input registered for the life of this object.
class RegisteredImage {
 public:
  explicit RegisteredImage(const tiler::MemoryPixels& pixels)
      : name_(tiler::registerMemoryImage(pixels, "image")) {}
  ~RegisteredImage() { tiler::unregisterMemoryImage(name_); }
  RegisteredImage(const RegisteredImage&) = delete;
  RegisteredImage& operator=(const RegisteredImage&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// `array` as the in-memory row reads it: H x W (one channel), H x W x C, or C x H x W (`layout`, or by its
// shape: C x H x W when the first axis is at most 16 and the last larger).
tiler::MemoryPixels pixelsOf(const py::array& array, const std::string& layout) {
  tiler::MemoryPixels p;
  p.data = array.data();
  if (array.dtype().is(py::dtype::of<uint8_t>()))
    p.type = tiler::SampleType::kU8;
  else if (array.dtype().is(py::dtype::of<uint16_t>()))
    p.type = tiler::SampleType::kU16;
  else if (array.dtype().is(py::dtype::of<float>()))
    p.type = tiler::SampleType::kF32;
  else
    TILER_THROW(tiler::ConfigError, "image: dtype " << std::string(py::str(array.dtype()))
                                                    << " is not read; give uint8, uint16 or float32");
  TILER_CHECK(layout.empty() || layout == "hwc" || layout == "chw", tiler::ConfigError,
              "layout must be hwc or chw; got '" << layout << "'");
  if (array.ndim() == 2) {
    TILER_CHECK(layout != "chw", tiler::ConfigError, "layout 'chw' for a 2-D image (H x W)");
    p.height = array.shape(0), p.width = array.shape(1), p.channels = 1;
    p.stride_y = array.strides(0), p.stride_x = array.strides(1), p.stride_c = 0;
    return p;
  }
  TILER_CHECK(array.ndim() == 3, tiler::ConfigError,
              "image: " << array.ndim() << " axes; give H x W, H x W x C or C x H x W");
  const bool chw =
      layout.empty() ? (array.shape(0) <= 16 && array.shape(2) > array.shape(0)) : layout == "chw";
  const int h = chw ? 1 : 0, w = chw ? 2 : 1, c = chw ? 0 : 2;
  p.height = array.shape(h), p.width = array.shape(w), p.channels = int(array.shape(c));
  p.stride_y = array.strides(h), p.stride_x = array.strides(w), p.stride_c = array.strides(c);
  return p;
}

// A kept array as a NumPy array that owns its buffer (no copy).
py::array arrayOf(tiler::MemoryArray kept) {
  py::dtype type = kept.type == tiler::SampleType::kU8    ? py::dtype::of<uint8_t>()
                   : kept.type == tiler::SampleType::kU16 ? py::dtype::of<uint16_t>()
                   : kept.type == tiler::SampleType::kU32 ? py::dtype::of<uint32_t>()
                   : kept.type == tiler::SampleType::kI16 ? py::dtype::of<int16_t>()
                   : kept.type == tiler::SampleType::kF16 ? py::dtype("float16")
                                                          : py::dtype::of<float>();
  uint8_t* data = kept.data.release();
  py::capsule owner(data, [](void* p) { delete[] static_cast<uint8_t*>(p); });
  return py::array(type, kept.shape, data, owner);
}

py::dict predict(const py::object& image, const py::object& model, const py::object& window,
                 const py::object& overlap, const std::string& layout, const py::object& progress,
                 const py::dict& flags, ModelCache* models) {
  py::array array = py::array::ensure(image);
  TILER_CHECK(array, tiler::ConfigError, "image: not an array (the buffer protocol)");
  const RegisteredImage input(pixelsOf(array, layout));
  TILER_CHECK(
      !flags.contains("output") && !flags.contains("report"), tiler::ConfigError,
      "predict keeps its outputs and report in memory: no output or report (tiler.infer writes them)");
  const MemoryOutputDir memory;
  std::vector<std::string> args{"-i", input.name(), "-o", memory.name()};
  if (!model.is_none()) args.insert(args.end(), {"-m", pathsOf(model).at(0)});
  if (!window.is_none()) args.insert(args.end(), {"--window", py::str(window)});
  if (!overlap.is_none()) args.insert(args.end(), {"--overlap", py::str(overlap)});
  if (!flags.contains("no_progress")) args.push_back("--no_progress");
  appendFlags(args, flags);
  py::dict report = runCommand(Command::kInfer, args, progress, models);
  py::dict entry = report["images"].cast<py::list>()[0];
  const std::string status = py::str(entry["status"]);
  if (status != "ok") {
    const std::string message = entry.contains("error") ? std::string(py::str(entry["error"])) : status;
    PyErr_SetString(g_errors.error, message.c_str());
    throw py::error_already_set();
  }
  py::dict out;
  py::dict outputs = entry["outputs"];
  for (const auto& [kind_object, path_object] : outputs) {
    const std::string path = py::str(path_object);
    if (std::optional<tiler::MemoryArray> kept = tiler::takeMemoryArray(path)) {
      out[kind_object] = arrayOf(std::move(*kept));
    } else if (std::optional<std::string> text = tiler::takeMemoryText(path)) {
      const std::string ext = tiler::lowerExtension(path);
      if (ext == ".geojson" || ext == ".json")
        out[kind_object] = py::module_::import("json").attr("loads")(py::str(*text));
      else
        out[kind_object] = py::str(*text);
    }
  }
  out["report"] = report;
  return out;
}

py::dict predictArray(const py::object& image, const py::object& model, const py::object& window,
                      const py::object& overlap, const std::string& layout, const py::object& progress,
                      const py::kwargs& flags) {
  return predict(image, model, window, overlap, layout, progress, flags, nullptr);
}

// A model and its flags, given once and used by every predict (a predict's own keywords win).
struct Model {
  py::object path;
  py::dict flags;
  std::shared_ptr<ModelCache> models = std::make_shared<ModelCache>();
};

}  // namespace

PYBIND11_MODULE(tiler, m) {
  m.doc() =
      "tiler: run a TorchScript model over large images in overlapping windows and blend the results "
      "(the `tiler` command's engine; docs/python.md)";
  py::object exception = py::module_::import("builtins").attr("Exception");
  py::object value_error = py::module_::import("builtins").attr("ValueError");
  py::object os_error = py::module_::import("builtins").attr("OSError");
  g_errors.error = newErrorType(m, "Error", py::make_tuple(exception), "tiler's errors");
  py::handle base(g_errors.error);
  g_errors.config =
      newErrorType(m, "ConfigError", py::make_tuple(base, value_error), "a bad flag, value or setting");
  g_errors.io =
      newErrorType(m, "IoError", py::make_tuple(base, os_error), "a file that cannot be read or written");
  g_errors.model =
      newErrorType(m, "ModelError", py::make_tuple(base), "a model that cannot be loaded or run");
  g_errors.dist = newErrorType(m, "DistError", py::make_tuple(base), "a failure between ranks");
  g_errors.timeout = newErrorType(m, "TimeoutError", py::make_tuple(py::handle(g_errors.dist)),
                                  "a rendezvous or collective past --timeout");
  g_errors.peer_lost = newErrorType(m, "PeerLostError", py::make_tuple(py::handle(g_errors.dist)),
                                    "another rank's connection closed");
  py::register_exception_translator(translateErrors);

  auto logger = std::make_shared<spdlog::logger>("tiler", std::make_shared<PythonLogSink>());
  logger->set_pattern("%v");
  spdlog::set_default_logger(logger);
  if (const char* level = std::getenv("TILER_LOG")) spdlog::set_level(spdlog::level::from_str(level));

  m.def("infer", &infer, py::arg("inputs"), py::arg("output") = "tiler-out", py::arg("model") = py::none(),
        py::kw_only(), py::arg("progress") = py::none(),
        "infer(inputs, output='tiler-out', model=None, *, progress=None, **flags) -> dict: `tiler infer` "
        "(every flag a keyword, underscores as the command's); the report as a dict (None on ranks other "
        "than 0), with `exit_code` (2: some images failed)");
  m.def("finetune", &finetune, py::arg("images"), py::arg("output") = "tiler-finetuned.pt",
        py::arg("model") = py::none(),
        "finetune(images, output='tiler-finetuned.pt', model=None, **flags) -> dict: `tiler finetune`, "
        "its report as a dict");
  m.def(
      "predict", &predictArray, py::arg("image"), py::arg("model") = py::none(), py::kw_only(),
      py::arg("window") = py::none(), py::arg("overlap") = py::none(), py::arg("layout") = "",
      py::arg("progress") = py::none(),
      "predict(image, model=None, *, window=None, overlap=None, layout='', progress=None, **flags) -> dict: "
      "`tiler infer` on a NumPy array (uint8, uint16 or float32; H x W, H x W x C or C x H x W) read in "
      "place; `probs` (C x H x W float32), `labels` (H x W), `objects` (GeoJSON dict) as the task saves "
      "them, and `report`");
  py::class_<Model>(m, "Model",
                    "Model(path=None, **flags): a model and the flags every predict() of it takes (window, "
                    "overlap, task, ...)")
      .def(py::init([](const py::object& path, const py::kwargs& flags) {
             return Model{path, py::dict(flags.attr("copy")())};
           }),
           py::arg("path") = py::none())
      .def(
          "predict",
          [](const Model& self, const py::object& image, const py::object& progress,
             const py::kwargs& flags) {
            py::dict merged = self.flags.attr("copy")();  // the model's own stay as given
            for (const auto& [key, value] : flags) merged[key] = value;
            py::object window =
                merged.contains("window") ? py::object(merged.attr("pop")("window")) : py::none();
            py::object overlap =
                merged.contains("overlap") ? py::object(merged.attr("pop")("overlap")) : py::none();
            std::string layout =
                merged.contains("layout") ? py::str(merged.attr("pop")("layout")) : py::str("");
            return predict(image, self.path, window, overlap, layout, progress, merged, self.models.get());
          },
          py::arg("image"), py::kw_only(), py::arg("progress") = py::none(),
          "predict(image, **flags): tiler.predict with this model and its flags")
      .def_property_readonly("path", [](const Model& self) { return self.path; })
      .def_property_readonly(
          "loads", [](const Model& self) { return self.models->loads(); },
          "how many times the engine loaded the model for this object (once for predicts of one window)")
      .def_property_readonly("flags", [](const Model& self) { return py::dict(self.flags.attr("copy")()); });
  m.attr("__version__") = TILER_VERSION;
}
