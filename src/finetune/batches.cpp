#include "tiler/finetune/batches.hpp"

#include <random>

#include "tiler/core/error.hpp"
#include "tiler/core/sampler.hpp"

namespace tiler {

TrainingBatches::TrainingBatches(const FinetuneOptions& o, const FinetunePlan& plan, const TrainingData& data,
                                 ModelRunner& runner, const FaultHooks& faults, int world_size, int rank)
    : o_(o),
      plan_(plan),
      data_(data),
      runner_(runner),
      faults_(faults),
      world_size_(world_size),
      rank_(rank) {}

std::vector<WindowRef> TrainingBatches::epochWindows(const std::vector<WindowRef>& pool, int64_t epoch,
                                                     bool shuffle, std::vector<bool>* padded) const {
  SamplerOptions so{world_size_, rank_, shuffle, o_.seed, shuffle && o_.drop_last};
  DistributedSampler sampler(int64_t(pool.size()), so);
  std::vector<WindowRef> out;
  for (const auto& s : sampler.slots(epoch)) {
    out.push_back(pool[size_t(s.index)]);
    if (padded) padded->push_back(s.padded);
  }
  return out;
}

std::unique_ptr<WindowLoader> TrainingBatches::loader(const std::vector<WindowRef>& windows,
                                                      ReaderCache& labels, bool count_for_fault) const {
  LoaderOptions lo;
  lo.batch_size = o_.batch_size;
  lo.input_channels = runner_.probed().input_channels;
  lo.pad = plan_.pad;
  lo.depth = size_t(o_.prefetch);
  lo.read_threads = 1;  // `labels` is one thread's reader cache
  lo.pinned = runner_.device().is_cuda();
  lo.bytes = inputAsBytes(data_.catalog);
  lo.device = runner_.device();
  lo.in_order = false;  // shuffled: readers stay open across images
  const auto [oh, ow, tc] = data_.labelShape();
  lo.make_labels = [oh = oh, ow = ow, tc = tc](int64_t B) {
    return std::vector<torch::Tensor>{torch::zeros({B, oh, ow, tc}, torch::kFloat32),
                                      torch::zeros({B, oh, ow}, torch::kFloat32)};
  };
  lo.read_labels = [this, &labels, count_for_fault](std::vector<torch::Tensor>& out, int64_t j, int image_id,
                                                    int64_t local) {
    const CatalogImage& img = data_.catalog.image(image_id);
    if (count_for_fault && faults_.before_read) faults_.before_read(img.label);
    data_.labelsOf(image_id).read(img, image_id, local, labels, out[0][j].data_ptr<float>(),
                                  out[1][j].data_ptr<float>());
  };
  // Every window of an epoch is trained on, a sampler's repeat too (as PyTorch's DistributedSampler's).
  std::vector<SampleSlot> slots;
  for (const auto& w : windows) slots.push_back({w.global, false});
  const int64_t steps = (int64_t(windows.size()) + o_.batch_size - 1) / o_.batch_size;
  return std::make_unique<WindowLoader>(data_.catalog, plan_.spec, std::move(lo), std::move(slots), steps);
}

DeviceBatch TrainingBatches::next(WindowLoader& loader, const std::vector<WindowRef>& refs,
                                  int64_t epoch) const {
  const int64_t B = int64_t(refs.size()), H = plan_.spec.window_h, W = plan_.spec.window_w;
  auto batch = loader.next();
  TILER_CHECK(batch.has_value(), DistError, "the read-ahead stopped early");
  if (batch->first_error) std::rethrow_exception(batch->first_error);
  TILER_CHECK(batch->failures.empty(), IoError, batch->failures.front().second);
  DeviceBatch d;
  d.x = runner_.normalize(batch->pixels.narrow(0, 0, B), batch->scales.narrow(0, 0, B));
  d.target = batch->labels[0].narrow(0, 0, B).permute({0, 3, 1, 2}).to(runner_.device());
  d.mask = batch->labels[1].narrow(0, 0, B).to(runner_.device());
  if (o_.augment && epoch >= 0) {
    // Flips and 90-degree turns, the same for image, target and mask; seeded by (seed, epoch, window).
    for (int64_t j = 0; j < B; ++j) {
      const auto& ref = refs[size_t(j)];
      std::mt19937_64 rng(o_.seed * 1000003u + uint64_t(epoch) * 7919u +
                          uint64_t(data_.catalog.image(ref.image).first_window + ref.local));
      const int flip = int(rng() % 4), turns = H == W ? int(rng() % 4) : 0;
      auto apply = [&](torch::Tensor t, int64_t hdim) {
        if (flip & 1) t = t.flip({hdim + 1});
        if (flip & 2) t = t.flip({hdim});
        if (turns) t = t.rot90(turns, {hdim, hdim + 1});
        return t.contiguous();
      };
      d.x[j] = apply(d.x[j], 1);
      d.target[j] = apply(d.target[j], 1);
      d.mask[j] = apply(d.mask[j], 0);
    }
  }
  return d;
}

}  // namespace tiler
