// AtomicHistogram: a fixed-bucket histogram that records without a lock, for
// the per-request hot path. prometheus-cpp 1.0's Histogram::Observe takes a
// std::mutex; this one does one relaxed atomic increment and one
// compare-exchange on the sum. It is exported at scrape time through a
// prometheus::Collectable (ServerMetrics).
#ifndef MATMUL_SERVER_ATOMIC_HISTOGRAM_H_
#define MATMUL_SERVER_ATOMIC_HISTOGRAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "prometheus/client_metric.h"

namespace matmul {

// Thread-safe; Observe is lock-free and wait-free apart from the sum's
// compare-exchange loop. A snapshot taken while observations are running
// may miss some of them in its sum, never in its buckets' consistency: the
// count and the +Inf bucket are derived from the same bucket reads.
class AtomicHistogram {
 public:
  // `upper_bounds`: strictly increasing finite bucket bounds (`le`); the
  // +Inf bucket is implicit.
  explicit AtomicHistogram(std::vector<double> upper_bounds);

  AtomicHistogram(const AtomicHistogram&) = delete;
  AtomicHistogram& operator=(const AtomicHistogram&) = delete;

  // Records one value; negative values count as 0, NaN is ignored.
  void Observe(double value);

  // Cumulative buckets (the last one +Inf), count and sum, as prometheus-cpp
  // serializes them.
  prometheus::ClientMetric::Histogram Snapshot() const;

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }

 private:
  const std::vector<double> upper_bounds_;
  // counts_[i]: values in (upper_bounds_[i-1], upper_bounds_[i]]; the last
  // one: above every bound.
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

}  // namespace matmul

#endif  // MATMUL_SERVER_ATOMIC_HISTOGRAM_H_
