// PinnedPool: staging memory for requests, carved out of one region that is
// allocated once at start (page-locked by the CUDA engine, so that H2D and
// D2H copies run at full speed and asynchronously). Requests lease a range
// and give it back when their reply no longer needs it; nothing is allocated
// from the OS per request. First fit over a free list kept in address order,
// with neighbours merged on release.
//
// Thread-safe. The pool must outlive its leases.
#ifndef MATMUL_GPU_CUDA_PINNED_POOL_H_
#define MATMUL_GPU_CUDA_PINNED_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/engine.h"

namespace matmul {

class PinnedPool {
 public:
  // A leased range; returns itself to the pool when destroyed. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept {
      if (this != &other) {
        Release();
        pool_ = std::exchange(other.pool_, nullptr);
        offset_ = other.offset_;
        size_ = other.size_;
      }
      return *this;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }

    std::byte* data() const;
    int64_t size() const { return size_; }
    void Release();

   private:
    friend class PinnedPool;
    Lease(PinnedPool* pool, int64_t offset, int64_t size)
        : pool_(pool), offset_(offset), size_(size) {}
    PinnedPool* pool_ = nullptr;
    int64_t offset_ = 0;
    int64_t size_ = 0;
  };

  // `region` is the memory to manage; leases are aligned to `alignment`.
  explicit PinnedPool(HostBuffer region, int64_t alignment = 4096);

  // A lease of at least `bytes`, or nullopt if no free range is big enough.
  std::optional<Lease> TryAcquire(int64_t bytes);

  // Waits until a lease of `bytes` can be made. Every `poll`, and before
  // waiting, asks `give_up`; a non-OK answer is returned instead of a lease.
  // RESOURCE_EXHAUSTED at once if `bytes` exceeds the capacity.
  absl::StatusOr<Lease> Acquire(int64_t bytes,
                                absl::FunctionRef<absl::Status()> give_up,
                                absl::Duration poll = absl::Milliseconds(50));

  int64_t capacity() const { return capacity_; }
  int64_t used() const;

 private:
  int64_t RoundUp(int64_t bytes) const;
  std::optional<int64_t> TakeLocked(int64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Free(int64_t offset, int64_t size);

  HostBuffer region_;
  const int64_t alignment_;
  const int64_t capacity_;
  mutable absl::Mutex mu_;
  absl::CondVar freed_;
  std::map<int64_t, int64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> size
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_PINNED_POOL_H_
