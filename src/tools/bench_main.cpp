// tiler_bench: the measurements scripts/bench.py composes. Each mode prints one JSON object on stdout.
//   forward   pure batched forward of N windows (the yardstick the pipeline is measured against)
//   io        every window of an image read through ImageReader: MB/s of decoded pixels, peak RSS
//   naive     what a user writes without tiler: whole image in memory, full-size float accumulators
//   make      a deterministic square RGB tiled TIFF of any size, written in bands
//   codecs    one TIFF's pixels through each output codec x level, with and without the predictor
//   gather    the step gather alone: ranks started by ctrun gather a batch of predictions K times
#include <torch/script.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>
#include <thread>

#include "tiler/core/cli.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/dist/dist.hpp"
#include "tiler/dist/loader.hpp"
#include "tiler/dist/report.hpp"
#include "tiler/infer/job.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/model/model.hpp"
#include "tiler/writers/blend.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using tiler::flagNames;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int forward(const std::string& model, int64_t window, int batch, int64_t windows, int threads, int replicas,
            const std::string& precision, bool jit_optimize) {
  tiler::ModelOptions o;
  o.path = model;
  o.jit_optimize = jit_optimize;
  o.device = "cpu";
  o.threads = threads;
  o.precision = precision;
  o.task = nullptr;  // auto: maps or per-window vectors, as the model gives them
  tiler::ModelRunner runner(o);
  auto probe = runner.probe(window, window);
  torch::manual_seed(0);
  auto input = torch::rand({batch, probe.input_channels, window, window}) * 255;
  auto scales = torch::full({batch}, 1.0f / 255);
  // Replicas as tiler runs them (ForwardPool), each warmed up: allocator and the graph executor's first runs.
  tiler::ForwardPool pool(runner, tiler::ForwardLayout{replicas, threads});
  auto run = [&](int64_t b) {
    return pool.submit<int>([&input, &scales, b](tiler::ModelRunner& r) {
      r.forward(input.narrow(0, 0, b), scales.narrow(0, 0, b));
      return 0;
    });
  };
  std::vector<std::future<int>> pending;
  for (int k = 0; k < 6 * replicas; ++k) pending.push_back(run(batch));
  for (auto& p : pending) p.get();
  pending.clear();
  auto t0 = Clock::now();
  for (int64_t done = 0; done < windows; done += batch)
    pending.push_back(run(std::min<int64_t>(batch, windows - done)));
  for (auto& p : pending) p.get();
  const double s = since(t0);
  std::cout << nlohmann::json{{"windows", windows},
                              {"seconds", s},
                              {"windows_per_second", double(windows) / s},
                              {"batch_size", batch},
                              {"replicas", replicas},
                              {"precision", precision},
                              {"threads", threads}}
                   .dump()
            << std::endl;
  return 0;
}

// Resident memory now, in MiB (the peak is in peakRssMegabytes()).
double currentRssMegabytes() {
  std::ifstream statm("/proc/self/statm");
  double pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * double(sysconf(_SC_PAGESIZE)) / 1048576.0;
}

// Window reads through one reader, by `threads` threads taking every threads-th window (as a decode pool
// would): the libtiff reader serialises them behind its lock, OpenSlide gives each thread a handle.
int io(const std::string& path, int64_t window, const std::string& overlap, int threads) {
  // What reading costs, apart from the process itself (this binary maps LibTorch, which tiler's reader
  // does not need): resident memory before the image is opened.
  const double baseline = currentRssMegabytes();
  auto reader = tiler::ImageReader::open(path);
  const auto& info = reader->info();
  tiler::GridSpec spec{window, window, 0.25, 0.25};
  tiler::parseOverlap(overlap, spec);
  tiler::WindowGrid grid(info.width, info.height, spec);
  auto t0 = Clock::now();
  std::vector<double> thread_bytes(size_t(std::max(1, threads)), 0.0);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < thread_bytes.size(); ++t)
    pool.emplace_back([&, t] {
      // Contiguous runs of windows, as the loader's read threads take a batch.
      const int64_t parts = int64_t(thread_bytes.size()), n = grid.count();
      for (int64_t i = int64_t(t) * n / parts; i < (int64_t(t) + 1) * n / parts; ++i) {
        cv::Mat m = tiler::readWindow(*reader, grid, i, tiler::PadMode::kConstant, 0);
        thread_bytes[t] += double(m.total() * m.elemSize());
      }
    });
  for (auto& th : pool) th.join();
  const double s = since(t0);
  double bytes = 0;
  for (double b : thread_bytes) bytes += b;
  const double image_mb =
      double(info.width * info.height * info.channels * tiler::bytesPerSample(info.type)) / 1048576.0;
  std::cout << nlohmann::json{{"windows", grid.count()},
                              {"reader", info.reader},
                              {"threads", thread_bytes.size()},
                              {"seconds", s},
                              {"windows_per_second", double(grid.count()) / s},
                              {"mb_per_second", bytes / 1048576.0 / s},
                              {"peak_rss_mb", tiler::peakRssMegabytes()},
                              {"image_mb", image_mb},
                              {"reader_rss_mb", tiler::peakRssMegabytes() - baseline},
                              {"reader_rss_share_of_image",
                               (tiler::peakRssMegabytes() - baseline) / image_mb}}
                   .dump()
            << std::endl;
  return 0;
}

int naive(const std::string& path, const std::string& model, int64_t window, int batch, int threads) {
  auto t0 = Clock::now();
  auto reader = tiler::ImageReader::open(path);
  const auto& info = reader->info();
  cv::Mat image = reader->readRegion({0, 0, info.width, info.height});  // the whole image, decoded
  tiler::ModelOptions o;
  o.path = model;
  o.device = "cpu";
  o.threads = threads;
  tiler::ModelRunner runner(o);
  auto probe = runner.probe(window, window);
  tiler::WindowGrid grid(info.width, info.height, tiler::GridSpec{window, window, 0.25, 0.25});
  const int C = probe.output_channels;
  std::vector<float> acc(size_t(info.width * info.height * C), 0.f),
      wsum(size_t(info.width * info.height), 0.f);
  auto imp = tiler::gaussianImportance(window, window, 0.125);
  for (int64_t i = 0; i < grid.count(); i += batch) {
    const int64_t b = std::min<int64_t>(batch, grid.count() - i);
    auto pixels = torch::zeros({b, probe.input_channels, window, window});
    for (int64_t j = 0; j < b; ++j) {
      tiler::Rect r = grid.window(i + j);
      tiler::windowToModelInput(image(cv::Rect(int(r.x), int(r.y), int(window), int(window))),
                                tiler::ChannelAdapt::kNone, pixels[j].data_ptr<float>());
    }
    auto out = runner.forward(pixels, torch::full({b}, 1.0f / 255)).contiguous();
    for (int64_t j = 0; j < b; ++j) {
      tiler::Rect r = grid.window(i + j);
      const float* p = out[j].data_ptr<float>();
      for (int64_t y = 0; y < window; ++y)
        for (int64_t x = 0; x < window; ++x) {
          const float w = imp[size_t(y * window + x)];
          const size_t px = size_t((r.y + y) * info.width + r.x + x);
          wsum[px] += w;
          for (int c = 0; c < C; ++c) acc[px * size_t(C) + size_t(c)] += w * p[(c * window + y) * window + x];
        }
    }
  }
  for (size_t px = 0; px < wsum.size(); ++px)
    for (int c = 0; c < C; ++c) acc[px * size_t(C) + size_t(c)] /= wsum[px];
  std::cout << nlohmann::json{{"seconds", since(t0)},
                              {"peak_rss_mb", tiler::peakRssMegabytes()},
                              {"windows", grid.count()}}
                   .dump()
            << std::endl;
  return 0;
}

// Writes a size x size RGB tiled TIFF band by band; pixel(x, y, rgb) fills one pixel.
template <typename PixelFn>
void writeSyntheticRgb(const std::string& path, int64_t size, PixelFn pixel) {
  tiler::WriterOptions o;
  o.compression = tiler::Compression{tiler::Codec::kDeflate};  // the inputs as measured since wave 1
  tiler::ImageWriter writer(path, size, size, 3, tiler::SampleType::kU8, o);
  const int band = 256;
  for (int64_t y0 = 0; y0 < size; y0 += band) {
    const int rows = int(std::min<int64_t>(band, size - y0));
    cv::Mat m(rows, int(size), CV_8UC3);
    for (int y = 0; y < rows; ++y) {
      auto* p = m.ptr<uint8_t>(y);
      for (int64_t x = 0; x < size; ++x) pixel(x, y0 + y, p + x * 3);
    }
    writer.writeRows(m);
  }
  writer.close();
}

// tissue > 0: a slide, light glass with stained discs covering about that share of it; noise: every sample
// drawn at random (a model's outputs over it are as incompressible as real ones get); discs > 0: one bright
// disc in each cell of that pitch, its radius and place in the cell varied (objects to count: (size /
// pitch)^2 of them); else coloured blobs on a dark textured background.
int make(const std::string& path, int64_t size, double tissue, bool noise, int64_t discs) {
  if (discs > 0) {
    TILER_CHECK(discs >= 8, tiler::ConfigError, "--discs is a pitch of at least 8 pixels");
    writeSyntheticRgb(path, size, [discs](int64_t x, int64_t y, uint8_t* rgb) {
      const int64_t cx = x / discs, cy = y / discs;
      const uint64_t h = (uint64_t(cy) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(cx) * 0xBF58476D1CE4E5B9ull);
      // A radius of 0.2-0.35 pitch, the centre up to 0.1 pitch off the cell's: discs never touch.
      const int64_t r = discs * (20 + int64_t(h % 16)) / 100,
                    jx = discs * int64_t((h >> 8) % 21) / 100 - discs / 10,
                    jy = discs * int64_t((h >> 16) % 21) / 100 - discs / 10;
      const int64_t dx = x % discs - discs / 2 - jx, dy = y % discs - discs / 2 - jy;
      const bool disc = dx * dx + dy * dy < r * r;
      rgb[0] = uint8_t(disc ? 220 : 60 + (x * 13 + y * 7) % 40);
      rgb[1] = uint8_t(disc ? 200 : 55 + (x * 5 + y * 11) % 30);
      rgb[2] = uint8_t(disc ? 180 : 50 + (x + y) % 20);
    });
    return 0;
  }
  if (noise) {
    writeSyntheticRgb(path, size, [](int64_t x, int64_t y, uint8_t* rgb) {
      uint64_t h = (uint64_t(y) << 32 | uint64_t(x)) * 0x9E3779B97F4A7C15ull;  // a fixed hash: the same image
      h ^= h >> 29;
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 32;
      for (int c = 0; c < 3; ++c) rgb[c] = uint8_t(h >> (8 * c));
    });
    return 0;
  }
  if (tissue <= 0) {
    writeSyntheticRgb(path, size, [](int64_t x, int64_t y, uint8_t* rgb) {
      const bool blob = ((x / 97) + (y / 89)) % 7 == 0 &&
                        (x % 97 - 48) * (x % 97 - 48) + (y % 89 - 44) * (y % 89 - 44) < 900;
      rgb[0] = uint8_t(blob ? 220 : 60 + (x * 13 + y * 7) % 40);
      rgb[1] = uint8_t(blob ? 200 : 55 + (x * 5 + y * 11) % 30);
      rgb[2] = uint8_t(blob ? 180 : 50 + (x + y) % 20);
    });
    return 0;
  }
  // Tissue lies in one clump, as on a real slide: discs of radius r packed at pitch 2.2r (covering pi/4.84 of
  // their cells) in a centred block of the grid sized for the share asked; the rest is glass.
  const int64_t r = std::max<int64_t>(8, size / 40), pitch = r * 22 / 10;
  const int64_t cells = size / pitch;
  const int64_t keep =
      std::min(cells, int64_t(std::lround(double(cells) * std::sqrt(tissue / (M_PI / 4.84)))));
  const int64_t first = (cells - keep) / 2;
  writeSyntheticRgb(path, size, [=](int64_t x, int64_t y, uint8_t* rgb) {
    const int64_t cx = x / pitch, cy = y / pitch, dx = x % pitch - pitch / 2, dy = y % pitch - pitch / 2;
    const bool disc =
        cx >= first && cx < first + keep && cy >= first && cy < first + keep && dx * dx + dy * dy < r * r;
    rgb[0] = uint8_t(disc ? 170 + (x * 7 + y * 3) % 30 : 232 + (x + y) % 8);
    rgb[1] = uint8_t(disc ? 80 + (x * 5 + y * 11) % 30 : 232 + (x * 3 + y) % 8);
    rgb[2] = uint8_t(disc ? 160 + (x + y * 5) % 30 : 236 + (x + y * 3) % 8);
  });
  return 0;
}

// threshold: class 1 where red is above half (the blobs of `make`'s image), so that outputs have regions.
int tinyModel(const std::string& path, bool threshold, int classes) {
  torch::jit::Module m("Tiny");
  torch::manual_seed(0);
  if (threshold) {
    m.define(
        "def forward(self, x):\n    r = x[:, 0:1]\n    return torch.cat([torch.zeros_like(r), r - 0.5], "
        "1)\n");
  } else {
    m.register_parameter("w", torch::randn({classes, 3, 1, 1}), false);
    m.define("def forward(self, x):\n    return torch.conv2d(x, self.w)\n");
  }
  m.save(path);
  return 0;
}

// Each codec of `list` (parseCompression's syntax, comma separated), with and without the predictor, over the
// pixels of `input`: the file size and the MB/s of raw samples one thread compresses (no pool: the writer
// compresses on the calling thread; reading the bands is not timed). The file goes to `scratch`, then away.
int codecs(const std::string& input, const std::string& list, const std::string& scratch) {
  auto reader = tiler::ImageReader::open(input);
  const tiler::ImageInfo& info = reader->info();
  const double raw_mb = double(info.width) * double(info.height) * info.channels *
                        double(tiler::bytesPerSample(info.type)) / 1e6;
  std::stringstream specs(list);
  for (std::string spec; std::getline(specs, spec, ',');) {
    for (bool predictor : {true, false}) {
      tiler::Compression c = tiler::parseCompression(spec);
      if (!predictor && c.codec == tiler::Codec::kNone) continue;
      c.predictor = predictor;
      tiler::WriterOptions o;
      o.compression = c;
      double seconds = 0;
      {
        tiler::ImageWriter writer(scratch, info.width, info.height, info.channels, info.type, o);
        for (int64_t y = 0; y < info.height; y += o.tile) {
          const cv::Mat band =
              reader->readRegion({0, y, info.width, std::min<int64_t>(o.tile, info.height - y)});
          const auto t0 = Clock::now();
          writer.writeRows(band);
          seconds += since(t0);
        }
        const auto t0 = Clock::now();
        writer.close();
        seconds += since(t0);
      }
      const double mb = double(std::filesystem::file_size(scratch)) / 1e6;
      std::filesystem::remove(scratch);
      std::cout << nlohmann::json{{"type", tiler::sampleTypeName(info.type)},
                                  {"channels", info.channels},
                                  {"codec", spec},
                                  {"predictor", predictor},
                                  {"raw_mb", raw_mb},
                                  {"mb", mb},
                                  {"ratio", raw_mb / mb},
                                  {"mb_per_s", raw_mb / seconds}}
                       .dump()
                << std::endl;
    }
  }
  return 0;
}

// The step gather alone, as tiler's ranks make it (rank 0 prints): `gathers` gathers of `mib` MiB a rank.
int gather(double mib, int gathers, bool shared_memory) {
  const tiler::WorldInfo world = tiler::discoverWorld();
  tiler::DistOptions o;
  o.shared_memory = shared_memory;
  tiler::DistContext dist(world, o, torch::Device(torch::kCPU));
  auto t = torch::full({int64_t(mib * 262144)}, float(world.rank));
  dist.gather(t, 0, "the first gather");
  dist.barrier("the start");
  const auto t0 = Clock::now();
  for (int k = 0; k < gathers; ++k) dist.gather(t, 0, "gather " + std::to_string(k));
  const double s = since(t0);
  if (world.rank == 0)
    std::cout << nlohmann::json{{"ranks", world.world_size},
                                {"mib", mib},
                                {"gathers", gathers},
                                {"seconds", s},
                                {"ms_per_gather", 1000 * s / gathers},
                                {"transport", dist.gatherTransport()}}
                     .dump()
              << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tiler_bench: measurements for scripts/bench.sh"};
  app.require_subcommand(1);
  std::string model, path, precision = "fp32", overlap = "0.25";
  int64_t window = 256, windows = 121, size = 4096;
  int batch = 8, threads = 2;
  auto* f = app.add_subcommand("forward", "pure batched forward");
  f->add_option(flagNames("-m,--model"), model)->required();
  f->add_option(flagNames("--window"), window);
  f->add_option(flagNames("--batch_size"), batch);
  f->add_option(flagNames("--windows"), windows);
  f->add_option(flagNames("--threads"), threads, "intra-op threads of each replica");
  int replicas = 1;
  f->add_option(flagNames("--replicas"), replicas, "model replicas, each on a thread of its own");
  f->add_option(flagNames("--precision"), precision);
  bool jit_optimize = false;
  f->add_flag(flagNames("--jit_optimize"), jit_optimize);
  auto* i = app.add_subcommand("io", "window reads");
  i->add_option("image", path)->required();
  i->add_option(flagNames("--window"), window);
  i->add_option(flagNames("--overlap"), overlap);
  int read_threads = 1;
  i->add_option(flagNames("--threads"), read_threads, "reading threads sharing the reader");
  auto* n = app.add_subcommand("naive", "whole-image baseline");
  n->add_option("image", path)->required();
  n->add_option(flagNames("-m,--model"), model)->required();
  n->add_option(flagNames("--window"), window);
  n->add_option(flagNames("--batch_size"), batch);
  n->add_option(flagNames("--threads"), threads);
  auto* mk = app.add_subcommand("make", "deterministic RGB tiled TIFF");
  mk->add_option("output", path)->required();
  mk->add_option(flagNames("--size"), size);
  double tissue = 0;
  int64_t discs = 0;
  mk->add_option(flagNames("--tissue"), tissue, "a slide with this share of stained discs on glass");
  bool noise = false;
  mk->add_flag(flagNames("--noise"), noise, "every sample at random (deterministic)");
  mk->add_option(flagNames("--discs"), discs,
                 "one bright disc in every cell of this pitch (objects to count)");
  auto* t = app.add_subcommand("tiny-model", "a 1x1 convolution TorchScript model");
  t->add_option("output", path)->required();
  bool threshold = false;
  t->add_flag("--threshold", threshold, "class 1 where red > 0.5 instead (regions for polygon runs)");
  int classes = 2;
  t->add_option(flagNames("--classes"), classes, "output channels of the convolution");
  auto* cd =
      app.add_subcommand("codecs", "an image's pixels through each codec: size and MB/s of one thread");
  cd->add_option("image", path)->required();
  std::string codec_list = "deflate:1,deflate:6,zstd:1,zstd:9,lzw,none";
  cd->add_option(flagNames("--codecs"), codec_list, "--compression values, comma separated");
  std::string scratch = "codecs-scratch.tif";
  cd->add_option(flagNames("--scratch"), scratch, "where each trial file is written (then removed)");
  auto* g = app.add_subcommand("gather", "the step gather alone (start the ranks with ctrun)");
  double mib = 4;
  int gathers = 100;
  bool no_shared_memory = false;
  g->add_option(flagNames("--mib"), mib, "MiB each rank sends per gather");
  g->add_option(flagNames("--gathers"), gathers);
  g->add_flag(flagNames("--no_shared_memory"), no_shared_memory, "through gloo's sockets");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*f) return forward(model, window, batch, windows, threads, replicas, precision, jit_optimize);
    if (*i) return io(path, window, overlap, read_threads);
    if (*n) return naive(path, model, window, batch, threads);
    if (*mk) return make(path, size, tissue, noise, discs);
    if (*t) return tinyModel(path, threshold, classes);
    if (*cd) return codecs(path, codec_list, scratch);
    return gather(mib, gathers, !no_shared_memory);
  } catch (const std::exception& e) {
    return tiler::reportFatal("tiler_bench", e);
  }
}
