// The raw-CUDA benches' checks (matmul-enqueue-cost, matmul-idle-job-bench):
// a failed CUDA runtime or cuBLAS call prints itself and its error and ends
// the program with status 1. For measuring programs only; the engine's
// code returns statuses (gpu/cuda/cuda_status.h).
#ifndef MATMUL_TOOLS_PIPELINE_BENCH_RAW_CUDA_CHECKS_H_
#define MATMUL_TOOLS_PIPELINE_BENCH_RAW_CUDA_CHECKS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                                        \
  do {                                                                       \
    cudaError_t cuda_error_ = (x);                                           \
    if (cuda_error_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(cuda_error_)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)
#define CHECK_CUBLAS(x)                                                 \
  do {                                                                  \
    cublasStatus_t s = (x);                                             \
    if (s != CUBLAS_STATUS_SUCCESS) {                                   \
      std::fprintf(stderr, "%s: status %d\n", #x, static_cast<int>(s)); \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

#endif  // MATMUL_TOOLS_PIPELINE_BENCH_RAW_CUDA_CHECKS_H_
