// StripeRegistry: the striped multiplies open on the server (see
// MultiplyStreamStart.stripe_key in matmul/v1/matmul.proto), so that a
// MultiplyStreamJoin on another call finds the multiply it carries part of.
//
// Keyed by (client, stripe_key), the client as the quotas see it
// (ClientKey), so a client can only ever find its own multiplies: another
// client's key looks exactly like one that does not exist. A join that
// comes before its start waits for it, up to the join timeout, then fails
// NOT_FOUND; a join past the multiply's `stripes - 1` fails NOT_FOUND at
// once. The registry holds a reference on every call it names (the owner
// of an open multiply, the calls of waiting joins) and calls into a call
// only when it holds no lock of its own.
#ifndef MATMUL_SERVER_RPC_STRIPE_REGISTRY_H_
#define MATMUL_SERVER_RPC_STRIPE_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace matmul {

class StripeCall;

// A join's multiply: the call that owns it and which stripe the join is.
struct StripeMatch {
  StripeCall* owner = nullptr;     // with a reference the receiver now holds
  std::shared_ptr<void> multiply;  // the owner's multiply (opaque)
  int stripe = 0;                  // 1 .. stripes - 1, in join order
};

// A MultiplyStream call as the registry sees it.
class StripeCall {
 public:
  virtual void Ref() = 0;
  virtual void Unref() = 0;
  // A join that waited is decided: matched, or NOT_FOUND.
  virtual void JoinResolved(uint64_t join_id,
                            absl::StatusOr<StripeMatch> match) = 0;

 protected:
  ~StripeCall() = default;
};

// Thread-safe.
class StripeRegistry {
 public:
  // A waiting join decided while the registry's lock was held; Deliver
  // hands it to its call (holding a reference until then).
  struct Resolution {
    StripeCall* call = nullptr;
    uint64_t join_id = 0;
    absl::StatusOr<StripeMatch> match;
  };

  explicit StripeRegistry(absl::Duration join_timeout);
  ~StripeRegistry();
  StripeRegistry(const StripeRegistry&) = delete;
  StripeRegistry& operator=(const StripeRegistry&) = delete;

  absl::Duration join_timeout() const { return join_timeout_; }

  // Registers the striped multiply `multiply` of `owner`. ALREADY_EXISTS if
  // the client has one open under `key`. Joins that were waiting for it
  // are decided and appended to `resolved`, for the caller to Deliver once
  // it holds no lock.
  absl::Status Open(const std::string& client, const std::string& key,
                    int stripes, StripeCall* owner,
                    std::shared_ptr<void> multiply,
                    std::vector<Resolution>* resolved);
  // The multiply has ended: later joins do not find it.
  void Close(const std::string& client, const std::string& key,
             const void* multiply);
  // A join of `key` on call `joiner`, request `join_id`: its match, or
  // NOT_FOUND (its multiply has all its stripes), or nullopt: it waits,
  // and JoinResolved tells the call later.
  absl::StatusOr<std::optional<StripeMatch>> Join(const std::string& client,
                                                  const std::string& key,
                                                  StripeCall* joiner,
                                                  uint64_t join_id);
  // `call` has ended: its waiting joins are dropped.
  void Forget(StripeCall* call);

  static void Deliver(std::vector<Resolution>& resolved);

  // Striped multiplies opened, and joins matched, since the start; joins
  // waiting now.
  int64_t opened() const;
  int64_t joined() const;
  int64_t waiting() const;

 private:
  using Key = std::pair<std::string, std::string>;  // (client, key)
  struct OpenMultiply {
    StripeCall* owner = nullptr;  // referenced
    std::shared_ptr<void> multiply;
    int stripes = 0;
    int joins = 0;
  };
  struct Waiter {
    StripeCall* call = nullptr;  // referenced
    uint64_t join_id = 0;
    absl::Time deadline;
  };

  // A match for `open` (the caller holds mu_).
  StripeMatch MatchLocked(OpenMultiply& open)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimeOutWaiters();

  const absl::Duration join_timeout_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, OpenMultiply> open_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, std::deque<Waiter>> waiting_ ABSL_GUARDED_BY(mu_);
  int64_t opened_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t joined_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;  // times out waiting joins
};

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_STRIPE_REGISTRY_H_
