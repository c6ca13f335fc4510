// JobGraph and JobGraphCache: a small multiply's stream work (its start,
// h2d_done and gemm_done events, the H2D copies of A and B, the GEMM, the
// D2H copy of C) recorded per lane and shape as a CUDA graph, then replayed
// for later jobs of that shape with one cudaGraphLaunch and one
// cudaEventRecord (the end event). A probe measured a graph launch at about
// 13.5 µs of host time against 29-35 µs for an n=256 job's calls one by one.
//
// A recorded graph (an instance) owns everything its work touches: device
// memory for A, B and C, a pinned staging range laid out like a job's
// staging slot ([staged A][staged B][returned C], JobLayout's offsets) and
// its own EventSet. The graph is captured reading and writing exactly
// those, so a replay changes nothing on the executable graph: the job
// writes its operands straight into the instance's staging, the launch
// copies them in, multiplies and copies C back into the staging, and the
// job's result is sent from there. (Setting each job's staging and events
// on the graph before its launch instead cost up to six driver calls a job.)
//
// Only jobs whose shape recurs are recorded (JobDescription::shape_recurs):
// a batch that BatchingEngine gathered carries its count in its shape, and
// one graph per count was evicted and recorded again for about every six
// jobs at n=64 c=64 on an H100.
//
// An instance serves one job at a time: it is taken (JobGraphCache::Take)
// by the dispatch that picks it and stays busy until that job's JobResult
// lets go of it (the reply has been sent from its staging) or the job
// fails. So several instances of one shape may exist on a lane (one held
// by a reply still being sent while the next job of its shape comes). A
// failed job or launch may leave an instance in an unknown state: it is
// marked broken and dropped, never replayed, once free.
//
// Ownership and threads: a lane's cache owns its instances (unique_ptr) and
// is used only by the thread dispatching on that lane (the lane's `busy`
// flag keeps dispatchers apart), which has the device current; so every
// instance is recorded, launched and destroyed there (or by the cache's
// destructor in Device::~Device). The busy and broken flags are a small
// State that the instance shares (shared_ptr) with its JobGraph::Use, the
// token a job holds; the token is moved into the job's JobResult release
// callback, which may run on any thread, even after the instance is gone:
// it only ever touches the State. The cache never destroys a busy instance,
// so a job may point at its instance's staging, events and C until it lets
// go of its Use. The counters may be read from any thread.
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
#include "gpu/cuda/pinned_pool.h"
#include "gpu/cuda/timing.h"
#include "gpu/matmul_spec.h"

namespace matmul {

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
  // The device's staging pool and spare events: each instance leases its
  // staging and takes its EventSet there, and gives both back when it goes.
  PinnedPool* pinned = nullptr;
  EventPool* events = nullptr;
  // Fill C on the device with NaN bytes before the GEMM (test aid; the
  // engine's poison_outputs).
  bool poison_c = false;
};

class JobGraph {
 private:
  struct State {
    std::atomic<bool> busy{false};
    std::atomic<bool> broken{false};
  };

 public:
  // A job's hold on an instance, from the dispatch that takes it until the
  // job's result lets go of it (or the job fails). Move-only; letting go
  // (Release, or destruction) frees the instance for the next job. May be
  // released on any thread, also after the instance is gone.
  class Use {
   public:
    Use() = default;
    Use(Use&& other) noexcept
        : state_(std::move(other.state_)),
          graph_(std::exchange(other.graph_, nullptr)) {}
    Use& operator=(Use&& other) noexcept {
      if (this != &other) {
        Release();
        state_ = std::move(other.state_);
        graph_ = std::exchange(other.graph_, nullptr);
      }
      return *this;
    }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ~Use() { Release(); }

    explicit operator bool() const { return state_ != nullptr; }
    // The instance held; null when nothing is. Valid until Release (the
    // cache never destroys a busy instance).
    JobGraph* graph() const { return graph_; }
    // The job or its launch failed: the instance is never replayed again
    // and goes once free. Before Release.
    void Break() {
      if (state_ != nullptr) {
        state_->broken.store(true, std::memory_order_relaxed);
      }
    }
    // Frees the instance; nothing of it may be touched afterwards. The
    // release store orders everything done with the instance's staging
    // (the reply read from it) before the next job's writes there.
    void Release() {
      if (state_ == nullptr) return;
      state_->busy.store(false, std::memory_order_release);
      state_.reset();
      graph_ = nullptr;
    }

   private:
    friend class JobGraph;
    Use(std::shared_ptr<State> state, JobGraph* graph)
        : state_(std::move(state)), graph_(graph) {}
    std::shared_ptr<State> state_;
    JobGraph* graph_ = nullptr;
  };

  // Records `spec`'s work by capturing it on `capture` (a stream of the
  // lane's own that nothing else uses, so that no other thread's query of
  // the lane's stream meets a capture) and instantiates it, with device
  // memory for A, B and C allocated on the lane's stream from its pool
  // (`device_bytes`, reserved against the budget by the caller, who
  // releases it when the instance goes), copies from and to `staging` (at
  // least a_bytes + b_bytes + c_bytes of the spec, laid out as a job's
  // slot) and event nodes recording `events`. The instance owns the staging
  // and the events from here on, also when recording fails. Nothing runs.
  static absl::StatusOr<std::unique_ptr<JobGraph>> Record(
      const JobGraphLane& lane, cudaStream_t capture, const MatmulSpec& spec,
      int64_t device_bytes, PinnedPool::Lease staging,
      std::unique_ptr<EventSet> events);
  // Frees the device memory in stream order (a launch still running
  // finishes first; cudaGraphExecDestroy defers while in flight), gives the
  // staging back and the events to the lane's spare list. Only once free:
  // its last job completed (its stream work is done) or failed.
  ~JobGraph();
  JobGraph(const JobGraph&) = delete;
  JobGraph& operator=(const JobGraph&) = delete;

  const MatmulSpec& spec() const { return spec_; }
  int64_t device_bytes() const { return device_bytes_; }
  // The staging the graph copies from and to: A at 0, B after A, C after
  // B, exactly as a job's slot (JobLayout::b_staging_offset(),
  // c_staging_offset()) for a replayable layout of this spec.
  std::byte* staging() const { return staging_.data(); }
  std::byte* host_a() const { return staging(); }
  std::byte* host_b() const { return staging() + spec_.a_bytes(); }
  std::byte* host_c() const {
    return staging() + spec_.a_bytes() + spec_.b_bytes();
  }
  // The events the graph records (start, h2d_done, gemm_done) and the end
  // event Launch records after it.
  EventSet& events() const { return *events_; }

  // Whether no job holds it (as last seen; only the lane's thread takes an
  // instance, so for that thread a free instance stays free).
  bool free() const { return !state_->busy.load(std::memory_order_acquire); }
  bool broken() const { return state_->broken.load(std::memory_order_relaxed); }
  // A Use of this instance if it is free and not broken; an empty one
  // otherwise.
  Use TryTake();

  // Launches the graph on the lane's stream, then records the end event
  // there (not as a node: the poller takes an end event that reads done for
  // a finished job, and a record call marks the event pending at once,
  // before the graph runs). For the job holding the instance, whose
  // operands are in its staging. An error fails the job (and breaks the
  // instance: the caller's Use).
  absl::Status Launch();

 private:
  JobGraph(const JobGraphLane& lane, const MatmulSpec& spec,
           int64_t device_bytes, PinnedPool::Lease staging,
           std::unique_ptr<EventSet> events);
  absl::Status Capture(cudaStream_t capture);

  const JobGraphLane lane_;
  const MatmulSpec spec_;
  const int64_t device_bytes_;
  PinnedPool::Lease staging_;
  std::unique_ptr<EventSet> events_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
  std::byte* memory_ = nullptr;  // A, B, C, each aligned
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

class JobGraphCache {
 public:
  // At most `capacity` instances; when a new one is needed, the least
  // recently used free one goes. A shape is recorded the `min_sightings`-th
  // time it comes without a free instance (so that shapes seen once, such
  // as the odd batch size, cost no recording); until then its jobs run call
  // by call.
  JobGraphCache(const JobGraphLane& lane, int capacity, int min_sightings);
  // After every job on the lane has completed or failed (the engine is shut
  // down): destroys every instance and releases their device memory.
  ~JobGraphCache();
  JobGraphCache(const JobGraphCache&) = delete;
  JobGraphCache& operator=(const JobGraphCache&) = delete;

  // Whether a job of this layout may be replayed at all: a multiply whose
  // operands are staged in the pinned pool (not prestaged) and whose
  // product comes back there (not into a c_destination), with no resident
  // operand or kept result, its staging exactly [A][B][C] of the spec, of
  // at most `max_device_bytes`.
  static bool Replayable(const JobLayout& layout, int64_t max_device_bytes);

  // A free instance of `spec`'s work taken for one job (recorded now if the
  // shape has been seen often enough and there is room: fewer than
  // `capacity` instances, or a free one to evict; and its device memory,
  // staging and events are free at once). An empty Use: none; the job goes
  // the usual way. `layout` must be Replayable.
  JobGraph::Use Take(const MatmulSpec& spec, const JobLayout& layout);

  // Destroys every free instance (counted as evicted), giving back its
  // device memory and staging: for a job of this lane that cannot have its
  // own at once, so that it does not wait on idle instances.
  void DropFree();

  // Launches a taken instance for its job (JobGraph::Launch), counting it.
  absl::Status Launch(JobGraph& graph);

  // Jobs launched through a graph, graphs recorded, graphs evicted.
  int64_t launches() const { return launches_.load(std::memory_order_relaxed); }
  int64_t recorded() const { return recorded_.load(std::memory_order_relaxed); }
  int64_t evicted() const { return evicted_.load(std::memory_order_relaxed); }

 private:
  using Instances = std::list<std::unique_ptr<JobGraph>>;
  // Destroys a free instance and releases its device memory.
  void Drop(Instances::iterator it);
  // Counts a sighting of `spec` without a free instance; true once it has
  // been seen min_sightings_ times.
  bool Sighted(const MatmulSpec& spec);

  const JobGraphLane lane_;
  const int capacity_;
  const int min_sightings_;
  CudaStream capture_;  // made at the first recording
  // Shapes seen without a free instance and how often, most recent first;
  // at most 4 * capacity_ of them.
  std::list<std::pair<MatmulSpec, int>> sightings_;
  Instances graphs_;  // most recently used first
  // Recording failed once (the driver or cuBLAS cannot capture it): no
  // further attempts on this lane.
  bool recording_failed_ = false;
  std::atomic<int64_t> launches_{0};
  std::atomic<int64_t> recorded_{0};
  std::atomic<int64_t> evicted_{0};
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_JOB_GRAPH_H_
