// BatchingEngine: an Engine decorator that merges small multiplies of the
// same shape, dtype and options that arrive within a short window into one
// strided-batched job of the wrapped engine. The batch's staging holds every
// member's operands back to back; each member gets its own slice of the
// product as its JobResult, and the batch's staging is released when the
// last member's result is. For small requests the per-job cost (thread
// hand-offs, launches, completion) dominates the GPU work, so paying it once
// per batch raises the request rate the engine sustains.
//
// Eligible: plain 2-D multiplies with staged operands (no stored operands,
// no kept result, no prestaged memory) of at most `max_flops` each. Others
// go straight through. Thread-safe.
#ifndef MATMUL_GPU_BATCHING_ENGINE_H_
#define MATMUL_GPU_BATCHING_ENGINE_H_

#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/engine.h"

namespace matmul {

struct BatchingOptions {
  // How long the first request of a group waits for company.
  absl::Duration window = absl::Microseconds(200);
  // Most requests merged into one job.
  int max_batch = 64;
  // Largest request (2·m·n·k) worth merging.
  double max_flops = 2.0 * 512 * 512 * 512;
};

class BatchingEngine final : public Engine {
 public:
  BatchingEngine(std::unique_ptr<Engine> inner, const BatchingOptions& options);
  ~BatchingEngine() override;

  const EngineInfo& info() const override { return inner_->info(); }
  absl::Status CheckFits(const MatmulSpec& spec) const override {
    return inner_->CheckFits(spec);
  }
  absl::Duration MinimumDuration(const MatmulSpec& spec) const override {
    return inner_->MinimumDuration(spec);
  }
  void Submit(std::unique_ptr<MatmulJob> job) override;
  EngineStats stats() const override { return inner_->stats(); }
  std::vector<StreamSpan> RecentSpans(absl::Duration window) const override {
    return inner_->RecentSpans(window);
  }
  absl::StatusOr<HostBuffer> AllocateHostBuffer(int64_t bytes) override {
    return inner_->AllocateHostBuffer(bytes);
  }
  void Shutdown() override;

  // Requests merged so far, and the batches they made (for tests, metrics).
  int64_t batched_requests() const;
  int64_t batches() const;

 private:
  // Requests that can share a batch.
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, bool, bool>;
  struct Group {
    std::vector<std::unique_ptr<MatmulJob>> jobs;
    absl::Time deadline;
  };

  static Key KeyOf(const MatmulSpec& spec);
  bool Eligible(const MatmulJob& job) const;
  // Hands a group to the wrapped engine (as one job if it has several).
  void Launch(std::vector<std::unique_ptr<MatmulJob>> jobs);
  void FlushLoop();

  const std::unique_ptr<Engine> inner_;
  const BatchingOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  absl::flat_hash_map<Key, Group> groups_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t batched_requests_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread flusher_;
};

}  // namespace matmul

#endif  // MATMUL_GPU_BATCHING_ENGINE_H_
