#include "server/device_health_monitor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace matmul {

DeviceHealthMonitor::DeviceHealthMonitor(
    const Engine* engine, absl::Duration interval, absl::Duration restart_after,
    absl::AnyInvocable<void(HealthVerdict)> apply)
    : engine_(engine),
      interval_(interval),
      restart_after_(restart_after),
      apply_(std::move(apply)) {
  thread_ = std::thread([this] { Loop(); });
}

DeviceHealthMonitor::~DeviceHealthMonitor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void DeviceHealthMonitor::Loop() {
  while (true) {
    const HealthVerdict verdict = Check(absl::Now());
    if (verdict != verdict_) {
      verdict_ = verdict;
      apply_(verdict);
    }
    absl::MutexLock lock(&mu_);
    const absl::Condition stopping(&stopping_);
    mu_.AwaitWithTimeout(stopping, interval_);
    if (stopping_) return;
  }
}

HealthVerdict DeviceHealthMonitor::Check(absl::Time now) {
  const EngineStats stats = engine_->stats();
  int healthy = 0;
  for (const DeviceStats& d : stats.devices) healthy += d.healthy ? 1 : 0;
  for (const DeviceStats& d : stats.devices) {
    auto [it, inserted] = healthy_.emplace(d.label, d.healthy);
    if (inserted ? d.healthy : it->second == d.healthy) continue;
    it->second = d.healthy;
    LogLine(absl::StrCat(
        d.healthy ? "" : "error: ", "device ", d.label, " (", d.uuid, ") is ",
        d.healthy ? "healthy again" : "unhealthy: it takes no more jobs", "; ",
        healthy, " of ", stats.devices.size(), " devices healthy"));
  }
  HealthVerdict verdict;
  verdict.serving = stats.devices.empty() || healthy > 0;
  if (verdict.serving) {
    unhealthy_since_ = absl::InfiniteFuture();
  } else if (unhealthy_since_ == absl::InfiniteFuture()) {
    unhealthy_since_ = now;
  }
  verdict.live = verdict.serving || restart_after_ <= absl::ZeroDuration() ||
                 now - unhealthy_since_ < restart_after_;
  if (verdict.serving != verdict_.serving) {
    LogLine(verdict.serving
                ? "health: a device is healthy again: SERVING"
                : absl::StrCat(
                      "error: health: no healthy device left: NOT_SERVING "
                      "(readiness fails, requests are answered UNAVAILABLE)",
                      restart_after_ > absl::ZeroDuration()
                          ? absl::StrCat("; liveness fails in ",
                                         absl::FormatDuration(restart_after_))
                          : ""));
  }
  if (!verdict.live && verdict_.live) {
    LogLine(absl::StrCat("error: health: no healthy device for ",
                         absl::FormatDuration(restart_after_),
                         ": liveness NOT_SERVING, so that the pod is "
                         "restarted (--unhealthy-restart-after)"));
  }
  return verdict;
}

}  // namespace matmul
