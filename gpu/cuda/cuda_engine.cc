#include "gpu/cuda/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/cuda/cublas_gemm.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device_registry.h"
#include "gpu/cuda/pinned_pool.h"
#include "gpu/cuda/stream_pool.h"
#include "gpu/interval_union.h"

namespace matmul {
namespace {

// The poller's pause between rounds of event queries that find nothing.
constexpr absl::Duration kPollInterval = absl::Microseconds(5);

// Device allocations are carved into A, B and C at this alignment.
constexpr int64_t kDeviceAlignment = 256;

int64_t AlignUp(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

int64_t DeviceBytes(const MatmulSpec& spec) {
  return AlignUp(spec.a_bytes(), kDeviceAlignment) +
         AlignUp(spec.b_bytes(), kDeviceAlignment) +
         AlignUp(spec.c_bytes(), kDeviceAlignment);
}

}  // namespace

// Where a job's operands and result live, and the memory it needs.
struct JobLayout {
  JobKind kind = JobKind::kMultiply;
  bool stage_a = false;  // A is copied to the device by this job
  bool stage_b = false;
  bool keep = false;            // the result stays on the device
  bool return_c = false;        // the result is copied back into staging
  int64_t transient_bytes = 0;  // device memory freed when the job ends
  int64_t kept_bytes = 0;       // device memory that becomes resident
  int64_t pinned_bytes = 0;     // staging: staged operands, returned C
  int64_t moved_bytes = 0;      // over the bus, both directions
  int required_device = -1;     // where resident operands are, or asked
  int64_t byte_offset = 0;      // into the upload target or download source
};

namespace {

absl::StatusOr<JobLayout> LayoutOf(const MatmulJob& job) {
  const MatmulSpec& spec = job.spec();
  const std::shared_ptr<ResidentTensor> ra = job.resident_a();
  const std::shared_ptr<ResidentTensor> rb = job.resident_b();
  const std::shared_ptr<ResidentTensor> target =
      job.kind() == JobKind::kUpload ? job.upload_target() : nullptr;
  JobLayout l;
  l.kind = job.kind();
  const bool upload = l.kind == JobKind::kUpload;
  const bool allocate = l.kind == JobKind::kAllocate;
  l.stage_a = l.kind != JobKind::kDownload && !allocate && !ra;
  l.stage_b = l.kind == JobKind::kMultiply && !rb;
  l.keep = (upload && target == nullptr) || allocate ||
           (l.kind == JobKind::kMultiply && job.keep_result());
  l.return_c = !l.keep && !upload;
  l.transient_bytes =
      (l.stage_a && !upload ? AlignUp(spec.a_bytes(), kDeviceAlignment) : 0) +
      (l.stage_b ? AlignUp(spec.b_bytes(), kDeviceAlignment) : 0) +
      (l.kind == JobKind::kMultiply && !l.keep
           ? AlignUp(spec.c_bytes(), kDeviceAlignment)
           : 0);
  l.kept_bytes = (upload || allocate) && l.keep
                     ? AlignUp(spec.a_bytes(), kDeviceAlignment)
                 : l.keep ? AlignUp(spec.c_bytes(), kDeviceAlignment)
                          : 0;
  const int64_t staged =
      (l.stage_a ? spec.a_bytes() : 0) + (l.stage_b ? spec.b_bytes() : 0);
  l.pinned_bytes =
      (job.prestaged() ? 0 : staged) + (l.return_c ? spec.c_bytes() : 0);
  l.moved_bytes = staged + (l.return_c ? spec.c_bytes() : 0);
  if (absl::Status bounds = CheckTransferBounds(job); !bounds.ok()) {
    return bounds;
  }
  l.byte_offset = job.byte_offset();
  l.required_device = job.device();
  for (const auto& r : {ra, rb, target}) {
    if (r == nullptr) continue;
    if (l.required_device >= 0 && l.required_device != r->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the operands live on different GPUs (", l.required_device, " and ",
          r->device(), "); download one and upload it to the other"));
    }
    l.required_device = r->device();
  }
  return l;
}

// Rough seconds of device work, for least-outstanding-work scheduling only.
double EstimatedSeconds(const MatmulSpec& spec, const JobLayout& layout) {
  double rate = 50e12;  // float32 strict
  if (spec.dtype == DType::kFloat64) rate = 50e12;
  if (spec.dtype == DType::kFloat16 || spec.dtype == DType::kBFloat16) {
    rate = 600e12;
  }
  if (spec.dtype == DType::kFloat32 && spec.compute == ComputeMode::kTf32) {
    rate = 300e12;
  }
  const double flops = layout.kind == JobKind::kMultiply ? spec.flops() : 0.0;
  return static_cast<double>(layout.moved_bytes) / 40e9 + flops / rate + 10e-6;
}

void AtomicAddDouble(std::atomic<double>& target, double delta) {
  double old = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(old, old + delta,
                                       std::memory_order_relaxed)) {
  }
}

// The four timing events of one job on its stream.
struct EventSet {
  CudaEvent start;
  CudaEvent h2d_done;
  CudaEvent gemm_done;
  CudaEvent end;
};

}  // namespace

// A job between its enqueue on a stream and its completion.
struct CudaEngine::InFlight {
  std::unique_ptr<MatmulJob> job;
  Device* device = nullptr;
  Lane* lane = nullptr;
  int64_t job_id = 0;
  MatmulSpec spec;
  double estimate = 0;  // seconds, as added to the lane's outstanding work
  JobLayout layout;
  int64_t device_bytes = 0;  // reserved against the device budget
  // Resident operands, held until the job's stream work is done.
  std::shared_ptr<ResidentTensor> resident_a;
  std::shared_ptr<ResidentTensor> resident_b;
  std::shared_ptr<ResidentTensor> upload_target;
  void* kept = nullptr;  // device memory that becomes the resident result
  PinnedPool::Lease lease;
  std::byte* host_c = nullptr;
  std::unique_ptr<EventSet> events;
  StageTimings timings;
  absl::Status status;  // an error met while enqueueing
  // Set by whoever completes the job: the poller, a completion thread or
  // FailDevice (under the device's done_mu; see Claim).
  bool claimed = false;
  // One reference for the host function's path, one for the completer's,
  // and one more while the poller queries the job's end event; the last to
  // let go frees the record (Release).
  std::atomic<int> refs{2};
};

struct CudaEngine::Lane {
  Device* device = nullptr;
  int index = 0;  // stream index within the device
  PooledStream* stream = nullptr;
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
  // the poller. Guarded by device->done_mu.
  std::deque<InFlight*> unclaimed;
  // Seconds of estimated work queued or running on this stream.
  std::atomic<double> outstanding{0};
  std::thread thread;
  // Stats (updated by completion threads).
  std::atomic<int64_t> jobs{0};
  std::atomic<double> busy_seconds{0};
};

struct CudaEngine::Device {
  int index = 0;
  CudaEngine* engine = nullptr;
  std::unique_ptr<StreamPool> streams;
  std::unique_ptr<PinnedPool> pinned;
  cudaMemPool_t memory_pool = nullptr;
  std::vector<std::unique_ptr<Lane>> lanes;

  // Device memory budget: bytes reserved by jobs in flight.
  absl::Mutex memory_mu;
  absl::CondVar memory_freed;
  int64_t memory_budget = 0;
  int64_t memory_reserved ABSL_GUARDED_BY(memory_mu) = 0;

  // Idle stream used only to record clock anchors (completes at once).
  CudaStream anchor_stream;
  absl::Mutex clock_mu;
  CudaEvent anchor ABSL_GUARDED_BY(clock_mu);
  absl::Time anchor_host ABSL_GUARDED_BY(clock_mu);
  double anchor_offset_ms ABSL_GUARDED_BY(clock_mu) = 0;

  // Spare timing events.
  absl::Mutex events_mu;
  std::vector<std::unique_ptr<EventSet>> spare_events
      ABSL_GUARDED_BY(events_mu);

  // Jobs enqueued and not completed; the completion queue.
  absl::Mutex done_mu;
  absl::CondVar done_cv;
  std::set<InFlight*> in_flight ABSL_GUARDED_BY(done_mu);
  std::deque<InFlight*> done ABSL_GUARDED_BY(done_mu);
  bool stopping ABSL_GUARDED_BY(done_mu) = false;
  std::vector<std::thread> completion_threads;
  // The poller sleeps on poll_cv until the next enqueue counts up.
  absl::CondVar poll_cv;
  int64_t enqueued ABSL_GUARDED_BY(done_mu) = 0;
  std::thread poller;

  // False once the device's context has failed (sticky CUDA error).
  std::atomic<bool> healthy{true};
  absl::Status failure ABSL_GUARDED_BY(done_mu);
  // When the clock anchor was last refreshed (Unix ns).
  std::atomic<int64_t> anchored_ns{0};

  absl::Status Failure() {
    absl::MutexLock lock(&done_mu);
    return failure;
  }

  // Busy accounting in device milliseconds (unions over streams).
  mutable absl::Mutex stats_mu;
  IntervalUnion busy_union ABSL_GUARDED_BY(stats_mu);
  IntervalUnion copy_union ABSL_GUARDED_BY(stats_mu);
  IntervalUnion compute_union ABSL_GUARDED_BY(stats_mu);
  double busy_ms ABSL_GUARDED_BY(stats_mu) = 0;
  double copy_ms ABSL_GUARDED_BY(stats_mu) = 0;
  double compute_ms ABSL_GUARDED_BY(stats_mu) = 0;
  double overlap_ms ABSL_GUARDED_BY(stats_mu) = 0;
  double latest_end_ms ABSL_GUARDED_BY(stats_mu) = 0;
  std::atomic<int64_t> h2d_bytes{0};
  std::atomic<int64_t> d2h_bytes{0};
  std::array<std::atomic<double>, kNumDTypes> flops{};
  std::atomic<int64_t> queued{0};

  absl::StatusOr<std::unique_ptr<EventSet>> TakeEvents();
  void ReturnEvents(std::unique_ptr<EventSet> events);
  absl::Status ReserveMemory(int64_t bytes, MatmulJob& job);
  // Reserves `bytes` if they are free now; false otherwise.
  bool TryReserveMemory(int64_t bytes);
  void ReleaseMemory(int64_t bytes);
  // Milliseconds on this device's clock, and wall time, of a completed event.
  absl::StatusOr<double> DeviceMs(cudaEvent_t event);
  absl::Time WallTime(double device_ms);
  void RefreshAnchor();
};

absl::StatusOr<std::unique_ptr<EventSet>> CudaEngine::Device::TakeEvents() {
  {
    absl::MutexLock lock(&events_mu);
    if (!spare_events.empty()) {
      std::unique_ptr<EventSet> events = std::move(spare_events.back());
      spare_events.pop_back();
      return events;
    }
  }
  auto events = std::make_unique<EventSet>();
  ASSIGN_OR_RETURN(events->start, CreateEvent());
  ASSIGN_OR_RETURN(events->h2d_done, CreateEvent());
  ASSIGN_OR_RETURN(events->gemm_done, CreateEvent());
  ASSIGN_OR_RETURN(events->end, CreateEvent());
  return events;
}

void CudaEngine::Device::ReturnEvents(std::unique_ptr<EventSet> events) {
  if (events == nullptr) return;
  absl::MutexLock lock(&events_mu);
  spare_events.push_back(std::move(events));
}

absl::Status CudaEngine::Device::ReserveMemory(int64_t bytes, MatmulJob& job) {
  absl::MutexLock lock(&memory_mu);
  while (memory_reserved + bytes > memory_budget) {
    if (absl::Status stop = job.Abandoned(); !stop.ok()) return stop;
    if (!job.wait_for_memory()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("GPU ", index, " has ", memory_budget - memory_reserved,
                       " of ", memory_budget, " bytes free now and this needs ",
                       bytes, "; retry later"));
    }
    memory_freed.WaitWithTimeout(&memory_mu, absl::Milliseconds(50));
  }
  memory_reserved += bytes;
  return absl::OkStatus();
}

bool CudaEngine::Device::TryReserveMemory(int64_t bytes) {
  absl::MutexLock lock(&memory_mu);
  if (memory_reserved + bytes > memory_budget) return false;
  memory_reserved += bytes;
  return true;
}

void CudaEngine::Device::ReleaseMemory(int64_t bytes) {
  absl::MutexLock lock(&memory_mu);
  memory_reserved -= bytes;
  memory_freed.SignalAll();
}

absl::StatusOr<double> CudaEngine::Device::DeviceMs(cudaEvent_t event) {
  absl::MutexLock lock(&clock_mu);
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, anchor.get(), event));
  return anchor_offset_ms + static_cast<double>(ms);
}

absl::Time CudaEngine::Device::WallTime(double device_ms) {
  absl::MutexLock lock(&clock_mu);
  return anchor_host + absl::Microseconds(static_cast<int64_t>(
                           (device_ms - anchor_offset_ms) * 1e3));
}

// Event timestamps are float milliseconds relative to an anchor event; a
// fresh anchor every few seconds keeps them precise to about a microsecond.
void CudaEngine::Device::RefreshAnchor() {
  absl::StatusOr<CudaEvent> fresh = CreateEvent();
  if (!fresh.ok()) return;
  if (cudaEventRecord(fresh->get(), anchor_stream.get()) != cudaSuccess ||
      cudaEventSynchronize(fresh->get()) != cudaSuccess) {
    return;
  }
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&clock_mu);
  float ms = 0;
  if (anchor &&
      cudaEventElapsedTime(&ms, anchor.get(), fresh->get()) != cudaSuccess) {
    return;
  }
  anchor_offset_ms += static_cast<double>(ms);
  anchor = std::move(*fresh);
  anchor_host = now;
}

namespace {

// Host function at the end of a job's stream work: hands the job to the
// completion threads. Must not call CUDA.
void CUDART_CB OnStreamDone(void* user_data) {
  auto* flight = static_cast<CudaEngine::InFlight*>(user_data);
  CudaEngine::Device* device = flight->device;
  absl::MutexLock lock(&device->done_mu);
  device->done.push_back(flight);
  device->done_cv.Signal();
}

// Makes the caller the one that completes `flight`; false if another
// already is. The caller holds the device's done_mu.
bool Claim(CudaEngine::InFlight* flight) {
  if (flight->claimed) return false;
  flight->claimed = true;
  std::deque<CudaEngine::InFlight*>& unclaimed = flight->lane->unclaimed;
  auto it = std::find(unclaimed.begin(), unclaimed.end(), flight);
  if (it != unclaimed.end()) unclaimed.erase(it);
  return true;
}

void Release(CudaEngine::InFlight* flight) {
  if (flight->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete flight;
}

}  // namespace

CudaEngine::CudaEngine(const CudaEngineOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(
    const CudaEngineOptions& options) {
  if (options.streams_per_device < 1 || options.streams_per_device > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams per device must be in [1, 64], got ",
                     options.streams_per_device));
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
    ScopedDevice scoped(index);
    auto device = std::make_unique<Device>();
    device->index = index;
    device->engine = this;
    ASSIGN_OR_RETURN(device->streams,
                     StreamPool::Create(index, options_.streams_per_device,
                                        options_.cublas_workspace_bytes));
    ASSIGN_OR_RETURN(PinnedBuffer pinned,
                     PinnedBuffer::Allocate(options_.pinned_bytes_per_device));
    // The pool owns the region through a HostBuffer that frees it.
    auto* region = new PinnedBuffer(std::move(pinned));
    device->pinned = std::make_unique<PinnedPool>(
        HostBuffer(region->data(), static_cast<int64_t>(region->size()),
                   [region] { delete region; }));

    // Stream-ordered allocations from the device's default pool, which keeps
    // freed memory for reuse instead of returning it to the driver.
    CUDA_RETURN_IF_ERROR(
        cudaDeviceGetDefaultMemPool(&device->memory_pool, index));
    uint64_t keep = std::numeric_limits<uint64_t>::max();
    CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(
        device->memory_pool, cudaMemPoolAttrReleaseThreshold, &keep));
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    device->memory_budget =
        std::max<int64_t>(0, static_cast<int64_t>(free_bytes) -
                                 options_.device_memory_reserve_bytes);

    ASSIGN_OR_RETURN(device->anchor_stream, CreateStream());
    device->RefreshAnchor();
    {
      absl::MutexLock lock(&device->clock_mu);
      if (!device->anchor) {
        return absl::InternalError(
            absl::StrCat("device ", index, ": cannot record a clock anchor"));
      }
    }

    DeviceInfo info = visible[index];
    info.staging_bytes = device->pinned->capacity();
    info_.devices.push_back(info);

    for (int s = 0; s < options_.streams_per_device; ++s) {
      auto lane = std::make_unique<Lane>();
      lane->device = device.get();
      lane->index = s;
      lane->stream = &device->streams->at(s);
      lanes_.push_back(lane.get());
      device->lanes.push_back(std::move(lane));
    }
    devices_.push_back(std::move(device));
  }

  for (auto& device : devices_) {
    Device* d = device.get();
    for (auto& lane : d->lanes) {
      Lane* l = lane.get();
      l->thread = std::thread([this, l] { LaneLoop(l); });
    }
    for (int i = 0; i < options_.streams_per_device; ++i) {
      d->completion_threads.emplace_back([this, d] { CompletionLoop(d); });
    }
    if (options_.completion_poll > absl::ZeroDuration()) {
      d->poller = std::thread([this, d] { PollLoop(d); });
    }
  }
  return absl::OkStatus();
}

CudaEngine::~CudaEngine() {
  Shutdown();
  // Resources go in a fixed order, each with its device current: streams
  // (synchronized first) and handles, then the pinned region.
  for (auto& device : devices_) {
    ScopedDevice scoped(device->index);
    device->lanes.clear();
    device->streams.reset();
    {
      absl::MutexLock lock(&device->events_mu);
      device->spare_events.clear();
    }
    {
      absl::MutexLock lock(&device->clock_mu);
      device->anchor.Reset();
    }
    device->anchor_stream.Reset();
    device->pinned.reset();
  }
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
    best_memory = std::max(best_memory, device->memory_budget);
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

CudaEngine::Lane* CudaEngine::PickLane(const JobLayout& layout) const {
  const int64_t device_bytes = layout.transient_bytes + layout.kept_bytes;
  Lane* best = nullptr;
  double best_work = std::numeric_limits<double>::infinity();
  for (Lane* lane : lanes_) {
    Device* d = lane->device;
    if (!d->healthy.load(std::memory_order_relaxed) ||
        (layout.required_device >= 0 && d->index != layout.required_device) ||
        device_bytes > d->memory_budget ||
        layout.pinned_bytes > d->pinned->capacity()) {
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

absl::Status CudaEngine::Inject(FaultInjector::Point point, int64_t job) {
  if (options_.fault_injector == nullptr) return absl::OkStatus();
  return options_.fault_injector->Inject(point, job);
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

void CudaEngine::Submit(std::unique_ptr<MatmulJob> job) {
  absl::Status refused;
  Lane* inline_lane = nullptr;  // dispatch here, on the submitting thread
  JobLayout inline_layout;
  absl::Time submitted;
  double estimate = 0;
  {
    absl::ReaderMutexLock shutdown_lock(&shutdown_mu_);
    absl::StatusOr<JobLayout> layout = LayoutOf(*job);
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
      lane->device->queued.fetch_add(1, std::memory_order_relaxed);
      submitted = absl::Now();
      absl::MutexLock lock(&lane->mu);
      // 0 turns this off even for jobs that stage nothing.
      if (options_.inline_dispatch_max_bytes > 0 && lane->queue.empty() &&
          !lane->busy &&
          layout->pinned_bytes <= options_.inline_dispatch_max_bytes) {
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
    ScopedDevice scoped(inline_lane->device->index);
    left = Dispatch(inline_lane, std::move(job), inline_layout, submitted,
                    estimate, /*may_wait=*/false);
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

void CudaEngine::LaneLoop(Lane* lane) {
  cudaSetDevice(lane->device->index);
  while (true) {
    Lane::Queued next;
    {
      absl::MutexLock lock(&lane->mu);
      while (lane->busy || (lane->queue.empty() && !lane->stopping)) {
        lane->cv.Wait(&lane->mu);
      }
      if (lane->queue.empty()) return;  // stopping, and nothing is left
      next = std::move(lane->queue.front());
      lane->queue.pop_front();
      lane->busy = true;
    }
    Dispatch(lane, std::move(next.job), next.layout, next.submitted,
             next.estimate, /*may_wait=*/true);
    absl::MutexLock lock(&lane->mu);
    lane->busy = false;
  }
}

std::unique_ptr<MatmulJob> CudaEngine::Dispatch(
    Lane* lane, std::unique_ptr<MatmulJob> job, const JobLayout& layout,
    absl::Time submitted, double estimate, bool may_wait) {
  Device* d = lane->device;
  bool started = false;
  auto fail = [&](const absl::Status& status) {
    if (!started) d->queued.fetch_sub(1, std::memory_order_relaxed);
    AtomicAddDouble(lane->outstanding, -estimate);
    job->Done(status);
  };
  if (absl::Status abandoned = job->Abandoned(); !abandoned.ok()) {
    fail(abandoned);
    return nullptr;
  }
  if (!d->healthy.load(std::memory_order_relaxed)) {
    fail(d->Failure());
    return nullptr;
  }
  const MatmulSpec spec = job->spec();
  const int64_t device_bytes = layout.transient_bytes + layout.kept_bytes;
  std::optional<PinnedPool::Lease> lease;
  if (may_wait) {
    if (absl::Status reserved = d->ReserveMemory(device_bytes, *job);
        !reserved.ok()) {
      fail(reserved);
      return nullptr;
    }
    absl::StatusOr<PinnedPool::Lease> acquired = d->pinned->Acquire(
        layout.pinned_bytes, [&job] { return job->Abandoned(); });
    if (!acquired.ok()) {
      d->ReleaseMemory(device_bytes);
      fail(acquired.status());
      return nullptr;
    }
    lease = std::move(*acquired);
  } else {
    if (!d->TryReserveMemory(device_bytes)) return job;
    lease = d->pinned->TryAcquire(layout.pinned_bytes);
    if (!lease.has_value()) {
      d->ReleaseMemory(device_bytes);
      return job;
    }
  }
  const std::optional<PrestagedOperands> prestaged = job->prestaged();
  d->queued.fetch_sub(1, std::memory_order_relaxed);
  started = true;

  auto flight = std::make_unique<InFlight>();
  flight->device = d;
  flight->lane = lane;
  flight->job_id = next_job_.fetch_add(1, std::memory_order_relaxed);
  flight->spec = spec;
  flight->layout = layout;
  flight->estimate = estimate;
  flight->device_bytes = device_bytes;
  flight->resident_a = job->resident_a();
  flight->resident_b = job->resident_b();
  if (layout.kind == JobKind::kUpload)
    flight->upload_target = job->upload_target();
  const absl::Time start = absl::Now();
  flight->timings.queue = absl::ToDoubleSeconds(start - submitted);

  // Staging slot: [staged A][staged B][returned C], each part present only
  // when the layout needs it.
  std::byte* slot = lease->data();
  const int64_t a_staged = layout.stage_a && !prestaged ? spec.a_bytes() : 0;
  const int64_t b_staged = layout.stage_b && !prestaged ? spec.b_bytes() : 0;
  const std::byte* host_a = prestaged ? prestaged->a : slot;
  const std::byte* host_b = prestaged ? prestaged->b : slot + a_staged;
  flight->host_c = layout.return_c ? slot + a_staged + b_staged : nullptr;
  flight->lease = std::move(*lease);
  if (a_staged + b_staged > 0) {
    absl::Status written = job->WriteOperands(
        absl::MakeSpan(slot, static_cast<size_t>(a_staged)),
        absl::MakeSpan(slot + a_staged, static_cast<size_t>(b_staged)));
    flight->timings.stage_in = absl::ToDoubleSeconds(absl::Now() - start);
    if (!written.ok()) {
      d->ReleaseMemory(device_bytes);
      flight.reset();  // returns the lease
      fail(written);
      return nullptr;
    }
  }
  if (options_.poison_outputs && flight->host_c != nullptr) {
    std::memset(flight->host_c, 0xff, static_cast<size_t>(spec.c_bytes()));
  }
  absl::StatusOr<std::unique_ptr<EventSet>> events = d->TakeEvents();
  if (!events.ok()) {
    d->ReleaseMemory(device_bytes);
    flight.reset();
    fail(events.status());
    return nullptr;
  }
  flight->events = std::move(*events);
  flight->job = std::move(job);
  Enqueue(flight.release(), host_a, host_b);
  return nullptr;
}

void CudaEngine::Enqueue(InFlight* flight, const std::byte* host_a,
                         const std::byte* host_b) {
  Device* d = flight->device;
  const MatmulSpec& spec = flight->spec;
  cudaStream_t stream = flight->lane->stream->stream.get();
  EventSet& ev = *flight->events;
  {
    absl::MutexLock lock(&d->done_mu);
    d->in_flight.insert(flight);
  }
  const JobLayout& l = flight->layout;
  const bool upload = l.kind == JobKind::kUpload;
  void* memory = nullptr;  // transient: staged operands, returned C
  flight->status = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.start.get(), stream));
    RETURN_IF_ERROR(Inject(FaultInjector::Point::kDeviceAlloc, flight->job_id));
    if (l.transient_bytes > 0) {
      CUDA_RETURN_IF_ERROR(cudaMallocFromPoolAsync(
          &memory, static_cast<size_t>(l.transient_bytes), d->memory_pool,
          stream));
    }
    if (l.kept_bytes > 0) {
      CUDA_RETURN_IF_ERROR(cudaMallocFromPoolAsync(
          &flight->kept, static_cast<size_t>(l.kept_bytes), d->memory_pool,
          stream));
    }
    auto* next = static_cast<std::byte*>(memory);
    auto carve = [&next](int64_t bytes) {
      std::byte* p = next;
      next += AlignUp(bytes, kDeviceAlignment);
      return p;
    };
    const std::byte* device_a =
        flight->resident_a
            ? static_cast<const std::byte*>(flight->resident_a->data()) +
                  (l.kind == JobKind::kDownload ? l.byte_offset : 0)
        : flight->upload_target
            ? static_cast<const std::byte*>(flight->upload_target->data()) +
                  l.byte_offset
        : upload || l.kind == JobKind::kAllocate
            ? static_cast<std::byte*>(flight->kept)
            : carve(spec.a_bytes());
    const std::byte* device_b =
        flight->resident_b
            ? static_cast<const std::byte*>(flight->resident_b->data())
        : l.stage_b ? carve(spec.b_bytes())
                    : nullptr;
    if (l.stage_a) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(const_cast<std::byte*>(device_a),
                                           host_a, spec.a_bytes(),
                                           cudaMemcpyHostToDevice, stream));
    }
    if (l.stage_b) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(const_cast<std::byte*>(device_b),
                                           host_b, spec.b_bytes(),
                                           cudaMemcpyHostToDevice, stream));
    }
    if (l.kind == JobKind::kAllocate && options_.poison_outputs) {
      CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(flight->kept, 0xff, spec.a_bytes(), stream));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.h2d_done.get(), stream));
    const std::byte* device_c = device_a;  // download: C is A itself
    if (l.kind == JobKind::kMultiply) {
      std::byte* c = l.keep ? static_cast<std::byte*>(flight->kept)
                            : carve(spec.c_bytes());
      device_c = c;
      if (options_.poison_outputs) {
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c, 0xff, spec.c_bytes(), stream));
      }
      RETURN_IF_ERROR(Inject(FaultInjector::Point::kGemm, flight->job_id));
      RETURN_IF_ERROR(EnqueueGemm(flight->lane->stream->cublas.get(), spec,
                                  device_a, device_b, c));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.gemm_done.get(), stream));
    if (l.return_c) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(flight->host_c, device_c,
                                           spec.c_bytes(),
                                           cudaMemcpyDeviceToHost, stream));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.end.get(), stream));
    return absl::OkStatus();
  }();
  // Freed in stream order: later work on any stream can reuse it.
  if (memory != nullptr) cudaFreeAsync(memory, stream);
  if (!flight->status.ok() && flight->kept != nullptr) {
    cudaFreeAsync(flight->kept, stream);
    flight->kept = nullptr;
  }
  // Only a job whose every event was recorded may be polled: an event that
  // was not recorded (or still holds an earlier job's record) reads as done.
  if (flight->status.ok() && options_.completion_poll > absl::ZeroDuration()) {
    absl::MutexLock lock(&d->done_mu);
    flight->lane->unclaimed.push_back(flight);
    ++d->enqueued;
    d->poll_cv.Signal();
  }
  if (cudaLaunchHostFunc(stream, OnStreamDone, flight) != cudaSuccess) {
    // Error path only: wait for what was enqueued before handing back the
    // memory it reads, then complete here (unless the poller already has).
    cudaStreamSynchronize(stream);
    {
      absl::MutexLock lock(&d->done_mu);
      if (!flight->claimed && flight->status.ok()) {
        flight->status = absl::InternalError(
            "cudaLaunchHostFunc failed after the job was enqueued");
      }
    }
    OnStreamDone(flight);
  }
}

void CudaEngine::CompletionLoop(Device* d) {
  cudaSetDevice(d->index);
  absl::Time last_progress = absl::Now();
  while (true) {
    InFlight* flight = nullptr;
    bool mine = false;  // this thread completes it (the poller has not)
    {
      absl::MutexLock lock(&d->done_mu);
      while (d->done.empty() && !(d->stopping && d->in_flight.empty())) {
        if (d->done_cv.WaitWithTimeout(&d->done_mu, absl::Seconds(1)) &&
            d->done.empty() && !d->in_flight.empty()) {
          break;  // timed out with work in flight: look at the device below
        }
      }
      if (!d->done.empty()) {
        flight = d->done.front();
        d->done.pop_front();
        d->in_flight.erase(flight);
        mine = Claim(flight);
      } else if (d->stopping && d->in_flight.empty()) {
        return;
      }
    }
    const absl::Time now = absl::Now();
    if (flight != nullptr) {
      last_progress = now;
      if (mine) {
        Complete(flight);
        Release(flight);  // the completer's reference
      }
      Release(flight);  // the host function's
    } else if (now - last_progress > absl::Seconds(1)) {
      // Nothing completed for a while: a broken context never runs host
      // functions, so ask the streams directly.
      for (auto& lane : d->lanes) {
        const cudaError_t error = cudaStreamQuery(lane->stream->stream.get());
        if (error != cudaSuccess && error != cudaErrorNotReady) {
          FailDevice(d, CudaStatus(error, "cudaStreamQuery"));
          break;
        }
      }
    }
    const int64_t now_ns = absl::ToUnixNanos(now);
    int64_t anchored_ns = d->anchored_ns.load(std::memory_order_relaxed);
    if (now_ns - anchored_ns > 5'000'000'000 &&
        d->anchored_ns.compare_exchange_strong(anchored_ns, now_ns)) {
      d->RefreshAnchor();
    }
  }
}

void CudaEngine::PollLoop(Device* d) {
  cudaSetDevice(d->index);
  const absl::Duration window = options_.completion_poll;
  int64_t seen = 0;  // d->enqueued when last looked at
  absl::Time poll_until = absl::InfinitePast();
  std::vector<std::pair<InFlight*, cudaEvent_t>> fronts;
  std::vector<InFlight*> finished;
  while (true) {
    // The oldest unclaimed job of each stream, referenced so that it stays
    // allocated while its event is queried outside the lock.
    fronts.clear();
    {
      absl::MutexLock lock(&d->done_mu);
      while (true) {
        if (d->stopping) return;
        if (d->enqueued != seen) {
          seen = d->enqueued;
          poll_until = absl::Now() + window;
        }
        for (auto& lane : d->lanes) {
          if (lane->unclaimed.empty()) continue;
          InFlight* front = lane->unclaimed.front();
          front->refs.fetch_add(1, std::memory_order_relaxed);
          fronts.emplace_back(front, front->events->end.get());
        }
        if (!fronts.empty() && absl::Now() < poll_until) break;
        for (auto& [flight, event] : fronts) Release(flight);
        fronts.clear();
        // Nothing to poll, or polling found nothing for a whole window: the
        // host functions complete what is in flight; wake at the next job.
        while (!d->stopping && d->enqueued == seen) {
          d->poll_cv.Wait(&d->done_mu);
        }
      }
    }
    // An event that reads done belongs to its job as long as the job is
    // unclaimed: events go back to the spare list only in Complete.
    finished.clear();
    for (auto& [flight, event] : fronts) {
      if (cudaEventQuery(event) == cudaSuccess) finished.push_back(flight);
    }
    if (!finished.empty()) {
      absl::MutexLock lock(&d->done_mu);
      for (InFlight*& flight : finished) {
        if (!Claim(flight)) flight = nullptr;
      }
      poll_until = absl::Now() + window;
    }
    for (InFlight* flight : finished) {
      if (flight == nullptr) continue;
      Complete(flight);
      Release(flight);  // the completer's reference
    }
    for (auto& [flight, event] : fronts) Release(flight);  // the query's
    if (finished.empty()) {
      // A pause between rounds of queries, without CUDA calls: the driver
      // serializes them with the enqueues of the lanes and submitters.
      const absl::Time resume = absl::Now() + kPollInterval;
      while (absl::Now() < resume) {
      }
    }
  }
}

// Device memory kept between requests. Its reservation against the device
// budget ends, and the memory is freed in stream order, when the last
// reference goes (after every job that used it has completed, since jobs
// hold references until then).
class CudaEngine::CudaResidentTensor final : public ResidentTensor {
 public:
  CudaResidentTensor(Device* device, DType dtype, int64_t batch, int64_t rows,
                     int64_t cols, void* data, int64_t reserved)
      : ResidentTensor(device->index, dtype, batch, rows, cols, data),
        device_(device),
        reserved_(reserved) {}
  ~CudaResidentTensor() override {
    ScopedDevice scoped(device_->index);
    cudaFreeAsync(const_cast<void*>(data()), device_->anchor_stream.get());
    device_->ReleaseMemory(reserved_);
  }

 private:
  Device* const device_;
  const int64_t reserved_;
};

void CudaEngine::Complete(InFlight* flight) {
  // The job goes with this call; the record stays until Release.
  std::unique_ptr<MatmulJob> job = std::move(flight->job);
  Device* d = flight->device;
  Lane* lane = flight->lane;
  const MatmulSpec& spec = flight->spec;
  absl::Status status = flight->status;
  if (status.ok()) {
    status = Inject(FaultInjector::Point::kCompletion, flight->job_id);
  }
  std::array<double, 4> ms{};  // start, h2d_done, gemm_done, end
  if (status.ok()) {
    const EventSet& ev = *flight->events;
    const cudaEvent_t events[4] = {ev.start.get(), ev.h2d_done.get(),
                                   ev.gemm_done.get(), ev.end.get()};
    for (int i = 0; i < 4 && status.ok(); ++i) {
      absl::StatusOr<double> t = d->DeviceMs(events[i]);
      if (t.ok()) {
        ms[i] = *t;
      } else {
        status = t.status();
      }
    }
  }
  const JobLayout& l = flight->layout;
  if (!status.ok() && flight->kept != nullptr) {
    cudaFreeAsync(flight->kept, d->anchor_stream.get());
    flight->kept = nullptr;
  }
  // Kept memory stays reserved: the resident tensor releases it.
  d->ReleaseMemory(flight->device_bytes -
                   (flight->kept != nullptr ? l.kept_bytes : 0));
  d->ReturnEvents(std::move(flight->events));
  AtomicAddDouble(lane->outstanding, -flight->estimate);
  flight->resident_a.reset();
  flight->resident_b.reset();
  flight->upload_target.reset();
  if (!status.ok()) {
    job->Done(status);
    return;
  }

  flight->timings.h2d = (ms[1] - ms[0]) * 1e-3;
  flight->timings.compute = (ms[2] - ms[1]) * 1e-3;
  flight->timings.d2h = (ms[3] - ms[2]) * 1e-3;
  lane->jobs.fetch_add(1, std::memory_order_relaxed);
  AtomicAddDouble(lane->busy_seconds, (ms[3] - ms[0]) * 1e-3);
  d->h2d_bytes.fetch_add(
      (l.stage_a ? spec.a_bytes() : 0) + (l.stage_b ? spec.b_bytes() : 0),
      std::memory_order_relaxed);
  d->d2h_bytes.fetch_add(l.return_c ? spec.c_bytes() : 0,
                         std::memory_order_relaxed);
  if (l.kind == JobKind::kMultiply) {
    AtomicAddDouble(d->flops[static_cast<int>(spec.dtype)], spec.flops());
  }
  {
    absl::MutexLock lock(&d->stats_mu);
    d->busy_ms += d->busy_union.Add(ms[0], ms[3]).added;
    for (auto [from, to] : {std::pair{ms[0], ms[1]}, std::pair{ms[2], ms[3]}}) {
      const IntervalUnion::Added copy =
          d->copy_union.Add(from, to, &d->compute_union);
      d->copy_ms += copy.added;
      d->overlap_ms += copy.overlap;
    }
    const IntervalUnion::Added compute =
        d->compute_union.Add(ms[1], ms[2], &d->copy_union);
    d->compute_ms += compute.added;
    d->overlap_ms += compute.overlap;
    // Streams run in order and report within seconds of finishing, so no
    // interval still to come starts a minute before the latest end.
    d->latest_end_ms = std::max(d->latest_end_ms, ms[3]);
    const double horizon = d->latest_end_ms - 60e3;
    d->busy_union.ForgetBefore(horizon);
    d->copy_union.ForgetBefore(horizon);
    d->compute_union.ForgetBefore(horizon);
  }
  const StreamSpan::Kind kinds[3] = {StreamSpan::Kind::kH2D,
                                     StreamSpan::Kind::kCompute,
                                     StreamSpan::Kind::kD2H};
  for (int i = 0; i < 3; ++i) {
    StreamSpan span;
    span.device = d->index;
    span.stream = lane->index;
    span.kind = kinds[i];
    span.job = flight->job_id;
    span.start = d->WallTime(ms[i]);
    span.end = d->WallTime(ms[i + 1]);
    spans_.Add(span);
  }

  JobResult result(
      absl::MakeConstSpan(flight->host_c,
                          l.return_c ? static_cast<size_t>(spec.c_bytes()) : 0),
      Placement{d->index, lane->index}, flight->timings,
      [lease = std::move(flight->lease)]() mutable { lease.Release(); });
  if (flight->kept != nullptr) {
    const bool upload =
        l.kind == JobKind::kUpload || l.kind == JobKind::kAllocate;
    result.set_resident(std::make_shared<CudaResidentTensor>(
        d, spec.dtype, upload ? spec.a_batch : spec.batch, spec.m,
        upload ? spec.k : spec.n, flight->kept, l.kept_bytes));
  }
  job->Done(std::move(result));
}

void CudaEngine::FailDevice(Device* d, const absl::Status& cause) {
  const absl::Status status = absl::InternalError(
      absl::StrCat("GPU ", d->index, " failed: ", cause.message()));
  std::set<InFlight*> victims;
  {
    absl::MutexLock lock(&d->done_mu);
    if (!d->healthy.load()) return;
    d->healthy.store(false);
    d->failure = status;
    // Jobs the poller has already claimed are its to finish.
    for (InFlight* flight : d->in_flight) {
      if (Claim(flight)) victims.insert(flight);
    }
    d->in_flight.clear();
  }
  LogLine(absl::StrCat("error: ", status.message(), "; failing ",
                       victims.size(), " requests in flight on it"));
  // A failed context never runs the jobs' host functions, so each job is
  // finished here. The InFlight records are left allocated on purpose: the
  // stream could in principle still reference them.
  for (InFlight* flight : victims) {
    flight->job->Done(status);
    d->ReleaseMemory(flight->device_bytes);
    AtomicAddDouble(flight->lane->outstanding, -flight->estimate);
    flight->lease.Release();
  }
}

EngineStats CudaEngine::stats() const {
  EngineStats stats;
  for (const auto& device : devices_) {
    Device* d = device.get();
    DeviceStats out;
    out.label = absl::StrCat(d->index);
    for (const auto& lane : d->lanes) {
      StreamStats s;
      s.jobs = lane->jobs.load(std::memory_order_relaxed);
      s.busy_seconds = lane->busy_seconds.load(std::memory_order_relaxed);
      out.streams.push_back(s);
    }
    {
      absl::MutexLock lock(&d->stats_mu);
      out.busy_seconds = d->busy_ms * 1e-3;
      out.compute_busy_seconds = d->compute_ms * 1e-3;
      out.copy_busy_seconds = d->copy_ms * 1e-3;
      out.copy_compute_overlap_seconds = d->overlap_ms * 1e-3;
    }
    out.h2d_bytes = d->h2d_bytes.load(std::memory_order_relaxed);
    out.d2h_bytes = d->d2h_bytes.load(std::memory_order_relaxed);
    for (int i = 0; i < kNumDTypes; ++i) {
      out.flops[i] = d->flops[i].load(std::memory_order_relaxed);
    }
    out.staging_used_bytes = d->pinned->used();
    out.staging_total_bytes = d->pinned->capacity();
    {
      absl::MutexLock lock(&d->memory_mu);
      out.device_memory_used_bytes = d->memory_reserved;
    }
    out.queued_jobs = d->queued.load(std::memory_order_relaxed);
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
    if (device->poller.joinable()) device->poller.join();
    for (std::thread& t : device->completion_threads) {
      if (t.joinable()) t.join();
    }
  }
}

}  // namespace matmul
