#include "server/atomic_histogram.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace matmul {

AtomicHistogram::AtomicHistogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    counts_[i].store(0, std::memory_order_relaxed);
  }
}

void AtomicHistogram::Observe(double value) {
  if (std::isnan(value)) return;
  value = std::max(value, 0.0);
  // `le` buckets: the first bound that is >= value.
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) -
      upper_bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  double sum = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(sum, sum + value,
                                     std::memory_order_relaxed)) {
  }
}

prometheus::ClientMetric::Histogram AtomicHistogram::Snapshot() const {
  prometheus::ClientMetric::Histogram out;
  out.bucket.reserve(upper_bounds_.size() + 1);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    prometheus::ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound = i < upper_bounds_.size()
                             ? upper_bounds_[i]
                             : std::numeric_limits<double>::infinity();
    out.bucket.push_back(bucket);
  }
  out.sample_count = cumulative;
  out.sample_sum = sum_.load(std::memory_order_relaxed);
  return out;
}

}  // namespace matmul
