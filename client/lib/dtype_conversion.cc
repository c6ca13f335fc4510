#include "client/lib/dtype_conversion.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "common/element.h"
#include "common/float16.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

void StoreFromDouble(double value, DType dtype, char* p) {
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(value);
      std::memcpy(p, &f, sizeof f);
      return;
    }
    case DType::kFloat64:
      std::memcpy(p, &value, sizeof value);
      return;
    case DType::kFloat16: {
      const uint16_t h = DoubleToHalf(value);
      std::memcpy(p, &h, sizeof h);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t b = DoubleToBFloat16(value);
      std::memcpy(p, &b, sizeof b);
      return;
    }
  }
}

}  // namespace

float DoubleToFloatRoundToOdd(double value) {
  float f = static_cast<float>(value);  // nearest, ties to even
  if (std::isnan(value) || static_cast<double>(f) == value) return f;
  // Inexact: step back to the truncated value (this also turns an overflow
  // to infinity into FLT_MAX), then make it odd to remember the lost bits.
  if (std::fabs(static_cast<double>(f)) > std::fabs(value)) {
    f = std::nextafter(f, 0.0f);
  }
  return BitsToFloat(FloatBits(f) | 1u);
}

uint16_t DoubleToHalf(double value) {
  return FloatToHalf(DoubleToFloatRoundToOdd(value));
}

uint16_t DoubleToBFloat16(double value) {
  return FloatToBFloat16(DoubleToFloatRoundToOdd(value));
}

absl::StatusOr<HostTensor> ConvertDType(const HostTensor& tensor, DType to) {
  RETURN_IF_ERROR(CheckHostTensor(tensor));
  if (tensor.dtype == to) return tensor;
  HostTensor out;
  out.shape = tensor.shape;
  out.dtype = to;
  const size_t in_size = DTypeSize(tensor.dtype);
  const size_t out_size = DTypeSize(to);
  const size_t n = tensor.data.size() / in_size;
  out.data.resize(n * out_size);
  const char* in = tensor.data.data();
  char* dst = out.data.data();
  // float32 -> 16-bit is the common case (matmul-cli --dtype bfloat16): one
  // rounding, no detour through double.
  if (tensor.dtype == DType::kFloat32 &&
      (to == DType::kFloat16 || to == DType::kBFloat16)) {
    for (size_t i = 0; i < n; ++i, in += 4, dst += 2) {
      float f;
      std::memcpy(&f, in, sizeof f);
      const uint16_t bits =
          to == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
      std::memcpy(dst, &bits, sizeof bits);
    }
    return out;
  }
  for (size_t i = 0; i < n; ++i, in += in_size, dst += out_size) {
    StoreFromDouble(LoadElement(tensor.dtype, in), to, dst);
  }
  return out;
}

}  // namespace matmul
