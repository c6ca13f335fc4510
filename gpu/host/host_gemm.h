// HostGemm: C = op(A)·op(B) on the calling thread with OpenBLAS, the host
// engine's compute. float32 and float64 go to cblas_sgemm / cblas_dgemm per
// batch entry (strides from gpu/layout_planner.h: 0 for a broadcast
// operand); float16 and bfloat16 are widened to float32, multiplied and
// rounded back. Reentrant.
#ifndef MATMUL_GPU_HOST_HOST_GEMM_H_
#define MATMUL_GPU_HOST_HOST_GEMM_H_

#include <cstddef>

#include "gpu/matmul_spec.h"

namespace matmul {

// Buffers are row-major in spec.dtype, laid out as MatmulSpec describes.
// Exposed for tests and references too.
void HostGemm(const MatmulSpec& spec, const std::byte* a, const std::byte* b,
              std::byte* c);

}  // namespace matmul

#endif  // MATMUL_GPU_HOST_HOST_GEMM_H_
