// InflightBytes: admission by bytes held. Each admitted request reserves its
// operand and result bytes until it is answered; a request that would take
// the total over the limit is refused. Lock-free; thread-safe.
#ifndef MATMUL_SERVER_ADMISSION_INFLIGHT_BYTES_H_
#define MATMUL_SERVER_ADMISSION_INFLIGHT_BYTES_H_

#include <atomic>
#include <cstdint>

namespace matmul {

class InflightBytes {
 public:
  explicit InflightBytes(int64_t limit) : limit_(limit) {}

  // Reserves `bytes` if the total stays within the limit.
  bool TryAcquire(int64_t bytes) {
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit_ - used) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes,
                                          std::memory_order_relaxed));
    return true;
  }

  void Release(int64_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

}  // namespace matmul

#endif  // MATMUL_SERVER_ADMISSION_INFLIGHT_BYTES_H_
