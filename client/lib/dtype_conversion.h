// Element-type conversion of HostTensors, for clients whose data is not in
// the dtype they want the server to compute in (e.g. float64 .npy files sent
// as float32, float32 ones rounded to bfloat16, bfloat16 results widened to
// float32 for NumPy).
//
// Every conversion rounds once, to nearest with ties to even, as NumPy's
// astype does: narrowing float64 to float16 or bfloat16 goes through a
// round-to-odd float32, which makes the two-step rounding exact. Widening is
// exact. NaN stays NaN; values beyond the target's range become infinities.
//
// Pure functions; thread-safe.
#ifndef MATMUL_CLIENT_LIB_DTYPE_CONVERSION_H_
#define MATMUL_CLIENT_LIB_DTYPE_CONVERSION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "client/lib/host_tensor.h"
#include "common/dtype.h"

namespace matmul {

// `tensor` with its elements converted to `to` (a copy when the dtype is
// already `to`). INVALID_ARGUMENT if the tensor's data does not match its
// shape and dtype.
absl::StatusOr<HostTensor> ConvertDType(const HostTensor& tensor, DType to);

// float64 -> float32 rounded to odd: truncated towards zero, with the lowest
// mantissa bit set when that lost anything. Rounding the result once more,
// to any format with at most 22 mantissa bits, gives the correctly rounded
// value of the float64.
float DoubleToFloatRoundToOdd(double value);

// float64 -> binary16 / bfloat16 bits, correctly rounded (nearest, even).
uint16_t DoubleToHalf(double value);
uint16_t DoubleToBFloat16(double value);

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_DTYPE_CONVERSION_H_
