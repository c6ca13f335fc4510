// Move-only RAII owners of CUDA and cuBLAS resources, and a scoped device
// guard. Each factory returns a Status instead of aborting; destructors never
// throw, and log a failed release (bounded, gpu/cuda/cuda_status.h) rather
// than pass it on: the context may already be in an error state.
// Thread-compatible: an owner is used by one thread at a time (the CUDA
// objects themselves are thread-safe).
#ifndef MATMUL_GPU_CUDA_CUDA_RESOURCES_H_
#define MATMUL_GPU_CUDA_CUDA_RESOURCES_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace matmul {

// Makes `device` current for the enclosing scope, restoring the previous one.
// status() says whether it could: a caller that can return a Status checks
// it before its first CUDA call; the restore is logged if it fails.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  absl::Status status_;
};

// Owner of one handle; Traits::Destroy(handle) releases it.
template <typename Handle, typename Traits>
class UniqueCudaHandle {
 public:
  UniqueCudaHandle() = default;
  explicit UniqueCudaHandle(Handle handle) : handle_(handle) {}
  UniqueCudaHandle(UniqueCudaHandle&& other) noexcept
      : handle_(std::exchange(other.handle_, Handle{})) {}
  UniqueCudaHandle& operator=(UniqueCudaHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      handle_ = std::exchange(other.handle_, Handle{});
    }
    return *this;
  }
  UniqueCudaHandle(const UniqueCudaHandle&) = delete;
  UniqueCudaHandle& operator=(const UniqueCudaHandle&) = delete;
  ~UniqueCudaHandle() { Reset(); }

  Handle get() const { return handle_; }
  explicit operator bool() const { return handle_ != Handle{}; }

  void Reset() {
    if (handle_ != Handle{}) Traits::Destroy(handle_);
    handle_ = Handle{};
  }

 private:
  Handle handle_{};
};

// Each Destroy logs a failure (bounded) and goes on.
struct StreamTraits {
  static void Destroy(cudaStream_t s);
};
struct EventTraits {
  static void Destroy(cudaEvent_t e);
};
struct CublasTraits {
  static void Destroy(cublasHandle_t h);
};
struct DeviceMemoryTraits {
  static void Destroy(void* p);
};
struct PinnedMemoryTraits {
  static void Destroy(void* p);
};

using CudaStream = UniqueCudaHandle<cudaStream_t, StreamTraits>;
using CudaEvent = UniqueCudaHandle<cudaEvent_t, EventTraits>;
using CublasHandle = UniqueCudaHandle<cublasHandle_t, CublasTraits>;

// A non-blocking stream (no implicit sync with the legacy default stream).
absl::StatusOr<CudaStream> CreateStream();
// An event; timing events unless `flags` says otherwise.
absl::StatusOr<CudaEvent> CreateEvent(unsigned flags = cudaEventDefault);
absl::StatusOr<CublasHandle> CreateCublasHandle();

// A device allocation (cudaMalloc; for long-lived buffers, not per request).
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer() = default;
  void* data() const { return memory_.get(); }
  size_t size() const { return size_; }

 private:
  DeviceBuffer(void* p, size_t bytes) : memory_(p), size_(bytes) {}
  UniqueCudaHandle<void*, DeviceMemoryTraits> memory_;
  size_t size_ = 0;
};

// Page-locked host memory (cudaHostAlloc, portable to every device).
class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);
  PinnedBuffer() = default;
  std::byte* data() const { return static_cast<std::byte*>(memory_.get()); }
  size_t size() const { return size_; }

 private:
  PinnedBuffer(void* p, size_t bytes) : memory_(p), size_(bytes) {}
  UniqueCudaHandle<void*, PinnedMemoryTraits> memory_;
  size_t size_ = 0;
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_CUDA_RESOURCES_H_
