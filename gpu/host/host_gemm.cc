#include "gpu/host/host_gemm.h"

#include <cblas.h>

#include <cstdint>
#include <vector>

#include "common/float16.h"
#include "gpu/layout_planner.h"

namespace matmul {
namespace {

// Row-major GEMM of one batch entry in float or double.
template <typename T>
void GemmOne(const MatmulSpec& s, const GemmStrides& g, const T* a, const T* b,
             T* c);

template <>
void GemmOne<float>(const MatmulSpec& s, const GemmStrides& g, const float* a,
                    const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans,
              s.transpose_b ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0f, a,
              g.lda, b, g.ldb, 0.0f, c, g.ldc);
}

template <>
void GemmOne<double>(const MatmulSpec& s, const GemmStrides& g, const double* a,
                     const double* b, double* c) {
  cblas_dgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans,
              s.transpose_b ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0, a,
              g.lda, b, g.ldb, 0.0, c, g.ldc);
}

template <typename T>
void GemmBatched(const MatmulSpec& s, const T* a, const T* b, T* c) {
  const GemmStrides g = StridesOf(s);
  for (int64_t i = 0; i < s.batch; ++i) {
    GemmOne<T>(s, g, a + i * g.stride_a, b + i * g.stride_b,
               c + i * g.stride_c);
  }
}

// float16 / bfloat16: widen to float32, multiply, round back.
void GemmHalfPrecision(const MatmulSpec& s, const uint16_t* a,
                       const uint16_t* b, uint16_t* c) {
  const bool bf16 = s.dtype == DType::kBFloat16;
  auto widen = [bf16](const uint16_t* in, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      out[i] = bf16 ? BFloat16ToFloat(in[i]) : HalfToFloat(in[i]);
    }
    return out;
  };
  const std::vector<float> a32 = widen(a, s.a_elements());
  const std::vector<float> b32 = widen(b, s.b_elements());
  std::vector<float> c32(static_cast<size_t>(s.c_elements()));
  GemmBatched<float>(s, a32.data(), b32.data(), c32.data());
  for (int64_t i = 0; i < s.c_elements(); ++i) {
    c[i] = bf16 ? FloatToBFloat16(c32[i]) : FloatToHalf(c32[i]);
  }
}

}  // namespace

void HostGemm(const MatmulSpec& spec, const std::byte* a, const std::byte* b,
              std::byte* c) {
  switch (spec.dtype) {
    case DType::kFloat32:
      GemmBatched<float>(spec, reinterpret_cast<const float*>(a),
                         reinterpret_cast<const float*>(b),
                         reinterpret_cast<float*>(c));
      break;
    case DType::kFloat64:
      GemmBatched<double>(spec, reinterpret_cast<const double*>(a),
                          reinterpret_cast<const double*>(b),
                          reinterpret_cast<double*>(c));
      break;
    case DType::kFloat16:
    case DType::kBFloat16:
      GemmHalfPrecision(spec, reinterpret_cast<const uint16_t*>(a),
                        reinterpret_cast<const uint16_t*>(b),
                        reinterpret_cast<uint16_t*>(c));
      break;
  }
}

}  // namespace matmul
