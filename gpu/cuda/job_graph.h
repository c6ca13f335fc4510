// JobGraph and JobGraphCache: a small multiply's stream work (its start,
// h2d_done and gemm_done events, the H2D copies of A and B, the GEMM, the
// D2H copy of C) recorded per lane and shape as a CUDA graph, then replayed
// for later jobs of that shape with one cudaGraphLaunch and one
// cudaEventRecord (the end event). A probe measured a graph launch at about
// 13.5 µs of host time against 29-35 µs for an n=256 job's calls one by one
// (docs/PERFORMANCE.md section 13); the engine with graphs has not been
// measured yet.
//
// A recorded graph owns its device memory for A, B and C, so every replay
// on the lane uses the same device addresses: the lane's stream orders one
// job's reads of C before the next job's GEMM writes it. What changes from
// job to job is host-side only: where A and B are staged, where C goes and
// which events time the stages; those are set on the executable graph
// before each launch (cudaGraphExec*SetParams), which affects only that and
// later launches.
//
// Thread safety: a cache belongs to one lane and is used only by the thread
// dispatching on that lane (the lane's `busy` flag keeps dispatchers apart);
// its counters may be read from any thread.
#ifndef MATMUL_GPU_CUDA_JOB_GRAPH_H_
#define MATMUL_GPU_CUDA_JOB_GRAPH_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device_memory.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/timing.h"
#include "gpu/matmul_spec.h"

namespace matmul {

// Where one job's operands and result are on the host.
struct JobHostMemory {
  const std::byte* a = nullptr;
  const std::byte* b = nullptr;
  std::byte* c = nullptr;
};

// What a lane's cache needs of its device and stream.
struct JobGraphLane {
  CudaSite site;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  // The handle's workspace: cublasSetStream drops it, so recording on
  // another stream sets it again.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaMemPool_t memory_pool = nullptr;
  DeviceMemoryBudget* budget = nullptr;
  // Fill C on the device with NaN bytes before the GEMM (test aid; the
  // engine's poison_outputs).
  bool poison_c = false;
};

class JobGraph {
 public:
  // Records `spec`'s work by capturing it on `capture` (a stream of the
  // lane's own that nothing else uses, so that no other thread's query of
  // the lane's stream meets a capture) and instantiates it, with device
  // memory for A, B and C allocated on the lane's stream from its pool
  // (reserved against the budget by the caller). Nothing runs.
  static absl::StatusOr<std::unique_ptr<JobGraph>> Record(
      const JobGraphLane& lane, cudaStream_t capture, const MatmulSpec& spec,
      int64_t device_bytes, const JobHostMemory& host, const EventSet& events);
  // Frees the device memory in stream order; a launch still running
  // finishes first (cudaGraphExecDestroy defers while in flight).
  ~JobGraph();
  JobGraph(const JobGraph&) = delete;
  JobGraph& operator=(const JobGraph&) = delete;

  const MatmulSpec& spec() const { return spec_; }
  int64_t device_bytes() const { return device_bytes_; }

  // Points the copies at `host` and the event nodes at `events`, then
  // launches on the lane's stream. An error before the launch leaves
  // nothing enqueued (`launched` false): the caller may do the job another
  // way. An error from the launch itself fails the job.
  struct Outcome {
    absl::Status status;
    bool launched = false;
  };
  Outcome Launch(const JobHostMemory& host, const EventSet& events);

 private:
  explicit JobGraph(const JobGraphLane& lane) : lane_(lane) {}
  absl::Status Build(cudaStream_t capture, const JobHostMemory& host,
                     const EventSet& events);
  absl::Status Capture(cudaStream_t capture, const JobHostMemory& host,
                       const EventSet& events);
  absl::Status FindNodes(const JobHostMemory& host, const EventSet& events);
  absl::Status SetCopy(int which, const void* host);

  const JobGraphLane lane_;
  MatmulSpec spec_;
  int64_t device_bytes_ = 0;
  std::byte* memory_ = nullptr;  // A, B, C, each aligned
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  // The copy nodes (A, B: H2D; C: D2H) with their parameters as recorded,
  // and the host address each has now.
  cudaGraphNode_t copy_[3] = {};
  cudaMemcpy3DParms copy_params_[3] = {};
  const void* copy_host_[3] = {};
  // The event nodes in EventSet order (start, h2d_done, gemm_done) and the
  // event each records now. The end event is recorded on the stream after
  // each launch (cudaEventRecord), not by a node: the poller takes an end
  // event that reads done for a finished job, and a record call marks the
  // event pending at once, before the graph runs.
  cudaGraphNode_t event_[3] = {};
  cudaEvent_t event_now_[3] = {};
};

class JobGraphCache {
 public:
  // At most `capacity` graphs; the least recently used goes first. A shape
  // is recorded the `min_sightings`-th time it comes without a graph (so
  // that shapes seen once, such as the odd batch size, cost no recording);
  // until then its jobs run call by call.
  JobGraphCache(const JobGraphLane& lane, int capacity, int min_sightings);
  ~JobGraphCache();
  JobGraphCache(const JobGraphCache&) = delete;
  JobGraphCache& operator=(const JobGraphCache&) = delete;

  // Whether a job of this layout may be replayed at all: a multiply whose
  // operands are staged in the pinned pool and whose product comes back
  // there, with no resident operand or kept result, of at most
  // `max_device_bytes`.
  static bool Replayable(const JobLayout& layout, int64_t max_device_bytes);

  // Enqueues the job through its shape's graph, recording the graph first
  // on a miss. `launched` false: nothing was enqueued (recording failed, or
  // the device memory for a new graph is not free now) and the caller
  // enqueues the job the usual way.
  JobGraph::Outcome Launch(const MatmulSpec& spec, int64_t device_bytes,
                           const JobHostMemory& host, const EventSet& events);

  // Jobs launched through a graph, graphs recorded, graphs evicted.
  int64_t launches() const { return launches_.load(std::memory_order_relaxed); }
  int64_t recorded() const { return recorded_.load(std::memory_order_relaxed); }
  int64_t evicted() const { return evicted_.load(std::memory_order_relaxed); }

 private:
  const JobGraphLane lane_;
  const int capacity_;
  const int min_sightings_;
  CudaStream capture_;  // made at the first recording
  // Shapes seen without a graph and how often, most recent first; at most
  // 4 * capacity_ of them.
  std::list<std::pair<MatmulSpec, int>> sightings_;
  std::list<std::unique_ptr<JobGraph>> graphs_;  // most recently used first
  // Recording failed once (the driver or cuBLAS cannot capture it): no
  // further attempts on this lane.
  bool recording_failed_ = false;
  std::atomic<int64_t> launches_{0};
  std::atomic<int64_t> recorded_{0};
  std::atomic<int64_t> evicted_{0};
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_JOB_GRAPH_H_
