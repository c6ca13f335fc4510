// DeviceMemoryBudget: the device memory one GPU lends to requests, as a byte
// budget that jobs reserve before they allocate (stream-ordered, from the
// device's memory pool) and release when they end or when their resident
// result goes. Reserving first keeps a full device from failing allocations
// on the stream: a job waits, or is refused, before it enqueues anything.
//
// Thread-safe. No CUDA header.
#ifndef MATMUL_GPU_CUDA_DEVICE_MEMORY_H_
#define MATMUL_GPU_CUDA_DEVICE_MEMORY_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gpu/engine.h"

namespace matmul {

class DeviceMemoryBudget {
 public:
  // `device` names the GPU in messages.
  DeviceMemoryBudget(int device, int64_t budget)
      : device_(device), budget_(budget) {}

  int64_t budget() const { return budget_; }
  int64_t reserved() const;

  // Reserves `bytes`, waiting while they are not free if the job may wait;
  // RESOURCE_EXHAUSTED if it may not, the job's own status once abandoned.
  absl::Status Reserve(int64_t bytes, MatmulJob& job);
  // Reserves `bytes` if they are free now; false otherwise.
  bool TryReserve(int64_t bytes);
  void Release(int64_t bytes);

 private:
  const int device_;
  const int64_t budget_;
  mutable absl::Mutex mu_;
  absl::CondVar freed_;
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_DEVICE_MEMORY_H_
