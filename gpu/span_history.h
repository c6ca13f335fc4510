// SpanHistory: a bounded, thread-safe record of recent stream activity
// (StreamSpan), for the pipeline timeline. Oldest spans are dropped first.
#ifndef MATMUL_GPU_SPAN_HISTORY_H_
#define MATMUL_GPU_SPAN_HISTORY_H_

#include <cstddef>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gpu/engine.h"

namespace matmul {

class SpanHistory {
 public:
  explicit SpanHistory(size_t capacity = 65536) : capacity_(capacity) {}

  void Add(const StreamSpan& span) {
    absl::MutexLock lock(&mu_);
    if (spans_.size() == capacity_) spans_.pop_front();
    spans_.push_back(span);
  }

  // Spans that ended within `window` of now, in the order they were added.
  std::vector<StreamSpan> Recent(absl::Duration window) const {
    const absl::Time since = absl::Now() - window;
    absl::MutexLock lock(&mu_);
    std::vector<StreamSpan> out;
    for (const StreamSpan& s : spans_) {
      if (s.end >= since) out.push_back(s);
    }
    return out;
  }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<StreamSpan> spans_ ABSL_GUARDED_BY(mu_);
};

}  // namespace matmul

#endif  // MATMUL_GPU_SPAN_HISTORY_H_
