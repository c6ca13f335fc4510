// CallRegistry: the calls in progress that a drain must end itself, so
// that an idle MultiplyStream ends as soon as the drain begins (instead of
// holding it for the whole --drain-timeout), and a call still running at
// the drain's deadline ends UNAVAILABLE, which clients retry, rather than
// with the CANCELLED gRPC gives what it cuts.
#ifndef MATMUL_SERVER_RPC_CALL_REGISTRY_H_
#define MATMUL_SERVER_RPC_CALL_REGISTRY_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace matmul {

// A reactor the registry can reach. Reference counted by the reactor
// itself: it stays registered until gRPC is done with it (OnDone), so a
// registered call always holds gRPC's reference and Ref is safe.
class DrainableCall {
 public:
  virtual void Ref() = 0;
  virtual void Unref() = 0;
  // The server has begun to drain: end now if there is nothing left to
  // answer, else after the last answer.
  virtual void Draining() = 0;
  // The drain's deadline has passed: end now, UNAVAILABLE.
  virtual void CutForDrain() = 0;

 protected:
  ~DrainableCall() = default;
};

// Thread-safe.
class CallRegistry {
 public:
  // A request: a call that ends with its answer (the unary job methods),
  // which came at `started`; OldestRequestAge counts it.
  void AddRequest(DrainableCall* call,
                  std::chrono::steady_clock::time_point started) {
    Add(call, started);
  }
  // A call that stays open for as long as its client wants
  // (MultiplyStream, RegisterSharedMemory).
  void AddOpen(DrainableCall* call) { Add(call, std::nullopt); }
  void Remove(DrainableCall* call) {
    absl::MutexLock lock(&mu_);
    calls_.erase(call);
  }
  // Calls registered since the start, ended or not.
  uint64_t started() const { return started_.load(std::memory_order_relaxed); }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return calls_.size();
  }
  // How long the oldest registered request has been in progress at `now`;
  // zero when there is none. A request stuck in the server shows as an age
  // that keeps growing. Linear in the calls: for a scrape, not for the
  // request path.
  absl::Duration OldestRequestAge(
      std::chrono::steady_clock::time_point now) const {
    std::optional<std::chrono::steady_clock::time_point> oldest;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [call, started] : calls_) {
        if (started.has_value() && (!oldest || *started < *oldest)) {
          oldest = started;
        }
      }
    }
    if (!oldest.has_value() || *oldest >= now) return absl::ZeroDuration();
    return absl::FromChrono(now - *oldest);
  }
  // Waits until no call is registered or `deadline`; true if none is.
  bool AwaitEmpty(absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return calls_.empty();
    };
    return mu_.AwaitWithDeadline(absl::Condition(&empty), deadline);
  }
  // Calls Draining on every registered call (without the registry's lock).
  void Draining() {
    for (DrainableCall* call : Snapshot()) {
      call->Draining();
      call->Unref();
    }
  }
  // Calls CutForDrain on every registered call.
  void CutForDrain() {
    for (DrainableCall* call : Snapshot()) {
      call->CutForDrain();
      call->Unref();
    }
  }

 private:
  // The registered calls, each with a reference the caller releases.
  std::vector<DrainableCall*> Snapshot() {
    absl::MutexLock lock(&mu_);
    std::vector<DrainableCall*> calls;
    calls.reserve(calls_.size());
    for (const auto& [call, started] : calls_) {
      call->Ref();
      calls.push_back(call);
    }
    return calls;
  }

  // `started`: when a request came; none for an open call.
  void Add(DrainableCall* call,
           std::optional<std::chrono::steady_clock::time_point> started) {
    started_.fetch_add(1, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    calls_.emplace(call, started);
  }

  std::atomic<uint64_t> started_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<DrainableCall*,
                      std::optional<std::chrono::steady_clock::time_point>>
      calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_CALL_REGISTRY_H_
