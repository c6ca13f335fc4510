// Device: one GPU as the engine drives it. It owns the device's
// parts (stream pool, pinned pool, memory budget over the device's memory
// pool, clock, spare events, busy accounting), its lanes (one per stream),
// the record of jobs in flight with the completion queue, and its health.
// Create opens it (with the device current); the destructor tears the parts
// down in a fixed order, before the CUDA context goes.
//
// Thread safety: the parts are thread-safe; the fields under done_mu are
// guarded by it; the threads (lanes, completion, poller) are started and
// joined by the engine.
#ifndef MATMUL_GPU_CUDA_DEVICE_H_
#define MATMUL_GPU_CUDA_DEVICE_H_

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "gpu/cuda/cuda_engine_options.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/device_memory.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/lane.h"
#include "gpu/cuda/pinned_pool.h"
#include "gpu/cuda/stream_pool.h"
#include "gpu/cuda/timing.h"

namespace matmul {

struct Device {
  // Opens GPU `index` as `options` say, lanes included (their threads not
  // yet started).
  static absl::StatusOr<std::unique_ptr<Device>> Create(
      int index, const CudaEngineOptions& options);
  ~Device();

  int index = 0;
  std::unique_ptr<StreamPool> streams;
  std::unique_ptr<PinnedPool> pinned;
  // Stream-ordered allocations come from the device's default pool.
  cudaMemPool_t memory_pool = nullptr;
  std::unique_ptr<DeviceMemoryBudget> memory;
  std::vector<std::unique_ptr<Lane>> lanes;

  // An idle stream: clock anchors (they complete at once) and stream-ordered
  // frees that belong to no job.
  CudaStream idle_stream;
  std::unique_ptr<DeviceClock> clock;
  EventPool events;
  BusyAccounting busy;

  // Jobs enqueued and not completed; the completion queue.
  absl::Mutex done_mu;
  absl::CondVar done_cv;
  std::set<InFlight*> in_flight ABSL_GUARDED_BY(done_mu);
  std::deque<InFlight*> done ABSL_GUARDED_BY(done_mu);
  bool stopping ABSL_GUARDED_BY(done_mu) = false;
  std::vector<std::thread> completion_threads;
  // The poller sleeps on poll_cv until the next enqueue counts up.
  absl::CondVar poll_cv;
  int64_t enqueued ABSL_GUARDED_BY(done_mu) = 0;
  // Jobs without a host function (CudaEngineOptions::poll_only_max_bytes)
  // that nobody has claimed: no poller sleeps while there are any (each
  // stops only once its own lanes have none).
  int64_t poll_only_unclaimed ABSL_GUARDED_BY(done_mu) = 0;
  std::vector<std::thread> pollers;  // CudaEngineOptions::pollers_per_device

  // False once the device's context has failed (sticky CUDA error).
  std::atomic<bool> healthy{true};
  absl::Status failure ABSL_GUARDED_BY(done_mu);

  absl::Status Failure() {
    absl::MutexLock lock(&done_mu);
    return failure;
  }

  // Counters for stats().
  std::atomic<int64_t> h2d_bytes{0};
  std::atomic<int64_t> d2h_bytes{0};
  std::array<std::atomic<double>, kNumDTypes> flops{};
  std::atomic<int64_t> queued{0};
};

// Host function at the end of a job's stream work: hands the job to the
// completion threads. Must not call CUDA. `user_data` is the InFlight.
void CUDART_CB OnStreamDone(void* user_data);

// Queues a finished job without a host function for the completion
// threads, as its host function would have: the poller completes one job
// per round itself and hands the rest off, so that many small jobs
// finishing at once are completed in parallel rather than one after
// another on the poller. The caller holds the device's done_mu.
void HandOff(InFlight* flight);

// Makes the caller the one that completes `flight`; false if another
// already is. The caller holds the device's done_mu. A job without a host
// function leaves the device's in_flight set with the poller's claim (see
// PollLoop), since no completion thread will take it out.
bool Claim(InFlight* flight);

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_DEVICE_H_
