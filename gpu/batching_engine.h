// BatchingEngine: an Engine decorator that merges small multiplies of the
// same shape, dtype and options into one strided-batched job of the wrapped
// engine. The batch's staging holds every
// member's operands back to back; each member gets its own slice of the
// product as its JobResult, and the batch's staging is released when the
// last member's result is. For small requests the per-job cost (thread
// hand-offs, launches, completion) dominates the GPU work, so paying it once
// per batch raises the request rate the engine sustains.
//
// When (adaptive, the default): a request goes out at once, alone, while the
// wrapped engine has a free slot (fewer batching-engine jobs in flight than
// it has streams); while every slot is taken, requests of one kind gather,
// and when a job finishes, the group that has waited longest goes out as
// one batch. So one client at a time waits for nothing, and many get
// batches as large as what accumulated during one job, the way TCP corks
// while its window is full. `window` bounds how long a request waits for a
// slot: a group that old goes out anyway. Not adaptive: the first request
// of a group waits `window` for company, whatever the engine is doing.
//
// Eligible: plain 2-D multiplies with staged or prestaged operands (no
// stored operands, no kept result) of at most `max_flops` each, with a
// product destination only where the operands are prestaged (and
// `gather_destinations` is set). Prestaged
// requests batch only with prestaged ones of their kind: the batch is a
// gathered multiply (MultiplyOp::gathered), whose engine copies each
// member's operands up from where that member keeps them, so the batch
// makes no host copies; those that name a product destination (a
// shared-memory client's c_shared) batch only with one another, and the
// engine writes each product there. Staged ones are copied into the
// batch's staging one after another. Others go straight through and do not
// count against the slots. Thread-safe.
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
  // Dispatch at once while the wrapped engine has a free slot, batch while
  // it has none (see above); false: always wait `window` for company.
  bool adaptive = true;
  // Jobs of this engine the wrapped one runs at once (adaptive); 0: its
  // streams, streams_per_device times its devices.
  int slots = 0;
  // Adaptive: the longest a request waits for a free slot. Not adaptive:
  // how long the first request of a group waits for company.
  absl::Duration window = absl::Microseconds(200);
  // Most requests merged into one job.
  int max_batch = 64;
  // Largest request (2·m·n·k) worth merging.
  double max_flops = 2.0 * 512 * 512 * 512;
  // Prestaged requests that name a product destination (shared memory's
  // c_shared) batch too, with one another: each product is written into
  // its member's destination. False (the default until it is measured on a
  // GPU): they go straight through, alone.
  bool gather_destinations = false;
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
  // The wrapped engine's, with the sizes of the launches made here.
  EngineStats stats() const override;
  std::vector<StreamSpan> RecentSpans(absl::Duration window) const override {
    return inner_->RecentSpans(window);
  }
  absl::StatusOr<HostBuffer> AllocateHostBuffer(int64_t bytes) override {
    return inner_->AllocateHostBuffer(bytes);
  }
  absl::StatusOr<HostMemoryRegistration> RegisterHostMemory(
      void* data, int64_t bytes) override {
    return inner_->RegisterHostMemory(data, bytes);
  }
  absl::StatusOr<std::shared_ptr<ResidentTensor>> ImportDeviceMemory(
      absl::Span<const std::byte> ipc_handle, int64_t bytes,
      absl::Span<const std::byte> device_uuid) override {
    return inner_->ImportDeviceMemory(ipc_handle, bytes, device_uuid);
  }
  void Shutdown() override;

  // Requests merged so far, and the batches they made (for tests, metrics).
  int64_t batched_requests() const;
  int64_t batches() const;

  // A job of this engine in the wrapped one has finished (adaptive: a slot
  // is free). Called by the jobs it submitted.
  void JobFinished();

 private:
  // Where a request's operands and product are: a batch is all of one kind.
  enum class OperandKind {
    kStaged,                  // copied into the batch's staging
    kPrestaged,               // gathered; the product returned
    kPrestagedToDestination,  // gathered; the product into the member's own
  };
  // Requests that can share a batch: dtype, compute mode, m, n, k, the
  // transposes, and where operands and product are.
  using Key =
      std::tuple<int, int, int64_t, int64_t, int64_t, bool, bool, OperandKind>;
  struct Group {
    std::vector<std::unique_ptr<MatmulJob>> jobs;
    absl::Time deadline;
  };
  // A request that goes out alone, counted against the slots.
  class SoloJob;

  static Key KeyOf(const MatmulJob& job);  // of an eligible job
  bool Eligible(const MatmulJob& job) const;
  // Hands a group to the wrapped engine (as one job if it has several),
  // counted against the slots.
  void Launch(std::vector<std::unique_ptr<MatmulJob>> jobs);
  // Adaptive: takes the group that has waited longest, if there is one and
  // a free slot (taking it), by TakeGroup.
  std::vector<std::unique_ptr<MatmulJob>> TakeOldestGroup()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the requests of `key`'s group, up to max_batch (a group left with
  // some keeps its deadline); starts their launch.
  std::vector<std::unique_ptr<MatmulJob>> TakeGroup(const Key& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A launch of `size` requests begins: it takes a slot, and is counted.
  void StartLaunch(size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLoop();

  const std::unique_ptr<Engine> inner_;
  const BatchingOptions options_;
  const int slots_;
  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  absl::flat_hash_map<Key, Group> groups_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // jobs of ours in the wrapped one
  BatchSizeCounts launches_ ABSL_GUARDED_BY(mu_);
  std::thread flusher_;
};

}  // namespace matmul

#endif  // MATMUL_GPU_BATCHING_ENGINE_H_
