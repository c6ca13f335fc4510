#include "gpu/cuda/cuda_resources.h"

#include "gpu/cuda/cuda_status.h"

namespace matmul {

ScopedDevice::ScopedDevice(int device) {
  if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
    changed_ = cudaSetDevice(device) == cudaSuccess;
  }
}

ScopedDevice::~ScopedDevice() {
  if (changed_) cudaSetDevice(previous_);
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
