// LatencyHistogram: a fixed-size, log-linear (HDR-style) histogram of
// non-negative integer values, used by matmul-bench for request latencies in
// nanoseconds.
//
// Values below 256 have a bucket each; above, every power-of-two range
// [2^e, 2^(e+1)) is split into 128 equal buckets, so a bucket is at most
// 1/128 of its lower bound wide. A percentile is reported as the middle of
// its bucket (clamped to the exact minimum and maximum seen), which puts it
// within 1/256 (0.4%) of a recorded value of that rank. The whole int64
// range is covered by 7,296 buckets (58 KiB), allocated once: recording never
// allocates.
//
// Thread safety: Record, Merge's source side and the const accessors may run
// from any number of threads at once (the counters are relaxed atomics).
// Readers racing with Record see some consistent-enough mix (each counter is
// exact, the set of them may be a few values apart); read after the writers
// are done for exact results. Reset, Merge and assignment must not race with
// anything else on the destination.
#ifndef MATMUL_CLIENT_TOOLS_LATENCY_HISTOGRAM_H_
#define MATMUL_CLIENT_TOOLS_LATENCY_HISTOGRAM_H_

#include <atomic>
#include <cstdint>
#include <memory>

namespace matmul {

class LatencyHistogram {
 public:
  // Buckets: 256 exact ones, then 128 per power of two up to 2^63.
  static constexpr int kSubBucketBits = 7;
  static constexpr int64_t kSubBuckets = int64_t{1} << kSubBucketBits;
  static constexpr int kBucketCount =
      2 * kSubBuckets + (63 - kSubBucketBits - 1) * kSubBuckets;

  LatencyHistogram();
  LatencyHistogram(const LatencyHistogram& other);
  LatencyHistogram& operator=(const LatencyHistogram& other);

  // Adds one value; negative values count as 0.
  void Record(int64_t value);

  // Adds every value `other` holds.
  void Merge(const LatencyHistogram& other);

  // Forgets every value.
  void Reset();

  // Values recorded.
  int64_t count() const { return count_.load(std::memory_order_relaxed); }
  // Exact smallest and largest value (0 when empty).
  int64_t min() const;
  int64_t max() const;
  // Exact arithmetic mean (0 when empty).
  double mean() const;

  // The value at quantile q in [0, 1] (0.5 = median, 0.999 = p99.9): the
  // middle of the bucket that holds the ceil(q * count)-th smallest value,
  // clamped to [min, max]. 0 when empty; q outside [0, 1] is clamped.
  double Percentile(double q) const;

  // Bucket arithmetic, exposed for tests.
  static int BucketIndex(int64_t value);
  static int64_t BucketLowerBound(int index);
  static int64_t BucketWidth(int index);

 private:
  std::unique_ptr<std::atomic<int64_t>[]> buckets_;
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> sum_{0};  // wraps after ~292 years of nanoseconds
  std::atomic<int64_t> min_;
  std::atomic<int64_t> max_{0};
};

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_LATENCY_HISTOGRAM_H_
