// exchange: the step exchange. Every collective a job makes per step goes through it, and the first one
// of every step carries each rank's status, so that ranks always enter the same collectives and leave
// together.
// Promise (the failure protocol): a rank that hit a fatal error calls share() (or check()) with its message
// instead of skipping the step; every rank then throws the same RankFailure naming the lowest failing rank
// and its message, at the same step, so no rank waits in a collective another will not enter. Messages
// travel through the store ("tiler/fatal/<rank>", "tiler/error/<image>"); tensors through the process
// group (on the communication device: the model's device for NCCL, the CPU for gloo). A world of one makes
// no collective and throws the same way. Not thread safe: one thread per rank calls it, in step order.
#pragma once

#include <torch/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tiler/core/error.hpp"
#include "tiler/core/slots.hpp"
#include "tiler/dist/dist.hpp"

namespace tiler {

// A fatal error that some rank reported through the step exchange; thrown on every rank.
class RankFailure : public DistError {
 public:
  RankFailure(int rank, const std::string& what, const char* file = nullptr, int line = 0)
      : DistError(what, file, line), rank_(rank) {}
  int failedRank() const { return rank_; }
  const char* kind() const override { return "rank_failure"; }

 private:
  int rank_;
};

class StepExchange {
 public:
  // `dist` must outlive the exchange.
  explicit StepExchange(DistContext& dist);

  int rank() const { return dist_.rank(); }
  int worldSize() const { return dist_.worldSize(); }

  // Every rank's `rows` (int64 [n,k], same shape everywhere) on every rank, with this rank's status.
  // Throws RankFailure on every rank when any rank passed a `fatal` message.
  std::vector<torch::Tensor> share(const torch::Tensor& rows, const std::optional<std::string>& fatal,
                                   const std::string& what);
  // Every rank's window slots of a step (the same count everywhere), through share().
  std::vector<StepSlots> shareSlots(const StepSlots& slots, const std::optional<std::string>& fatal,
                                    const std::string& what);
  // share() with nothing but the status.
  void check(const std::optional<std::string>& fatal, const std::string& what);

  // The collectives of a step that every rank entered share()/check() for (tensors on any device; results
  // come back on the CPU). gather(): rank `root`'s concatenation of every rank's `t` (DistContext::gather);
  // `stay`: the result stays on the communication device (NCCL's GPU), for a stitcher there.
  torch::Tensor gather(const torch::Tensor& t, int root, const std::string& what, bool stay = false);
  std::vector<torch::Tensor> allgather(const torch::Tensor& t, const std::string& what);
  // Every rank's string on every rank, in rank order.
  std::vector<std::string> allgatherStrings(const std::string& s, const std::string& what);
  void allreduceSum(torch::Tensor& t, const std::string& what);
  void broadcast(torch::Tensor& t, int root, const std::string& what);

  // Per-image failure messages: the first rank to report an image wins.
  void reportImageFailure(int image_id, const std::string& message);
  std::string imageFailure(int image_id, const std::string& fallback);

  // Rank 0's verdict (an exit code, or a fatal message of its own) reaches every rank: returns the code
  // on every rank, or throws RankFailure on every rank.
  int agreeOnExitCode(int code, const std::optional<std::string>& fatal);

  // Marks this rank's progress (a step, or past the last one); from then on a collective that times out
  // throws a TimeoutError that also names the ranks whose mark is behind this rank's (laggards()): the
  // rank that waited is not the one to look at.
  void markStep(int64_t step);
  std::string laggards(int64_t step);

 private:
  torch::Tensor onComm(const torch::Tensor& t) const;
  [[noreturn]] void throwFailure(int rank, const std::optional<std::string>& own);
  // collective(), its TimeoutError naming the laggards once a step is marked.
  template <typename Collective>
  auto namingLaggards(const Collective& collective) -> decltype(collective());

  DistContext& dist_;
  bool on_device_ = false;                   // NCCL: collectives on the model's device
  std::map<int, std::string> own_failures_;  // this rank's first message per image (the store's, on one rank)
  int64_t marked_ = -1;                      // markStep's last step (-1: none marked)
};

// A step's routes: routes[owner][rank] are the slots of `rank` (every_rank[rank], the step's window lists as
// shareSlots gave them) that hold a window of an image whose writer is `owner` (owners[image]), in slot
// order; failed and padded slots go nowhere. Plain logic, the same on every rank: each owner gathers from
// every rank the slots its route names.
using StepRoutes = std::vector<std::vector<std::vector<int64_t>>>;
StepRoutes routeSlots(const std::vector<StepSlots>& every_rank, const std::vector<int>& owners);

// Runs `body` and returns the message of any exception it throws (describeException), nullopt otherwise:
// the way a rank turns a failure into a status for the next share().
template <typename F>
std::optional<std::string> captureFailure(F&& body) {
  try {
    body();
    return std::nullopt;
  } catch (...) {
    return describeException(std::current_exception());
  }
}

}  // namespace tiler
