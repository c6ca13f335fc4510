// The one place that turns a MatmulSpec into a cuBLAS call.
#ifndef MATMUL_GPU_CUDA_CUBLAS_GEMM_H_
#define MATMUL_GPU_CUDA_CUBLAS_GEMM_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/grouped_layout.h"
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

// Whether cublasGemmGroupedBatchedEx takes this dtype and compute mode.
// cuBLAS 12.5+ documents COMPUTE_32F over float32, float16 and bfloat16
// (inputs and output of one type), COMPUTE_32F_FAST_TF32 over float32 and
// COMPUTE_64F over float64: every dtype and mode this service has.
bool GroupedGemmSupported(DType dtype, ComputeMode compute);

// Bytes of the pointer table EnqueueGroupedGemm needs for `group`: an A, a
// B and a C pointer per GEMM.
int64_t GroupedTableBytes(const GroupLayout& group);

// Enqueues every member of a grouped multiply on the handle's stream, C_i
// = op(A_i)·op(B_i) with member i's A, B and C at its offsets into the A, B
// and C regions `a`, `b` and `c` (device memory). Where the dtype and mode
// are supported, as ONE cublasGemmGroupedBatchedEx launch (consecutive
// members of one shape and transposes share a cuBLAS group): its pointer
// arrays are written into `host_table` (pinned, GroupedTableBytes long,
// untouched until the stream has copied it) and copied on `stream` into
// `device_table` (device memory of the same size) before the launch.
// Otherwise one EnqueueGemm per member. A failure names `site`.
absl::Status EnqueueGroupedGemm(cublasHandle_t handle, cudaStream_t stream,
                                const GroupLayout& group, const std::byte* a,
                                const std::byte* b, std::byte* c,
                                void** host_table, void** device_table,
                                CudaSite site = {});

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_CUBLAS_GEMM_H_
