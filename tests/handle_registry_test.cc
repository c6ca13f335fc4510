#include "server/handle_registry.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/handle_id.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

class FakeTensor final : public ResidentTensor {
 public:
  FakeTensor(int64_t rows, int64_t cols, std::atomic<int>* alive)
      : ResidentTensor(0, DType::kFloat32, 1, rows, cols, nullptr),
        alive_(alive) {
    ++*alive_;
  }
  ~FakeTensor() override { --*alive_; }

 private:
  std::atomic<int>* alive_;
};

HandleLimits SmallLimits() {
  HandleLimits l;
  l.max_bytes_per_client = 1000;
  l.max_handles_per_client = 3;
  l.default_ttl = absl::Seconds(60);
  l.max_ttl = absl::Seconds(600);
  return l;
}

TEST(HandleRegistryTest, AddGetDelete) {
  HandleRegistry registry(SmallLimits());
  std::atomic<int> alive{0};
  absl::StatusOr<HandleRegistry::Reservation> r =
      registry.Reserve("alice", 400);
  ASSERT_TRUE(r.ok());
  HandleRegistry::Entry e =
      registry.Add(std::move(*r), std::make_shared<FakeTensor>(10, 10, &alive),
                   {10, 10}, absl::Seconds(60));
  EXPECT_EQ(e.id.size(), 34u);
  EXPECT_EQ(registry.stored_bytes(), 400);
  EXPECT_EQ(registry.stored_handles(), 1);
  absl::StatusOr<HandleRegistry::Entry> got = registry.Get(e.id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->owner, "alice");
  got->tensor.reset();
  e.tensor.reset();
  EXPECT_TRUE(registry.Delete(e.id).ok());
  EXPECT_EQ(alive, 0);
  EXPECT_EQ(registry.stored_bytes(), 0);
  EXPECT_EQ(registry.Get(e.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Delete(e.id).code(), absl::StatusCode::kNotFound);
}

TEST(HandleRegistryTest, WithAHomeIdsNameTheServerAndTheDevice) {
  HandleRegistry registry(SmallLimits());
  registry.SetHome("10.0.0.5:50051");
  EXPECT_EQ(registry.home(), "10.0.0.5:50051");
  std::atomic<int> alive{0};
  absl::StatusOr<HandleRegistry::Reservation> r =
      registry.Reserve("alice", 400);
  ASSERT_TRUE(r.ok());
  HandleRegistry::Entry e =
      registry.Add(std::move(*r), std::make_shared<FakeTensor>(10, 10, &alive),
                   {10, 10}, absl::Seconds(60));
  std::optional<HandleHome> home = HandleHomeOf(e.id);
  ASSERT_TRUE(home.has_value()) << e.id;
  EXPECT_EQ(home->address, "10.0.0.5:50051");
  EXPECT_EQ(home->device, 0);  // FakeTensor's
  // The random part keeps its 128 bits.
  EXPECT_EQ(e.id.size(), std::string("h1.10.0.0.5:50051.0.").size() + 32);
  ASSERT_TRUE(registry.Get(e.id).ok());
  // Only the whole id names the tensor: not its random part alone, nor it
  // under another home.
  const std::string random = e.id.substr(e.id.size() - 32);
  EXPECT_EQ(registry.Get("h-" + random).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Get("h1.10.0.0.6:50051.0." + random).status().code(),
            absl::StatusCode::kNotFound);
  e.tensor.reset();
  EXPECT_TRUE(registry.Delete(e.id).ok());
  EXPECT_EQ(alive, 0);
}

TEST(HandleRegistryTest, QuotasPerClient) {
  HandleRegistry registry(SmallLimits());
  std::atomic<int> alive{0};
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<HandleRegistry::Reservation> r =
        registry.Reserve("bob", 400);
    ASSERT_TRUE(r.ok());
    ids.push_back(registry
                      .Add(std::move(*r),
                           std::make_shared<FakeTensor>(10, 10, &alive),
                           {10, 10}, absl::Seconds(60))
                      .id);
  }
  absl::StatusOr<HandleRegistry::Reservation> over =
      registry.Reserve("bob", 400);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr("holds 800 bytes in stored tensors; this one needs "
                        "400 more, over the limit of 1000"));
  // Another client has its own quota.
  EXPECT_TRUE(registry.Reserve("carol", 400).ok());
  // A reservation given back (failed upload) returns the quota.
  {
    absl::StatusOr<HandleRegistry::Reservation> r =
        registry.Reserve("bob", 100);
    ASSERT_TRUE(r.ok());
  }
  absl::StatusOr<HandleRegistry::Reservation> small =
      registry.Reserve("bob", 100);
  ASSERT_TRUE(small.ok());
  // Count limit: 2 stored + 1 reserved = 3.
  EXPECT_EQ(registry.Reserve("bob", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(registry.Delete(ids[0]).ok());
  EXPECT_TRUE(registry.Reserve("bob", 1).ok());
}

TEST(HandleRegistryTest, TheServerTotalBoundsAllClientsTogether) {
  HandleLimits limits = SmallLimits();
  limits.max_bytes_total = 1000;
  limits.max_handles_per_client = 100;
  HandleRegistry registry(limits);
  std::atomic<int> alive{0};
  absl::StatusOr<HandleRegistry::Reservation> alice =
      registry.Reserve("alice", 400);
  ASSERT_TRUE(alice.ok());
  const std::string stored =
      registry
          .Add(std::move(*alice), std::make_shared<FakeTensor>(10, 10, &alive),
               {10, 10}, absl::Seconds(60))
          .id;
  absl::StatusOr<HandleRegistry::Reservation> bob =
      registry.Reserve("bob", 400);
  ASSERT_TRUE(bob.ok());
  // Carol is well inside her own quota, but not inside the server's.
  absl::StatusOr<HandleRegistry::Reservation> carol =
      registry.Reserve("carol", 400);
  EXPECT_EQ(carol.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(carol.status().message()),
              HasSubstr("the server holds 800 bytes in stored tensors for all "
                        "clients; this one needs 400 more, over the server's "
                        "limit of 1000 bytes (--max-stored-bytes)"));
  // Fresh client ids do not make room: 201 clients of 1 byte are too many.
  int admitted = 0;
  std::vector<HandleRegistry::Reservation> many;
  for (int i = 0; i < 201; ++i) {
    absl::StatusOr<HandleRegistry::Reservation> r =
        registry.Reserve(absl::StrCat("client-", i), 1);
    if (r.ok()) {
      ++admitted;
      many.push_back(std::move(*r));
    }
  }
  EXPECT_EQ(admitted, 200);
  many.clear();
  // A reservation given back and a tensor deleted both make room.
  bob = absl::CancelledError("bob's upload failed");
  EXPECT_TRUE(registry.Reserve("carol", 400).ok());
  EXPECT_FALSE(registry.Reserve("carol", 700).ok());
  EXPECT_TRUE(registry.Delete(stored).ok());
  EXPECT_TRUE(registry.Reserve("carol", 700).ok());
}

TEST(HandleRegistryTest, TheDefaultTotalAppliesWhenNoneWasGiven) {
  HandleRegistry unset(SmallLimits());  // per client 1000, no total
  EXPECT_EQ(unset.limits().max_bytes_total, 0);
  EXPECT_EQ(unset.limits().max_bytes_per_client, 1000);
  unset.SetDefaultTotalBytes(600);
  EXPECT_EQ(unset.limits().max_bytes_total, 600);
  // The per-client quota in effect never exceeds the total.
  EXPECT_EQ(unset.limits().max_bytes_per_client, 600);
  EXPECT_EQ(unset.Reserve("alice", 700).status().code(),
            absl::StatusCode::kResourceExhausted);

  HandleLimits given = SmallLimits();
  given.max_bytes_total = 5000;
  HandleRegistry set(given);
  set.SetDefaultTotalBytes(600);  // a flag's value wins over the default
  EXPECT_EQ(set.limits().max_bytes_total, 5000);
  EXPECT_EQ(set.limits().max_bytes_per_client, 1000);
}

TEST(HandleRegistryTest, ExpiredEntriesAreFreedBySweeper) {
  HandleRegistry registry(SmallLimits(), absl::Milliseconds(10));
  // An entry that outlives the test: the sweeper must leave it alone.
  std::atomic<int> kept_alive{0};
  absl::StatusOr<HandleRegistry::Reservation> k = registry.Reserve("erin", 4);
  ASSERT_TRUE(k.ok());
  const std::string kept =
      registry
          .Add(std::move(*k), std::make_shared<FakeTensor>(1, 1, &kept_alive),
               {1, 1}, absl::Seconds(600))
          .id;
  // An entry that expires soon.
  std::atomic<int> alive{0};
  absl::StatusOr<HandleRegistry::Reservation> r = registry.Reserve("dan", 4);
  ASSERT_TRUE(r.ok());
  const absl::Time added = absl::Now();  // its expiry is 50 ms after this
  const std::string id =
      registry
          .Add(std::move(*r), std::make_shared<FakeTensor>(1, 1, &alive),
               {1, 1}, absl::Milliseconds(50))
          .id;
  // It is there until it expires. A stall of 50 ms since `added` (a loaded
  // machine, a sanitizer) may have let it expire already: checked only
  // when none came.
  const bool early = registry.Get(id).ok();
  if (absl::Now() - added < absl::Milliseconds(50)) {
    EXPECT_TRUE(early);
  }
  for (int i = 0; i < 1000 && alive > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(alive, 0);
  EXPECT_EQ(registry.Get(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.Reserve("dan", 1000).ok());  // quota returned
  // The entry that has not expired is still there, and only its bytes are
  // stored.
  EXPECT_TRUE(registry.Get(kept).ok());
  EXPECT_EQ(kept_alive, 1);
  EXPECT_EQ(registry.stored_bytes(), 4);
}

TEST(HandleRegistryTest, TtlBounds) {
  HandleRegistry registry(SmallLimits());
  EXPECT_EQ(*registry.Ttl(0), absl::Seconds(60));
  EXPECT_EQ(*registry.Ttl(5), absl::Seconds(5));
  EXPECT_EQ(registry.Ttl(601).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Ttl(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HandleRegistryTest, ClearFreesEverything) {
  std::atomic<int> alive{0};
  {
    HandleRegistry registry(SmallLimits());
    for (const char* owner : {"a", "b"}) {
      absl::StatusOr<HandleRegistry::Reservation> r =
          registry.Reserve(owner, 4);
      ASSERT_TRUE(r.ok());
      registry.Add(std::move(*r), std::make_shared<FakeTensor>(1, 1, &alive),
                   {1, 1}, absl::Seconds(60));
    }
    EXPECT_EQ(alive, 2);
    registry.Clear();
    EXPECT_EQ(alive, 0);
  }
}

}  // namespace
}  // namespace matmul
