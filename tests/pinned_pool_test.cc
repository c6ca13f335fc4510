#include "gpu/cuda/pinned_pool.h"

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace matmul {
namespace {

PinnedPool MakePool(int64_t bytes, int64_t alignment = 4096) {
  auto* data = new std::byte[bytes];
  return PinnedPool(HostBuffer(data, bytes, [data] { delete[] data; }),
                    alignment);
}

TEST(PinnedPoolTest, LeasesAreAlignedDisjointAndReturned) {
  PinnedPool pool = MakePool(1 << 20);
  EXPECT_EQ(pool.capacity(), 1 << 20);
  std::optional<PinnedPool::Lease> a = pool.TryAcquire(100);
  std::optional<PinnedPool::Lease> b = pool.TryAcquire(5000);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->size(), 4096);
  EXPECT_EQ(b->size(), 8192);
  EXPECT_EQ((b->data() - a->data()) % 4096, 0);
  EXPECT_TRUE(b->data() >= a->data() + a->size() ||
              a->data() >= b->data() + b->size());
  EXPECT_EQ(pool.used(), 4096 + 8192);
  a.reset();
  b.reset();
  EXPECT_EQ(pool.used(), 0);
  // Everything merged back: the whole region can be leased at once.
  EXPECT_TRUE(pool.TryAcquire(1 << 20).has_value());
}

TEST(PinnedPoolTest, FullPoolRefusesAndRecoversAfterRelease) {
  PinnedPool pool = MakePool(64 * 1024);
  std::vector<PinnedPool::Lease> leases;
  for (int i = 0; i < 16; ++i) {
    std::optional<PinnedPool::Lease> l = pool.TryAcquire(4096);
    ASSERT_TRUE(l.has_value());
    leases.push_back(std::move(*l));
  }
  EXPECT_FALSE(pool.TryAcquire(1).has_value());
  // Free every other lease: 8 holes of 4 KiB, none of 8 KiB.
  for (int i = 0; i < 16; i += 2) leases[i].Release();
  EXPECT_FALSE(pool.TryAcquire(8192).has_value());
  EXPECT_TRUE(pool.TryAcquire(4096).has_value());
  leases.clear();
  EXPECT_EQ(pool.used(), 0);
  EXPECT_TRUE(pool.TryAcquire(64 * 1024).has_value());
}

TEST(PinnedPoolTest, AcquireWaitsForARelease) {
  PinnedPool pool = MakePool(8192);
  std::optional<PinnedPool::Lease> held = pool.TryAcquire(8192);
  ASSERT_TRUE(held.has_value());
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));  // let Acquire block first
    released = true;
    held.reset();
  });
  absl::StatusOr<PinnedPool::Lease> lease =
      pool.Acquire(8192, [] { return absl::OkStatus(); });
  // Only a release can have made room for it.
  EXPECT_TRUE(released) << "Acquire returned while the pool was full";
  releaser.join();
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->size(), 8192);
}

TEST(PinnedPoolTest, AcquireGivesUpWhenTheJobIsAbandoned) {
  PinnedPool pool = MakePool(8192);
  std::optional<PinnedPool::Lease> held = pool.TryAcquire(8192);
  int asked = 0;
  absl::StatusOr<PinnedPool::Lease> lease = pool.Acquire(
      4096,
      [&] {
        return ++asked < 3 ? absl::OkStatus()
                           : absl::CancelledError("client went away");
      },
      absl::Milliseconds(1));
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(asked, 3);
}

TEST(PinnedPoolTest, RequestLargerThanThePoolIsResourceExhausted) {
  PinnedPool pool = MakePool(8192);
  absl::StatusOr<PinnedPool::Lease> lease =
      pool.Acquire(1 << 20, [] { return absl::OkStatus(); });
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(lease.status().message().find("--pinned-pool-bytes"),
            absl::string_view::npos);
}

TEST(PinnedPoolTest, ConcurrentLeasesNeverOverlap) {
  PinnedPool pool = MakePool(1 << 22, 256);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 gen(t);
      for (int i = 0; i < 2000; ++i) {
        const int64_t size = 1 + gen() % 20000;
        absl::StatusOr<PinnedPool::Lease> lease =
            pool.Acquire(size, [] { return absl::OkStatus(); });
        if (!lease.ok()) {
          ++failures;
          continue;
        }
        // Fill with a per-thread byte and check nobody else wrote into it.
        std::memset(lease->data(), t, static_cast<size_t>(size));
        for (int64_t j = 0; j < size; j += 97) {
          if (lease->data()[j] != static_cast<std::byte>(t)) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(pool.used(), 0);
}

}  // namespace
}  // namespace matmul
