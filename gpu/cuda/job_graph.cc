#include "gpu/cuda/job_graph.h"

#include <atomic>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/cuda/cublas_gemm.h"

namespace matmul {
namespace {

// Same recorded work: every field the GEMM and the copies depend on.
bool SameWork(const MatmulSpec& x, const MatmulSpec& y) {
  return x.dtype == y.dtype && x.compute == y.compute && x.batch == y.batch &&
         x.a_batch == y.a_batch && x.b_batch == y.b_batch && x.m == y.m &&
         x.n == y.n && x.k == y.k && x.transpose_a == y.transpose_a &&
         x.transpose_b == y.transpose_b;
}

struct DevicePointers {
  std::byte* a;
  std::byte* b;
  std::byte* c;
};

DevicePointers Carve(std::byte* memory, const MatmulSpec& spec) {
  std::byte* b = memory + AlignUp(spec.a_bytes(), kDeviceAlignment);
  std::byte* c = b + AlignUp(spec.b_bytes(), kDeviceAlignment);
  return {memory, b, c};
}

}  // namespace

JobGraph::JobGraph(const JobGraphLane& lane, const MatmulSpec& spec,
                   int64_t device_bytes, PinnedPool::Lease staging,
                   std::unique_ptr<EventSet> events)
    : lane_(lane),
      spec_(spec),
      device_bytes_(device_bytes),
      staging_(std::move(staging)),
      events_(std::move(events)) {}

absl::StatusOr<std::unique_ptr<JobGraph>> JobGraph::Record(
    const JobGraphLane& lane, cudaStream_t capture, const MatmulSpec& spec,
    int64_t device_bytes, PinnedPool::Lease staging,
    std::unique_ptr<EventSet> events) {
  // The graph's own parts go with it, whatever happens below.
  std::unique_ptr<JobGraph> graph(new JobGraph(
      lane, spec, device_bytes, std::move(staging), std::move(events)));
  if (graph->events_ == nullptr ||
      graph->staging_.size() <
          spec.a_bytes() + spec.b_bytes() + spec.c_bytes() ||
      device_bytes < DeviceBytes(spec)) {
    return absl::InternalError(absl::StrCat(
        "recording a job as a CUDA graph: ", graph->staging_.size(),
        " bytes of staging and ", device_bytes,
        " of device memory do not hold A, B and C, or no events"));
  }
  void* memory = nullptr;
  CUDA_RETURN_IF_ERROR_AT(
      lane.site,
      cudaMallocFromPoolAsync(&memory, static_cast<size_t>(device_bytes),
                              lane.memory_pool, lane.stream));
  graph->memory_ = static_cast<std::byte*>(memory);  // freed by ~JobGraph
  RETURN_IF_ERROR(graph->Capture(capture));
  CUDA_RETURN_IF_ERROR_AT(
      lane.site, cudaGraphInstantiate(&graph->exec_, graph->graph_, 0));
  return graph;
}

JobGraph::~JobGraph() {
  if (exec_ != nullptr)
    CUDA_LOG_IF_ERROR_AT(lane_.site, cudaGraphExecDestroy(exec_));
  if (graph_ != nullptr)
    CUDA_LOG_IF_ERROR_AT(lane_.site, cudaGraphDestroy(graph_));
  // After every launch already on the lane's stream.
  if (memory_ != nullptr) {
    CUDA_LOG_IF_ERROR_AT(lane_.site, cudaFreeAsync(memory_, lane_.stream));
  }
  // No stream work records the events any more: the instance is free, so
  // its last job's stream work is done (or the engine is shut down).
  if (events_ != nullptr) lane_.events->Return(std::move(events_));
  staging_.Release();
}

absl::Status JobGraph::Capture(cudaStream_t capture) {
  const CudaSite site = lane_.site;
  const DevicePointers d = Carve(memory_, spec_);
  const EventSet& events = *events_;
  // The handle follows the capture stream while recording, then goes back
  // to the lane's stream (each cublasSetStream drops the workspace).
  auto use_stream = [this, site](cudaStream_t stream) -> absl::Status {
    CUBLAS_RETURN_IF_ERROR_AT(site, cublasSetStream(lane_.cublas, stream));
    CUBLAS_RETURN_IF_ERROR_AT(site,
                              cublasSetWorkspace(lane_.cublas, lane_.workspace,
                                                 lane_.workspace_bytes));
    return absl::OkStatus();
  };
  if (absl::Status set = use_stream(capture); !set.ok()) {
    // Back to the lane's stream whatever happened.
    CUDA_LOG_IF_ERROR_STATUS(use_stream(lane_.stream));
    return set;
  }
  absl::Status recorded = CudaStatus(
      cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal),
      "cudaStreamBeginCapture", site);
  if (recorded.ok()) {
    recorded = [&]() -> absl::Status {
      auto record = [&](const CudaEvent& event) {
        return CudaStatus(cudaEventRecordWithFlags(event.get(), capture,
                                                   cudaEventRecordExternal),
                          "cudaEventRecordWithFlags(external)", site);
      };
      RETURN_IF_ERROR(record(events.start));
      // One copy node for both operands where they lie back to back.
      if (OperandsContiguous(host_a(), host_b(), d.a, d.b, spec_.a_bytes())) {
        CUDA_RETURN_IF_ERROR_AT(
            site,
            cudaMemcpyAsync(d.a, host_a(), spec_.a_bytes() + spec_.b_bytes(),
                            cudaMemcpyHostToDevice, capture));
      } else {
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMemcpyAsync(d.a, host_a(), spec_.a_bytes(),
                                  cudaMemcpyHostToDevice, capture));
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMemcpyAsync(d.b, host_b(), spec_.b_bytes(),
                                  cudaMemcpyHostToDevice, capture));
      }
      if (lane_.poison_c) {
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMemsetAsync(d.c, 0xff, spec_.c_bytes(), capture));
      }
      RETURN_IF_ERROR(record(events.h2d_done));
      RETURN_IF_ERROR(EnqueueGemm(lane_.cublas, spec_, d.a, d.b, d.c, site));
      RETURN_IF_ERROR(record(events.gemm_done));
      CUDA_RETURN_IF_ERROR_AT(site,
                              cudaMemcpyAsync(host_c(), d.c, spec_.c_bytes(),
                                              cudaMemcpyDeviceToHost, capture));
      return absl::OkStatus();
    }();
    // Ends the capture whether or not the recording went through.
    absl::Status ended = CudaStatus(cudaStreamEndCapture(capture, &graph_),
                                    "cudaStreamEndCapture", site);
    if (recorded.ok()) recorded = std::move(ended);
  }
  absl::Status restored = use_stream(lane_.stream);
  if (recorded.ok()) recorded = std::move(restored);
  return recorded;
}

JobGraph::Use JobGraph::TryTake() {
  if (broken()) return Use();
  bool expected = false;
  if (!state_->busy.compare_exchange_strong(expected, true,
                                            std::memory_order_acq_rel)) {
    return Use();
  }
  return Use(state_, this);
}

absl::Status JobGraph::Launch() {
  const CudaSite site = lane_.site;
  CUDA_RETURN_IF_ERROR_AT(site, cudaGraphLaunch(exec_, lane_.stream));
  CUDA_RETURN_IF_ERROR_AT(site,
                          cudaEventRecord(events_->end.get(), lane_.stream));
  return absl::OkStatus();
}

JobGraphCache::JobGraphCache(const JobGraphLane& lane, int capacity,
                             int min_sightings)
    : lane_(lane), capacity_(capacity), min_sightings_(min_sightings) {}

JobGraphCache::~JobGraphCache() {
  for (const auto& graph : graphs_)
    lane_.budget->Release(graph->device_bytes());
  graphs_.clear();
}

bool JobGraphCache::Replayable(const JobLayout& l, int64_t max_device_bytes) {
  // Only staging-pool memory on the host side, the instance's own: memory
  // the caller frees or unregisters after its job (prestaged operands, a
  // c_destination) is never a graph's. The staging must be exactly the
  // instance's [A][B][C] (JobGraph::host_a(), host_b(), host_c()), and the
  // device memory its three aligned blocks.
  return l.gemm && l.stage_a && l.stage_b && !l.prestaged &&
         !l.c_to_destination && l.transient_a && l.transient_b &&
         l.transient_c && l.return_c && !l.keep && !l.keeps_a &&
         l.kept_bytes == 0 && l.byte_offset == 0 &&
         l.staged_a_bytes == l.a_bytes && l.staged_b_bytes == l.b_bytes &&
         l.returned_c_bytes == l.c_bytes && l.c_out_bytes == l.c_bytes &&
         l.staging_bytes == l.a_bytes + l.b_bytes + l.c_bytes &&
         l.transient_bytes > 0 && l.transient_bytes <= max_device_bytes;
}

void JobGraphCache::Drop(Instances::iterator it) {
  lane_.budget->Release((*it)->device_bytes());
  graphs_.erase(it);
}

void JobGraphCache::DropFree() {
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    auto next = std::next(it);
    if ((*it)->free()) {
      if (!(*it)->broken()) evicted_.fetch_add(1, std::memory_order_relaxed);
      Drop(it);
    }
    it = next;
  }
}

bool JobGraphCache::Sighted(const MatmulSpec& spec) {
  auto seen = sightings_.begin();
  while (seen != sightings_.end() && !SameWork(seen->first, spec)) ++seen;
  if (seen == sightings_.end()) {
    sightings_.emplace_front(spec, 0);
    if (static_cast<int>(sightings_.size()) > 4 * capacity_) {
      sightings_.pop_back();
    }
  } else {
    sightings_.splice(sightings_.begin(), sightings_, seen);
  }
  return ++sightings_.front().second >= min_sightings_;
}

JobGraph::Use JobGraphCache::Take(const MatmulSpec& spec,
                                  const JobLayout& layout) {
  // Broken instances go as soon as nobody holds them.
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    auto next = std::next(it);
    if ((*it)->free() && (*it)->broken()) Drop(it);
    it = next;
  }
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
    if (!SameWork((*it)->spec(), spec)) continue;
    JobGraph::Use use = (*it)->TryTake();
    if (!use) continue;                            // held by a job (or broken)
    graphs_.splice(graphs_.begin(), graphs_, it);  // most recently used
    return use;
  }
  if (recording_failed_ || capacity_ <= 0) return {};
  // Counted as a sighting; recorded once seen often enough.
  if (!Sighted(spec)) return {};
  if (static_cast<int>(graphs_.size()) >= capacity_) {
    // Room for one more: the least recently used free instance goes. None
    // free: this job runs call by call, and the shape's sighting stays
    // counted, so that the next job of it records as soon as one is free.
    auto victim = graphs_.end();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
      if ((*it)->free()) victim = it;
    }
    if (victim == graphs_.end()) return {};
    Drop(victim);
    evicted_.fetch_add(1, std::memory_order_relaxed);
  }
  // The instance's own device memory, staging and events, if free now;
  // otherwise this job runs call by call and a later one records.
  const int64_t device_bytes = layout.transient_bytes;
  if (!lane_.budget->TryReserve(device_bytes)) return {};
  std::optional<PinnedPool::Lease> staging =
      lane_.pinned->TryAcquire(layout.staging_bytes);
  if (!staging.has_value()) {
    lane_.budget->Release(device_bytes);
    return {};
  }
  absl::StatusOr<std::unique_ptr<EventSet>> events = lane_.events->Take();
  absl::StatusOr<std::unique_ptr<JobGraph>> recorded =
      absl::FailedPreconditionError("no capture stream");
  if (!events.ok()) {
    recorded = events.status();
  } else if (capture_.get() == nullptr) {
    absl::StatusOr<CudaStream> stream = CreateStream();
    if (stream.ok()) {
      capture_ = std::move(*stream);
    } else {
      recorded = stream.status();
    }
  }
  if (events.ok() && capture_.get() != nullptr) {
    recorded = JobGraph::Record(lane_, capture_.get(), spec, device_bytes,
                                std::move(*staging), std::move(*events));
  }
  if (!recorded.ok()) {
    // Events not handed to a recording (no capture stream) go back.
    if (events.ok() && *events != nullptr) {
      lane_.events->Return(std::move(*events));
    }
    lane_.budget->Release(device_bytes);
    recording_failed_ = true;
    LogLine(absl::StrCat(
        "warning: GPU ", lane_.site.device, " stream ", lane_.site.stream,
        ": jobs are not recorded as CUDA graphs on this stream (",
        recorded.status().message(), "); they run call by call"));
    return {};
  }
  sightings_.pop_front();  // Sighted left the shape in front
  graphs_.push_front(std::move(*recorded));
  recorded_.fetch_add(1, std::memory_order_relaxed);
  return graphs_.front()->TryTake();  // new: free, not broken
}

absl::Status JobGraphCache::Launch(JobGraph& graph) {
  absl::Status launched = graph.Launch();
  if (launched.ok()) launches_.fetch_add(1, std::memory_order_relaxed);
  return launched;
}

}  // namespace matmul
