#include "gpu/cuda/pinned_pool.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace matmul {

std::byte* PinnedPool::Lease::data() const {
  return pool_ == nullptr ? nullptr : pool_->region_.data() + offset_;
}

void PinnedPool::Lease::Release() {
  if (pool_ != nullptr) pool_->Free(offset_, size_);
  pool_ = nullptr;
  size_ = 0;
}

PinnedPool::PinnedPool(HostBuffer region, int64_t alignment)
    : region_(std::move(region)),
      alignment_(alignment),
      capacity_(region_.size() / alignment * alignment) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

int64_t PinnedPool::RoundUp(int64_t bytes) const {
  if (bytes <= 0) return alignment_;
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

std::optional<int64_t> PinnedPool::TakeLocked(int64_t size) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const int64_t offset = it->first;
    const int64_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + size, rest);
    used_ += size;
    return offset;
  }
  return std::nullopt;
}

std::optional<PinnedPool::Lease> PinnedPool::TryAcquire(int64_t bytes) {
  const int64_t size = RoundUp(bytes);
  absl::MutexLock lock(&mu_);
  std::optional<int64_t> offset = TakeLocked(size);
  if (!offset.has_value()) return std::nullopt;
  return Lease(this, *offset, size);
}

absl::StatusOr<PinnedPool::Lease> PinnedPool::Acquire(
    int64_t bytes, absl::FunctionRef<absl::Status()> give_up,
    absl::Duration poll) {
  const int64_t size = RoundUp(bytes);
  if (size > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "needs ", size, " bytes of pinned staging memory; the pool has ",
        capacity_, " (--pinned-pool-bytes)"));
  }
  absl::MutexLock lock(&mu_);
  while (true) {
    if (std::optional<int64_t> offset = TakeLocked(size)) {
      return Lease(this, *offset, size);
    }
    if (absl::Status stop = give_up(); !stop.ok()) return stop;
    freed_.WaitWithTimeout(&mu_, poll);
  }
}

void PinnedPool::Free(int64_t offset, int64_t size) {
  absl::MutexLock lock(&mu_);
  used_ -= size;
  auto next = free_.lower_bound(offset);
  // Merge with the following free range.
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  // Merge with the preceding free range.
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      freed_.SignalAll();
      return;
    }
  }
  free_.emplace(offset, size);
  freed_.SignalAll();
}

int64_t PinnedPool::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace matmul
