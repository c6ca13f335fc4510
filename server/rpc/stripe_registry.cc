#include "server/rpc/stripe_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace matmul {
namespace {

absl::Status NotFound(absl::Duration waited) {
  return absl::NotFoundError(absl::StrCat(
      "MultiplyStreamJoin: no striped multiply of this client with that "
      "stripe_key started within ",
      absl::FormatDuration(waited),
      " (send its start on another stream of the same client)"));
}

}  // namespace

StripeRegistry::StripeRegistry(absl::Duration join_timeout)
    : join_timeout_(join_timeout), timer_([this] { TimeOutWaiters(); }) {}

StripeRegistry::~StripeRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  timer_.join();
  // Every call has ended by now (the server is gone); drop what is left.
  std::vector<StripeCall*> calls;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, open] : open_) calls.push_back(open.owner);
    for (auto& [key, waiters] : waiting_) {
      for (Waiter& w : waiters) calls.push_back(w.call);
    }
    open_.clear();
    waiting_.clear();
  }
  for (StripeCall* call : calls) call->Unref();
}

StripeMatch StripeRegistry::MatchLocked(OpenMultiply& open) {
  StripeMatch match;
  open.owner->Ref();
  match.owner = open.owner;
  match.multiply = open.multiply;
  match.stripe = ++open.joins;
  ++joined_;
  return match;
}

absl::Status StripeRegistry::Open(const std::string& client,
                                  const std::string& key, int stripes,
                                  StripeCall* owner,
                                  std::shared_ptr<void> multiply,
                                  std::vector<Resolution>* resolved) {
  absl::MutexLock lock(&mu_);
  Key k(client, key);
  if (open_.contains(k)) {
    return absl::AlreadyExistsError(
        "start.stripe_key: this client already has an open striped multiply "
        "with that key; keys must be unique among its open multiplies");
  }
  owner->Ref();
  OpenMultiply& open = open_[k];
  open.owner = owner;
  open.multiply = std::move(multiply);
  open.stripes = stripes;
  ++opened_;
  if (auto it = waiting_.find(k); it != waiting_.end()) {
    for (Waiter& w : it->second) {
      Resolution r;
      r.call = w.call;  // its reference goes with it
      r.join_id = w.join_id;
      if (open.joins < open.stripes - 1) {
        r.match = MatchLocked(open);
      } else {
        r.match = absl::NotFoundError(absl::StrCat(
            "MultiplyStreamJoin: the striped multiply with that stripe_key "
            "already has its ",
            stripes, " streams"));
      }
      resolved->push_back(std::move(r));
    }
    waiting_.erase(it);
  }
  return absl::OkStatus();
}

void StripeRegistry::Close(const std::string& client, const std::string& key,
                           const void* multiply) {
  StripeCall* owner = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(Key(client, key));
    if (it == open_.end() || it->second.multiply.get() != multiply) return;
    owner = it->second.owner;
    open_.erase(it);
  }
  owner->Unref();
}

absl::StatusOr<std::optional<StripeMatch>> StripeRegistry::Join(
    const std::string& client, const std::string& key, StripeCall* joiner,
    uint64_t join_id) {
  absl::MutexLock lock(&mu_);
  Key k(client, key);
  if (auto it = open_.find(k); it != open_.end()) {
    OpenMultiply& open = it->second;
    if (open.joins >= open.stripes - 1) {
      return absl::NotFoundError(absl::StrCat(
          "MultiplyStreamJoin: the striped multiply with that stripe_key "
          "already has its ",
          open.stripes, " streams"));
    }
    return std::optional<StripeMatch>(MatchLocked(open));
  }
  joiner->Ref();
  waiting_[k].push_back({joiner, join_id, absl::Now() + join_timeout_});
  return std::optional<StripeMatch>();
}

void StripeRegistry::Forget(StripeCall* call) {
  std::vector<StripeCall*> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      std::deque<Waiter>& waiters = it->second;
      for (auto w = waiters.begin(); w != waiters.end();) {
        if (w->call == call) {
          dropped.push_back(w->call);
          w = waiters.erase(w);
        } else {
          ++w;
        }
      }
      if (waiters.empty()) {
        waiting_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (StripeCall* c : dropped) c->Unref();
}

void StripeRegistry::Deliver(std::vector<Resolution>& resolved) {
  for (Resolution& r : resolved) {
    r.call->JoinResolved(r.join_id, std::move(r.match));
    r.call->Unref();
  }
  resolved.clear();
}

int64_t StripeRegistry::opened() const {
  absl::MutexLock lock(&mu_);
  return opened_;
}

int64_t StripeRegistry::joined() const {
  absl::MutexLock lock(&mu_);
  return joined_;
}

int64_t StripeRegistry::waiting() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [key, waiters] : waiting_) n += waiters.size();
  return n;
}

void StripeRegistry::TimeOutWaiters() {
  while (true) {
    std::vector<Resolution> expired;
    {
      absl::MutexLock lock(&mu_);
      // Waiters are appended in deadline order per key; find the earliest.
      absl::Time next = absl::Now() + std::min(join_timeout_, absl::Seconds(1));
      for (const auto& [key, waiters] : waiting_) {
        next = std::min(next, waiters.front().deadline);
      }
      mu_.AwaitWithDeadline(absl::Condition(&stopping_), next);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        std::deque<Waiter>& waiters = it->second;
        while (!waiters.empty() && waiters.front().deadline <= now) {
          Resolution r;
          r.call = waiters.front().call;
          r.join_id = waiters.front().join_id;
          r.match = NotFound(join_timeout_);
          expired.push_back(std::move(r));
          waiters.pop_front();
        }
        if (waiters.empty()) {
          waiting_.erase(it++);
        } else {
          ++it;
        }
      }
    }
    Deliver(expired);
  }
}

}  // namespace matmul
