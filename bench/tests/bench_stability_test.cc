#include "bench/service/bench_stability.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

TEST(BenchStabilityTest, ThreeWindowsWithinTheToleranceAreStable) {
  const Stability s = JudgeStability({1000, 1050, 980}, 0.10);
  EXPECT_TRUE(s.stable);
  EXPECT_NEAR(s.spread, 1050.0 / 980 - 1, 1e-12);
}

TEST(BenchStabilityTest, FewerThanThreeWindowsAreNeverStable) {
  EXPECT_FALSE(JudgeStability({}, 0.10).stable);
  EXPECT_FALSE(JudgeStability({1000}, 0.10).stable);
  EXPECT_FALSE(JudgeStability({1000, 1000}, 0.10).stable);
  EXPECT_EQ(JudgeStability({1000}, 0.10).spread, 0);
}

TEST(BenchStabilityTest, OnlyTheLastThreeCount) {
  // A warm-up transient in the first windows does not matter once the
  // last three agree; a jump in the last one does.
  EXPECT_TRUE(JudgeStability({200, 600, 1000, 1020, 1010}, 0.10).stable);
  EXPECT_FALSE(JudgeStability({1000, 1020, 1010, 1300}, 0.10).stable);
}

TEST(BenchStabilityTest, ZeroRateIsNotStable) {
  const Stability s = JudgeStability({0, 0, 0}, 0.10);
  EXPECT_FALSE(s.stable);
  EXPECT_TRUE(std::isinf(s.spread));
}

TEST(BenchStabilityTest, TheLineSaysWhatHappened) {
  const std::vector<double> ok = {1000, 1050, 980};
  EXPECT_THAT(StabilityLine(ok, JudgeStability(ok, 0.10), 0.10),
              HasSubstr("stable after 3 windows (spread 7.1%): 1000.0 "
                        "1050.0 980.0 req/s"));
  const std::vector<double> bad = {1000, 1300, 900};
  EXPECT_THAT(StabilityLine(bad, JudgeStability(bad, 0.10), 0.10),
              HasSubstr("NOT stable after 3 windows (spread 44.4%, tolerance "
                        "10%)"));
}

}  // namespace
}  // namespace matmul
