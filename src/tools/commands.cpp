#include <algorithm>
#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/io/npy.hpp"
#include "tiler/io/zip_archive.hpp"
#include "tiler/model/model.hpp"
#include "tiler/model/model_card.hpp"
#include "tiler/tasks/registry.hpp"

namespace tiler::tools {

namespace {

// The card's test input [B, C, H, W] through its model as infer feeds it: raw values, the card's scale, mean,
// std and activation, fp32.
torch::Tensor runTestInput(const ModelCard& card, const NpyArray& input, const std::string& device) {
  TILER_CHECK(input.shape.size() == 4, ConfigError,
              "'" << card.test_input << "': the test input has " << input.shape.size()
                  << " dimension(s); tiler feeds batch, channel, y, x");
  ModelOptions mo;
  mo.path = card.weights;
  mo.sha256 = card.weights_sha256, mo.sha256_card = card.path;
  mo.device = device;
  mo.precision = "fp32";
  mo.mean = card.mean.value_or(std::vector<double>{});
  mo.std = card.std.value_or(std::vector<double>{});
  mo.activation = parseActivation(card.activation.value_or("none"));
  mo.input_steps = card.preprocessing;
  const auto [per_window, blended] = splitAtStatistics(card.postprocessing);
  mo.output_steps = per_window;
  mo.task = findTask(card.task.value_or("auto"));
  mo.classes_named = card.classes.has_value();
  mo.batch_size = input.shape[0];
  mo.preferred_input_channels = int(input.shape[1]);
  ModelRunner model(mo);
  model.probe(input.shape[3], input.shape[2]);
  torch::Tensor batch = torch::tensor(input.values, torch::kDouble).to(torch::kFloat).reshape(input.shape);
  torch::Tensor scales = torch::full({input.shape[0]}, card.scale.value_or(1.0), torch::kFloat);
  torch::Tensor affine;
  if (!card.preprocessing.empty()) {
    // The test tensor is the image: its statistics are the whole tensor's (every batch entry), exact.
    const int64_t B = input.shape[0], C = input.shape[1], plane = input.shape[2] * input.shape[3];
    std::vector<std::vector<double>> channels(static_cast<size_t>(C));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) {
        const double* at = input.values.data() + (b * C + c) * plane;
        channels[size_t(c)].insert(channels[size_t(c)].end(), at, at + plane);
      }
    const ImageStatistics stats = exactStatistics(channels, percentilesRead(card.preprocessing));
    const ChannelAffine before{{card.scale.value_or(1.0)}, {0.0}};
    const ChannelAffine f = inputAffine(card.preprocessing, stats, before, "'" + card.test_input + "'");
    affine = torch::empty({B, 2, C}, torch::kFloat);
    for (int64_t c = 0; c < C; ++c) {
      affine.select(2, c).select(1, 0).fill_(f.gain[size_t(c)]);
      affine.select(2, c).select(1, 1).fill_(f.offset[size_t(c)]);
    }
  }
  torch::Tensor out = model.forward(batch, scales, affine).to(torch::kCPU, torch::kFloat).contiguous();
  if (!blended.empty()) {
    // The test output is the whole image's: the steps over its statistics run on all of it at once (every
    // batch entry), exact, with the test input's as read for a reference_tensor.
    TILER_CHECK(out.dim() == 4, ConfigError,
                "outputs[0].postprocessing (" << stepNames(blended) << ") reads the statistics of a map; the "
                                              << "model gives " << out.sizes());
    auto exact = [](const torch::Tensor& t, const std::vector<double>& qs) {
      const torch::Tensor planes = t.transpose(0, 1).reshape({t.size(1), -1}).to(torch::kDouble).contiguous();
      std::vector<std::vector<double>> channels(size_t(planes.size(0)));
      for (int64_t c = 0; c < planes.size(0); ++c)
        channels[size_t(c)].assign(planes[c].data_ptr<double>(),
                                   planes[c].data_ptr<double>() + planes.size(1));
      return exactStatistics(channels, qs);
    };
    const ImageStatistics output = exact(out, percentilesRead(blended)),
                          reference = exact(torch::tensor(input.values, torch::kDouble).reshape(input.shape),
                                            percentilesRead(blended, true));
    const ChannelAffine f = outputAffine(blended, output, &reference, "'" + card.test_output + "'");
    torch::Tensor hwc = out.permute({0, 2, 3, 1}).contiguous();
    applyFixedSteps(hwc.data_ptr<float>(), hwc.numel() / out.size(1), int(out.size(1)), f,
                    fixedTail(blended));
    out = hwc.permute({0, 3, 1, 2}).contiguous();
  }
  return out.to(torch::kDouble).contiguous();
}

// Element `flat` of a C-order array of `shape` as [i, j, ...].
std::string indexText(const std::vector<int64_t>& shape, size_t flat) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] > 0 ? int64_t(flat % size_t(shape[d])) : 0;
    flat = shape[d] > 0 ? flat / size_t(shape[d]) : flat;
  }
  std::string text = "[";
  for (size_t d = 0; d < index.size(); ++d) text += (d ? ", " : "") + std::to_string(index[d]);
  return text + "]";
}

// The most a test tensor of `card` may hold: one window of the card's size with up to 1024 channels of 8
// bytes, so a tensor far larger than the card declares is refused before it is read.
int64_t testTensorBytes(const ModelCard& card) {
  if (!card.window) return kMaxNpyBytes;
  const size_t comma = card.window->find(',');
  const double w = std::stod(card.window->substr(0, comma)),
               h = comma == std::string::npos ? w : std::stod(card.window->substr(comma + 1));
  return int64_t(std::min(double(kMaxNpyBytes), w * h * 1024 * 8 + 4096));  // in doubles: no overflow
}

}  // namespace

int checkModel(const std::string& card_path, const std::string& device) {
  const auto card = findModelCard(card_path);
  TILER_CHECK(card && !card->test_input.empty(), ConfigError,
              "'" << card_path
                  << "' names no test tensors: check-model takes a bioimage.io rdf.yaml, package directory "
                     "or zipped package");
  checkCardNumbers(*card);
  const int64_t most = testTensorBytes(*card);
  // A zipped package's test tensors are read from its members.
  const NpyArray input = parseNpy(readFileOrZipMember(card->test_input, most), card->test_input),
                 expected = parseNpy(readFileOrZipMember(card->test_output, most), card->test_output);
  torch::Tensor out;
  try {
    out = runTestInput(*card, input, device);
  } catch (const Error& e) {
    // Every setting here is the card's, and a failure of its model on its own test input is the card's.
    std::vector<std::pair<std::string, std::string>> all_card;
    for (const std::string& name : cardSettingNames()) all_card.emplace_back(name, "card");
    TILER_THROW(ConfigError,
                "check-model '" << card->path << "': " << cardBlamed(e.message(), all_card, card->path));
  } catch (const c10::Error& e) {
    TILER_THROW(ModelError, "check-model '" << card->path << "': '" << card->weights
                                            << "' fails on the test input '" << card->test_input
                                            << "': " << firstLine(e.what_without_backtrace()));
  }
  TILER_CHECK(size_t(out.numel()) == expected.values.size(), ModelError,
              "'" << card->weights << "' gives " << out.sizes() << " for the test input, the test output '"
                  << card->test_output << "' holds " << expected.values.size() << " values");
  const double* got = out.data_ptr<double>();
  const CardTolerance& tol = card->tolerance;
  double largest = 0;
  size_t largest_at = 0, mismatched = 0;
  for (size_t i = 0; i < expected.values.size(); ++i) {
    const double want = expected.values[i], diff = std::abs(got[i] - want);
    // A NaN on either side is a mismatch, never within tolerance.
    const bool off = !(diff <= tol.absolute + tol.relative * std::abs(want));
    mismatched += off;
    if (!std::isnan(largest) && !(diff <= largest))
      largest = diff, largest_at = i;  // a NaN stays the largest
  }
  const double per_million = 1e6 * double(mismatched) / double(std::max<size_t>(expected.values.size(), 1));
  const bool pass = per_million <= tol.mismatched_per_million;
  std::cout << "check-model: '" << card->path << "': " << expected.values.size()
            << " values, largest difference " << largest << " (at " << indexText(expected.shape, largest_at)
            << ": " << got[largest_at] << " for " << expected.values[largest_at] << "), " << mismatched
            << " beyond |d| <= " << tol.absolute << " + " << tol.relative << " x |expected| (" << per_million
            << " per million; the card allows " << tol.mismatched_per_million
            << "): " << (pass ? "pass" : "FAIL") << std::endl;
  return pass ? kExitOk : kExitFatal;
}

}  // namespace tiler::tools
