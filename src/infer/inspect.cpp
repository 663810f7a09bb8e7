#include "tiler/infer/inspect.hpp"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/io/image_io.hpp"
#include "tiler/io/readers/readers.hpp"

namespace tiler {
namespace {

// --mask_preview is written, so it is none of the files info reads.
void checkMaskPreviewPath(const InfoOptions& o, const MaskSpec& mask,
                          const std::vector<std::string>& images) {
  if (o.mask_preview.empty()) return;
  PathRoles roles;
  for (const auto& path : images) {
    roles.reads(path, "the image");
    if (!mask.roi.empty()) roles.reads(roiFileFor(mask.roi, path), "the ROI");
  }
  if (mask.mode == MaskMode::kPath) roles.reads(mask.path, "the mask");
  const std::string clash = roles.claim(o.mask_preview, "--mask_preview");
  TILER_CHECK(clash.empty(), ConfigError, clash);
}

// What the reader sees: size, type, layout, tiler's own probabilities, resolution and levels.
void printReaderView(const std::string& path, const ImageInfo& s) {
  std::cout << path << ": " << s.width << "x" << s.height << ", " << s.channels << " channel(s), "
            << sampleTypeName(s.type) << ", reader " << s.reader;
  if (!s.vendor.empty()) std::cout << " (" << s.vendor << ")";
  if (readerHas(s, kTiffLayout)) {
    std::cout << (s.tiled ? ", tiled " + std::to_string(s.tile_width) + "x" + std::to_string(s.tile_height)
                          : ", striped (" + std::to_string(s.rows_per_strip) + " rows/strip)")
              << ", " << s.compression << (s.planar_separate ? ", planar separate" : "")
              << (s.bigtiff ? ", BigTIFF" : "") << ", " << s.pages << " page(s)";
  } else if (readerHas(s, kDecodedWhole)) {
    std::cout << ", " << s.format;
  }
  std::cout << "\n";
  if (s.description.find("\"probabilities\"") != std::string::npos) {
    // tiler's own probabilities output: how stored values read back.
    const auto j = nlohmann::json::parse(s.description, nullptr, false);
    if (j.is_object() && j.contains("probabilities") && j["probabilities"].is_object())
      std::cout << "  probabilities: " << j["probabilities"].value("dtype", "?") << ", "
                << j["probabilities"].value("meaning", "?") << "\n";
  }
  if (s.mpp || s.objective_power) {
    std::cout << "  resolution:";
    if (s.mpp) std::cout << " " << *s.mpp << " um/px";
    if (s.objective_power) std::cout << " " << *s.objective_power << "x";
    std::cout << "\n";
  }
  for (size_t l = 0; l < s.levels.size() && s.levels.size() > 1; ++l) {
    std::cout << "  level " << l << ": " << s.levels[l].width << "x" << s.levels[l].height << ", downsample "
              << s.levels[l].downsample;
    if (s.mpp) std::cout << ", " << *s.mpp * s.levels[l].downsample << " um/px";
    std::cout << "\n";
  }
}

void printGrid(const CatalogImage& img, const CatalogSpec& spec) {
  const WindowGrid& grid = img.grid;
  std::cout << "  grid: " << grid.count() << " windows (" << grid.startsX().size() << " x "
            << grid.startsY().size() << ") of " << spec.grid.window_w << "x" << spec.grid.window_h
            << ", overlap " << spec.grid.overlap_x << "," << spec.grid.overlap_y;
  if (grid.paddedWidth() != img.info.width || grid.paddedHeight() != img.info.height)
    std::cout << ", padded to " << grid.paddedWidth() << "x" << grid.paddedHeight();
  std::cout << "\n  x starts:";
  for (auto x : grid.startsX()) std::cout << " " << x;
  std::cout << "\n  y starts:";
  for (auto y : grid.startsY()) std::cout << " " << y;
  std::cout << "\n";
}

// The same mask the catalog made (same reader, spec and size), drawn to --mask_preview.
void writeMaskPreview(ImageReader& source, const MaskSpec& mask, const ImageInfo& at,
                      const std::string& path) {
  const CoverageMask m = CoverageMask::make(source, mask, at.width, at.height);
  cv::Mat preview;
  m.map().convertTo(preview, CV_8U, 255.0);
  WriterOptions png;
  png.format = "png";
  ImageWriter writer(path, preview.cols, preview.rows, 1, SampleType::kU8, png);
  writer.writeRows(preview);
  writer.close();
  std::cout << "  mask preview: " << path << " (" << preview.cols << "x" << preview.rows << ")\n";
}

// What `tiler infer` would plan for the image: the catalog's own description (resolution, grid, kept
// windows).
void printPlan(const std::string& path, ImageReader& source, const InfoOptions& o, const CatalogSpec& spec) {
  const CatalogImage img = WindowCatalog::describe(path, spec);
  TILER_CHECK(img.status == "ok", IoError, img.error);
  const ImageInfo& i = img.info;
  if (o.resolution.chosen()) {
    std::cout << "  processing: level " << img.resolution.level
              << (img.resolution.factor != 1.0 ? " resampled" : "") << ", " << i.width << "x" << i.height;
    if (img.resolution.mpp) std::cout << ", " << *img.resolution.mpp << " um/px";
    std::cout << "\n";
  }
  if (spec.with_grid) printGrid(img, spec);
  if (!img.masked) return;
  std::cout << "  mask: " << img.mask_method << ", coverage " << std::fixed << std::setprecision(1)
            << 100.0 * img.mask_coverage << "%" << std::defaultfloat;
  if (spec.with_grid)
    std::cout << ", " << img.kept.size() << " of " << img.grid.count() << " windows kept at --mask_fraction "
              << spec.mask.fraction;
  std::cout << "\n";
  if (!o.mask_preview.empty()) writeMaskPreview(source, spec.mask, i, o.mask_preview);
}

}  // namespace

int runInfo(const InfoOptions& o) {
  CatalogSpec spec;
  spec.mask = parseMaskSpec(o.mask, o.mask_fraction, o.roi, o.roi_class);
  spec.input_channels = 0;  // no model
  spec.with_grid = !o.window.empty();
  if (spec.with_grid) spec.grid = parseGridSpec(o.window, o.overlap);
  spec.resolution = o.resolution;
  const std::vector<std::string> images = listImages(o.paths, false);
  checkMaskPreviewPath(o, spec.mask, images);
  int status = kExitOk;
  for (const auto& path : images) {
    try {
      auto source = ImageReader::open(path);
      printReaderView(path, source->info());
      if (spec.with_grid || spec.mask.active() || o.resolution.chosen()) printPlan(path, *source, o, spec);
    } catch (...) {
      std::cerr << "tiler info: " << describeImageException(std::current_exception(), path) << "\n";
      status = kExitSomeFailed;
    }
  }
  return status;
}

void writeOverlay(const std::string& image_path, const std::string& labels_path, const std::string& out_path,
                  int max_side, const GridSpec* grid, const MaskSpec* mask) {
  PathRoles roles;
  roles.reads(image_path, "the image");
  roles.reads(labels_path, "the labels");
  if (mask != nullptr && mask->mode == MaskMode::kPath) roles.reads(mask->path, "the mask");
  const std::string clash = roles.claim(out_path, "the overlay");
  TILER_CHECK(clash.empty(), ConfigError, clash);
  auto image = ImageReader::open(image_path);
  auto labels = ImageReader::open(labels_path);
  const ImageInfo& info = image->info();
  const double factor = std::min(1.0, double(max_side) / double(std::max(info.width, info.height)));
  // A whole slide is shrunk from its coarsest level that is still large enough.
  cv::Mat rgb = shrinkImage(
      *viewAtResolution(*image, chooseResolution(info, {overviewLevel(info, max_side)})), max_side);
  if (rgb.depth() != CV_8U) cv::normalize(rgb, rgb, 0, 255, cv::NORM_MINMAX, CV_8U);
  if (rgb.channels() == 1) cv::cvtColor(rgb, rgb, cv::COLOR_GRAY2RGB);
  if (rgb.channels() == 4) cv::cvtColor(rgb, rgb, cv::COLOR_RGBA2RGB);
  const double label_scale = double(labels->info().width) / double(info.width);
  cv::Mat lab = shrinkImage(*labels, std::max(1, int(std::lround(double(max_side) * label_scale))), nullptr,
                            cv::INTER_NEAREST);
  cv::resize(lab, lab, rgb.size(), 0, 0, cv::INTER_NEAREST);
  // Class k > 0 gets a colour from a fixed palette, blended at 50%; class boundaries are drawn solid.
  static const cv::Vec3b kPalette[] = {
      {255, 40, 40}, {40, 220, 40}, {60, 120, 255}, {255, 200, 0}, {220, 0, 220}};
  cv::Mat out = rgb.clone();
  auto label = [&lab](int y, int x) {
    return lab.depth() == CV_16U ? lab.at<uint16_t>(y, x) : lab.at<uint8_t>(y, x);
  };
  for (int y = 0; y < out.rows; ++y) {
    for (int x = 0; x < out.cols; ++x) {
      const int k = label(y, x);
      if (k == 0) continue;
      const cv::Vec3b c = kPalette[(k - 1) % 5];
      const bool edge = (x > 0 && label(y, x - 1) != k) || (y > 0 && label(y - 1, x) != k);
      cv::Vec3b& p = out.at<cv::Vec3b>(y, x);
      for (int i = 0; i < 3; ++i) p[i] = edge ? c[i] : uchar((p[i] + c[i]) / 2);
    }
  }
  if (mask != nullptr && mask->mode != MaskMode::kNone) {
    // The mask's outline (where at least half of a map pixel is inside), in cyan.
    cv::Mat map, inside;
    cv::resize(CoverageMask::make(*image, *mask).map(), map, out.size(), 0, 0, cv::INTER_LINEAR);
    cv::Mat(map >= 0.5).copyTo(inside);
    std::vector<std::vector<cv::Point>> contours;
    cv::findContours(inside, contours, cv::RETR_LIST, cv::CHAIN_APPROX_SIMPLE);
    cv::drawContours(out, contours, -1, cv::Scalar(0, 230, 230), 2);
  }
  if (grid != nullptr) {
    // The window outlines, to show how the image was cut.
    WindowGrid g(info.width, info.height, *grid);
    for (int64_t i = 0; i < g.count(); ++i) {
      Rect r = g.imageWindow(i);
      cv::rectangle(out, cv::Point(int(double(r.x) * factor), int(double(r.y) * factor)),
                    cv::Point(int(double(r.right()) * factor) - 1, int(double(r.bottom()) * factor) - 1),
                    cv::Scalar(255, 230, 0), 1);
    }
  }
  WriterOptions o;
  o.format = "png";
  ImageWriter writer(out_path, out.cols, out.rows, 3, SampleType::kU8, o);
  writer.writeRows(out);
  writer.close();
}

}  // namespace tiler
