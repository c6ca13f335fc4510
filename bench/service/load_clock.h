// What matmul-bench's load generators (load_generator.cc, bench_stream.cc)
// share to time a point: the steady clock, conversions between its
// durations and absl::Duration, the phases a point goes through, and the
// open loop's schedule.
#ifndef MATMUL_CLIENT_TOOLS_LOAD_CLOCK_H_
#define MATMUL_CLIENT_TOOLS_LOAD_CLOCK_H_

#include <chrono>
#include <cstdint>

#include "absl/time/time.h"

namespace matmul::load_clock {

using Clock = std::chrono::steady_clock;

// Warm-up (not counted), the measured window, then done.
enum Phase : int { kWarmup, kMeasure, kDone };

inline int64_t Nanos(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

inline absl::Duration ToAbsl(Clock::duration d) {
  return absl::Nanoseconds(Nanos(d));
}

inline Clock::duration ToClock(absl::Duration d) {
  return std::chrono::nanoseconds(absl::ToInt64Nanoseconds(d));
}

// Open loop: when the i-th request (from 0) of a schedule of `rate` (> 0)
// requests per second that began at `start` is due.
inline Clock::time_point Due(Clock::time_point start, double rate, int64_t i) {
  return start +
         std::chrono::duration_cast<Clock::duration>(
             std::chrono::duration<double>(static_cast<double>(i) / rate));
}

}  // namespace matmul::load_clock

#endif  // MATMUL_CLIENT_TOOLS_LOAD_CLOCK_H_
