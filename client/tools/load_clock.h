// What matmul-bench's load generators (load_generator.cc, bench_stream.cc)
// share to time a point: the steady clock, conversions between its
// durations and absl::Duration, and the phases a point goes through.
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

}  // namespace matmul::load_clock

#endif  // MATMUL_CLIENT_TOOLS_LOAD_CLOCK_H_
