// CudaEngine: opening and closing the engine, what it can take
// (CheckFits, MinimumDuration), its stats and host buffers. The request path
// is in dispatch.cc (Submit, lanes), enqueue.cc (the stream work of a job)
// and completion.cc (finishing jobs, device failure).
#include "gpu/cuda/cuda_engine.h"

#include <algorithm>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/device_registry.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/lane.h"

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
                     Device::Create(index, options_));
    DeviceInfo info = visible[index];
    info.staging_bytes = device->pinned->capacity();
    info_.devices.push_back(info);
    for (auto& lane : device->lanes) lanes_.push_back(lane.get());
    devices_.push_back(std::move(device));
  }

  for (auto& device : devices_) {
    Device* d = device.get();
    for (auto& lane : d->lanes) {
      Lane* l = lane.get();
      l->thread = std::thread([this, l] { LaneLoop(l); });
      NameThread(l->thread, absl::StrCat("mm-lane", d->index, ".", l->index));
    }
    for (int i = 0; i < options_.streams_per_device; ++i) {
      d->completion_threads.emplace_back([this, d] { CompletionLoop(d); });
      NameThread(d->completion_threads.back(),
                 absl::StrCat("mm-done", d->index, ".", i));
    }
    if (options_.completion_poll > absl::ZeroDuration()) {
      const int pollers = std::clamp(options_.pollers_per_device, 1,
                                     static_cast<int>(d->lanes.size()));
      for (int p = 0; p < pollers; ++p) {
        d->pollers.emplace_back(
            [this, d, p, pollers] { PollLoop(d, p, pollers); });
        NameThread(d->pollers.back(),
                   absl::StrCat("mm-poll", d->index, ".", p));
      }
    }
  }
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
    best_memory = std::max(best_memory, device->memory->budget());
    best_pinned = std::max(best_pinned, device->pinned->capacity());
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

absl::Status CudaEngine::Inject(FaultInjector::Point point, int64_t job) {
  return InjectFault(options_, point, job);
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
    Device* d = devices_[i].get();
    DeviceStats out;
    out.label = absl::StrCat(d->index);
    out.uuid = info_.devices[i].uuid;
    out.healthy = d->healthy.load();
    for (const auto& lane : d->lanes) {
      StreamStats s;
      s.jobs = lane->jobs.load(std::memory_order_relaxed);
      s.busy_seconds = lane->busy_seconds.load(std::memory_order_relaxed);
      out.streams.push_back(s);
    }
    const BusyAccounting::Totals busy = d->busy.totals();
    out.busy_seconds = busy.busy_seconds;
    out.compute_busy_seconds = busy.compute_seconds;
    out.copy_busy_seconds = busy.copy_seconds;
    out.copy_compute_overlap_seconds = busy.overlap_seconds;
    out.h2d_bytes = d->h2d_bytes.load(std::memory_order_relaxed);
    out.d2h_bytes = d->d2h_bytes.load(std::memory_order_relaxed);
    for (int i = 0; i < kNumDTypes; ++i) {
      out.flops[i] = d->flops[i].load(std::memory_order_relaxed);
    }
    out.staging_used_bytes = d->pinned->used();
    out.staging_total_bytes = d->pinned->capacity();
    out.device_memory_used_bytes = d->memory->reserved();
    out.queued_jobs = d->queued.load(std::memory_order_relaxed);
    for (const auto& lane : d->lanes) {
      if (lane->graphs == nullptr) continue;
      out.graph_jobs += lane->graphs->launches();
      out.graphs_recorded += lane->graphs->recorded();
      out.graphs_evicted += lane->graphs->evicted();
    }
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

void CudaEngine::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Lanes dispatch what they hold, then the completion threads finish every
  // job in flight.
  for (Lane* lane : lanes_) {
    absl::MutexLock lock(&lane->mu);
    lane->stopping = true;
    lane->cv.Signal();
  }
  for (Lane* lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
  for (auto& device : devices_) {
    {
      absl::MutexLock lock(&device->done_mu);
      device->stopping = true;
      device->done_cv.SignalAll();
      device->poll_cv.SignalAll();
    }
    for (std::thread& t : device->pollers) {
      if (t.joinable()) t.join();
    }
    for (std::thread& t : device->completion_threads) {
      if (t.joinable()) t.join();
    }
  }
}

}  // namespace matmul
