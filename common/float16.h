// Conversions between float and the 16-bit formats (IEEE binary16 and
// bfloat16), rounding to nearest, ties to even, as NumPy and CUDA do.
// Pure functions; thread-safe.
#ifndef MATMUL_COMMON_FLOAT16_H_
#define MATMUL_COMMON_FLOAT16_H_

#include <cstdint>
#include <cstring>

namespace matmul {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float -> binary16 bits. Overflow gives infinity, NaN stays a (quiet) NaN.
inline uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t h;
  if (u >= (127u + 16u) << 23) {  // |f| >= 65536, Inf or NaN
    h = u > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (u < (127u - 14u) << 23) {  // result is subnormal or zero
    // Adding 0.5 aligns the 10 mantissa bits at the bottom of the float's
    // mantissa; the FPU's round-to-nearest-even does the rounding.
    const uint32_t magic_bits = (127u - 1u) << 23;  // 0.5
    const float sum = BitsToFloat(u) + BitsToFloat(magic_bits);
    h = static_cast<uint16_t>(FloatBits(sum) - magic_bits);
  } else {
    const uint32_t mantissa_odd = (u >> 13) & 1u;
    u += ((15u - 127u) << 23) + 0xfffu;  // rebias the exponent, round half
    u += mantissa_odd;                   // ... to even
    h = static_cast<uint16_t>(u >> 13);  // a carry into Inf is correct
  }
  return static_cast<uint16_t>(h | (sign >> 16));
}

// binary16 bits -> float (exact).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24.
    const float v = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return BitsToFloat(sign | FloatBits(v));
  }
  if (exponent == 31) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// float -> bfloat16 bits. NaN stays a (quiet) NaN.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  }
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// bfloat16 bits -> float (exact).
inline float BFloat16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

}  // namespace matmul

#endif  // MATMUL_COMMON_FLOAT16_H_
