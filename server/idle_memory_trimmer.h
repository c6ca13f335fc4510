// IdleMemoryTrimmer: gives the heap's free memory back to the operating
// system once the server has been idle for a while after work.
//
// glibc's allocator keeps what a burst of load freed in its arenas (one per
// thread that allocated, up to MALLOC_ARENA_MAX) and returns only the top of
// each heap: after 240 clients × 20 s of 256² multiplies on the host engine,
// RSS stayed at 400 MiB against 172 MiB before the load, with every gauge
// idle, until malloc_trim(0) brought it to 188 MiB. So, once no call has
// started and no work has been in flight for `quiet`, the trimmer calls
// malloc_trim(0), once per quiet spell (nothing is trimmed again until more
// work has come and gone). It never runs while work is in flight, where
// trimming would only slow the allocations that follow.
//
// Tick is the decision, free of threads and clocks (tests drive it); Start
// runs it on its own thread every `quiet / 4` (at most 1 s).
//
// Thread-safe: Tick is called from one thread (the trimmer's or a test's);
// trims() from any.
#ifndef MATMUL_SERVER_IDLE_MEMORY_TRIMMER_H_
#define MATMUL_SERVER_IDLE_MEMORY_TRIMMER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace matmul {

class IdleMemoryTrimmer {
 public:
  // What the server is doing: `calls_started` only grows, one per call;
  // `busy` is true while admitted work is in flight.
  struct Activity {
    uint64_t calls_started = 0;
    bool busy = false;
  };
  using ActivityProbe = std::function<Activity()>;
  // Returns free heap memory to the operating system.
  using TrimFunction = std::function<void()>;

  // `quiet` must be positive.
  IdleMemoryTrimmer(absl::Duration quiet, ActivityProbe probe,
                    TrimFunction trim = ReleaseFreeHeapMemory);
  ~IdleMemoryTrimmer();  // stops the thread, if started

  IdleMemoryTrimmer(const IdleMemoryTrimmer&) = delete;
  IdleMemoryTrimmer& operator=(const IdleMemoryTrimmer&) = delete;

  // Looks at the activity at `now` and trims if the server has been quiet
  // for `quiet` since the last work and has not been trimmed since. True
  // if it trimmed.
  bool Tick(absl::Time now);

  // Ticks on a thread of its own until destroyed.
  void Start();

  // How many times it trimmed.
  int64_t trims() const { return trims_.load(std::memory_order_relaxed); }

  // malloc_trim(0) where the C library has it (glibc), else nothing; logs
  // the resident memory before and after when it moved by 16 MiB or more.
  static void ReleaseFreeHeapMemory();

 private:
  const absl::Duration quiet_;
  const ActivityProbe probe_;
  const TrimFunction trim_;
  uint64_t last_calls_ = 0;
  absl::Time last_work_ = absl::InfinitePast();
  bool worked_since_trim_ = false;
  std::atomic<int64_t> trims_{0};
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_IDLE_MEMORY_TRIMMER_H_
