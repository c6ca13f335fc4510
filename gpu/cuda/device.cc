#include "gpu/cuda/device.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/lane.h"

namespace matmul {

Device::Device(int index, const CudaEngineOptions& options, SpanHistory* spans,
               std::atomic<int64_t>* next_job)
    : index_(index), options_(options), spans_(spans), next_job_(next_job) {}

absl::StatusOr<std::unique_ptr<Device>> Device::Create(
    int index, const CudaEngineOptions& options, SpanHistory* spans,
    std::atomic<int64_t>* next_job) {
  ScopedDevice scoped(index);
  RETURN_IF_ERROR(scoped.status());
  const CudaSite site{index};
  std::unique_ptr<Device> device(new Device(index, options, spans, next_job));
  ASSIGN_OR_RETURN(device->streams_,
                   StreamPool::Create(index, options.streams_per_device,
                                      options.cublas_workspace_bytes));
  ASSIGN_OR_RETURN(PinnedBuffer pinned,
                   PinnedBuffer::Allocate(options.pinned_pool_bytes));
  // The pool owns the region through a HostBuffer that frees it.
  auto* region = new PinnedBuffer(std::move(pinned));
  device->pinned_ = std::make_unique<PinnedPool>(
      HostBuffer(region->data(), static_cast<int64_t>(region->size()),
                 [region] { delete region; }));

  // Stream-ordered allocations from the device's default pool, which keeps
  // freed memory for reuse instead of returning it to the driver.
  CUDA_RETURN_IF_ERROR_AT(
      site, cudaDeviceGetDefaultMemPool(&device->memory_pool_, index));
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  CUDA_RETURN_IF_ERROR_AT(
      site, cudaMemPoolSetAttribute(device->memory_pool_,
                                    cudaMemPoolAttrReleaseThreshold, &keep));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  CUDA_RETURN_IF_ERROR_AT(site, cudaMemGetInfo(&free_bytes, &total_bytes));
  device->memory_ = std::make_unique<DeviceMemoryBudget>(
      index, std::max<int64_t>(0, static_cast<int64_t>(free_bytes) -
                                      options.device_memory_reserve_bytes));

  ASSIGN_OR_RETURN(device->idle_stream_, CreateStream());
  device->clock_ =
      std::make_unique<DeviceClock>(index, device->idle_stream_.get());
  RETURN_IF_ERROR(device->clock_->Refresh());

  for (int s = 0; s < options.streams_per_device; ++s) {
    auto lane = std::make_unique<Lane>();
    lane->device = device.get();
    lane->index = s;
    lane->stream = &device->streams_->at(s);
    if (options.job_graphs_per_stream > 0) {
      PooledStream& pooled = *lane->stream;
      JobGraphLane graph_lane;
      graph_lane.site = CudaSite{index, s};
      graph_lane.stream = pooled.stream.get();
      graph_lane.cublas = pooled.cublas.get();
      graph_lane.workspace = pooled.workspace.data();
      graph_lane.workspace_bytes = pooled.workspace.size();
      graph_lane.memory_pool = device->memory_pool_;
      graph_lane.budget = device->memory_.get();
      graph_lane.pinned = device->pinned_.get();
      graph_lane.events = &device->events_;
      graph_lane.poison_c = options.poison_outputs;
      lane->graphs = std::make_unique<JobGraphCache>(
          graph_lane, options.job_graphs_per_stream,
          options.job_graph_min_sightings);
    }
    device->lanes_.push_back(std::move(lane));
  }
  return device;
}

Device::~Device() {
  // Resources go in a fixed order, with the device current: streams
  // (synchronized first) and handles, then events, then the pinned region.
  ScopedDevice scoped(index_);
  CUDA_LOG_IF_ERROR_STATUS(scoped.status());
  lanes_.clear();
  streams_.reset();
  events_.Clear();
  if (clock_ != nullptr) clock_->Reset();
  idle_stream_.Reset();
  pinned_.reset();
}

void Device::Start() {
  for (auto& lane : lanes_) {
    Lane* l = lane.get();
    l->thread = std::thread([this, l] { LaneLoop(l); });
    NameThread(l->thread, absl::StrCat("mm-lane", index_, ".", l->index));
  }
  for (int i = 0; i < options_.streams_per_device; ++i) {
    completion_threads_.emplace_back([this] { CompletionLoop(); });
    NameThread(completion_threads_.back(),
               absl::StrCat("mm-done", index_, ".", i));
  }
  if (options_.completion_poll > absl::ZeroDuration()) {
    const int pollers = std::clamp(options_.pollers_per_device, 1,
                                   static_cast<int>(lanes_.size()));
    for (int p = 0; p < pollers; ++p) {
      pollers_.emplace_back([this, p, pollers] { PollLoop(p, pollers); });
      NameThread(pollers_.back(), absl::StrCat("mm-poll", index_, ".", p));
    }
  }
}

void Device::StopLanes() {
  for (auto& lane : lanes_) {
    absl::MutexLock lock(&lane->mu);
    lane->stopping = true;
    lane->cv.Signal();
  }
}

void Device::JoinLanes() {
  for (auto& lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
}

void Device::StopCompletion() {
  {
    absl::MutexLock lock(&done_mu_);
    stopping_ = true;
    done_cv_.SignalAll();
    poll_cv_.SignalAll();
  }
  for (std::thread& t : pollers_) {
    if (t.joinable()) t.join();
  }
  for (std::thread& t : completion_threads_) {
    if (t.joinable()) t.join();
  }
}

DeviceStats Device::Stats() const {
  DeviceStats out;
  out.label = absl::StrCat(index_);
  out.healthy = healthy_.load();
  for (const auto& lane : lanes_) {
    StreamStats s;
    s.jobs = lane->jobs.load(std::memory_order_relaxed);
    s.busy_seconds = lane->busy_seconds.load(std::memory_order_relaxed);
    out.streams.push_back(s);
  }
  const BusyAccounting::Totals busy = busy_.totals();
  out.busy_seconds = busy.busy_seconds;
  out.compute_busy_seconds = busy.compute_seconds;
  out.copy_busy_seconds = busy.copy_seconds;
  out.copy_compute_overlap_seconds = busy.overlap_seconds;
  out.h2d_bytes = h2d_bytes_.load(std::memory_order_relaxed);
  out.d2h_bytes = d2h_bytes_.load(std::memory_order_relaxed);
  for (int i = 0; i < kNumDTypes; ++i) {
    out.flops[i] = flops_[i].load(std::memory_order_relaxed);
  }
  out.staging_used_bytes = pinned_->used();
  out.staging_total_bytes = pinned_->capacity();
  out.device_memory_used_bytes = memory_->reserved();
  out.queued_jobs = queued_.load(std::memory_order_relaxed);
  for (const auto& lane : lanes_) {
    if (lane->graphs == nullptr) continue;
    out.graph_jobs += lane->graphs->launches();
    out.graphs_recorded += lane->graphs->recorded();
    out.graphs_evicted += lane->graphs->evicted();
  }
  return out;
}

}  // namespace matmul
