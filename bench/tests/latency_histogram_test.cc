// Tests of LatencyHistogram: bucket arithmetic, exact small values, and
// percentiles of known distributions within 1% of the exact order
// statistics.
#include "bench/service/latency_histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

namespace matmul {
namespace {

// The exact value of rank ceil(q * n) in `sorted`, as Percentile defines it.
double ExactPercentile(const std::vector<int64_t>& sorted, double q) {
  const int64_t n = static_cast<int64_t>(sorted.size());
  int64_t rank = static_cast<int64_t>(std::ceil(q * n - 1e-9));
  rank = std::max<int64_t>(1, std::min(n, rank));
  return static_cast<double>(sorted[rank - 1]);
}

void ExpectPercentilesWithin1Percent(std::vector<int64_t> values) {
  LatencyHistogram h;
  for (int64_t v : values) h.Record(v);
  std::sort(values.begin(), values.end());
  ASSERT_EQ(h.count(), static_cast<int64_t>(values.size()));
  EXPECT_EQ(h.min(), values.front());
  EXPECT_EQ(h.max(), values.back());
  for (double q :
       {0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0}) {
    const double want = ExactPercentile(values, q);
    const double got = h.Percentile(q);
    EXPECT_NEAR(got, want, 0.01 * want + 0.5) << "q = " << q;
  }
}

TEST(LatencyHistogramTest, BucketsCoverTheRangeContiguously) {
  int64_t expected_lower = 0;
  for (int i = 0; i < LatencyHistogram::kBucketCount; ++i) {
    ASSERT_EQ(LatencyHistogram::BucketLowerBound(i), expected_lower)
        << "bucket " << i;
    const int64_t width = LatencyHistogram::BucketWidth(i);
    ASSERT_EQ(LatencyHistogram::BucketIndex(expected_lower), i);
    ASSERT_EQ(LatencyHistogram::BucketIndex(expected_lower + (width - 1)), i);
    // At most 1/128 of the lower bound wide, beyond the exact buckets.
    if (i >= 256) {
      ASSERT_LE(width * 128, expected_lower) << "bucket " << i;
    }
    if (i + 1 < LatencyHistogram::kBucketCount) expected_lower += width;
  }
  EXPECT_EQ(LatencyHistogram::BucketIndex(INT64_MAX),
            LatencyHistogram::kBucketCount - 1);
}

TEST(LatencyHistogramTest, EmptyIsZero) {
  LatencyHistogram h;
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(h.min(), 0);
  EXPECT_EQ(h.max(), 0);
  EXPECT_EQ(h.mean(), 0);
  EXPECT_EQ(h.Percentile(0.5), 0);
}

TEST(LatencyHistogramTest, SmallValuesAreExact) {
  LatencyHistogram h;
  for (int v = 1; v <= 100; ++v) h.Record(v);
  EXPECT_EQ(h.Percentile(0.5), 50);
  EXPECT_EQ(h.Percentile(0.99), 99);
  EXPECT_EQ(h.Percentile(0.999), 100);
  EXPECT_EQ(h.Percentile(1), 100);
  EXPECT_EQ(h.Percentile(0), 1);
  EXPECT_DOUBLE_EQ(h.mean(), 50.5);
}

TEST(LatencyHistogramTest, SingleValueIsExact) {
  LatencyHistogram h;
  h.Record(123456789);
  EXPECT_EQ(h.Percentile(0.5), 123456789);
  EXPECT_EQ(h.Percentile(0.999), 123456789);
}

TEST(LatencyHistogramTest, NegativeCountsAsZero) {
  LatencyHistogram h;
  h.Record(-5);
  EXPECT_EQ(h.min(), 0);
  EXPECT_EQ(h.Percentile(0.5), 0);
}

TEST(LatencyHistogramTest, UniformWithin1Percent) {
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int64_t> dist(100000, 50000000);  // 0.1-50 ms
  std::vector<int64_t> values(200000);
  for (int64_t& v : values) v = dist(rng);
  ExpectPercentilesWithin1Percent(values);
}

TEST(LatencyHistogramTest, ExponentialWithin1Percent) {
  std::mt19937_64 rng(2);
  std::exponential_distribution<double> dist(1.0 / 2e6);  // mean 2 ms
  std::vector<int64_t> values(200000);
  for (int64_t& v : values) v = static_cast<int64_t>(dist(rng)) + 1000;
  ExpectPercentilesWithin1Percent(values);
}

TEST(LatencyHistogramTest, LogNormalWithin1Percent) {
  std::mt19937_64 rng(3);
  // Median ~1 ms with a long tail (p99.9 near 100 ms).
  std::lognormal_distribution<double> dist(std::log(1e6), 1.5);
  std::vector<int64_t> values(200000);
  for (int64_t& v : values) v = static_cast<int64_t>(dist(rng));
  ExpectPercentilesWithin1Percent(values);
}

TEST(LatencyHistogramTest, BimodalWithin1Percent) {
  // 95% fast (~0.3 ms), 5% slow (~40 ms): the tail percentiles land in the
  // second mode.
  std::mt19937_64 rng(4);
  std::normal_distribution<double> fast(3e5, 2e4);
  std::normal_distribution<double> slow(4e7, 5e6);
  std::uniform_real_distribution<double> pick(0, 1);
  std::vector<int64_t> values(100000);
  for (int64_t& v : values) {
    v = std::max<int64_t>(
        1, static_cast<int64_t>(pick(rng) < 0.95 ? fast(rng) : slow(rng)));
  }
  ExpectPercentilesWithin1Percent(values);
}

TEST(LatencyHistogramTest, HugeValues) {
  ExpectPercentilesWithin1Percent(
      {int64_t{1} << 40, (int64_t{1} << 50) + 12345, INT64_MAX / 3, 7});
}

TEST(LatencyHistogramTest, MergeAndCopy) {
  LatencyHistogram a;
  LatencyHistogram b;
  for (int v = 1; v <= 50; ++v) a.Record(v * 1000);
  for (int v = 51; v <= 100; ++v) b.Record(v * 1000);
  a.Merge(b);
  EXPECT_EQ(a.count(), 100);
  EXPECT_EQ(a.min(), 1000);
  EXPECT_EQ(a.max(), 100000);
  EXPECT_NEAR(a.Percentile(0.5), 50000, 500);
  LatencyHistogram c = a;
  EXPECT_EQ(c.count(), 100);
  EXPECT_EQ(c.Percentile(0.9), a.Percentile(0.9));
  c.Reset();
  EXPECT_EQ(c.count(), 0);
  EXPECT_EQ(c.Percentile(0.9), 0);
  c = a;
  EXPECT_EQ(c.count(), 100);
}

TEST(LatencyHistogramTest, ConcurrentRecordLosesNothing) {
  LatencyHistogram h;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < kPerThread; ++i) h.Record(1000 + t * 100000 + i);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(h.count(), kThreads * kPerThread);
  EXPECT_EQ(h.min(), 1000);
  EXPECT_EQ(h.max(), 1000 + (kThreads - 1) * 100000 + kPerThread - 1);
}

}  // namespace
}  // namespace matmul
