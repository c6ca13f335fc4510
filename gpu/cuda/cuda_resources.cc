#include "gpu/cuda/cuda_resources.h"

#include "gpu/cuda/cuda_status.h"

namespace matmul {

ScopedDevice::ScopedDevice(int device) {
  status_ = CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice", {device});
  if (!status_.ok() || previous_ == device) return;
  status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice", {device});
  changed_ = status_.ok();
}

ScopedDevice::~ScopedDevice() {
  if (changed_) {
    CUDA_LOG_IF_ERROR_AT(CudaSite{previous_}, cudaSetDevice(previous_));
  }
}

void StreamTraits::Destroy(cudaStream_t s) {
  CUDA_LOG_IF_ERROR(cudaStreamDestroy(s));
}

void EventTraits::Destroy(cudaEvent_t e) {
  CUDA_LOG_IF_ERROR(cudaEventDestroy(e));
}

void CublasTraits::Destroy(cublasHandle_t h) {
  CUBLAS_LOG_IF_ERROR(cublasDestroy(h));
}

void DeviceMemoryTraits::Destroy(void* p) { CUDA_LOG_IF_ERROR(cudaFree(p)); }

void PinnedMemoryTraits::Destroy(void* p) {
  CUDA_LOG_IF_ERROR(cudaFreeHost(p));
}

absl::StatusOr<CudaStream> CreateStream() {
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return CudaStream(stream);
}

absl::StatusOr<CudaEvent> CreateEvent(unsigned flags) {
  cudaEvent_t event = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, flags));
  return CudaEvent(event);
}

absl::StatusOr<CublasHandle> CreateCublasHandle() {
  cublasHandle_t handle = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  return CublasHandle(handle);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return DeviceBuffer(p, bytes);
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return PinnedBuffer(p, bytes);
}

}  // namespace matmul
