#include "gpu/cuda/timing.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gpu/cuda/cuda_status.h"

namespace matmul {

void SetDeviceStages(const EventTimes& ms, StageTimings& timings) {
  timings.h2d = (ms[1] - ms[0]) * 1e-3;
  timings.compute = (ms[2] - ms[1]) * 1e-3;
  timings.d2h = (ms[3] - ms[2]) * 1e-3;
}

absl::StatusOr<std::unique_ptr<EventSet>> EventPool::Take(bool timed) {
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::unique_ptr<EventSet>>& spare =
        timed ? spare_ : spare_untimed_;
    if (!spare.empty()) {
      std::unique_ptr<EventSet> events = std::move(spare.back());
      spare.pop_back();
      return events;
    }
  }
  const unsigned flags = timed ? cudaEventDefault : cudaEventDisableTiming;
  auto events = std::make_unique<EventSet>();
  if (timed) {
    ASSIGN_OR_RETURN(events->start, CreateEvent(flags));
    ASSIGN_OR_RETURN(events->h2d_done, CreateEvent(flags));
    ASSIGN_OR_RETURN(events->gemm_done, CreateEvent(flags));
  }
  ASSIGN_OR_RETURN(events->end, CreateEvent(flags));
  events->timed = timed;
  return events;
}

void EventPool::Return(std::unique_ptr<EventSet> events) {
  if (events == nullptr) return;
  absl::MutexLock lock(&mu_);
  (events->timed ? spare_ : spare_untimed_).push_back(std::move(events));
}

void EventPool::Clear() {
  absl::MutexLock lock(&mu_);
  spare_.clear();
  spare_untimed_.clear();
}

absl::Status DeviceClock::Refresh() {
  const CudaSite site{device_};
  ASSIGN_OR_RETURN(CudaEvent fresh, CreateEvent());
  CUDA_RETURN_IF_ERROR_AT(site, cudaEventRecord(fresh.get(), stream_));
  CUDA_RETURN_IF_ERROR_AT(site, cudaEventSynchronize(fresh.get()));
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  float ms = 0;
  if (anchor_) {
    CUDA_RETURN_IF_ERROR_AT(
        site, cudaEventElapsedTime(&ms, anchor_.get(), fresh.get()));
  }
  anchor_offset_ms_ += static_cast<double>(ms);
  anchor_ = std::move(fresh);
  anchor_host_ = now;
  return absl::OkStatus();
}

void DeviceClock::MaybeRefresh(absl::Time now) {
  const int64_t now_ns = absl::ToUnixNanos(now);
  int64_t anchored_ns = anchored_ns_.load(std::memory_order_relaxed);
  if (now_ns - anchored_ns > 5'000'000'000 &&
      anchored_ns_.compare_exchange_strong(anchored_ns, now_ns)) {
    CUDA_LOG_IF_ERROR_STATUS(Refresh());
  }
}

absl::StatusOr<double> DeviceClock::DeviceMs(cudaEvent_t event) const {
  absl::MutexLock lock(&mu_);
  float ms = 0;
  CUDA_RETURN_IF_ERROR_AT(CudaSite{device_},
                          cudaEventElapsedTime(&ms, anchor_.get(), event));
  return anchor_offset_ms_ + static_cast<double>(ms);
}

absl::Time DeviceClock::WallTime(double device_ms) const {
  absl::MutexLock lock(&mu_);
  return anchor_host_ + absl::Microseconds(static_cast<int64_t>(
                            (device_ms - anchor_offset_ms_) * 1e3));
}

void DeviceClock::Reset() {
  absl::MutexLock lock(&mu_);
  anchor_.Reset();
}

void BusyAccounting::Add(const EventTimes& ms) {
  absl::MutexLock lock(&mu_);
  busy_ms_ += busy_union_.Add(ms[0], ms[3]).added;
  for (auto [from, to] : {std::pair{ms[0], ms[1]}, std::pair{ms[2], ms[3]}}) {
    const IntervalUnion::Added copy =
        copy_union_.Add(from, to, &compute_union_);
    copy_ms_ += copy.added;
    overlap_ms_ += copy.overlap;
  }
  const IntervalUnion::Added compute =
      compute_union_.Add(ms[1], ms[2], &copy_union_);
  compute_ms_ += compute.added;
  overlap_ms_ += compute.overlap;
  // Streams run in order and report within seconds of finishing, so no
  // interval still to come starts a minute before the latest end.
  latest_end_ms_ = std::max(latest_end_ms_, ms[3]);
  const double horizon = latest_end_ms_ - 60e3;
  busy_union_.ForgetBefore(horizon);
  copy_union_.ForgetBefore(horizon);
  compute_union_.ForgetBefore(horizon);
}

BusyAccounting::Totals BusyAccounting::totals() const {
  absl::MutexLock lock(&mu_);
  Totals t;
  t.busy_seconds = busy_ms_ * 1e-3;
  t.compute_seconds = compute_ms_ * 1e-3;
  t.copy_seconds = copy_ms_ * 1e-3;
  t.overlap_seconds = overlap_ms_ * 1e-3;
  return t;
}

}  // namespace matmul
