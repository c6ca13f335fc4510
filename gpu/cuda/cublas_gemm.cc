#include "gpu/cuda/cublas_gemm.h"

#include "gpu/cuda/cuda_status.h"
#include "gpu/layout_planner.h"

namespace matmul {
namespace {

struct GemmTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
};

GemmTypes TypesFor(const MatmulSpec& spec) {
  switch (spec.dtype) {
    case DType::kFloat32:
      return {CUDA_R_32F, spec.compute == ComputeMode::kTf32
                              ? CUBLAS_COMPUTE_32F_FAST_TF32
                              : CUBLAS_COMPUTE_32F};
    case DType::kFloat64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::kFloat16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
    case DType::kBFloat16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
  }
  return {CUDA_R_32F, CUBLAS_COMPUTE_32F};
}

}  // namespace

absl::Status EnqueueGemm(cublasHandle_t handle, const MatmulSpec& spec,
                         const void* a, const void* b, void* c, CudaSite site,
                         const GemmStrides* batch_strides) {
  const GemmTypes types = TypesFor(spec);
  // alpha and beta take the compute type's scalar type.
  const double alpha64 = 1.0;
  const double beta64 = 0.0;
  const float alpha32 = 1.0f;
  const float beta32 = 0.0f;
  const bool f64 = types.compute == CUBLAS_COMPUTE_64F;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;

  const int m = static_cast<int>(spec.m);
  const int n = static_cast<int>(spec.n);
  const int k = static_cast<int>(spec.k);
  // Column-major view: Cᵀ (n×m) = op(B)ᵀ (n×k) · op(A)ᵀ (k×m).
  const cublasOperation_t op_b = spec.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = spec.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const GemmStrides strides =
      batch_strides != nullptr ? *batch_strides : StridesOf(spec);
  const int ldb = static_cast<int>(strides.ldb);
  const int lda = static_cast<int>(strides.lda);
  const int ldc = static_cast<int>(strides.ldc);

  if (spec.batch == 1) {
    CUBLAS_RETURN_IF_ERROR_AT(
        site, cublasGemmEx(handle, op_b, op_a, n, m, k, alpha, b, types.data,
                           ldb, a, types.data, lda, beta, c, types.data, ldc,
                           types.compute, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  const long long stride_a = strides.stride_a;
  const long long stride_b = strides.stride_b;
  const long long stride_c = strides.stride_c;
  CUBLAS_RETURN_IF_ERROR_AT(
      site, cublasGemmStridedBatchedEx(handle, op_b, op_a, n, m, k, alpha, b,
                                       types.data, ldb, stride_b, a, types.data,
                                       lda, stride_a, beta, c, types.data, ldc,
                                       stride_c, static_cast<int>(spec.batch),
                                       types.compute, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace matmul
