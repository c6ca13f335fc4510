#include "gpu/interval_union.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace matmul {
namespace {

TEST(IntervalUnionTest, AddReturnsNewlyCoveredLength) {
  IntervalUnion u;
  EXPECT_DOUBLE_EQ(u.Add(0, 10).added, 10);
  EXPECT_DOUBLE_EQ(u.Add(5, 15).added, 5);    // overlaps the first
  EXPECT_DOUBLE_EQ(u.Add(20, 30).added, 10);  // disjoint
  EXPECT_DOUBLE_EQ(u.Add(2, 25).added, 5);    // fills the gap [15, 20)
  EXPECT_DOUBLE_EQ(u.Add(0, 30).added, 0);
  EXPECT_EQ(u.size(), 1u);
  EXPECT_DOUBLE_EQ(u.Covered(-5, 35), 30);
  EXPECT_DOUBLE_EQ(u.Add(30, 30).added, 0);  // empty interval
}

TEST(IntervalUnionTest, OutOfOrderArrivalsSumToTheUnion) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> start(0, 900);
  std::uniform_real_distribution<double> length(0, 30);
  IntervalUnion u;
  std::vector<char> grid(2000, 0);  // 0.5-unit cells, starts on the grid
  double total = 0;
  for (int i = 0; i < 500; ++i) {
    const double s = static_cast<int>(start(gen));
    const double e = s + static_cast<int>(length(gen));
    total += u.Add(s, e).added;
    for (int c = static_cast<int>(s * 2); c < static_cast<int>(e * 2); ++c)
      grid[c] = 1;
  }
  double want = 0;
  for (char c : grid) want += c * 0.5;
  EXPECT_NEAR(total, want, 1e-9);
}

// Copy and compute intervals arriving in any order: the summed overlaps
// equal |copy ∩ compute| computed directly.
TEST(IntervalUnionTest, IncrementalIntersectionIsExact) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> start(0, 400);
  std::uniform_int_distribution<int> length(1, 20);
  IntervalUnion copy;
  IntervalUnion compute;
  std::vector<char> copy_grid(500, 0), compute_grid(500, 0);
  double overlap = 0;
  for (int i = 0; i < 300; ++i) {
    const int s = start(gen);
    const int e = s + length(gen);
    if (gen() % 2) {
      overlap += copy.Add(s, e, &compute).overlap;
      for (int c = s; c < e; ++c) copy_grid[c] = 1;
    } else {
      overlap += compute.Add(s, e, &copy).overlap;
      for (int c = s; c < e; ++c) compute_grid[c] = 1;
    }
  }
  double want = 0;
  for (int c = 0; c < 500; ++c) want += copy_grid[c] && compute_grid[c];
  EXPECT_DOUBLE_EQ(overlap, want);
}

TEST(IntervalUnionTest, ForgetBeforeDropsOldIntervals) {
  IntervalUnion u;
  u.Add(0, 1);
  u.Add(5, 6);
  u.Add(10, 11);
  u.ForgetBefore(7);
  EXPECT_EQ(u.size(), 1u);
  EXPECT_DOUBLE_EQ(u.Covered(0, 20), 1);
}

}  // namespace
}  // namespace matmul
