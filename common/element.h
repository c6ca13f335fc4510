// One element of a dtype as a double, written to or read from its
// little-endian bytes: for tests and the bench's workloads, which build and
// check tensors element by element, and the client's dtype conversion,
// which reads with LoadElement. Writing a float16 or bfloat16 rounds
// through float32 (twice, so a float64 between two float32s can land one
// step off the correctly rounded value; client/lib/dtype_conversion.h
// writes rounding once, as NumPy does). Reading is exact. Pure functions;
// thread-safe.
#ifndef MATMUL_COMMON_ELEMENT_H_
#define MATMUL_COMMON_ELEMENT_H_

#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/float16.h"

namespace matmul {

// Writes `value` as one `dtype` element at `out` (DTypeSize(dtype) bytes).
inline void StoreElement(DType dtype, double value, char* out) {
  switch (dtype) {
    case DType::kFloat64:
      std::memcpy(out, &value, 8);
      return;
    case DType::kFloat32: {
      const float f = static_cast<float>(value);
      std::memcpy(out, &f, 4);
      return;
    }
    case DType::kFloat16: {
      const uint16_t h = FloatToHalf(static_cast<float>(value));
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t b = FloatToBFloat16(static_cast<float>(value));
      std::memcpy(out, &b, 2);
      return;
    }
  }
}

// The `dtype` element at `in` (DTypeSize(dtype) bytes), exactly, as a double.
inline double LoadElement(DType dtype, const char* in) {
  switch (dtype) {
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, in, 8);
      return v;
    }
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, in, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, in, 2);
      return HalfToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, in, 2);
      return BFloat16ToFloat(b);
    }
  }
  return 0;
}

}  // namespace matmul

#endif  // MATMUL_COMMON_ELEMENT_H_
