// CudaEngineOptions: how the CUDA engine is set up (streams, pools,
// completion, graphs, test aids), and FaultInjector, the test seam for device
// faults. Plain data; the engine copies the options at Create.
#ifndef MATMUL_GPU_CUDA_CUDA_ENGINE_OPTIONS_H_
#define MATMUL_GPU_CUDA_CUDA_ENGINE_OPTIONS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace matmul {

// Test seam for device faults that the real device cannot produce on demand:
// the engine asks it at each point of a job's path, and a non-OK answer is
// handled exactly as if the CUDA or cuBLAS call there had failed with it.
// Must be thread-safe.
class FaultInjector {
 public:
  enum class Point {
    kDeviceAlloc,  // the job's stream-ordered device allocation
    kGemm,         // the cuBLAS GEMM launch
    kCompletion,   // reading the job's events once its stream is done
    // The device's context, checked as each job's stream work is done: a
    // non-OK answer is a sticky error (the context is broken), so the
    // device fails: this job and every other in flight there fail with
    // INTERNAL, later jobs go to the other devices (UNAVAILABLE when none
    // is left), and stats() reports the device unhealthy.
    kContext,
  };
  virtual ~FaultInjector() = default;
  virtual absl::Status Inject(Point point, int64_t job_id) = 0;
};

struct CudaEngineOptions {
  int streams_per_device = 4;
  // Pinned staging memory per device.
  int64_t pinned_pool_bytes = int64_t{4} << 30;
  // cuBLAS workspace per stream (NVIDIA recommends 32 MiB on Hopper).
  int64_t cublas_workspace_bytes = int64_t{32} << 20;
  // Device memory kept free for the driver, cuBLAS and fragmentation.
  int64_t device_memory_reserve_bytes = int64_t{1} << 30;
  // Devices to use; empty means all visible.
  std::vector<int> devices;
  // Test aid: fill every result buffer (device and pinned) with NaN bytes
  // before the GEMM writes it, so a result never written cannot pass.
  bool poison_outputs = false;
  // Test aid: fault injection (not owned; must outlive the engine).
  FaultInjector* fault_injector = nullptr;
  // Jobs that stage at most this many operand bytes are dispatched by the
  // submitting thread when their stream is idle and their memory and
  // staging are free at once (0: always by the lane thread).
  int64_t inline_dispatch_max_bytes = int64_t{1} << 20;
  // How long the poller keeps querying the end events of jobs in flight
  // after the last enqueue or completion before it sleeps until the next
  // enqueue; zero runs no poller (completion through host functions only).
  // While it polls, it keeps one CPU core busy.
  absl::Duration completion_poll = absl::Milliseconds(1);
  // The poller's pause between rounds of end-event queries that find no
  // job finished. Each query is a CUDA call, which the driver serializes
  // with the lanes' enqueueing; a longer pause leaves them more of it and
  // answers a job up to that much later.
  absl::Duration poll_pause = absl::Microseconds(5);
  // Pollers per device (at most one per stream), each querying the end
  // events of its share of the streams (stream i goes to poller i mod N)
  // and completing what it finds. One poller completes every small job of
  // the device on one thread; more spread that over cores, each keeping one
  // busy while it polls.
  int pollers_per_device = 1;
  // One job in this many on each stream records timed events; the others
  // record only their end event, untimed (cudaEventDisableTiming), which
  // the device records for nothing: on an H100 four timestamps cost 4.5 us
  // of device time a job at n=256 float32, and the three events left out
  // are three calls fewer on the host.
  // An untimed job reports no device stage times (h2d, compute and d2h are
  // 0 in its StageTimings) and adds nothing to its stream's busy seconds,
  // the device's busy, copy and compute seconds, or the timeline: those
  // then count the timed jobs alone, a sample. Job, byte and FLOP counts
  // count every job. 1 (the default): every job is timed. Jobs replayed
  // from CUDA graphs are always timed (their graph records timed events).
  // A measuring aid (matmul-pipeline-bench --timed-job-every): the server
  // leaves it at 1, since its stage metrics expect every job's times.
  int timed_job_every = 1;
  // Jobs that move at most this many bytes (operands in, product out) are
  // completed by the poller alone: no host function follows their stream
  // work, so the stream goes straight on to its next job and no completion
  // thread wakes for them. While such a job is in flight the poller keeps
  // querying, past completion_poll. Needs the poller (completion_poll > 0);
  // 0: every job ends with a host function.
  int64_t poll_only_max_bytes = 0;
  // Small multiplies (staged operands, product returned, at most
  // job_graph_max_device_bytes of device memory for A, B and C) are
  // recorded per stream and shape as CUDA graphs and replayed with one
  // launch (gpu/cuda/job_graph.h). Each recorded graph owns its device
  // memory, pinned staging and events and serves one job at a time, from
  // its dispatch until its result is let go of, so a shape may have several
  // on a stream. At most this many graphs per stream, the least recently
  // used free one evicted; 0 turns graphs off.
  int job_graphs_per_stream = 0;
  // A shape is recorded on its job_graph_min_sightings-th arrival without
  // a free graph.
  int job_graph_min_sightings = 2;
  int64_t job_graph_max_device_bytes = int64_t{16} << 20;
};

// The fault injector's answer at `point` for job `job`: OK without one.
inline absl::Status InjectFault(const CudaEngineOptions& options,
                                FaultInjector::Point point, int64_t job) {
  if (options.fault_injector == nullptr) return absl::OkStatus();
  return options.fault_injector->Inject(point, job);
}

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_CUDA_ENGINE_OPTIONS_H_
