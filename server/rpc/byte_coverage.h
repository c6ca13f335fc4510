// ByteCoverage: which bytes of an operand have arrived, as disjoint ranges,
// so that chunks may come in any order (and on any stream of a striped
// multiply) while each byte is taken exactly once. Not thread-safe: the
// owner serializes.
#ifndef MATMUL_SERVER_RPC_BYTE_COVERAGE_H_
#define MATMUL_SERVER_RPC_BYTE_COVERAGE_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

namespace matmul {

class ByteCoverage {
 public:
  // [begin, end) of bytes covered before.
  using Range = std::pair<int64_t, int64_t>;

  // The first range covered before that [at, at + n) overlaps, if any.
  std::optional<Range> Overlap(int64_t at, int64_t n) const {
    auto it = ranges_.upper_bound(at);
    if (it != ranges_.begin()) {
      auto before = std::prev(it);
      if (before->second > at) return Range(before->first, before->second);
    }
    if (it != ranges_.end() && it->first < at + n) {
      return Range(it->first, it->second);
    }
    return std::nullopt;
  }

  // Adds [at, at + n), which must not overlap (see Overlap), merging it
  // with the ranges it touches.
  void Add(int64_t at, int64_t n) {
    int64_t begin = at, end = at + n;
    auto it = ranges_.upper_bound(at);
    if (it != ranges_.begin()) {
      auto before = std::prev(it);
      if (before->second == at) {
        begin = before->first;
        ranges_.erase(before);
      }
    }
    if (it != ranges_.end() && it->first == end) {
      end = it->second;
      ranges_.erase(it);
    }
    ranges_[begin] = end;
    covered_ += n;
  }

  int64_t covered() const { return covered_; }
  // The first byte not covered (0 if none is).
  int64_t FirstGap() const {
    auto it = ranges_.begin();
    return it != ranges_.end() && it->first == 0 ? it->second : 0;
  }

 private:
  std::map<int64_t, int64_t> ranges_;  // begin -> end, disjoint, not touching
  int64_t covered_ = 0;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_BYTE_COVERAGE_H_
