// CUDA and cuBLAS results as absl::Status, carrying the failed call's text,
// the device and (where known) the stream. Nothing here aborts: a failed call
// fails the request that made it, or, where no Status can flow (destructors,
// threads with no caller), is logged, a bounded number of times per call
// site.
//
// Every check clears the thread's CUDA error state (cudaGetLastError), so
// that a non-sticky error (a bad argument, an allocation that did not fit)
// fails only the call that made it and does not reappear in the next,
// unrelated check. A sticky error (the context is broken) keeps coming
// back from every later call; the engine fails the device on it.
//
// Thread-safe.
#ifndef MATMUL_GPU_CUDA_CUDA_STATUS_H_
#define MATMUL_GPU_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>

#include "absl/status/status.h"

namespace matmul {

// Where a CUDA call ran, for its message: the device, and the stream's index
// in that device's pool. -1 where unknown; an unknown device is read back
// (cudaGetDevice) when the message is made.
struct CudaSite {
  int device = -1;
  int stream = -1;
};

// OK for cudaSuccess. Otherwise a Status whose message names the call, the
// site, the error and its description, with the code chosen for the error:
// RESOURCE_EXHAUSTED for an allocation that does not fit,
// FAILED_PRECONDITION when the device does not exist or cannot be used (no
// device, an invalid device ordinal, a driver too old for the runtime),
// INTERNAL for everything else (device faults, misuse). Clears the error.
absl::Status CudaStatus(cudaError_t error, const char* call,
                        CudaSite site = {});
// The same for cuBLAS: RESOURCE_EXHAUSTED for CUBLAS_STATUS_ALLOC_FAILED,
// INTERNAL otherwise.
absl::Status CublasStatus(cublasStatus_t status, const char* call,
                          CudaSite site = {});

// Logs a non-OK `status` where no caller can take it, at most a few times
// per `count` (one counter per call site; the macros below keep one), then
// once more to say that further failures there go unlogged.
void LogCudaFailure(const absl::Status& status, std::atomic<int>& count);

}  // namespace matmul

#define CUDA_RETURN_IF_ERROR_AT(site, call)                    \
  do {                                                         \
    ::absl::Status matmul_cuda_status_ =                       \
        ::matmul::CudaStatus((call), #call, (site));           \
    if (!matmul_cuda_status_.ok()) return matmul_cuda_status_; \
  } while (0)

#define CUDA_RETURN_IF_ERROR(call) \
  CUDA_RETURN_IF_ERROR_AT(::matmul::CudaSite{}, call)

#define CUBLAS_RETURN_IF_ERROR_AT(site, call)                      \
  do {                                                             \
    ::absl::Status matmul_cublas_status_ =                         \
        ::matmul::CublasStatus((call), #call, (site));             \
    if (!matmul_cublas_status_.ok()) return matmul_cublas_status_; \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(call) \
  CUBLAS_RETURN_IF_ERROR_AT(::matmul::CudaSite{}, call)

// For destructors and threads: checks `call`, logging a failure (bounded per
// call site) instead of returning it.
#define CUDA_LOG_IF_ERROR_AT(site, call)                           \
  do {                                                             \
    const cudaError_t matmul_cuda_error_ = (call);                 \
    if (matmul_cuda_error_ != cudaSuccess) {                       \
      static ::std::atomic<int> matmul_cuda_log_count_{0};         \
      ::matmul::LogCudaFailure(                                    \
          ::matmul::CudaStatus(matmul_cuda_error_, #call, (site)), \
          matmul_cuda_log_count_);                                 \
    }                                                              \
  } while (0)

#define CUDA_LOG_IF_ERROR(call) CUDA_LOG_IF_ERROR_AT(::matmul::CudaSite{}, call)

#define CUBLAS_LOG_IF_ERROR(call)                               \
  do {                                                          \
    const cublasStatus_t matmul_cublas_result_ = (call);        \
    if (matmul_cublas_result_ != CUBLAS_STATUS_SUCCESS) {       \
      static ::std::atomic<int> matmul_cublas_log_count_{0};    \
      ::matmul::LogCudaFailure(                                 \
          ::matmul::CublasStatus(matmul_cublas_result_, #call), \
          matmul_cublas_log_count_);                            \
    }                                                           \
  } while (0)

// Logs a non-OK Status (e.g. a ScopedDevice's) where it cannot be returned.
#define CUDA_LOG_IF_ERROR_STATUS(expr)                       \
  do {                                                       \
    const ::absl::Status matmul_logged_status_ = (expr);     \
    if (!matmul_logged_status_.ok()) {                       \
      static ::std::atomic<int> matmul_status_log_count_{0}; \
      ::matmul::LogCudaFailure(matmul_logged_status_,        \
                               matmul_status_log_count_);    \
    }                                                        \
  } while (0)

#endif  // MATMUL_GPU_CUDA_CUDA_STATUS_H_
