// CUDA and cuBLAS errors as absl::Status, carrying the failed call's text.
// Nothing here aborts: a failed call fails the request that made it.
#ifndef MATMUL_GPU_CUDA_CUDA_STATUS_H_
#define MATMUL_GPU_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace matmul {

// OK for cudaSuccess; RESOURCE_EXHAUSTED for allocation failures; INTERNAL
// otherwise. The message names the call, the error and its description.
absl::Status CudaStatus(cudaError_t error, const char* call);
absl::Status CublasStatus(cublasStatus_t status, const char* call);

}  // namespace matmul

#define CUDA_RETURN_IF_ERROR(call)                                            \
  do {                                                                        \
    ::absl::Status matmul_cuda_status_ = ::matmul::CudaStatus((call), #call); \
    if (!matmul_cuda_status_.ok()) return matmul_cuda_status_;                \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(call)                               \
  do {                                                             \
    ::absl::Status matmul_cublas_status_ =                         \
        ::matmul::CublasStatus((call), #call);                     \
    if (!matmul_cublas_status_.ok()) return matmul_cublas_status_; \
  } while (0)

#endif  // MATMUL_GPU_CUDA_CUDA_STATUS_H_
