// DeviceHealthMonitor: turns the engine's device health into the server's
// health. A thread reads Engine::stats() every `interval`; it logs each
// device that fails (or comes back), and decides:
//
//   serving  at least one device is healthy (or the engine has none to
//            lose): readiness and the service's own health stay SERVING;
//            with none left they go NOT_SERVING, so that traffic moves to
//            other pods while this one answers UNAVAILABLE.
//   live     false once no device has been healthy for `restart_after`
//            (zero: never), so that the liveness probe fails and the kubelet
//            restarts the pod: a failed GPU context does not come back
//            within the process.
//
// One failed device of several only shrinks capacity: the engine sends it
// no more jobs, matmul_device_healthy shows it, and health stays SERVING.
//
// Thread-safe. `engine` must outlive the monitor; `apply` runs on the
// monitor's thread, once at each change of the verdict (the verdict starts
// serving and live: what the server has set before the monitor starts).
#ifndef MATMUL_SERVER_DEVICE_HEALTH_MONITOR_H_
#define MATMUL_SERVER_DEVICE_HEALTH_MONITOR_H_

#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/engine.h"

namespace matmul {

struct HealthVerdict {
  bool serving = true;
  bool live = true;
  bool operator==(const HealthVerdict& o) const {
    return serving == o.serving && live == o.live;
  }
  bool operator!=(const HealthVerdict& o) const { return !(*this == o); }
};

class DeviceHealthMonitor {
 public:
  DeviceHealthMonitor(const Engine* engine, absl::Duration interval,
                      absl::Duration restart_after,
                      absl::AnyInvocable<void(HealthVerdict)> apply);
  // Stops the thread (a round in progress finishes first).
  ~DeviceHealthMonitor();

  DeviceHealthMonitor(const DeviceHealthMonitor&) = delete;
  DeviceHealthMonitor& operator=(const DeviceHealthMonitor&) = delete;

 private:
  void Loop();
  // One look at the engine at `now`: logs changes, returns the verdict.
  HealthVerdict Check(absl::Time now);

  const Engine* const engine_;
  const absl::Duration interval_;
  const absl::Duration restart_after_;
  absl::AnyInvocable<void(HealthVerdict)> apply_;
  // Only the monitor's thread touches these.
  std::map<std::string, bool> healthy_;  // by device label
  absl::Time unhealthy_since_ = absl::InfiniteFuture();
  HealthVerdict verdict_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_DEVICE_HEALTH_MONITOR_H_
