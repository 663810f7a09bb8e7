#include "tiler/dist/exchange.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstring>

namespace tiler {

StepExchange::StepExchange(DistContext& dist) : dist_(dist), on_device_(dist.backendName() == "nccl") {}

torch::Tensor StepExchange::onComm(const torch::Tensor& t) const {
  return on_device_ ? t.to(dist_.commDevice()) : t.cpu();
}

void StepExchange::throwFailure(int rank, const std::optional<std::string>& own) {
  if (own) throw RankFailure(this->rank(), *own, __FILE__, __LINE__);
  const std::string message =
      dist_.getString("tiler/fatal/" + std::to_string(rank), "(its message did not reach the store)");
  throw RankFailure(rank, "rank " + std::to_string(rank) + " failed: " + message, __FILE__, __LINE__);
}

template <typename Collective>
auto StepExchange::namingLaggards(const Collective& collective) -> decltype(collective()) {
  try {
    return collective();
  } catch (const TimeoutError& e) {
    // The rank that timed out only waited: the message names those that had not come as far.
    if (marked_ < 0) throw;
    throw TimeoutError(e.message() + laggards(marked_), __FILE__, __LINE__);
  }
}

std::vector<torch::Tensor> StepExchange::share(const torch::Tensor& rows,
                                               const std::optional<std::string>& fatal,
                                               const std::string& what) {
  TILER_CHECK(rows.dim() == 2 && rows.scalar_type() == torch::kInt64, ConfigError,
              "step exchange: rows must be int64 [n,k]");
  if (dist_.worldSize() == 1) {
    if (fatal) throwFailure(0, fatal);
    return {rows.cpu()};
  }
  // The message goes to the store before the collective that tells everyone to read it.
  if (fatal) dist_.setString("tiler/fatal/" + std::to_string(rank()), *fatal);
  auto header = torch::zeros({1, std::max<int64_t>(rows.size(1), 1)}, torch::kInt64);
  header[0][0] = fatal ? 1 : 0;
  auto body = rows.size(1) == 0 ? torch::zeros({rows.size(0), 1}, torch::kInt64) : rows.cpu();
  auto all = namingLaggards([&] { return dist_.allgather(onComm(torch::cat({header, body})), what); });
  int failed = -1;
  std::vector<torch::Tensor> out;
  for (size_t r = 0; r < all.size(); ++r) {
    auto t = all[r].cpu();
    if (failed < 0 && t[0][0].item<int64_t>() != 0) failed = int(r);
    out.push_back(t.narrow(0, 1, rows.size(0)).narrow(1, 0, rows.size(1)));
  }
  if (failed >= 0) throwFailure(failed, fatal);
  return out;
}

std::vector<StepSlots> StepExchange::shareSlots(const StepSlots& slots,
                                                const std::optional<std::string>& fatal,
                                                const std::string& what) {
  auto rows = torch::empty({int64_t(slots.size()), 4}, torch::kInt64);
  auto mine = rows.accessor<int64_t, 2>();
  for (size_t k = 0; k < slots.size(); ++k) {
    mine[int64_t(k)][0] = slots[k].image;
    mine[int64_t(k)][1] = slots[k].window;
    mine[int64_t(k)][2] = int64_t(slots[k].status);
    mine[int64_t(k)][3] = slots[k].record_bytes;
  }
  std::vector<StepSlots> out;
  for (const auto& t : share(rows, fatal, what)) {
    auto theirs = t.accessor<int64_t, 2>();
    StepSlots& s = out.emplace_back(slots.size());
    for (size_t k = 0; k < s.size(); ++k)
      s[k] = WindowSlot{int(theirs[int64_t(k)][0]), theirs[int64_t(k)][1], SlotStatus(theirs[int64_t(k)][2]),
                        theirs[int64_t(k)][3]};
  }
  return out;
}

void StepExchange::check(const std::optional<std::string>& fatal, const std::string& what) {
  share(torch::zeros({0, 0}, torch::kInt64), fatal, what);
}

torch::Tensor StepExchange::gather(const torch::Tensor& t, int root, const std::string& what, bool stay) {
  auto all = namingLaggards([&] { return dist_.gather(onComm(t), root, what); });
  if (!all.defined() || !stay) return all.defined() ? all.cpu() : all;
  if (!all.device().is_cpu()) {
    // NCCL's work is ordered before this thread's stream only: another thread's stream (the stitcher's)
    // would not wait for it. The copy to the CPU waited the same way.
    const c10::impl::VirtualGuardImpl device(all.device().type());
    device.synchronizeStream(device.getStream(all.device()));
  }
  return all;
}

std::vector<torch::Tensor> StepExchange::allgather(const torch::Tensor& t, const std::string& what) {
  auto parts = namingLaggards([&] { return dist_.allgather(onComm(t), what); });
  for (auto& p : parts) p = p.cpu();
  return parts;
}

std::vector<std::string> StepExchange::allgatherStrings(const std::string& s, const std::string& what) {
  if (worldSize() == 1) return {s};
  // Lengths first, then every string padded to the longest (allgather takes one shape).
  int64_t longest = 0;
  for (const auto& n : allgather(torch::tensor({int64_t(s.size())}, torch::kInt64), what))
    longest = std::max(longest, n.item<int64_t>());
  auto mine = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kUInt8);
  std::memcpy(mine.data_ptr<uint8_t>(), s.data(), s.size());
  std::vector<std::string> out;
  for (const auto& t : allgather(mine, what)) {
    const auto* p = reinterpret_cast<const char*>(t.data_ptr<uint8_t>());
    out.emplace_back(p, strnlen(p, size_t(t.numel())));
  }
  return out;
}

void StepExchange::allreduceSum(torch::Tensor& t, const std::string& what) {
  auto comm = onComm(t);
  namingLaggards([&] { dist_.allreduceSum(comm, what); });
  if (!comm.is_same(t)) t.copy_(comm);
}

void StepExchange::broadcast(torch::Tensor& t, int root, const std::string& what) {
  auto comm = onComm(t);
  namingLaggards([&] { dist_.broadcast(comm, root, what); });
  if (!comm.is_same(t)) t.copy_(comm);
}

void StepExchange::reportImageFailure(int image_id, const std::string& message) {
  own_failures_.emplace(image_id, message);
  if (dist_.worldSize() > 1) dist_.setString("tiler/error/" + std::to_string(image_id), message);
}

std::string StepExchange::imageFailure(int image_id, const std::string& fallback) {
  if (dist_.worldSize() == 1) {
    const auto it = own_failures_.find(image_id);
    return it == own_failures_.end() ? fallback : it->second;
  }
  return dist_.getString("tiler/error/" + std::to_string(image_id), fallback);
}

int StepExchange::agreeOnExitCode(int code, const std::optional<std::string>& fatal) {
  auto codes = share(torch::tensor({{int64_t(code)}}, torch::kInt64), fatal, "the exit code");
  return int(codes[0][0][0].item<int64_t>());
}

void StepExchange::markStep(int64_t step) {
  marked_ = step;
  if (dist_.worldSize() > 1) dist_.setString("tiler/step/" + std::to_string(rank()), std::to_string(step));
}

std::string StepExchange::laggards(int64_t step) {
  std::string behind;
  for (int r = 0; r < worldSize(); ++r) {
    const std::string at = dist_.getString("tiler/step/" + std::to_string(r), "-1");
    if (std::stoll(at) < step) behind += " rank " + std::to_string(r) + " (last seen at step " + at + ")";
  }
  return behind.empty() ? std::string() : "; behind:" + behind + ": still at work, hung or dead";
}

StepRoutes routeSlots(const std::vector<StepSlots>& every_rank, const std::vector<int>& owners) {
  const size_t world = every_rank.size();
  StepRoutes routes(world, std::vector<std::vector<int64_t>>(world));
  for (size_t r = 0; r < world; ++r) {
    const StepSlots& slots = every_rank[r];
    for (size_t k = 0; k < slots.size(); ++k)
      if (slots[k].ok()) routes[size_t(owners[size_t(slots[k].image)])][r].push_back(int64_t(k));
  }
  return routes;
}

}  // namespace tiler
