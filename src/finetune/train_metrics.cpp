#include "tiler/finetune/train_metrics.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <opencv2/imgproc.hpp>

namespace tiler {

nlohmann::json segmentationMetrics(const std::vector<ClassCounts>& counts,
                                   const std::vector<std::string>& classes) {
  nlohmann::json per_iou = nlohmann::json::object(), per_dice = nlohmann::json::object();
  double iou = 0, dice = 0;
  int present = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    const ClassCounts& k = counts[c];
    const std::string& name = classes[c];
    if (k.predicted + k.truth == 0) {  // a class absent from both counts for neither metric
      per_iou[name] = nullptr;
      per_dice[name] = nullptr;
      continue;
    }
    const double class_iou = k.intersection / (k.predicted + k.truth - k.intersection),
                 class_dice = 2 * k.intersection / (k.predicted + k.truth);
    per_iou[name] = class_iou;
    per_dice[name] = class_dice;
    iou += class_iou;
    dice += class_dice;
    ++present;
  }
  return {{"val_iou", present ? iou / present : 0.0},
          {"val_dice", present ? dice / present : 0.0},
          {"val_class_iou", per_iou},
          {"val_class_dice", per_dice}};
}

namespace {

std::string cell(const nlohmann::json& value) {
  if (value.is_number_integer()) return std::to_string(value.get<int64_t>());
  if (value.is_number()) return fmt::format("{:.6g}", value.get<double>());
  return "";  // null or absent: no value
}

// The class names of the first epoch that has per-class metrics, in the report's order.
std::vector<std::string> classNames(const nlohmann::json& history) {
  std::vector<std::string> names;
  for (const auto& e : history)
    if (e.contains("val_class_dice")) {
      for (const auto& item : e["val_class_dice"].items()) names.push_back(item.key());
      break;
    }
  return names;
}

}  // namespace

std::string epochsCsv(const nlohmann::json& history, const std::vector<std::string>& classes) {
  std::vector<const char*> columns = {"epoch",    "train_loss", "val_loss", "val_iou",
                                      "val_dice", "val_psnr",   "lr",       "seconds"};
  // Window classification's accuracy: a column after val_dice where an epoch has it (maps' CSVs keep theirs).
  for (const auto& e : history)
    if (e.contains("val_accuracy")) {
      columns.insert(columns.begin() + 5, "val_accuracy");
      break;
    }
  const std::vector<std::string> names = classes.empty() ? classNames(history) : classes;
  std::string text;
  for (const char* c : columns) text += std::string(text.empty() ? "" : ",") + c;
  // Class names are --classes' (no control characters); a comma or quote is quoted as CSV says.
  auto quoted = [](const std::string& s) {
    if (s.find_first_of(",\"") == std::string::npos) return s;
    std::string q = "\"";
    for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  for (const auto& n : names) text += "," + quoted("iou_" + n);
  for (const auto& n : names) text += "," + quoted("dice_" + n);
  text += "\n";
  for (const auto& e : history) {
    std::string row;
    for (const char* c : columns)
      row += std::string(row.empty() ? "" : ",") + cell(e.value(c, nlohmann::json()));
    for (const char* kind : {"val_class_iou", "val_class_dice"})
      for (const auto& n : names)
        row += "," + (e.contains(kind) ? cell(e[kind].value(n, nlohmann::json())) : std::string());
    text += row + "\n";
  }
  return text;
}

namespace {

struct Curve {
  const char* key;
  cv::Scalar colour;  // BGR
  bool right_axis;    // [0,1] metrics
};

const Curve kCurves[] = {{"train_loss", {200, 80, 0}, false},
                         {"val_loss", {0, 140, 255}, false},
                         {"val_iou", {60, 160, 60}, true},
                         {"val_dice", {40, 40, 200}, true},
                         {"val_accuracy", {160, 40, 160}, true}};  // window labels' only

}  // namespace

cv::Mat drawCurves(const nlohmann::json& history, int width, int height) {
  cv::Mat image(height, width, CV_8UC3, cv::Scalar::all(255));
  const int left = 60, right = width - 60, top = 40, bottom = height - 50;
  double loss_max = 0;
  int64_t first = 0, last = 1;
  for (const auto& e : history) {
    for (const char* k : {"train_loss", "val_loss"})
      if (e.contains(k) && e[k].is_number() && std::isfinite(e[k].get<double>()))
        loss_max = std::max(loss_max, e[k].get<double>());
    last = std::max<int64_t>(last, e.value("epoch", int64_t(0)));
  }
  if (!history.empty()) first = history.front().value("epoch", int64_t(1));
  if (loss_max <= 0) loss_max = 1;
  const double span = std::max<double>(1.0, double(last - first));
  auto xAt = [&](int64_t epoch) {
    return left + int(std::lround(double(epoch - first) / span * (right - left)));
  };
  auto yAt = [&](double v, double top_value) {
    return bottom - int(std::lround(std::clamp(v / top_value, 0.0, 1.0) * (bottom - top)));
  };
  const cv::Scalar grey(160, 160, 160), black(0, 0, 0);
  cv::rectangle(image, {left, top}, {right, bottom}, grey);
  const auto font = cv::FONT_HERSHEY_SIMPLEX;
  for (int t = 0; t <= 4; ++t) {
    const int y = yAt(t / 4.0, 1.0);
    cv::line(image, {left - 4, y}, {right + 4, y}, cv::Scalar(230, 230, 230));
    cv::putText(image, fmt::format("{:.3g}", loss_max * t / 4.0), {4, y + 4}, font, 0.4, black);
    cv::putText(image, fmt::format("{:.2f}", t / 4.0), {right + 8, y + 4}, font, 0.4, black);
  }
  const int64_t step = std::max<int64_t>(1, (last - first) / 10 + 1);
  for (int64_t epoch = first; epoch <= last; epoch += step)
    cv::putText(image, std::to_string(epoch), {xAt(epoch) - 4, bottom + 18}, font, 0.4, black);
  cv::putText(image, "epoch", {(left + right) / 2 - 20, height - 10}, font, 0.5, black);
  cv::putText(image, "loss", {4, 20}, font, 0.5, black);
  cv::putText(image, "IoU / Dice", {right - 40, 20}, font, 0.5, black);
  int legend_x = left + 10;
  for (const Curve& c : kCurves) {
    std::vector<cv::Point> points;
    for (const auto& e : history)
      if (e.contains(c.key) && e[c.key].is_number() && std::isfinite(e[c.key].get<double>()))
        points.emplace_back(xAt(e.value("epoch", int64_t(0))),
                            yAt(e[c.key].get<double>(), c.right_axis ? 1.0 : loss_max));
    if (points.empty()) continue;
    cv::polylines(image, points, false, c.colour, 2, cv::LINE_AA);
    for (const auto& p : points) cv::circle(image, p, 3, c.colour, cv::FILLED, cv::LINE_AA);
    cv::line(image, {legend_x, top - 14}, {legend_x + 20, top - 14}, c.colour, 2);
    cv::putText(image, c.key, {legend_x + 24, top - 10}, font, 0.45, black);
    legend_x += 40 + 9 * int(std::string(c.key).size());
  }
  return image;
}

}  // namespace tiler
