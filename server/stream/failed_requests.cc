#include "server/stream/failed_requests.h"

namespace matmul {

void FailedRequests::Remember(uint64_t id) {
  const uint64_t when = ++failures_;
  when_[id] = when;
  order_.emplace_back(id, when);
  while (order_.size() > capacity_) {
    const auto [old, at] = order_.front();
    order_.pop_front();
    if (auto it = when_.find(old); it != when_.end() && it->second == at) {
      when_.erase(it);
    }
  }
}

}  // namespace matmul
