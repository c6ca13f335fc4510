// Device: one GPU as the engine drives it. It owns the device's parts
// (stream pool, pinned pool, memory budget over the device's memory pool,
// clock, spare events, busy accounting), its lanes (one per stream) with
// their threads, the record of jobs in flight, the completion threads and
// pollers that finish them, and its health. CudaEngine routes each job to a
// lane of one device (its Submit); the device does the rest, in parts:
// dispatch.cc (the lanes: memory, staging, operands), enqueue.cc (a job's
// stream work, by kind), completion.cc (completion threads, pollers,
// Complete, Fail).
//
// Create opens it (with the device current), Start starts its threads; at
// shutdown StopLanes and JoinLanes (on every device first), then
// StopCompletion; the destructor tears the parts down in a fixed order,
// before the CUDA context goes.
//
// Thread safety: thread-safe; the fields under done_mu_ are guarded by it.
#ifndef MATMUL_GPU_CUDA_DEVICE_H_
#define MATMUL_GPU_CUDA_DEVICE_H_

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "gpu/cuda/cuda_engine_options.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/device_memory.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/job_graph.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/lane.h"
#include "gpu/cuda/pinned_pool.h"
#include "gpu/cuda/stream_pool.h"
#include "gpu/cuda/timing.h"
#include "gpu/engine.h"
#include "gpu/engine_stats.h"
#include "gpu/span_history.h"

namespace matmul {

struct CudaSite;

class Device {
 public:
  // Opens GPU `index` as `options` say, lanes included (their threads not
  // yet started). Jobs' spans go to `spans` and their ids come from
  // `next_job`; both must outlive the device.
  static absl::StatusOr<std::unique_ptr<Device>> Create(
      int index, const CudaEngineOptions& options, SpanHistory* spans,
      std::atomic<int64_t>* next_job);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Starts the lanes' threads, the completion threads and the pollers.
  void Start();
  // Shutdown, in this order: every device's lanes dispatch what they hold
  // and stop (StopLanes, then JoinLanes), then each device's completion
  // threads and pollers finish every job in flight (StopCompletion).
  void StopLanes();
  void JoinLanes();
  void StopCompletion();

  int index() const { return index_; }
  const std::vector<std::unique_ptr<Lane>>& lanes() const { return lanes_; }
  PinnedPool& pinned() const { return *pinned_; }
  DeviceMemoryBudget& memory() const { return *memory_; }
  // An idle stream: clock anchors and stream-ordered frees that belong to
  // no job.
  cudaStream_t idle_stream() const { return idle_stream_.get(); }
  // False once the device's context has failed (sticky CUDA error).
  bool healthy() const { return healthy_.load(std::memory_order_relaxed); }
  // A job was queued on one of the lanes (Dispatch counts it out).
  void CountQueued() { queued_.fetch_add(1, std::memory_order_relaxed); }
  // Its stats, but for the uuid (the engine's).
  DeviceStats Stats() const;

  // Starts `job` (laid out as `layout`) on `lane`'s stream, or fails it.
  // With `may_wait` false it returns the job instead when memory or
  // staging is not free at once. Called by the lane's thread, or by a
  // submitter that made the lane busy.
  std::unique_ptr<MatmulJob> Dispatch(Lane* lane,
                                      std::unique_ptr<MatmulJob> job,
                                      const JobLayout& layout,
                                      absl::Time submitted, double estimate,
                                      bool may_wait);

 private:
  Device(int index, const CudaEngineOptions& options, SpanHistory* spans,
         std::atomic<int64_t>* next_job);

  // dispatch.cc: the lanes.
  void LaneLoop(Lane* lane);
  // A free graph instance for a small multiply; an empty Use if none.
  JobGraph::Use TakeGraph(Lane* lane, const MatmulJob& job,
                          const JobLayout& layout);
  // The job's device memory and staging, waiting for them while the device
  // is full (a job that cannot have them at once lets the lane's idle
  // graph instances go first); or only if both are free at once.
  absl::StatusOr<PinnedPool::Lease> LeaseWaiting(Lane* lane, MatmulJob& job,
                                                 const JobLayout& layout,
                                                 int64_t device_bytes);
  std::optional<PinnedPool::Lease> TryLease(const JobLayout& layout,
                                            int64_t device_bytes);
  // Has the job write its operands into its staging slot.
  absl::Status StageOperands(InFlight& flight, MatmulJob& job, std::byte* slot,
                             absl::Time start);
  // The job's own events from the spare list, timed or not
  // (CudaEngineOptions::timed_job_every).
  absl::Status TakeEvents(InFlight& flight);

  // enqueue.cc: a job's stream work, then its hand-off to completion:
  // the poller, or the host function that queues it for the completion
  // threads.
  void Enqueue(InFlight* flight, const std::byte* host_a,
               const std::byte* host_b);
  void HandToCompletion(InFlight* flight, const CudaSite& site);
  // Host function at the end of a job's stream work: hands the job to the
  // completion threads. Must not call CUDA. `user_data` is the InFlight.
  static void CUDART_CB OnStreamDone(void* user_data);

  // completion.cc.
  void CompletionLoop();
  // Poller `poller` of `pollers`: lanes poller, poller + pollers, ...
  void PollLoop(int poller, int pollers);
  // What a poller carries from one round to the next.
  struct PollState {
    int64_t seen = 0;  // enqueued_ when last looked at
    absl::Time poll_until = absl::InfinitePast();
  };
  // Waits until there is something to poll on `lanes`: fills `fronts`
  // with the oldest unclaimed job of each stream, referenced so that it
  // stays allocated while its event is queried outside the lock. False
  // once the device stops and no job without a host function is left to
  // the poller.
  bool WaitForFronts(const std::vector<Lane*>& lanes, PollState& state,
                     std::vector<std::pair<InFlight*, cudaEvent_t>>& fronts);
  // Keeps the first of `finished` that nobody has claimed for the caller
  // to complete (the others become null); other jobs without a host
  // function go to the completion threads (HandOff).
  void ClaimOne(std::vector<InFlight*>& finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu_);
  // Queues a finished job without a host function for the completion
  // threads, as its host function would have: the poller completes one job
  // per round itself and hands the rest off, so that many small jobs
  // finishing at once are completed in parallel rather than one after
  // another on the poller.
  void HandOff(InFlight* flight) ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu_);
  // Makes the caller the one that completes `flight`; false if another
  // already is. A job without a host function leaves in_flight_ with the
  // poller's claim (see PollLoop), since no completion thread will take it
  // out.
  bool Claim(InFlight* flight) ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu_);
  // Reads the job's events, accounts it and finishes the job; called once
  // per job, by whoever claimed it.
  void Complete(InFlight* flight);
  // Complete's steps: the job's status (faults injected at completion, its
  // event times into `ms`); its memory, events and operands let go of; the
  // stats and spans of a job that succeeded (`timed`: it has event times);
  // its result.
  absl::Status CompletionStatus(InFlight* flight, EventTimes& ms);
  void ReleaseJobResources(InFlight* flight, const absl::Status& status);
  void Account(InFlight* flight, const EventTimes& ms, bool timed);
  JobResult ResultOf(InFlight* flight);
  // Fails every job in flight: the device's context is broken.
  void Fail(const absl::Status& cause);
  absl::Status Failure() {
    absl::MutexLock lock(&done_mu_);
    return failure_;
  }

  const int index_;
  const CudaEngineOptions options_;
  SpanHistory* const spans_;
  std::atomic<int64_t>* const next_job_;

  std::unique_ptr<StreamPool> streams_;
  std::unique_ptr<PinnedPool> pinned_;
  // Stream-ordered allocations come from the device's default pool.
  cudaMemPool_t memory_pool_ = nullptr;
  std::unique_ptr<DeviceMemoryBudget> memory_;
  std::vector<std::unique_ptr<Lane>> lanes_;

  // An idle stream: clock anchors (they complete at once) and stream-ordered
  // frees that belong to no job.
  CudaStream idle_stream_;
  std::unique_ptr<DeviceClock> clock_;
  EventPool events_;
  BusyAccounting busy_;

  // Jobs enqueued and not completed; the completion queue.
  absl::Mutex done_mu_;
  absl::CondVar done_cv_;
  std::set<InFlight*> in_flight_ ABSL_GUARDED_BY(done_mu_);
  std::deque<InFlight*> done_ ABSL_GUARDED_BY(done_mu_);
  bool stopping_ ABSL_GUARDED_BY(done_mu_) = false;
  std::vector<std::thread> completion_threads_;
  // The poller sleeps on poll_cv_ until the next enqueue counts up.
  absl::CondVar poll_cv_;
  int64_t enqueued_ ABSL_GUARDED_BY(done_mu_) = 0;
  // Jobs without a host function (CudaEngineOptions::poll_only_max_bytes)
  // that nobody has claimed: no poller sleeps while there are any (each
  // stops only once its own lanes have none).
  int64_t poll_only_unclaimed_ ABSL_GUARDED_BY(done_mu_) = 0;
  std::vector<std::thread> pollers_;  // CudaEngineOptions::pollers_per_device

  std::atomic<bool> healthy_{true};
  absl::Status failure_ ABSL_GUARDED_BY(done_mu_);

  // Counters for Stats().
  std::atomic<int64_t> h2d_bytes_{0};
  std::atomic<int64_t> d2h_bytes_{0};
  std::array<std::atomic<double>, kNumDTypes> flops_{};
  std::atomic<int64_t> queued_{0};
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_DEVICE_H_
