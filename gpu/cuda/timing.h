// Timing on one device, from CUDA events: the four events that bracket a
// job's stages on its stream (EventSet, reused through EventPool), the clock
// that turns event timestamps into device milliseconds and wall time
// (DeviceClock), and the device's busy, copy and compute time as unions over
// its streams (BusyAccounting). The engine's stage timings, stream busy
// seconds and timeline spans all come from here.
#ifndef MATMUL_GPU_CUDA_TIMING_H_
#define MATMUL_GPU_CUDA_TIMING_H_

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/engine.h"
#include "gpu/interval_union.h"

namespace matmul {

// The events of one job on its stream, recorded in this order. Timed (the
// default), the four give the job's stage times. An untimed set
// (CudaEngineOptions::timed_job_every) has `end` alone, made with
// cudaEventDisableTiming: it tells the poller that the job's stream work is
// done, and start, h2d_done and gemm_done stay empty and are never recorded,
// three calls a job fewer for the enqueuing thread.
struct EventSet {
  CudaEvent start;
  CudaEvent h2d_done;
  CudaEvent gemm_done;
  CudaEvent end;
  bool timed = true;
};

// Device milliseconds of a job's four events, in EventSet order.
using EventTimes = std::array<double, 4>;

// The job's h2d, compute and d2h durations from its event times.
void SetDeviceStages(const EventTimes& ms, StageTimings& timings);

// Spare EventSets of one device, timed and untimed, so that a job takes
// four recorded-before events instead of creating them. Thread-safe. Clear
// it with the device current, before the context goes.
class EventPool {
 public:
  // A spare set of the kind asked for, or a new one (with the caller's
  // device current).
  absl::StatusOr<std::unique_ptr<EventSet>> Take(bool timed = true);
  // Only once no stream work can still record into `events`.
  void Return(std::unique_ptr<EventSet> events);
  void Clear();

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<EventSet>> spare_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<EventSet>> spare_untimed_ ABSL_GUARDED_BY(mu_);
};

// One device's clock. Event timestamps are float milliseconds relative to an
// anchor event; a fresh anchor every few seconds keeps them precise to about
// a microsecond, and the wall time at the anchor maps them to absl::Time.
// Thread-safe. The anchor stream must outlive it (or Reset it first).
class DeviceClock {
 public:
  // Records anchors on `stream`, an idle stream of GPU `device` (so that an
  // anchor completes at once).
  DeviceClock(int device, cudaStream_t stream)
      : device_(device), stream_(stream) {}

  // Records a fresh anchor and waits for it; on failure the old anchor stays
  // and the failed call comes back.
  absl::Status Refresh();
  // Refreshes the anchor if the last refresh is over five seconds old and no
  // other thread is refreshing it; logs a failure (bounded), since its
  // callers (completion threads) have nobody to return it to.
  void MaybeRefresh(absl::Time now);
  // Milliseconds on this device's clock of a completed event.
  absl::StatusOr<double> DeviceMs(cudaEvent_t event) const;
  absl::Time WallTime(double device_ms) const;
  // Destroys the anchor event (with the device current).
  void Reset();

 private:
  const int device_;
  const cudaStream_t stream_;
  mutable absl::Mutex mu_;
  CudaEvent anchor_ ABSL_GUARDED_BY(mu_);
  absl::Time anchor_host_ ABSL_GUARDED_BY(mu_);
  double anchor_offset_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // When the anchor was last refreshed (Unix ns).
  std::atomic<int64_t> anchored_ns_{0};
};

// A device's busy time (any stream has work), copy and compute time, and
// the time copies and compute overlapped, each counted once however many
// streams were at it. Thread-safe.
class BusyAccounting {
 public:
  struct Totals {
    double busy_seconds = 0;
    double copy_seconds = 0;
    double compute_seconds = 0;
    double overlap_seconds = 0;
  };
  // One completed job: [start, h2d_done) and [gemm_done, end) were copies,
  // [h2d_done, gemm_done) compute.
  void Add(const EventTimes& ms);
  Totals totals() const;

 private:
  mutable absl::Mutex mu_;
  IntervalUnion busy_union_ ABSL_GUARDED_BY(mu_);
  IntervalUnion copy_union_ ABSL_GUARDED_BY(mu_);
  IntervalUnion compute_union_ ABSL_GUARDED_BY(mu_);
  double busy_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double copy_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double compute_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double overlap_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double latest_end_ms_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_TIMING_H_
