// Lane: one stream of a device and the queue of jobs waiting to
// be dispatched onto it, with the thread that dispatches them. A submitter
// may dispatch a small job itself while the lane is idle (`busy` keeps the
// two apart). Owned by its Device, which runs its thread. Fields are
// guarded as marked; the counters are atomics.
#ifndef MATMUL_GPU_CUDA_LANE_H_
#define MATMUL_GPU_CUDA_LANE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/cuda/job_graph.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/stream_pool.h"
#include "gpu/engine.h"

namespace matmul {

class Device;
struct InFlight;

struct Lane {
  Device* device = nullptr;
  int index = 0;  // stream index within the device
  PooledStream* stream = nullptr;
  // Small multiplies recorded as CUDA graphs (CudaEngineOptions::
  // job_graphs_per_stream); null when off. Used only by the thread
  // dispatching here (an instance's busy flag, which a job's result clears
  // on any thread, is the one exception: see job_graph.h).
  std::unique_ptr<JobGraphCache> graphs;
  absl::Mutex mu;
  absl::CondVar cv;
  struct Queued {
    std::unique_ptr<MatmulJob> job;
    JobLayout layout;  // as Submit worked it out
    absl::Time submitted;
    double estimate = 0;
  };
  std::deque<Queued> queue ABSL_GUARDED_BY(mu);
  // A thread (the lane's own or a submitter) is dispatching onto the stream.
  bool busy ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Jobs on the stream that nobody has claimed yet, in stream order, for
  // the poller. Guarded by the device's done_mu_.
  std::deque<InFlight*> unclaimed;
  // Seconds of estimated work queued or running on this stream.
  std::atomic<double> outstanding{0};
  std::thread thread;
  // Stats (updated by completion threads).
  std::atomic<int64_t> jobs{0};
  // Jobs given their events on this stream, for
  // CudaEngineOptions::timed_job_every.
  std::atomic<int64_t> events_taken{0};
  std::atomic<double> busy_seconds{0};
};

// target += delta, for the atomic doubles above.
inline void AtomicAddDouble(std::atomic<double>& target, double delta) {
  double old = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(old, old + delta,
                                       std::memory_order_relaxed)) {
  }
}

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_LANE_H_
