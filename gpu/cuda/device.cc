#include "gpu/cuda/device.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/lane.h"

namespace matmul {

absl::StatusOr<std::unique_ptr<Device>> Device::Create(
    int index, const CudaEngineOptions& options) {
  ScopedDevice scoped(index);
  RETURN_IF_ERROR(scoped.status());
  const CudaSite site{index};
  auto device = std::make_unique<Device>();
  device->index = index;
  ASSIGN_OR_RETURN(device->streams,
                   StreamPool::Create(index, options.streams_per_device,
                                      options.cublas_workspace_bytes));
  ASSIGN_OR_RETURN(PinnedBuffer pinned,
                   PinnedBuffer::Allocate(options.pinned_pool_bytes));
  // The pool owns the region through a HostBuffer that frees it.
  auto* region = new PinnedBuffer(std::move(pinned));
  device->pinned = std::make_unique<PinnedPool>(
      HostBuffer(region->data(), static_cast<int64_t>(region->size()),
                 [region] { delete region; }));

  // Stream-ordered allocations from the device's default pool, which keeps
  // freed memory for reuse instead of returning it to the driver.
  CUDA_RETURN_IF_ERROR_AT(
      site, cudaDeviceGetDefaultMemPool(&device->memory_pool, index));
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  CUDA_RETURN_IF_ERROR_AT(
      site, cudaMemPoolSetAttribute(device->memory_pool,
                                    cudaMemPoolAttrReleaseThreshold, &keep));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  CUDA_RETURN_IF_ERROR_AT(site, cudaMemGetInfo(&free_bytes, &total_bytes));
  device->memory = std::make_unique<DeviceMemoryBudget>(
      index, std::max<int64_t>(0, static_cast<int64_t>(free_bytes) -
                                      options.device_memory_reserve_bytes));

  ASSIGN_OR_RETURN(device->idle_stream, CreateStream());
  device->clock =
      std::make_unique<DeviceClock>(index, device->idle_stream.get());
  RETURN_IF_ERROR(device->clock->Refresh());

  for (int s = 0; s < options.streams_per_device; ++s) {
    auto lane = std::make_unique<Lane>();
    lane->device = device.get();
    lane->index = s;
    lane->stream = &device->streams->at(s);
    if (options.job_graphs_per_stream > 0) {
      PooledStream& pooled = *lane->stream;
      JobGraphLane graph_lane;
      graph_lane.site = CudaSite{index, s};
      graph_lane.stream = pooled.stream.get();
      graph_lane.cublas = pooled.cublas.get();
      graph_lane.workspace = pooled.workspace.data();
      graph_lane.workspace_bytes = pooled.workspace.size();
      graph_lane.memory_pool = device->memory_pool;
      graph_lane.budget = device->memory.get();
      graph_lane.pinned = device->pinned.get();
      graph_lane.events = &device->events;
      graph_lane.poison_c = options.poison_outputs;
      lane->graphs = std::make_unique<JobGraphCache>(
          graph_lane, options.job_graphs_per_stream,
          options.job_graph_min_sightings);
    }
    device->lanes.push_back(std::move(lane));
  }
  return device;
}

Device::~Device() {
  // Resources go in a fixed order, with the device current: streams
  // (synchronized first) and handles, then events, then the pinned region.
  ScopedDevice scoped(index);
  CUDA_LOG_IF_ERROR_STATUS(scoped.status());
  lanes.clear();
  streams.reset();
  events.Clear();
  if (clock != nullptr) clock->Reset();
  idle_stream.Reset();
  pinned.reset();
}

void CUDART_CB OnStreamDone(void* user_data) {
  auto* flight = static_cast<InFlight*>(user_data);
  Device* device = flight->device;
  absl::MutexLock lock(&device->done_mu);
  device->done.push_back(flight);
  device->done_cv.Signal();
}

void HandOff(InFlight* flight) {
  Device* device = flight->device;
  device->done_mu.AssertHeld();
  flight->handed_off = true;
  --device->poll_only_unclaimed;  // no longer the poller's to find
  std::deque<InFlight*>& unclaimed = flight->lane->unclaimed;
  auto it = std::find(unclaimed.begin(), unclaimed.end(), flight);
  if (it != unclaimed.end()) unclaimed.erase(it);
  // The reference a host function's path would hold; the completion
  // thread lets go of it.
  flight->refs.fetch_add(1, std::memory_order_relaxed);
  device->done.push_back(flight);
  device->done_cv.Signal();
}

bool Claim(InFlight* flight) {
  if (flight->claimed) return false;
  flight->claimed = true;
  if (!flight->host_function && !flight->handed_off) {
    Device* device = flight->device;
    device->done_mu.AssertHeld();
    --device->poll_only_unclaimed;
  }
  std::deque<InFlight*>& unclaimed = flight->lane->unclaimed;
  auto it = std::find(unclaimed.begin(), unclaimed.end(), flight);
  if (it != unclaimed.end()) unclaimed.erase(it);
  return true;
}

}  // namespace matmul
