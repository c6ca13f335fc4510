#include "tests/reference_gemm.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/element.h"

namespace matmul::testing {

std::string RandomBytes(DType dtype, int64_t count, absl::BitGen& gen) {
  std::string out(static_cast<size_t>(count) * DTypeSize(dtype), '\0');
  for (int64_t i = 0; i < count; ++i) {
    StoreElement(dtype, absl::Uniform<double>(gen, -1.0, 1.0),
                 out.data() + i * DTypeSize(dtype));
  }
  return out;
}

std::vector<double> ToDoubles(DType dtype, const void* data, int64_t count) {
  std::vector<double> out(static_cast<size_t>(count));
  const char* p = static_cast<const char*>(data);
  for (int64_t i = 0; i < count; ++i) {
    out[i] = LoadElement(dtype, p + i * DTypeSize(dtype));
  }
  return out;
}

std::vector<double> ReferenceGemm(const MatmulSpec& s,
                                  const std::vector<double>& a,
                                  const std::vector<double>& b) {
  std::vector<double> c(static_cast<size_t>(s.c_elements()), 0.0);
  for (int64_t bi = 0; bi < s.batch; ++bi) {
    const double* ab = a.data() + (s.a_batch == 1 ? 0 : bi * s.m * s.k);
    const double* bb = b.data() + (s.b_batch == 1 ? 0 : bi * s.k * s.n);
    double* cb = c.data() + bi * s.m * s.n;
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t p = 0; p < s.k; ++p) {
        // A stored [m, k], or [k, m] when transposed.
        const double av = s.transpose_a ? ab[p * s.m + i] : ab[i * s.k + p];
        for (int64_t j = 0; j < s.n; ++j) {
          // B stored [k, n], or [n, k] when transposed.
          const double bv = s.transpose_b ? bb[j * s.k + p] : bb[p * s.n + j];
          cb[i * s.n + j] += av * bv;
        }
      }
    }
  }
  return c;
}

double RelativeError(const std::vector<double>& out,
                     const std::vector<double>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double diff = 0;
  double norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (norm == 0) return diff == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

namespace {

// Half the smallest step of `dtype` (its smallest subnormal): the most
// that rounding a result to it can move one near zero.
double SubnormalRounding(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return std::ldexp(1.0, -25);
    case DType::kBFloat16:
      return std::ldexp(1.0, -134);
    case DType::kFloat32:
      return std::ldexp(1.0, -150);
    case DType::kFloat64:
      return 0;
  }
  return 0;
}

}  // namespace

double ProductError(const MatmulSpec& spec, const std::vector<double>& a,
                    const std::vector<double>& b,
                    const std::vector<double>& out) {
  const std::vector<double> ref = ReferenceGemm(spec, a, b);
  std::vector<double> abs_a(a.size());
  std::vector<double> abs_b(b.size());
  for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(a[i]);
  for (size_t i = 0; i < b.size(); ++i) abs_b[i] = std::fabs(b[i]);
  const std::vector<double> scale = ReferenceGemm(spec, abs_a, abs_b);
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  const double floor = SubnormalRounding(spec.dtype);
  double diff = 0;
  double norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    const double error = std::max(0.0, std::fabs(out[i] - ref[i]) - floor);
    diff += error * error;
    norm += scale[i] * scale[i];
  }
  if (norm == 0) return diff == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

double Tolerance(DType dtype, ComputeMode compute) {
  switch (dtype) {
    case DType::kFloat32:
      return compute == ComputeMode::kTf32 ? 1e-3 : 1e-5;
    case DType::kFloat64:
      return 1e-12;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 1e-2;
  }
  return 0;
}

MatmulSpec MakeSpec(DType dtype, int64_t batch_a, int64_t batch_b, int64_t m,
                    int64_t n, int64_t k, bool transpose_a, bool transpose_b,
                    bool c_is_3d, ComputeMode compute) {
  MatmulSpec s;
  s.dtype = dtype;
  s.compute = compute;
  s.a_batch = batch_a;
  s.b_batch = batch_b;
  s.batch = batch_a > batch_b ? batch_a : batch_b;
  s.m = m;
  s.n = n;
  s.k = k;
  s.transpose_a = transpose_a;
  s.transpose_b = transpose_b;
  s.c_is_3d = c_is_3d;
  return s;
}

}  // namespace matmul::testing
