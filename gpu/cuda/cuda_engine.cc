// CudaEngine: opening and closing the engine, what it can take
// (CheckFits, MinimumDuration), its stats and host buffers, and routing:
// Submit picks a lane (PickLane: least outstanding work on a healthy device
// that can hold the job) and queues the job there, or has the device
// dispatch a small one on the submitting thread. The rest of a job's path
// is the Device's (device.h).
#include "gpu/cuda/cuda_engine.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/device_registry.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/lane.h"
#include "gpu/layout_planner.h"

namespace matmul {

CudaEngine::CudaEngine(const CudaEngineOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(
    const CudaEngineOptions& options) {
  if (options.streams_per_device < 1 || options.streams_per_device > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams per device must be in [1, 64], got ",
                     options.streams_per_device));
  }
  if (options.timed_job_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("one timed job in every N needs N >= 1, got ",
                     options.timed_job_every));
  }
  std::unique_ptr<CudaEngine> engine(new CudaEngine(options));
  if (absl::Status status = engine->Init(); !status.ok()) {
    engine->Shutdown();
    return status;
  }
  return engine;
}

absl::Status CudaEngine::Init() {
  ASSIGN_OR_RETURN(std::vector<DeviceInfo> visible, DiscoverCudaDevices());
  std::vector<int> chosen = options_.devices;
  if (chosen.empty()) {
    for (const DeviceInfo& d : visible) chosen.push_back(d.index);
  }
  info_.name = "cuda";
  info_.streams_per_device = options_.streams_per_device;
  info_.dtypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                  DType::kBFloat16};

  for (int index : chosen) {
    if (index < 0 || index >= static_cast<int>(visible.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no CUDA device ", index, " (", visible.size(), " visible)"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                     Device::Create(index, options_, &spans_, &next_job_));
    DeviceInfo info = visible[index];
    info.staging_bytes = device->pinned().capacity();
    info_.devices.push_back(info);
    for (auto& lane : device->lanes()) lanes_.push_back(lane.get());
    devices_.push_back(std::move(device));
  }

  for (auto& device : devices_) device->Start();
  return absl::OkStatus();
}

CudaEngine::~CudaEngine() {
  Shutdown();
  // Each device then tears its parts down in order (Device::~Device).
  devices_.clear();
}

absl::Status CudaEngine::CheckFits(const MatmulSpec& spec) const {
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (spec.m > kMaxInt || spec.n > kMaxInt || spec.k > kMaxInt ||
      spec.batch > kMaxInt) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuBLAS takes 32-bit dimensions; got m=", spec.m,
                     " n=", spec.n, " k=", spec.k, " batch=", spec.batch));
  }
  const int64_t device_bytes = DeviceBytes(spec);
  const int64_t pinned_bytes = spec.a_bytes() + spec.b_bytes() + spec.c_bytes();
  int64_t best_memory = 0;
  int64_t best_pinned = 0;
  for (const auto& device : devices_) {
    best_memory = std::max(best_memory, device->memory().budget());
    best_pinned = std::max(best_pinned, device->pinned().capacity());
  }
  if (device_bytes > best_memory) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request needs ", device_bytes,
        " bytes of device memory (A, B and C); the largest GPU has ",
        best_memory, " bytes available to requests"));
  }
  if (pinned_bytes > best_pinned) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request needs ", pinned_bytes,
                     " bytes of pinned staging memory; each GPU's pool has ",
                     best_pinned, " bytes (--pinned-pool-bytes)"));
  }
  return absl::OkStatus();
}

absl::Duration CudaEngine::MinimumDuration(const MatmulSpec& spec) const {
  // Upper bounds of the H200's rates, so that this stays a lower bound on
  // any current GPU: 64 GB/s per PCIe direction, dense tensor peaks.
  double peak = 70e12;  // float32 / float64 without tensor cores
  if (spec.dtype == DType::kFloat16 || spec.dtype == DType::kBFloat16) {
    peak = 1000e12;
  } else if (spec.dtype == DType::kFloat32 &&
             spec.compute == ComputeMode::kTf32) {
    peak = 500e12;
  }
  const double h2d =
      static_cast<double>(spec.a_bytes() + spec.b_bytes()) / 64e9;
  const double d2h = static_cast<double>(spec.c_bytes()) / 64e9;
  return absl::Seconds(h2d + spec.flops() / peak + d2h);
}

EngineStats CudaEngine::stats() const {
  EngineStats stats;
  for (size_t i = 0; i < devices_.size(); ++i) {
    DeviceStats out = devices_[i]->Stats();
    out.uuid = info_.devices[i].uuid;
    stats.devices.push_back(std::move(out));
  }
  return stats;
}

absl::StatusOr<HostBuffer> CudaEngine::AllocateHostBuffer(int64_t bytes) {
  ASSIGN_OR_RETURN(PinnedBuffer pinned,
                   PinnedBuffer::Allocate(static_cast<size_t>(bytes)));
  auto* owned = new PinnedBuffer(std::move(pinned));
  return HostBuffer(owned->data(), bytes, [owned] { delete owned; });
}

absl::StatusOr<HostMemoryRegistration> CudaEngine::RegisterHostMemory(
    void* data, int64_t bytes) {
  if (data == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot register ", bytes, " bytes of host memory at ",
                     data == nullptr ? "null" : "that address"));
  }
  // Portable: every device's copy engines may use it, whichever device a
  // job runs on.
  CUDA_RETURN_IF_ERROR(cudaHostRegister(data, static_cast<size_t>(bytes),
                                        cudaHostRegisterPortable));
  return HostMemoryRegistration(/*pinned=*/true, [data] {
    // Every job using the memory is done by now (the caller's contract);
    // a failure can only be logged.
    CUDA_LOG_IF_ERROR(cudaHostUnregister(data));
  });
}

absl::StatusOr<std::shared_ptr<ResidentTensor>> CudaEngine::ImportDeviceMemory(
    absl::Span<const std::byte> ipc_handle, int64_t bytes,
    absl::Span<const std::byte> device_uuid) {
  if (device_uuid.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_uuid: expected the 16 bytes of a GPU's UUID, got ",
                     device_uuid.size()));
  }
  unsigned char raw[16];
  std::memcpy(raw, device_uuid.data(), sizeof raw);
  const std::string uuid = FormatGpuUuid(raw);
  std::string used;
  for (const DeviceInfo& device : info_.devices) {
    if (device.uuid == uuid) {
      return imported_.Import(device.index, ipc_handle, bytes);
    }
    absl::StrAppend(&used, used.empty() ? "" : ", ", device.uuid);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "device_uuid: the memory is on GPU ", uuid,
      ", which this server does not use (it drives ", used,
      "); run the server where that GPU is visible (CUDA_VISIBLE_DEVICES) or "
      "allocate on one of these"));
}

void CudaEngine::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Lanes dispatch what they hold, then the completion threads finish every
  // job in flight.
  for (auto& device : devices_) device->StopLanes();
  for (auto& device : devices_) device->JoinLanes();
  for (auto& device : devices_) device->StopCompletion();
}

Lane* CudaEngine::PickLane(const JobLayout& layout) const {
  const int64_t device_bytes = layout.transient_bytes + layout.kept_bytes;
  Lane* best = nullptr;
  double best_work = std::numeric_limits<double>::infinity();
  for (Lane* lane : lanes_) {
    Device* d = lane->device;
    if (!d->healthy() ||
        (layout.required_device >= 0 && d->index() != layout.required_device) ||
        device_bytes > d->memory().budget() ||
        layout.staging_bytes > d->pinned().capacity()) {
      continue;
    }
    const double work = lane->outstanding.load(std::memory_order_relaxed);
    if (work < best_work) {
      best_work = work;
      best = lane;
    }
  }
  return best;
}

void CudaEngine::Submit(std::unique_ptr<MatmulJob> job) {
  absl::Status refused;
  Lane* inline_lane = nullptr;  // dispatch here, on the submitting thread
  JobLayout inline_layout;
  absl::Time submitted;
  double estimate = 0;
  {
    absl::ReaderMutexLock shutdown_lock(&shutdown_mu_);
    absl::StatusOr<JobLayout> layout = LayoutOf(job->description());
    Lane* lane = layout.ok() ? PickLane(*layout) : nullptr;
    if (shut_down_) {
      refused = absl::UnavailableError("the CUDA engine is shut down");
    } else if (!layout.ok()) {
      refused = layout.status();
    } else if (lane == nullptr) {
      refused = absl::UnavailableError(
          layout->required_device >= 0
              ? absl::StrCat("GPU ", layout->required_device,
                             " cannot take the request (unhealthy, or not "
                             "enough memory; see the server log)")
              : "no healthy GPU can take the request (see the server log)");
    } else {
      estimate = EstimatedSeconds(job->spec(), *layout);
      AtomicAddDouble(lane->outstanding, estimate);
      lane->device->CountQueued();
      submitted = absl::Now();
      absl::MutexLock lock(&lane->mu);
      // 0 turns this off even for jobs that stage nothing.
      if (options_.inline_dispatch_max_bytes > 0 && lane->queue.empty() &&
          !lane->busy &&
          layout->staging_bytes <= options_.inline_dispatch_max_bytes) {
        lane->busy = true;
        inline_lane = lane;
        inline_layout = *layout;
      } else {
        lane->queue.push_back({std::move(job), *layout, submitted, estimate});
        lane->cv.Signal();
        return;
      }
    }
  }
  if (inline_lane == nullptr) {
    job->Done(refused);
    return;
  }
  // The lane thread waits while `busy`, and Shutdown joins it, so the
  // engine stays up until this dispatch ends.
  std::unique_ptr<MatmulJob> left;
  {
    ScopedDevice scoped(inline_lane->device->index());
    if (scoped.status().ok()) {
      left = inline_lane->device->Dispatch(inline_lane, std::move(job),
                                           inline_layout, submitted, estimate,
                                           /*may_wait=*/false);
    } else {
      // This thread cannot make the device current: the lane's thread,
      // which has it current, takes the job.
      CUDA_LOG_IF_ERROR_STATUS(scoped.status());
      left = std::move(job);
    }
  }
  absl::MutexLock lock(&inline_lane->mu);
  inline_lane->busy = false;
  if (left != nullptr) {
    // Memory or staging was not free at once: the lane thread waits for it.
    inline_lane->queue.push_front(
        {std::move(left), inline_layout, submitted, estimate});
  }
  inline_lane->cv.Signal();
}

}  // namespace matmul
