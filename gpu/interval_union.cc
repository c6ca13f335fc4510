#include "gpu/interval_union.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

namespace matmul {
namespace {

// The parts of [start, end) not covered by `intervals`, in order.
std::vector<std::pair<double, double>> Gaps(
    const std::map<double, double>& intervals, double start, double end) {
  std::vector<std::pair<double, double>> gaps;
  auto it = intervals.upper_bound(start);
  if (it != intervals.begin()) {
    auto prev = std::prev(it);
    if (prev->second > start) start = prev->second;
  }
  for (; start < end && it != intervals.end() && it->first < end; ++it) {
    if (it->first > start) gaps.emplace_back(start, it->first);
    start = std::max(start, it->second);
  }
  if (start < end) gaps.emplace_back(start, end);
  return gaps;
}

}  // namespace

double IntervalUnion::Covered(double start, double end) const {
  if (!(end > start)) return 0;
  double gaps = 0;
  for (const auto& [s, e] : Gaps(intervals_, start, end)) gaps += e - s;
  return (end - start) - gaps;
}

IntervalUnion::Added IntervalUnion::Add(double start, double end,
                                        const IntervalUnion* other) {
  Added result;
  if (!(end > start)) return result;
  for (const auto& [s, e] : Gaps(intervals_, start, end)) {
    result.added += e - s;
    if (other != nullptr) result.overlap += other->Covered(s, e);
  }
  // Merge every interval that touches [start, end) into one.
  auto it = intervals_.upper_bound(start);
  if (it != intervals_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= start) it = prev;
  }
  while (it != intervals_.end() && it->first <= end) {
    start = std::min(start, it->first);
    end = std::max(end, it->second);
    it = intervals_.erase(it);
  }
  intervals_.emplace(start, end);
  return result;
}

void IntervalUnion::ForgetBefore(double t) {
  auto it = intervals_.begin();
  while (it != intervals_.end() && it->second < t) it = intervals_.erase(it);
}

}  // namespace matmul
