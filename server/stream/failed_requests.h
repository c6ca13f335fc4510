// FailedRequests: the request ids of one stream whose multiply failed while
// the client may still be sending its chunks, so that those chunks are
// dropped quietly rather than each answered "not open". Bounded: only the
// `capacity` most recent are kept (a late chunk for a forgotten id gets one
// more "not open" error, and is then remembered again). No gRPC.
//
// Not thread-safe: the session serializes.
#ifndef MATMUL_SERVER_STREAM_FAILED_REQUESTS_H_
#define MATMUL_SERVER_STREAM_FAILED_REQUESTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace matmul {

class FailedRequests {
 public:
  explicit FailedRequests(size_t capacity) : capacity_(capacity) {}

  // Remembers `id` (again: its latest failure counts), forgetting the
  // oldest beyond the capacity.
  void Remember(uint64_t id);
  // `id` was started or joined again.
  void Forget(uint64_t id) { when_.erase(id); }
  bool Contains(uint64_t id) const { return when_.contains(id); }
  size_t size() const { return when_.size(); }

 private:
  const size_t capacity_;
  // id -> when it was remembered, and the ids in that order (an id that
  // failed again appears twice; only its latest entry counts).
  absl::flat_hash_map<uint64_t, uint64_t> when_;
  std::deque<std::pair<uint64_t, uint64_t>> order_;
  uint64_t failures_ = 0;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_FAILED_REQUESTS_H_
