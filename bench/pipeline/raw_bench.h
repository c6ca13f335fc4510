// What the raw-CUDA benches (matmul-enqueue-cost, matmul-idle-job-bench)
// share: checks by which a failed CUDA runtime or cuBLAS call prints itself
// and its error and ends the program with status 1 (for measuring programs
// only; the engine's code returns statuses, gpu/cuda/cuda_status.h), and
// the mean and percentiles of their samples.
#ifndef MATMUL_TOOLS_PIPELINE_BENCH_RAW_BENCH_H_
#define MATMUL_TOOLS_PIPELINE_BENCH_RAW_BENCH_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>

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

namespace matmul::raw_bench {

inline double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// The value at quantile q in [0, 1] of `v` (0.5: the median); 0 for none.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k),
                   v.end());
  return v[k];
}

}  // namespace matmul::raw_bench

#endif  // MATMUL_TOOLS_PIPELINE_BENCH_RAW_BENCH_H_
