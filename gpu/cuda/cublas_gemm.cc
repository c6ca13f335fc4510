#include "gpu/cuda/cublas_gemm.h"

#include <vector>

#include "common/status_macros.h"
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

bool GroupedGemmSupported(DType dtype, ComputeMode compute) {
#if CUBLAS_VERSION >= 120500
  (void)compute;  // strict and tf32 both, for float32; the rest: strict
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
      return true;
  }
  return false;
#else
  (void)dtype;
  (void)compute;
  return false;
#endif
}

int64_t GroupedTableBytes(const GroupLayout& group) {
  return 3 * group.problems * static_cast<int64_t>(sizeof(void*));
}

absl::Status EnqueueGroupedGemm(cublasHandle_t handle, cudaStream_t stream,
                                const GroupLayout& group, const std::byte* a,
                                const std::byte* b, std::byte* c,
                                void** host_table, void** device_table,
                                CudaSite site) {
  if (group.members.empty()) return absl::OkStatus();
  const MatmulSpec& first = group.members.front().spec;
  if (!GroupedGemmSupported(first.dtype, first.compute)) {
    for (const GroupMember& m : group.members) {
      RETURN_IF_ERROR(EnqueueGemm(handle, m.spec, a + m.a_offset,
                                  b + m.b_offset, c + m.c_offset, site));
    }
    return absl::OkStatus();
  }
#if CUBLAS_VERSION >= 120500
  const GemmTypes types = TypesFor(first);
  const bool f64 = types.compute == CUBLAS_COMPUTE_64F;
  // Per cuBLAS group (host arrays); the column-major view of each row-major
  // product, as in EnqueueGemm: Cᵀ (n×m) = op(B)ᵀ (n×k) · op(A)ᵀ (k×m).
  std::vector<cublasOperation_t> trans_first;   // applies to B
  std::vector<cublasOperation_t> trans_second;  // applies to A
  std::vector<int> rows, cols, depth, ld_first, ld_second, ld_c, sizes;
  const size_t problems = static_cast<size_t>(group.problems);
  // The pointer table: cuBLAS's A pointers (our B), its B pointers (our
  // A), then C's.
  void** first_ptrs = host_table;
  void** second_ptrs = host_table + problems;
  void** c_ptrs = host_table + 2 * problems;
  size_t problem = 0;
  const MatmulSpec* previous = nullptr;
  for (const GroupMember& m : group.members) {
    const MatmulSpec& s = m.spec;
    const GemmStrides g = StridesOf(s);
    const bool same_as_previous = previous != nullptr && previous->m == s.m &&
                                  previous->n == s.n && previous->k == s.k &&
                                  previous->transpose_a == s.transpose_a &&
                                  previous->transpose_b == s.transpose_b;
    if (same_as_previous) {
      sizes.back() += static_cast<int>(s.batch);
    } else {
      trans_first.push_back(s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N);
      trans_second.push_back(s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N);
      rows.push_back(static_cast<int>(s.n));
      cols.push_back(static_cast<int>(s.m));
      depth.push_back(static_cast<int>(s.k));
      ld_first.push_back(static_cast<int>(g.ldb));
      ld_second.push_back(static_cast<int>(g.lda));
      ld_c.push_back(static_cast<int>(g.ldc));
      sizes.push_back(static_cast<int>(s.batch));
    }
    previous = &s;
    const int64_t elem = s.elem_size();
    for (int64_t i = 0; i < s.batch; ++i, ++problem) {
      first_ptrs[problem] =
          const_cast<std::byte*>(b) + m.b_offset + i * g.stride_b * elem;
      second_ptrs[problem] =
          const_cast<std::byte*>(a) + m.a_offset + i * g.stride_a * elem;
      c_ptrs[problem] = c + m.c_offset + i * g.stride_c * elem;
    }
  }
  CUDA_RETURN_IF_ERROR_AT(
      site, cudaMemcpyAsync(device_table, host_table,
                            static_cast<size_t>(GroupedTableBytes(group)),
                            cudaMemcpyHostToDevice, stream));
  const size_t groups = sizes.size();
  // alpha and beta: one each per group, in the compute type's scalar type,
  // from host memory (the handle's pointer mode is the default, host).
  std::vector<float> alpha32(groups, 1.0f), beta32(groups, 0.0f);
  std::vector<double> alpha64(groups, 1.0), beta64(groups, 0.0);
  const void* alpha =
      f64 ? static_cast<const void*>(alpha64.data()) : alpha32.data();
  const void* beta =
      f64 ? static_cast<const void*>(beta64.data()) : beta32.data();
  CUBLAS_RETURN_IF_ERROR_AT(
      site,
      cublasGemmGroupedBatchedEx(
          handle, trans_first.data(), trans_second.data(), rows.data(),
          cols.data(), depth.data(), alpha, device_table, types.data,
          ld_first.data(), device_table + problems, types.data,
          ld_second.data(), beta, device_table + 2 * problems, types.data,
          ld_c.data(), static_cast<int>(groups), sizes.data(), types.compute));
  return absl::OkStatus();
#else
  (void)stream;
  (void)host_table;
  (void)device_table;
  return absl::InternalError("grouped GEMM needs cuBLAS 12.5 or later");
#endif
}

}  // namespace matmul
