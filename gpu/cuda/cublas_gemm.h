// The one place that turns a MatmulSpec into a cuBLAS call.
#ifndef MATMUL_GPU_CUDA_CUBLAS_GEMM_H_
#define MATMUL_GPU_CUDA_CUBLAS_GEMM_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/layout_planner.h"
#include "gpu/matmul_spec.h"

namespace matmul {

// Enqueues C = op(A)·op(B) on the handle's stream; A, B and C are device
// pointers holding row-major data as MatmulSpec describes. Row-major C = A·B
// is computed as column-major Cᵀ = Bᵀ·Aᵀ, so no data is transposed.
// Types: float32 (COMPUTE_32F, or COMPUTE_32F_FAST_TF32 in tf32 mode),
// float64 (COMPUTE_64F), float16 and bfloat16 (inputs and output in the
// dtype, COMPUTE_32F accumulation). Batches use strided-batched GEMM with
// stride 0 for a broadcast operand; `batch_strides`, if given, replaces the
// spec's batch strides (in elements; a gathered batch whose members' A and
// B alternate on the device). Dimensions must fit in int. A failure names
// `site` (the handle's device and stream).
absl::Status EnqueueGemm(cublasHandle_t handle, const MatmulSpec& spec,
                         const void* a, const void* b, void* c,
                         CudaSite site = {},
                         const GemmStrides* batch_strides = nullptr);

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_CUBLAS_GEMM_H_
