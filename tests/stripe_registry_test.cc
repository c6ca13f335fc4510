// StripeRegistry on its own: which join finds which striped multiply, the
// wait of a join that comes before its start, and the references it holds
// on the calls it names (every one given back). The calls are counting
// stand-ins; the real ones are MultiplyStream reactors
// (multiply_stream_stripe_test runs those).
#include "server/rpc/stripe_registry.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

// A call that counts its references and records what it was told.
class Recorder final : public StripeCall {
 public:
  void Ref() override {
    absl::MutexLock lock(&mu_);
    ++refs_;
  }
  void Unref() override {
    absl::MutexLock lock(&mu_);
    --refs_;
  }
  void JoinResolved(uint64_t join_id,
                    absl::StatusOr<StripeMatch> match) override {
    absl::MutexLock lock(&mu_);
    // Code and text only: an absl::Status shares its message between
    // copies through Debian's uninstrumented Abseil, which TSan cannot see.
    resolved_.push_back({join_id, match.status().code(),
                         std::string(match.status().message())});
    if (match.ok()) {
      stripes_.push_back(match->stripe);
      match->owner->Unref();  // the receiver's reference
    }
  }

  int refs() const {
    absl::MutexLock lock(&mu_);
    return refs_;
  }
  // Waits (bounded) until no reference is held: the registry's thread
  // lets go of a call just after telling it.
  bool AwaitNoRefs() {
    absl::MutexLock lock(&mu_);
    auto none = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return refs_ == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&none), absl::Seconds(10));
  }
  // Waits (bounded) for `n` resolutions.
  bool AwaitResolved(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return resolved_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  struct Resolved {
    uint64_t join_id;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Resolved> resolved() const {
    absl::MutexLock lock(&mu_);
    return resolved_;
  }
  std::vector<int> stripes() const {
    absl::MutexLock lock(&mu_);
    return stripes_;
  }

 private:
  mutable absl::Mutex mu_;
  int refs_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Resolved> resolved_ ABSL_GUARDED_BY(mu_);
  std::vector<int> stripes_ ABSL_GUARDED_BY(mu_);
};

const std::string kKey(20, 'k');

TEST(StripeRegistryTest, JoinsFindTheirClientsMultiplyUpToItsStripes) {
  Recorder owner, joiner;  // outlive the registry
  StripeRegistry registry(absl::Seconds(10));
  auto multiply = std::make_shared<int>(1);
  std::vector<StripeRegistry::Resolution> resolved;
  ASSERT_TRUE(
      registry.Open("alice", kKey, 3, &owner, multiply, &resolved).ok());
  EXPECT_TRUE(resolved.empty());
  EXPECT_EQ(owner.refs(), 1);  // the registry's
  // The same key again while open.
  EXPECT_EQ(registry.Open("alice", kKey, 2, &owner, multiply, &resolved).code(),
            absl::StatusCode::kAlreadyExists);
  for (int stripe : {1, 2}) {
    absl::StatusOr<std::optional<StripeMatch>> match =
        registry.Join("alice", kKey, &joiner, 10 + stripe);
    ASSERT_TRUE(match.ok()) << match.status();
    ASSERT_TRUE(match->has_value());
    EXPECT_EQ((*match)->stripe, stripe);
    EXPECT_EQ((*match)->owner, &owner);
    EXPECT_EQ((*match)->multiply.get(), multiply.get());
    (*match)->owner->Unref();
  }
  // One past stripes - 1.
  absl::StatusOr<std::optional<StripeMatch>> extra =
      registry.Join("alice", kKey, &joiner, 13);
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(extra.status().message(), HasSubstr("already has its 3 streams"));
  EXPECT_EQ(registry.joined(), 2);
  // Closed by another multiply's pointer: nothing happens.
  registry.Close("alice", kKey, &joiner);
  EXPECT_EQ(owner.refs(), 1);
  registry.Close("alice", kKey, multiply.get());
  EXPECT_EQ(owner.refs(), 0);
  EXPECT_EQ(joiner.refs(), 0);
  EXPECT_EQ(registry.opened(), 1);
}

TEST(StripeRegistryTest, AJoinBeforeItsStartWaitsAndIsMatchedByIt) {
  // The calls outlive the registry, which lets go of what it still holds.
  Recorder owner, first, second, third;
  StripeRegistry registry(absl::Seconds(10));
  // Three joins wait for a start of two stripes: the first is matched,
  // the others are told at once that it is full.
  for (Recorder* r : {&first, &second, &third}) {
    absl::StatusOr<std::optional<StripeMatch>> match =
        registry.Join("bob", kKey, r, 7);
    ASSERT_TRUE(match.ok());
    EXPECT_FALSE(match->has_value());
    EXPECT_EQ(r->refs(), 1);  // held while it waits
  }
  EXPECT_EQ(registry.waiting(), 3);
  std::vector<StripeRegistry::Resolution> resolved;
  ASSERT_TRUE(
      registry.Open("bob", kKey, 2, &owner, std::make_shared<int>(2), &resolved)
          .ok());
  EXPECT_EQ(registry.waiting(), 0);
  ASSERT_EQ(resolved.size(), 3u);
  StripeRegistry::Deliver(resolved);
  EXPECT_TRUE(resolved.empty());
  ASSERT_EQ(first.resolved().size(), 1u);
  EXPECT_EQ(first.resolved()[0].code, absl::StatusCode::kOk);
  EXPECT_EQ(first.stripes(), std::vector<int>{1});
  for (Recorder* r : {&second, &third}) {
    ASSERT_EQ(r->resolved().size(), 1u);
    EXPECT_EQ(r->resolved()[0].code, absl::StatusCode::kNotFound);
  }
  for (Recorder* r : {&first, &second, &third}) EXPECT_EQ(r->refs(), 0);
}

TEST(StripeRegistryTest, AJoinThatFindsNothingTimesOutNotFound) {
  // The calls outlive the registry, which lets go of what it still holds.
  Recorder owner, other_client, unknown, forgotten, forgotten_start;
  StripeRegistry registry(absl::Milliseconds(50));
  std::vector<StripeRegistry::Resolution> resolved;
  ASSERT_TRUE(
      registry
          .Open("carol", kKey, 2, &owner, std::make_shared<int>(3), &resolved)
          .ok());
  // Another client's key is as good as unknown.
  ASSERT_TRUE(registry.Join("mallory", kKey, &other_client, 1).ok());
  ASSERT_TRUE(registry.Join("carol", std::string(20, 'x'), &unknown, 2).ok());
  // A call that ends while its join waits is dropped, never told. Its join
  // waits in a registry whose timeout no stall reaches, so that only Forget
  // can end it (with 50 ms, a stall before Forget would time it out).
  StripeRegistry patient(absl::Minutes(10));
  ASSERT_TRUE(patient.Join("carol", std::string(20, 'y'), &forgotten, 3).ok());
  EXPECT_EQ(patient.waiting(), 1);
  EXPECT_EQ(forgotten.refs(), 1);
  patient.Forget(&forgotten);
  EXPECT_EQ(forgotten.refs(), 0);
  EXPECT_EQ(patient.waiting(), 0);
  // Its start, when it comes, finds no join to answer.
  std::vector<StripeRegistry::Resolution> none;
  ASSERT_TRUE(patient
                  .Open("carol", std::string(20, 'y'), 2, &forgotten_start,
                        std::make_shared<int>(4), &none)
                  .ok());
  EXPECT_TRUE(none.empty());
  StripeRegistry::Deliver(none);
  for (Recorder* r : {&other_client, &unknown}) {
    ASSERT_TRUE(r->AwaitResolved(1));
    const auto got = r->resolved();
    EXPECT_EQ(got[0].code, absl::StatusCode::kNotFound);
    EXPECT_THAT(got[0].message,
                HasSubstr("no striped multiply of this client"));
    EXPECT_TRUE(r->AwaitNoRefs());
  }
  EXPECT_TRUE(forgotten.resolved().empty());
  EXPECT_EQ(forgotten.refs(), 0);
  EXPECT_EQ(registry.waiting(), 0);
}

}  // namespace
}  // namespace matmul
