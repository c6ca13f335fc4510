#include "gpu/cuda/job_graph.h"

#include <atomic>
#include <utility>
#include <vector>

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

absl::StatusOr<std::unique_ptr<JobGraph>> JobGraph::Record(
    const JobGraphLane& lane, cudaStream_t capture, const MatmulSpec& spec,
    int64_t device_bytes, const JobHostMemory& host, const EventSet& events) {
  std::unique_ptr<JobGraph> graph(new JobGraph(lane));
  graph->spec_ = spec;
  graph->device_bytes_ = device_bytes;
  void* memory = nullptr;
  CUDA_RETURN_IF_ERROR_AT(
      lane.site,
      cudaMallocFromPoolAsync(&memory, static_cast<size_t>(device_bytes),
                              lane.memory_pool, lane.stream));
  graph->memory_ = static_cast<std::byte*>(memory);  // freed by ~JobGraph
  RETURN_IF_ERROR(graph->Build(capture, host, events));
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
}

absl::Status JobGraph::Build(cudaStream_t capture, const JobHostMemory& host,
                             const EventSet& events) {
  RETURN_IF_ERROR(Capture(capture, host, events));
  RETURN_IF_ERROR(FindNodes(host, events));
  CUDA_RETURN_IF_ERROR_AT(lane_.site, cudaGraphInstantiate(&exec_, graph_, 0));
  return absl::OkStatus();
}

absl::Status JobGraph::Capture(cudaStream_t capture, const JobHostMemory& host,
                               const EventSet& events) {
  const CudaSite site = lane_.site;
  const DevicePointers d = Carve(memory_, spec_);
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
      CUDA_RETURN_IF_ERROR_AT(site,
                              cudaMemcpyAsync(d.a, host.a, spec_.a_bytes(),
                                              cudaMemcpyHostToDevice, capture));
      CUDA_RETURN_IF_ERROR_AT(site,
                              cudaMemcpyAsync(d.b, host.b, spec_.b_bytes(),
                                              cudaMemcpyHostToDevice, capture));
      if (lane_.poison_c) {
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMemsetAsync(d.c, 0xff, spec_.c_bytes(), capture));
      }
      RETURN_IF_ERROR(record(events.h2d_done));
      RETURN_IF_ERROR(EnqueueGemm(lane_.cublas, spec_, d.a, d.b, d.c, site));
      RETURN_IF_ERROR(record(events.gemm_done));
      CUDA_RETURN_IF_ERROR_AT(site,
                              cudaMemcpyAsync(host.c, d.c, spec_.c_bytes(),
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

absl::Status JobGraph::FindNodes(const JobHostMemory& host,
                                 const EventSet& events) {
  const CudaSite site = lane_.site;
  const DevicePointers d = Carve(memory_, spec_);
  size_t count = 0;
  CUDA_RETURN_IF_ERROR_AT(site, cudaGraphGetNodes(graph_, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CUDA_RETURN_IF_ERROR_AT(site,
                          cudaGraphGetNodes(graph_, nodes.data(), &count));
  const std::pair<const void*, const void*> copies[3] = {
      {host.a, d.a}, {host.b, d.b}, {d.c, host.c}};  // (source, destination)
  const cudaEvent_t recorded[3] = {events.start.get(), events.h2d_done.get(),
                                   events.gemm_done.get()};
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CUDA_RETURN_IF_ERROR_AT(site, cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeMemcpy) {
      cudaMemcpy3DParms params = {};
      CUDA_RETURN_IF_ERROR_AT(site,
                              cudaGraphMemcpyNodeGetParams(node, &params));
      for (int i = 0; i < 3; ++i) {
        if (params.srcPtr.ptr == copies[i].first &&
            params.dstPtr.ptr == copies[i].second) {
          copy_[i] = node;
        }
      }
    } else if (type == cudaGraphNodeTypeEventRecord) {
      cudaEvent_t event = nullptr;
      CUDA_RETURN_IF_ERROR_AT(site,
                              cudaGraphEventRecordNodeGetEvent(node, &event));
      for (int i = 0; i < 3; ++i) {
        if (event == recorded[i]) event_[i] = node;
      }
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (copy_[i] == nullptr) {
      return absl::InternalError(absl::StrCat(
          "recording a job as a CUDA graph: copy ", i,
          " (A, B, C) not found among the ", count, " captured nodes"));
    }
    copy_host_[i] = i < 2 ? copies[i].first : copies[i].second;
  }
  for (int i = 0; i < 3; ++i) {
    if (event_[i] == nullptr) {
      return absl::InternalError(
          absl::StrCat("recording a job as a CUDA graph: event ", i,
                       " not found among the ", count, " captured nodes"));
    }
    event_now_[i] = recorded[i];
  }
  return absl::OkStatus();
}

JobGraph::Outcome JobGraph::Launch(const JobHostMemory& host,
                                   const EventSet& events) {
  const CudaSite site = lane_.site;
  const cudaEvent_t wanted[3] = {events.start.get(), events.h2d_done.get(),
                                 events.gemm_done.get()};
  for (int i = 0; i < 3; ++i) {
    if (event_now_[i] == wanted[i]) continue;
    event_now_[i] = nullptr;  // unknown until the call succeeds
    absl::Status set = CudaStatus(
        cudaGraphExecEventRecordNodeSetEvent(exec_, event_[i], wanted[i]),
        "cudaGraphExecEventRecordNodeSetEvent", site);
    if (!set.ok()) return {std::move(set), false};
    event_now_[i] = wanted[i];
  }
  const DevicePointers d = Carve(memory_, spec_);
  const void* host_of[3] = {host.a, host.b, host.c};
  for (int i = 0; i < 3; ++i) {
    if (copy_host_[i] == host_of[i]) continue;
    copy_host_[i] = nullptr;
    const cudaError_t error =
        i == 0   ? cudaGraphExecMemcpyNodeSetParams1D(exec_, copy_[0], d.a,
                                                      host.a, spec_.a_bytes(),
                                                      cudaMemcpyHostToDevice)
        : i == 1 ? cudaGraphExecMemcpyNodeSetParams1D(exec_, copy_[1], d.b,
                                                      host.b, spec_.b_bytes(),
                                                      cudaMemcpyHostToDevice)
                 : cudaGraphExecMemcpyNodeSetParams1D(exec_, copy_[2], host.c,
                                                      d.c, spec_.c_bytes(),
                                                      cudaMemcpyDeviceToHost);
    absl::Status set =
        CudaStatus(error, "cudaGraphExecMemcpyNodeSetParams1D", site);
    if (!set.ok()) return {std::move(set), false};
    copy_host_[i] = host_of[i];
  }
  absl::Status launched =
      CudaStatus(cudaGraphLaunch(exec_, lane_.stream), "cudaGraphLaunch", site);
  if (launched.ok()) {
    launched = CudaStatus(cudaEventRecord(events.end.get(), lane_.stream),
                          "cudaEventRecord(end)", site);
  }
  return {std::move(launched), true};
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
  // Only staging-pool memory on the host side: a graph's copy nodes keep
  // the last job's host addresses, and the pool lives as long as the engine.
  // Memory the caller frees or unregisters after its job (prestaged
  // operands, a c_destination) crashed the process at the next update of
  // those nodes on an H100 (job_graph_test, 2026-12-05).
  return l.gemm && l.group == nullptr && l.stage_a && l.stage_b &&
         !l.prestaged && !l.c_to_destination && l.transient_a &&
         l.transient_b && l.transient_c && l.return_c && !l.keep &&
         !l.keeps_a && l.kept_bytes == 0 && l.byte_offset == 0 &&
         l.transient_bytes > 0 && l.transient_bytes <= max_device_bytes;
}

JobGraph::Outcome JobGraphCache::Launch(const MatmulSpec& spec,
                                        int64_t device_bytes,
                                        const JobHostMemory& host,
                                        const EventSet& events) {
  static std::atomic<int> failures_logged{0};
  auto launch = [this](JobGraph& graph, const JobHostMemory& host,
                       const EventSet& events) {
    JobGraph::Outcome outcome = graph.Launch(host, events);
    if (outcome.launched) {
      launches_.fetch_add(1, std::memory_order_relaxed);
    } else {
      // Setting this job's addresses failed (memory the graph's copies
      // cannot take, say): the job goes the usual way.
      LogCudaFailure(outcome.status, failures_logged);
    }
    return outcome;
  };
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
    if (!SameWork((*it)->spec(), spec)) continue;
    graphs_.splice(graphs_.begin(), graphs_, it);  // most recently used
    return launch(*graphs_.front(), host, events);
  }
  if (recording_failed_ || capacity_ <= 0) return {absl::OkStatus(), false};
  // Counted as a sighting; recorded once seen often enough.
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
  if (++sightings_.front().second < min_sightings_) {
    return {absl::OkStatus(), false};
  }
  sightings_.pop_front();
  if (static_cast<int>(graphs_.size()) >= capacity_) {
    lane_.budget->Release(graphs_.back()->device_bytes());
    graphs_.pop_back();
    evicted_.fetch_add(1, std::memory_order_relaxed);
  }
  if (!lane_.budget->TryReserve(device_bytes)) {
    return {absl::OkStatus(), false};
  }
  absl::StatusOr<std::unique_ptr<JobGraph>> recorded =
      absl::FailedPreconditionError("no capture stream");
  if (capture_.get() == nullptr) {
    absl::StatusOr<CudaStream> stream = CreateStream();
    if (stream.ok()) {
      capture_ = std::move(*stream);
    } else {
      recorded = stream.status();
    }
  }
  if (capture_.get() != nullptr) {
    recorded = JobGraph::Record(lane_, capture_.get(), spec, device_bytes, host,
                                events);
  }
  if (!recorded.ok()) {
    lane_.budget->Release(device_bytes);
    recording_failed_ = true;
    LogLine(absl::StrCat(
        "warning: GPU ", lane_.site.device, " stream ", lane_.site.stream,
        ": jobs are not recorded as CUDA graphs on this stream (",
        recorded.status().message(), "); they run call by call"));
    return {absl::OkStatus(), false};
  }
  graphs_.push_front(std::move(*recorded));
  recorded_.fetch_add(1, std::memory_order_relaxed);
  return launch(*graphs_.front(), host, events);
}

}  // namespace matmul
