// ThreadSanitizer annotations for Debian's absl::Mutex, CondVar,
// Notification and BlockingCounter.
//
// Debian's Abseil is a shared library built without -fsanitize=thread, so its
// mutex.cc lacks the __tsan_mutex_* annotations an instrumented build has:
// TSan sees neither the lock nor the unlock, and reports every access that
// absl::Mutex correctly guards as a data race (tests/sanitizers/README.md has
// a three-line proof). This library, LD_PRELOADed into the TSan test runs
// (scripts/sanitize.sh), interposes the synchronizing member functions,
// forwards each to Abseil's own (dlsym RTLD_NEXT) and tells TSan what it did,
// the way absl/synchronization/mutex.cc does when it is instrumented:
//   lock:   __tsan_mutex_pre_lock, the real call, __tsan_mutex_post_lock
//   unlock: __tsan_mutex_pre_unlock, the real call, __tsan_mutex_post_unlock
//   waits (CondVar::Wait, Mutex::Await): the mutex is released and taken back
//           around the real call, which runs inside the unlock's ignore region
//           (so conditions Abseil evaluates there are not reported)
//   Notification, BlockingCounter: release on notify / decrement, acquire
//           when the wait returns (their fast paths are lock-free atomics).
// Being preloaded, it also annotates the absl::Mutex uses inside gRPC.
// Only for TSan builds (MATMUL_SANITIZE=thread); it never changes what the
// real functions do.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#define MATMUL_STRINGIFY_INNER(x) #x
#define MATMUL_STRINGIFY(x) MATMUL_STRINGIFY_INNER(x)

namespace {

// The real function: `qualifier` is "N" or "NK" (const), `rest` the mangled
// name after "absl::<inline namespace>::".
template <typename Fn>
Fn Real(const char* qualifier, const char* rest) {
  static_assert(ABSL_OPTION_USE_INLINE_NAMESPACE == 1, "absl inline namespace");
  const char* ns = MATMUL_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string("_Z") + qualifier + "4absl" +
                           std::to_string(std::strlen(ns)) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_tsan_annotations: %s not found: %s\n",
                 name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

using absl::Condition;
using absl::CondVar;
using absl::Mutex;

// Abseil's functions call one another (WaitWithTimeout calls
// WaitWithDeadline, Notification::Notify locks its Mutex, ...), and those
// calls reach the wrappers too: only the outermost call on a thread is
// annotated, as it is in an instrumented Abseil.
thread_local int depth = 0;

class Outermost {
 public:
  Outermost() : outermost_(depth++ == 0) {}
  ~Outermost() { --depth; }
  Outermost(const Outermost&) = delete;
  Outermost& operator=(const Outermost&) = delete;
  explicit operator bool() const { return outermost_; }

 private:
  const bool outermost_;
};

// Exclusive release and re-acquisition around a wait; the real call runs in
// the release's ignore region.
template <typename Call>
auto ReleasedDuring(Mutex* mu, Call call) {
  const Outermost outermost;
  if (!outermost) return call();
  __tsan_mutex_pre_unlock(mu, 0);
  auto result = call();
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

// Locking calls (with or without a condition, timeout or deadline).
template <typename Call>
auto Locked(Mutex* mu, unsigned flags, Call call) {
  const Outermost outermost;
  if (!outermost) return call();
  __tsan_mutex_pre_lock(mu, flags);
  auto result = call();
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// Unlocking calls.
template <typename Call>
void Unlocked(Mutex* mu, unsigned flags, Call call) {
  const Outermost outermost;
  if (!outermost) return call();
  __tsan_mutex_pre_unlock(mu, flags);
  call();
  __tsan_mutex_post_unlock(mu, flags);
}

// Try-locks.
template <typename Call>
bool TryLocked(Mutex* mu, unsigned flags, Call call) {
  const Outermost outermost;
  if (!outermost) return call();
  flags |= __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(mu, flags);
  const bool locked = call();
  __tsan_mutex_post_lock(
      mu, locked ? flags : flags | __tsan_mutex_try_lock_failed, 0);
  return locked;
}

// The sync address for Notification and BlockingCounter: their atomic,
// which follows their Mutex (so it is not the address the mutex annotations
// use). For Notification it is notified_yet_, which the inline
// HasBeenNotified() loads with acquire order: TSan then syncs that load with
// the release below, too.
template <typename T>
void* SyncAddress(const T* object) {
  return const_cast<char*>(reinterpret_cast<const char*>(object)) +
         sizeof(absl::Mutex);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  static auto real = Real<void (*)(Mutex*)>("N", "5MutexD2Ev");
  __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("N", "5Mutex4LockEv");
  Locked(this, 0, [&] { return (real(this), 0); });
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("N", "5Mutex10ReaderLockEv");
  Locked(this, __tsan_mutex_read_lock, [&] { return (real(this), 0); });
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("N", "5Mutex7TryLockEv");
  return TryLocked(this, 0, [&] { return real(this); });
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("N", "5Mutex13ReaderTryLockEv");
  return TryLocked(this, __tsan_mutex_read_lock, [&] { return real(this); });
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("N", "5Mutex6UnlockEv");
  Unlocked(this, 0, [&] { real(this); });
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("N", "5Mutex12ReaderUnlockEv");
  Unlocked(this, __tsan_mutex_read_lock, [&] { real(this); });
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "N", "5Mutex8LockWhenERKNS0_9ConditionE");
  Locked(this, 0, [&] { return (real(this, cond), 0); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "N", "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locked(this, __tsan_mutex_read_lock, [&] { return (real(this, cond), 0); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "N", "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locked(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "N", "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locked(this, 0, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "N", "5Mutex5AwaitERKNS0_9ConditionE");
  ReleasedDuring(this, [&] { return (real(this, cond), 0); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "N", "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return ReleasedDuring(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "N", "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return ReleasedDuring(this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static auto real =
      Real<void (*)(CondVar*, Mutex*)>("N", "7CondVar4WaitEPNS0_5MutexE");
  ReleasedDuring(mu, [&] { return (real(this, mu), 0); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "N", "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return ReleasedDuring(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "N", "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return ReleasedDuring(mu, [&] { return real(this, mu, deadline); });
}

void Notification::Notify() {
  static auto real =
      Real<void (*)(Notification*)>("N", "12Notification6NotifyEv");
  const Outermost outermost;
  if (outermost) __tsan_release(SyncAddress(this));
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>(
      "NK", "12Notification19WaitForNotificationEv");
  const Outermost outermost;
  real(this);
  if (outermost) __tsan_acquire(SyncAddress(this));
}

bool Notification::WaitForNotificationWithTimeout(
    absl::Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      "NK", "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const Outermost outermost;
  const bool notified = real(this, timeout);
  if (notified && outermost) __tsan_acquire(SyncAddress(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, absl::Time)>(
      "NK", "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const Outermost outermost;
  const bool notified = real(this, deadline);
  if (notified && outermost) __tsan_acquire(SyncAddress(this));
  return notified;
}

bool BlockingCounter::DecrementCount() {
  static auto real = Real<bool (*)(BlockingCounter*)>(
      "N", "15BlockingCounter14DecrementCountEv");
  const Outermost outermost;
  if (outermost) __tsan_release(SyncAddress(this));
  return real(this);
}

void BlockingCounter::Wait() {
  static auto real =
      Real<void (*)(BlockingCounter*)>("N", "15BlockingCounter4WaitEv");
  const Outermost outermost;
  real(this);
  if (outermost) __tsan_acquire(SyncAddress(this));
}

ABSL_NAMESPACE_END
}  // namespace absl
