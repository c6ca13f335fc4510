// IntervalUnion: the union of time intervals that arrive out of order, with
// incremental measures. Used to turn per-stream busy intervals (from CUDA
// events) into device-level busy time (the union over streams) and into the
// time copies overlapped compute (the intersection of two unions), without
// double counting. Not thread-safe: callers serialize.
#ifndef MATMUL_GPU_INTERVAL_UNION_H_
#define MATMUL_GPU_INTERVAL_UNION_H_

#include <cstddef>
#include <map>

namespace matmul {

class IntervalUnion {
 public:
  struct Added {
    double added = 0;    // length of [start, end) not covered before
    double overlap = 0;  // length of that part which `other` covers
  };

  // Adds [start, end). With two sets A and B, adding each interval to its
  // set with the other set as `other` and summing `overlap` over all adds
  // gives |A ∩ B| exactly (each point is counted once, when the later of
  // its two coverings arrives).
  Added Add(double start, double end, const IntervalUnion* other = nullptr);

  // Length of [start, end) that the union covers.
  double Covered(double start, double end) const;

  // Forgets everything that ends before `t` (intervals still to come must
  // start at or after t for the measures to stay exact).
  void ForgetBefore(double t);

  size_t size() const { return intervals_.size(); }

 private:
  // Disjoint, non-adjacent intervals: start -> end.
  std::map<double, double> intervals_;
};

}  // namespace matmul

#endif  // MATMUL_GPU_INTERVAL_UNION_H_
