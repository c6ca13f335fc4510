// How the project's programs run absl::Mutex.
#ifndef MATMUL_COMMON_MUTEX_MODE_H_
#define MATMUL_COMMON_MUTEX_MODE_H_

#include "absl/synchronization/mutex.h"

namespace matmul {

// Turns off Abseil's lock-order (deadlock) detector for this process.
// Debian's Abseil is built without NDEBUG, so by default every
// absl::Mutex::Lock, ours and gRPC's (grpc_core::Mutex wraps absl::Mutex),
// takes one process-wide spinlock to look the mutex up in a global graph,
// and every nested acquisition and Mutex destruction updates that graph.
// perf showed the graph's functions at about 4% of matmul-server's cycles
// at n=64 with 64 requests in flight, all behind that one lock. Programs
// (server, bench, cli) call this first thing in main; tests do not, so
// they keep the detector.
inline void SkipMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace matmul

#endif  // MATMUL_COMMON_MUTEX_MODE_H_
