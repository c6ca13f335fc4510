#include "server/idle_memory_trimmer.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/log.h"
#include "server/http/process_collector.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace matmul {

IdleMemoryTrimmer::IdleMemoryTrimmer(absl::Duration quiet, ActivityProbe probe,
                                     TrimFunction trim)
    : quiet_(quiet), probe_(std::move(probe)), trim_(std::move(trim)) {}

IdleMemoryTrimmer::~IdleMemoryTrimmer() {
  if (thread_.joinable()) {
    stop_.Notify();
    thread_.join();
  }
}

bool IdleMemoryTrimmer::Tick(absl::Time now) {
  const Activity activity = probe_();
  if (activity.busy || activity.calls_started != last_calls_) {
    last_calls_ = activity.calls_started;
    last_work_ = now;
    worked_since_trim_ = true;
    return false;
  }
  if (!worked_since_trim_ || now - last_work_ < quiet_) return false;
  worked_since_trim_ = false;
  trim_();
  trims_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void IdleMemoryTrimmer::Start() {
  const absl::Duration period = std::min(quiet_ / 4, absl::Seconds(1));
  thread_ = std::thread([this, period] {
    while (!stop_.WaitForNotificationWithTimeout(period)) Tick(absl::Now());
  });
}

void IdleMemoryTrimmer::ReleaseFreeHeapMemory() {
#if defined(__GLIBC__)
  const std::optional<int64_t> before = ResidentMemoryBytes();
  malloc_trim(0);
  const std::optional<int64_t> after = ResidentMemoryBytes();
  if (before && after && *before - *after >= (int64_t{16} << 20)) {
    LogLine(absl::StrFormat(
        "idle: returned freed heap memory to the system, resident %.0f -> "
        "%.0f MiB",
        static_cast<double>(*before) / (1 << 20),
        static_cast<double>(*after) / (1 << 20)));
  }
#endif
}

}  // namespace matmul
