// IdleMemoryTrimmer's decision, driven by hand: an injected clock, activity
// and trim function; no thread, no sleeps.
#include "server/idle_memory_trimmer.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace matmul {
namespace {

class IdleMemoryTrimmerTest : public ::testing::Test {
 protected:
  IdleMemoryTrimmerTest()
      : trimmer_(
            absl::Seconds(2), [this] { return activity_; },
            [this] { ++trimmed_; }) {}

  // Ticks at `seconds` after the start.
  bool TickAt(double seconds) {
    return trimmer_.Tick(start_ + absl::Seconds(seconds));
  }
  void CallStarts() { ++activity_.calls_started; }

  const absl::Time start_ = absl::FromUnixSeconds(1000);
  IdleMemoryTrimmer::Activity activity_;
  int trimmed_ = 0;
  IdleMemoryTrimmer trimmer_;
};

TEST_F(IdleMemoryTrimmerTest, NothingHappenedNothingIsTrimmed) {
  for (double t = 0; t < 60; t += 0.5) EXPECT_FALSE(TickAt(t));
  EXPECT_EQ(trimmed_, 0);
}

TEST_F(IdleMemoryTrimmerTest, TrimsOnceAQuietSpellFollowsWork) {
  CallStarts();
  EXPECT_FALSE(TickAt(0));
  EXPECT_FALSE(TickAt(1));
  EXPECT_FALSE(TickAt(1.9));
  EXPECT_TRUE(TickAt(2));
  EXPECT_EQ(trimmed_, 1);
  // Still quiet: nothing more to give back.
  for (double t = 2.5; t < 60; t += 0.5) EXPECT_FALSE(TickAt(t));
  EXPECT_EQ(trimmer_.trims(), 1);
  // More work, another quiet spell, another trim.
  CallStarts();
  EXPECT_FALSE(TickAt(60));
  EXPECT_TRUE(TickAt(62.5));
  EXPECT_EQ(trimmed_, 2);
}

TEST_F(IdleMemoryTrimmerTest, NeverWhileWorkIsInFlight) {
  CallStarts();
  activity_.busy = true;  // one long multiply, no new call
  for (double t = 0; t < 30; t += 0.5) EXPECT_FALSE(TickAt(t));
  activity_.busy = false;
  EXPECT_FALSE(TickAt(31));
  EXPECT_TRUE(TickAt(32.5));  // quiet counts from the last busy look
}

TEST_F(IdleMemoryTrimmerTest, CallsThatKeepComingPutItOff) {
  for (double t = 0; t < 30; t += 0.5) {
    CallStarts();  // short calls, each over between two looks
    EXPECT_FALSE(TickAt(t));
  }
  EXPECT_EQ(trimmed_, 0);
  EXPECT_TRUE(TickAt(31.5));
}

TEST(IdleMemoryTrimmerThreadTest,
     TheThreadTrimsAfterWorkAndStopsWhenDestroyed) {
  std::atomic<uint64_t> calls{1};
  std::atomic<int> trimmed{0};
  {
    IdleMemoryTrimmer trimmer(
        absl::Milliseconds(40),
        [&] {
          return IdleMemoryTrimmer::Activity{calls.load(), false};
        },
        [&] { trimmed.fetch_add(1); });
    trimmer.Start();
    for (int i = 0; i < 500 && trimmed.load() == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(trimmed.load(), 1);
  }  // joins the thread
  const int after = trimmed.load();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(trimmed.load(), after);
}

// The real one runs (glibc's malloc_trim) and leaves the heap usable.
TEST(IdleMemoryTrimmerThreadTest, ReleaseFreeHeapMemoryKeepsTheHeapUsable) {
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 64; ++i) blocks.emplace_back(new char[1 << 16]());
  blocks.clear();
  IdleMemoryTrimmer::ReleaseFreeHeapMemory();
  std::unique_ptr<char[]> again(new char[1 << 20]());
  again[(1 << 20) - 1] = 1;
  EXPECT_EQ(again[(1 << 20) - 1], 1);
}

}  // namespace
}  // namespace matmul
