#include "bench/service/latency_histogram.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace matmul {
namespace {

constexpr int64_t kNoMin = std::numeric_limits<int64_t>::max();

int HighestBit(uint64_t v) { return 63 - __builtin_clzll(v); }

void StoreMin(std::atomic<int64_t>& target, int64_t value) {
  int64_t seen = target.load(std::memory_order_relaxed);
  while (value < seen && !target.compare_exchange_weak(
                             seen, value, std::memory_order_relaxed)) {
  }
}

void StoreMax(std::atomic<int64_t>& target, int64_t value) {
  int64_t seen = target.load(std::memory_order_relaxed);
  while (value > seen && !target.compare_exchange_weak(
                             seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

LatencyHistogram::LatencyHistogram()
    : buckets_(new std::atomic<int64_t>[kBucketCount]), min_(kNoMin) {
  for (int i = 0; i < kBucketCount; ++i) {
    buckets_[i].store(0, std::memory_order_relaxed);
  }
}

LatencyHistogram::LatencyHistogram(const LatencyHistogram& other)
    : LatencyHistogram() {
  Merge(other);
}

LatencyHistogram& LatencyHistogram::operator=(const LatencyHistogram& other) {
  if (this != &other) {
    Reset();
    Merge(other);
  }
  return *this;
}

int LatencyHistogram::BucketIndex(int64_t value) {
  if (value < 2 * kSubBuckets) return value < 0 ? 0 : static_cast<int>(value);
  const int exponent = HighestBit(static_cast<uint64_t>(value));
  const int shift = exponent - kSubBucketBits;
  const int64_t sub = (value >> shift) - kSubBuckets;
  return static_cast<int>(2 * kSubBuckets +
                          (exponent - kSubBucketBits - 1) * kSubBuckets + sub);
}

int64_t LatencyHistogram::BucketLowerBound(int index) {
  if (index < 2 * kSubBuckets) return index;
  const int64_t r = index - 2 * kSubBuckets;
  const int shift = static_cast<int>(r / kSubBuckets) + 1;
  return (kSubBuckets + r % kSubBuckets) << shift;
}

int64_t LatencyHistogram::BucketWidth(int index) {
  if (index < 2 * kSubBuckets) return 1;
  const int shift =
      static_cast<int>((index - 2 * kSubBuckets) / kSubBuckets) + 1;
  return int64_t{1} << shift;
}

void LatencyHistogram::Record(int64_t value) {
  if (value < 0) value = 0;
  buckets_[BucketIndex(value)].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
  StoreMin(min_, value);
  StoreMax(max_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  const int64_t n = other.count();
  if (n == 0) return;
  for (int i = 0; i < kBucketCount; ++i) {
    const int64_t c = other.buckets_[i].load(std::memory_order_relaxed);
    if (c != 0) buckets_[i].fetch_add(c, std::memory_order_relaxed);
  }
  sum_.fetch_add(other.sum_.load(std::memory_order_relaxed),
                 std::memory_order_relaxed);
  StoreMin(min_, other.min_.load(std::memory_order_relaxed));
  StoreMax(max_, other.max_.load(std::memory_order_relaxed));
  count_.fetch_add(n, std::memory_order_relaxed);
}

void LatencyHistogram::Reset() {
  for (int i = 0; i < kBucketCount; ++i) {
    buckets_[i].store(0, std::memory_order_relaxed);
  }
  count_.store(0, std::memory_order_relaxed);
  sum_.store(0, std::memory_order_relaxed);
  min_.store(kNoMin, std::memory_order_relaxed);
  max_.store(0, std::memory_order_relaxed);
}

int64_t LatencyHistogram::min() const {
  return count() == 0 ? 0 : min_.load(std::memory_order_relaxed);
}

int64_t LatencyHistogram::max() const {
  return count() == 0 ? 0 : max_.load(std::memory_order_relaxed);
}

double LatencyHistogram::mean() const {
  const int64_t n = count();
  if (n == 0) return 0;
  return static_cast<double>(sum_.load(std::memory_order_relaxed)) /
         static_cast<double>(n);
}

double LatencyHistogram::Percentile(double q) const {
  // Sum the buckets rather than trusting count_, which a concurrent Record
  // may have bumped before or after its bucket.
  int64_t total = 0;
  for (int i = 0; i < kBucketCount; ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
  }
  if (total == 0) return 0;
  if (!(q > 0)) q = 0;  // also NaN
  if (q > 1) q = 1;
  // rank = ceil(q * total), forgiving the rounding error of the product
  // (0.999 * 1000 must be 999, not 1000).
  const double exact = q * static_cast<double>(total);
  int64_t rank = static_cast<int64_t>(exact);
  if (exact - static_cast<double>(rank) > 1e-9 * std::max(1.0, exact)) ++rank;
  rank = std::max<int64_t>(1, std::min(total, rank));
  int64_t seen = 0;
  int index = kBucketCount - 1;
  for (int i = 0; i < kBucketCount; ++i) {
    seen += buckets_[i].load(std::memory_order_relaxed);
    if (seen >= rank) {
      index = i;
      break;
    }
  }
  const double middle = static_cast<double>(BucketLowerBound(index)) +
                        static_cast<double>(BucketWidth(index) - 1) / 2.0;
  const double lo = static_cast<double>(min());
  const double hi = static_cast<double>(max());
  return std::min(std::max(middle, lo), hi);
}

}  // namespace matmul
