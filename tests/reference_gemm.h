// Test support: random operands in any dtype, a float64 reference product,
// and the error measure the engine tests use.
#ifndef MATMUL_TESTS_REFERENCE_GEMM_H_
#define MATMUL_TESTS_REFERENCE_GEMM_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "common/dtype.h"
#include "gpu/matmul_spec.h"

namespace matmul::testing {

// `count` random values uniform in [-1, 1), encoded as `dtype` bytes.
std::string RandomBytes(DType dtype, int64_t count, absl::BitGen& gen);

// Decodes `dtype` bytes to doubles.
std::vector<double> ToDoubles(DType dtype, const void* data, int64_t count);

// C = op(A)·op(B) in float64 for `spec`, from A and B given as doubles.
std::vector<double> ReferenceGemm(const MatmulSpec& spec,
                                  const std::vector<double>& a,
                                  const std::vector<double>& b);

// ||out - ref||_F / ||ref||_F; infinity if `out` has a NaN or Inf, or the
// sizes differ.
double RelativeError(const std::vector<double>& out,
                     const std::vector<double>& ref);

// ||out - A·B||_F / || |A|·|B| ||_F: the error of a product measured
// against the size of the terms it sums, the scale rounding works at. Unlike
// RelativeError it stays meaningful when the terms cancel: a product with one
// or a few elements whose dot products come out near zero reads as
// inaccurate under RelativeError however well it was computed. An element
// off by no more than half the output dtype's smallest subnormal counts as
// exact (a float16 product below about 6e-5 is rounded on that absolute
// scale, not relative to itself). Infinity if `out` has a NaN or Inf, or
// the sizes differ. Bounded by Tolerance too.
double ProductError(const MatmulSpec& spec, const std::vector<double>& a,
                    const std::vector<double>& b,
                    const std::vector<double>& out);

// Bound on RelativeError (and ProductError) for a dtype and compute mode, as
// the engine tests require: float32 strict 1e-5, tf32 1e-3, float16/bfloat16
// 1e-2, float64 1e-12.
double Tolerance(DType dtype, ComputeMode compute);

// A spec for shapes given the way the API takes them.
MatmulSpec MakeSpec(DType dtype, int64_t batch_a, int64_t batch_b, int64_t m,
                    int64_t n, int64_t k, bool transpose_a, bool transpose_b,
                    bool c_is_3d, ComputeMode compute = ComputeMode::kStrict);

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_REFERENCE_GEMM_H_
