#include "common/float16.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace matmul {
namespace {

TEST(Float16Test, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << h;
  }
}

TEST(Float16Test, KnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // min subnormal
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // min normal
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(Float16Test, RoundsToNearestTiesToEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to even (1).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 lies halfway between 1+2^-10 (odd) and 1+2^-9 (even).
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above the halfway point rounds up.
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)),
            0x3c01);
  // Overflow: 65519 rounds down to 65504, 65520 (halfway) up to infinity.
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  // Subnormals: 2^-25 is halfway between 0 and 2^-24: ties to even (0).
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(1.5f * std::ldexp(1.0f, -24)), 0x0002);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

// Brute-force reference: the nearest of all finite halves, ties to even.
uint16_t ReferenceFloatToHalf(float f, const std::vector<double>& positive) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  auto it = std::lower_bound(positive.begin(), positive.end(), a);
  size_t hi = static_cast<size_t>(it - positive.begin());
  if (hi == positive.size()) return sign | 0x7bff;  // (65504, 65520)
  if (hi < positive.size() && positive[hi] == a) return sign | hi;
  const size_t lo = hi - 1;
  const double dlo = a - positive[lo];
  const double dhi = positive[hi] - a;
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | hi;
  return sign | ((lo % 2 == 0) ? lo : hi);
}

TEST(Float16Test, MatchesBruteForceOnRandomFloats) {
  std::vector<double> positive;  // index == bit pattern for 0..0x7bff
  for (uint32_t h = 0; h <= 0x7bff; ++h) positive.push_back(HalfToFloat(h));
  std::mt19937 gen(42);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int i = 0; i < 200000; ++i) {
    float f;
    if (i % 2 == 0) {
      const uint32_t u = bits(gen);
      std::memcpy(&f, &u, 4);
    } else {
      f = small(gen) * std::ldexp(1.0f, -(i % 40));
    }
    const uint16_t got = FloatToHalf(f);
    const uint16_t want = ReferenceFloatToHalf(f, positive);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(got)));
    } else {
      ASSERT_EQ(got, want) << "f=" << f;
    }
  }
}

TEST(BFloat16Test, EveryBFloat16RoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
      continue;
    }
    EXPECT_EQ(FloatToBFloat16(f), b) << b;
  }
}

TEST(BFloat16Test, RoundsToNearestTiesToEven) {
  // bfloat16 keeps 7 mantissa bits: 1 + 2^-8 is halfway between 1 and
  // 1 + 2^-7; ties to even.
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(FloatToBFloat16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)),
            0x3f81);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  // A NaN whose payload is all in the low bits stays a NaN.
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(BitsToFloat(0x7f800001)))));
}

}  // namespace
}  // namespace matmul
