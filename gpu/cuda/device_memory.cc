#include "gpu/cuda/device_memory.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace matmul {

int64_t DeviceMemoryBudget::reserved() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

absl::Status DeviceMemoryBudget::Reserve(int64_t bytes, MatmulJob& job) {
  absl::MutexLock lock(&mu_);
  while (reserved_ + bytes > budget_) {
    if (absl::Status stop = job.Abandoned(); !stop.ok()) return stop;
    if (!job.description().wait_for_memory) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "GPU ", device_, " has ", budget_ - reserved_, " of ", budget_,
          " bytes free now and this needs ", bytes, "; retry later"));
    }
    freed_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
  }
  reserved_ += bytes;
  return absl::OkStatus();
}

bool DeviceMemoryBudget::TryReserve(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (reserved_ + bytes > budget_) return false;
  reserved_ += bytes;
  return true;
}

void DeviceMemoryBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_ -= bytes;
  freed_.SignalAll();
}

}  // namespace matmul
