#include "cli_commands.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <optional>
#include <set>
#include <stdexcept>

#include "commands.hpp"
#include "tiler/core/cli.hpp"
#include "tiler/core/error.hpp"
#include "tiler/finetune/checkpoint.hpp"
#include "tiler/finetune/finetune.hpp"
#include "tiler/infer/inspect.hpp"
#include "tiler/infer/job.hpp"
#include "tiler/model/model_card.hpp"
#include "tiler/tasks/heads.hpp"
#include "tiler/tasks/registry.hpp"
#include "tiler/view/server.hpp"

namespace tiler::tools {
namespace {

using tiler::finiteNumber;
using tiler::flagNames;
using tiler::nonNegativeNumber;
using tiler::positiveNumber;

// The flags infer and finetune share (JobOptions), so that a model is fed alike when trained and when run.
void addJobFlags(CLI::App& app, tiler::JobOptions& o) {
  app.add_option(flagNames("-m,--model"), o.model,
                 "TorchScript model file, or a bioimage.io rdf.yaml or package directory (default: the "
                 "bundled sample model); a WSInfer config.json beside the model is read too");
  app.add_option(flagNames("--device"), o.device, "auto | cpu | cuda | cuda:K")->capture_default_str();
  app.add_option(flagNames("--backend"), o.backend, "auto | gloo | nccl")->capture_default_str();
  app.add_option(flagNames("--precision"), o.precision,
                 "fp32 | fp16 | bf16 (default: fp16 on CUDA, fp32 on CPU)")
      ->capture_default_str();
  app.add_option(flagNames("--threads"), o.threads, "LibTorch intra-op threads (of each model replica)")
      ->check(positiveNumber());
  app.add_option(flagNames("--timeout"), o.timeout, "seconds any rendezvous or collective may take")
      ->capture_default_str()
      ->check(positiveNumber());
  app.add_option(flagNames("--window"), o.window, "window size N or W,H")->capture_default_str();
  app.add_option(flagNames("--overlap"), o.overlap, "overlap F or FX,FY in [0,1)")->capture_default_str();
  app.add_option(flagNames("--batch_size"), o.batch_size, "windows per forward and rank")
      ->capture_default_str()
      ->check(positiveNumber());
  app.add_option(flagNames("--pad"), o.pad, "constant | reflect | replicate")->capture_default_str();
  app.add_option(flagNames("--channels"), o.channels,
                 "input channels to take, in order, 0-based: 2,0,1 | 0-2 | 3,1-2 (default: all)");
  app.add_option(flagNames("--scale"), o.scale, "input scale (default: 1/255 u8, 1/65535 u16, 1 f32)")
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--mean"), o.mean, "per-channel mean A,B,C")
      ->delimiter(',')
      ->check(finiteNumber());
  app.add_option(flagNames("--std"), o.std, "per-channel std A,B,C")->delimiter(',')->check(positiveNumber());
  app.add_flag(flagNames("--no_progress"), o.no_progress, "no progress output");
}

// --level | --mpp | --magnification (at most one), --input_mpp and --no_upsample, for infer, finetune and
// info.
void addResolutionFlags(CLI::App& app, int& level, double& mpp, double& magnification, double& input_mpp,
                        bool& no_upsample) {
  auto* l = app.add_option(flagNames("--level"), level, "process this resolution level as it is (0: full)")
                ->check(nonNegativeNumber());
  auto* m = app.add_option(flagNames("--mpp"), mpp,
                           "process at this many micrometres per pixel (from the coarsest level at least as "
                           "fine, resampled by area)")
                ->check(positiveNumber());
  auto* x = app.add_option(flagNames("--magnification"), magnification,
                           "process at this objective power (20 = 20x; 10/X um/px when a slide states none)")
                ->check(positiveNumber());
  l->excludes(m)->excludes(x);
  m->excludes(x);
  app.add_option(flagNames("--input_mpp"), input_mpp, "the inputs' level-0 um/px, over their metadata")
      ->check(positiveNumber());
  app.add_flag(flagNames("--no_upsample"), no_upsample,
               "refuse an image whose level 0 is coarser than --mpp / --magnification asks (default: "
               "upsample it by area, with a warning)");
}

// A model `tiler finetune` wrote records how it was trained (its window, um/px and classes): a card of its
// own (kind "tiler", the file itself), so it runs as trained without re-typed flags, a flag still winning.
std::optional<tiler::ModelCard> trainedModelCard(const std::string& model) {
  if (model.empty()) return std::nullopt;
  const auto trained = tiler::readTrainedSettings(model);
  if (!trained) return std::nullopt;
  tiler::ModelCard card;
  card.kind = "tiler";
  card.path = card.weights = model;
  if (!trained->window.empty()) card.window = trained->window;
  if (trained->mpp > 0) card.mpp = trained->mpp;
  if (!trained->classes.empty()) card.classes = trained->classes;
  return card;
}

// A model card (-m naming a bioimage.io rdf.yaml or package, or a WSInfer config.json beside the model): its
// settings where no flag or --config key gives them; -m becomes the weights it names.
void takeModelCard(const CLI::App& app, tiler::InferOptions& o) {
  auto card = tiler::findModelCard(o.model);
  if (!card) card = trainedModelCard(o.model);
  if (!card) return;
  std::set<std::string> given;
  for (const auto& name : tiler::cardSettingNames())
    if (app.count("--" + name) > 0) given.insert(name);
  if (app.count("--level") + app.count("--magnification") > 0) given.insert("mpp");
  o.model = card->weights;
  o.model_sha256 = card->weights_sha256;
  o.model_card = card->path;
  o.settings_from =
      tiler::applyModelCard(*card, given,
                            {&o.window, &o.mpp, &o.scale, &o.mean, &o.std, &o.classes, &o.activation, &o.task,
                             &o.halo, &o.preprocessing, &o.postprocessing});
}

}  // namespace

int runCheckModelCli(int argc, char** argv) {
  std::string card, device = "cpu";
  CLI::App app{
      "tiler check-model: run a bioimage.io model card's test input through its model and compare the "
      "result with its test output (exit 0: within the card's tolerance, 1: not)"};
  app.add_option("card", card, "rdf.yaml, a package directory holding one, or a zipped package (.zip)")
      ->required();
  app.add_option(flagNames("--device"), device, "cpu | cuda | cuda:K")->capture_default_str();
  if (const int code = tiler::parseCommandLine(app, argc, argv, "tiler check-model"); code >= 0) return code;
  return tiler::tools::checkModel(card, device);
}

int runViewCli(int argc, char** argv) {
  tiler::ViewOptions o;
  CLI::App app{
      "tiler view: serve a finished job's images and results to a browser (IIIF Image API 3.0 tiles and a "
      "page over them) and print the URL to open"};
  app.add_option("output_dir", o.output_dir, "the job's output directory (holding its report.json)")
      ->required();
  app.add_option(flagNames("--port"), o.port, "TCP port (0: a free one, printed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option(
         flagNames("--host"), o.host,
         "address to listen on; any other than 127.0.0.1 lets other machines read the job (a warning)")
      ->capture_default_str();
  app.add_option(flagNames("--cache_mb"), o.cache_mb, "MiB of served tiles kept for the next request")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--threads"), o.threads, "requests worked on at once (read, resample, encode)")
      ->capture_default_str()
      ->check(positiveNumber());
  app.add_option(flagNames("--objects_limit"), o.objects_limit,
                 "outlines one objects request returns; past it, their centroids")
      ->capture_default_str()
      ->check(positiveNumber());
  if (const int code = tiler::parseCommandLine(app, argc, argv, "tiler view"); code >= 0) return code;
  return tiler::runView(o);
}

namespace {

// Task flag `name` (a tasks/registry declaration) into o.task_flags, at its place in --help.
void addTaskFlag(CLI::App& app, tiler::InferOptions& o, const std::string& name) {
  const auto& flags = tiler::taskFlagDeclarations();
  const auto flag =
      std::find_if(flags.begin(), flags.end(), [&name](const tiler::TaskFlag& f) { return name == f.name; });
  if (flag == flags.end()) throw std::logic_error("no task declares --" + name);
  std::string& value = o.task_flags[flag->name] = flag->default_value;
  using Check = tiler::TaskFlag::Check;
  if (flag->check == Check::kSwitch) {
    app.add_flag_function(
        flagNames("--" + name), [&value](int64_t count) { value = count > 0 ? "true" : "false"; },
        flag->help);
    return;
  }
  CLI::Option* option = app.add_option(flagNames("--" + name), value, flag->help);
  if (flag->show_default) option->capture_default_str();
  if (flag->check != Check::kNone) option->type_name("FLOAT");
  if (flag->check == Check::kNumber) option->check(finiteNumber().description(""));
  if (flag->check == Check::kPositive) option->check(positiveNumber());
  if (flag->check == Check::kNonNegative) option->check(nonNegativeNumber());
}

// The task flags not placed among infer's own above: a task's new flag needs no line here.
void addOtherTaskFlags(CLI::App& app, tiler::InferOptions& o) {
  for (const tiler::TaskFlag& flag : tiler::taskFlagDeclarations())
    if (!o.task_flags.count(flag.name)) addTaskFlag(app, o, flag.name);
}

// infer's flags, in --help's order: how windows are padded, blended and activated (after the shared flags).
void addWindowFlags(CLI::App& app, tiler::InferOptions& o) {
  app.add_option(flagNames("--cval"), o.cval, "value for constant padding")
      ->capture_default_str()
      ->check(finiteNumber());
  addTaskFlag(app, o, "blend");
  addTaskFlag(app, o, "sigma_scale");
  app.add_option(flagNames("--halo"), o.halo,
                 "px of each window's edge (at the output's resolution) the model cannot compute: not "
                 "blended where windows meet; the overlap is raised to twice it")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--activation"), o.activation, "none | softmax | sigmoid")->capture_default_str();
  app.add_option(
         flagNames("--tta"), o.tta,
         "none | flip | d4: also run each window mirrored (d4: rotated too, square windows), averaged")
      ->capture_default_str();
}

// What infer writes and for which task: --save (into `save`; the option returned, to tell whether it was
// given), --task, --heads, formats, --resume and --report.
CLI::Option* addOutputFlags(CLI::App& app, tiler::InferOptions& o, std::string& save) {
  auto* save_option = app.add_option(flagNames("--save"), save, tiler::saveHelpText());
  app.add_option(
         flagNames("--task"), o.task,
         tiler::taskWordsText() +
             " (auto: NCHW output segment; [B,D] "
             "classify with --activation softmax|sigmoid or --classes, else embed; detect and instances "
             "only when named or saved: boxes [B,N,6], instance ids [B,1+K,h,w])")
      ->capture_default_str();
  app.add_option(flagNames("--edge"), o.edge,
                 "auto | lattice | shift: the last windows on whole strides past the edge (lattice, as "
                 "TRIDENT/CLAM patches; classify, embed, detect) or shifted back to end at it (shift, "
                 "MONAI's grid); auto: lattice for per-window tasks, shift for segment")
      ->capture_default_str();
  addTaskFlag(app, o, "nms");
  app.add_option(flagNames("--heads"), o.heads,
                 "NAME[:TASK],...: a model's several outputs (dict keys, else tuple indices), run once per "
                 "batch, each a task (" +
                     tiler::headTaskWords() + ") with outputs <stem>_<NAME>_...");
  app.add_option(flagNames("--head_opt"), o.head_opt,
                 "NAME.KEY=VALUE (repeat it): a head's own " + tiler::headSettingWords());
  addTaskFlag(app, o, "encoder_name");
  app.add_option(flagNames("--format"), o.format, "tif | png (labels)")->capture_default_str();
  app.add_option(
      flagNames("--compression"), o.compression,
      "TIFF outputs: deflate[:1-12] | zstd[:1-22] | lzw | none (default: per output, docs/cli.md)");
  app.add_flag(flagNames("--resume"), o.resume, "skip images whose outputs exist");
  app.add_flag(flagNames("--overwrite"), o.overwrite, "redo images whose outputs exist");
  app.add_option(flagNames("--on_error"), o.on_error, "skip | abort")->capture_default_str();
  app.add_option(flagNames("--report"), o.report, "report JSON (default: <output>/report.json)");
  return save_option;
}

// Where infer looks (--mask, --roi, the resolution), then --pyramid, --simplify, --classes, --recursive,
// --output_key and --jit_optimize, as --help lists them.
void addRegionFlags(CLI::App& app, tiler::InferOptions& o) {
  app.add_option(flagNames("--mask"), o.mask,
                 "none | auto (tissue, nodata or alpha) | PATH (non-zero: process)")
      ->capture_default_str();
  app.add_option(flagNames("--mask_fraction"), o.mask_fraction,
                 "share of a window inside the mask to process it")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--roi"), o.roi,
                 "GeoJSON polygons (level-0 pixels, or a georeferenced image's CRS), or a directory of "
                 "<stem>.geojson: process only windows in them (with --mask: in both)");
  app.add_option(flagNames("--roi_class"), o.roi_class, "only the ROI features of this classification name");
  addResolutionFlags(app, o.level, o.mpp, o.magnification, o.input_mpp, o.no_upsample);
  app.add_flag(flagNames("--pyramid"), o.pyramid, "reduced-resolution levels in the TIFF outputs");
  addTaskFlag(app, o, "simplify");
  app.add_option(flagNames("--classes"), o.classes,
                 "class names NAME[:#rrggbb],... (labels palette, metadata)");
  app.add_flag(flagNames("--recursive"), o.recursive, "walk input directories recursively");
  app.add_option(flagNames("--output_key"), o.output_key, "dict key or tuple index of the model's output");
  app.add_flag(flagNames("--jit_optimize"), o.jit_optimize, "freeze + optimize_for_inference");
}

// How infer's stages share the machine: read-ahead, replicas, threads, buffers, where it stitches.
void addThroughputFlags(CLI::App& app, tiler::InferOptions& o) {
  app.add_option(flagNames("--prefetch"), o.prefetch, "batches read ahead")
      ->capture_default_str()
      ->check(positiveNumber());
  app.add_option(flagNames("--replicas"), o.replicas,
                 "model copies run side by side, --threads each (default: one per core on the CPU without "
                 "--threads, else 1)")
      ->check(positiveNumber());
  app.add_option(flagNames("--read_threads"), o.read_threads,
                 "threads reading each batch's windows (default: the CPUs the forward leaves, 1 to 4)")
      ->check(nonNegativeNumber());
  app.add_option(
         flagNames("--shard_buffer"), o.shard_buffer,
         "MiB of early predictions an image's owner rank may hold: with several ranks, each takes a part of "
         "every row of "
         "windows (of every piece of a row, when a row's parts do not fit), so few input tiles are decoded "
         "twice (0: one batch a rank per piece)")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--write_threads"), o.write_threads,
                 "threads compressing output tiles (default: the CPUs this rank may use)")
      ->check(positiveNumber());
  addTaskFlag(app, o, "probs_dtype");
  app.add_option(
         flagNames("--stitch"), o.stitch,
         "auto | host | device: where a segment model's windows are blended (auto: on a GPU, where the "
         "owner's windows arrive there: one rank or NCCL)")
      ->capture_default_str();
  app.add_flag(flagNames("--no_shared_memory"), o.no_shared_memory,
               "ranks of one host gather predictions through gloo's sockets, not shared memory");
}

}  // namespace

int runInferCli(int argc, char** argv, const CommandHooks& hooks) {
  tiler::InferOptions o;
  CLI::App app{
      "tiler: run a TorchScript model over large images in overlapping windows and stitch the result"};
  app.footer(
      "Commands:\n"
      "  tiler [infer] [FLAGS]               run a model over images (the default; the flags above)\n"
      "  tiler finetune --images I --labels L  train a model on tiles of image/label pairs\n"
      "  tiler info IMAGE...                 what tiler sees: size, type, levels, grid, mask\n"
      "  tiler overlay IMAGE LABELS OUT.png  a colour overlay of a result, with grid and mask\n"
      "  tiler check-model CARD              reproduce a bioimage.io package's test tensors\n"
      "  tiler view OUT_DIR                  a job's images and results in the browser (IIIF tiles)\n"
      "  tiler version                       versions, CUDA/NCCL, where the bundled samples are\n"
      "Run 'tiler COMMAND --help' for a command's flags.");
  app.set_config(flagNames("--config"), "", "TOML/INI file with any of these flags");
  app.add_option(flagNames("-i,--input"), o.inputs, "files or directories (default: the bundled samples)");
  app.add_option(flagNames("-o,--output"), o.output_dir, "output directory")->capture_default_str();
  addJobFlags(app, o);
  addWindowFlags(app, o);
  std::string save;
  CLI::Option* save_option = addOutputFlags(app, o, save);
  addRegionFlags(app, o);
  addThroughputFlags(app, o);
  addOtherTaskFlags(app, o);
  if (const int code = tiler::parseCommandLine(app, argc, argv, "tiler", hooks.throw_parse_errors); code >= 0)
    return code;
  if (save_option->count() > 0) o.save = save;
  o.overlap_given = app.count("--overlap") > 0;
  takeModelCard(app, o);
  o.after_step = hooks.after_step;
  o.check_interrupt = hooks.check_interrupt;
  o.load_model = hooks.load_model;
  if (hooks.report_path) *hooks.report_path = o.report.empty() ? o.output_dir + "/report.json" : o.report;
  return tiler::runInfer(o);
}

int runInfoCli(int argc, char** argv) {
  tiler::InfoOptions o;
  CLI::App app{"tiler info: what tiler sees in each image, the window grid and the mask"};
  app.add_option("images", o.paths, "image files or directories")->required();
  app.add_option(flagNames("--window"), o.window, "show the grid for this window (N or W,H)");
  app.add_option(flagNames("--overlap"), o.overlap, "overlap for the grid")->capture_default_str();
  app.add_option(flagNames("--mask"), o.mask, "none | auto | PATH: show the mask's coverage")
      ->capture_default_str();
  app.add_option(flagNames("--mask_fraction"), o.mask_fraction,
                 "share of a window inside the mask to keep it")
      ->capture_default_str();
  app.add_option(flagNames("--roi"), o.roi, "GeoJSON file or directory of <stem>.geojson: show its coverage");
  app.add_option(flagNames("--roi_class"), o.roi_class, "only the ROI features of this classification name");
  app.add_option(flagNames("--mask_preview"), o.mask_preview, "write the coverage map as a PNG");
  bool no_upsample = false;
  addResolutionFlags(app, o.resolution.level, o.resolution.mpp, o.resolution.magnification,
                     o.resolution.input_mpp, no_upsample);
  if (const int code = tiler::parseCommandLine(app, argc, argv, "tiler info"); code >= 0) return code;
  o.resolution.upsample = !no_upsample;
  return tiler::runInfo(o);
}

int runOverlayCli(int argc, char** argv) {
  std::string image, labels, out;
  int max_side = 2048;
  CLI::App app{"tiler overlay: a colour overlay PNG of a labels output on its input"};
  app.add_option("image", image, "input image")->required();
  app.add_option("labels", labels, "labels output of tiler")->required();
  app.add_option("output", out, "PNG to write")->required();
  app.add_option(flagNames("--max_side"), max_side, "longest side of the overlay")
      ->capture_default_str()
      ->check(positiveNumber());
  std::string window, overlap = "0.25";
  app.add_option(flagNames("--window"), window, "also draw the window grid (N or W,H)");
  app.add_option(flagNames("--overlap"), overlap, "overlap of that grid")->capture_default_str();
  std::string mask = "none";
  app.add_option(flagNames("--mask"), mask, "also draw this mask's outline: auto | PATH")
      ->capture_default_str();
  if (const int code = tiler::parseCommandLine(app, argc, argv, "tiler overlay"); code >= 0) return code;
  const tiler::MaskSpec mask_spec = tiler::parseMaskSpec(mask, 0.05);
  tiler::GridSpec spec;
  if (!window.empty()) spec = tiler::parseGridSpec(window, overlap);
  tiler::writeOverlay(image, labels, out, max_side, window.empty() ? nullptr : &spec, &mask_spec);
  return 0;
}

int runFinetuneCli(int argc, char** argv, const CommandHooks& hooks) {
  tiler::FinetuneOptions o;
  CLI::App app{"tiler finetune: data-parallel training on tiles"};
  app.set_config(flagNames("--config"), "", "TOML/INI file with any of these flags");
  app.add_option(flagNames("--images"), o.images_dir, "directory of training images")->required();
  app.add_option(flagNames("--labels"), o.labels_dir, "directory of label images, paired by file stem");
  app.add_option(flagNames("--annotations"), o.annotations,
                 "GeoJSON annotations (QuPath export; level-0 pixels or the image's CRS), or a directory of "
                 "<stem>.geojson: labels instead of --labels, windows only where annotations are");
  app.add_option(
      flagNames("--window_labels"), o.window_labels,
      "CSV image,x,y,label: a class a window (level-0 top-left corners of grid windows) for a model "
      "of [B,K] class scores, instead of --labels");
  app.add_option(flagNames("--classes"), o.classes,
                 "class names NAME[:#rrggbb],... for classes 0..K-1 (annotations' classification names)");
  app.add_option(flagNames("--unlabeled"), o.unlabeled,
                 "ignore | background: pixels outside every annotation are left out of the loss, or class 0")
      ->capture_default_str();
  app.add_option(
      flagNames("--class_weights"), o.class_weights,
      "auto (inverse frequency over the training windows' labelled pixels) | w1,w2,... (ce, dice)");
  app.add_option(flagNames("--val_images"), o.val_images, "held-out images (instead of --val_fraction)");
  app.add_option(flagNames("--val_labels"), o.val_labels, "their label images");
  app.add_option(flagNames("--val_annotations"), o.val_annotations, "their annotations");
  app.add_flag(flagNames("--save_best"), o.save_best,
               "also write <output>.best.pt: the model of the epoch with the best validation mean Dice");
  app.add_option(flagNames("--mask"), o.mask, "none | auto | PATH: train only on windows in it")
      ->capture_default_str();
  app.add_option(flagNames("--mask_fraction"), o.mask_fraction,
                 "share of a window inside the mask (or the annotations) to train on it")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--roi"), o.roi, "GeoJSON or directory of <stem>.geojson: train only in it");
  addResolutionFlags(app, o.level, o.mpp, o.magnification, o.input_mpp, o.no_upsample);
  app.add_option(flagNames("--loss_scale"), o.loss_scale,
                 "first dynamic loss scale (default: 65536 with fp16, none otherwise; given: scaled in any "
                 "precision)")
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--loss_scale_growth_steps"), o.loss_scale_growth_steps,
                 "finite steps after which the loss scale doubles")
      ->capture_default_str()
      ->check(positiveNumber());
  addJobFlags(app, o);
  app.add_option(flagNames("--grad_accum_steps"), o.grad_accum_steps, "micro-batches per optimizer step")
      ->capture_default_str()
      ->check(positiveNumber());
  app.add_option(flagNames("-o,--output"), o.output, "trained TorchScript file")->capture_default_str();
  app.add_option(flagNames("--epochs"), o.epochs, "epochs")->capture_default_str()->check(positiveNumber());
  app.add_option(flagNames("--lr"), o.lr, "learning rate")->capture_default_str()->check(positiveNumber());
  app.add_option(flagNames("--optimizer"), o.optimizer, "adam | sgd")->capture_default_str();
  app.add_option(flagNames("--momentum"), o.momentum, "SGD momentum")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--weight_decay"), o.weight_decay, "weight decay")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--schedule"), o.schedule, "constant | cosine")->capture_default_str();
  app.add_option(flagNames("--warmup_epochs"), o.warmup_epochs, "linear warm-up epochs")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_option(flagNames("--loss"), o.loss, "ce | bce | mse | dice")->capture_default_str();
  app.add_option(flagNames("--seed"), o.seed, "shuffle and augmentation seed")->capture_default_str();
  app.add_option(flagNames("--val_fraction"), o.val_fraction, "held-out share")
      ->capture_default_str()
      ->check(nonNegativeNumber());
  app.add_flag(flagNames("--augment"), o.augment, "random flips and 90-degree rotations");
  app.add_flag(flagNames("--drop_last"), o.drop_last, "drop the uneven tail of each epoch");
  app.add_option(flagNames("--checkpoint_dir"), o.checkpoint_dir, "checkpoint every epoch here");
  app.add_flag(flagNames("--resume"), o.resume, "continue from the last checkpoint");
  app.add_option(flagNames("--report"), o.report, "report JSON");
  if (const int code = tiler::parseCommandLine(app, argc, argv, "tiler finetune", hooks.throw_parse_errors);
      code >= 0)
    return code;
  if (hooks.report_path) *hooks.report_path = o.report.empty() ? o.output + ".report.json" : o.report;
  o.check_interrupt = hooks.check_interrupt;
  return tiler::runFinetune(o);
}

}  // namespace tiler::tools
