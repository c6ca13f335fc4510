// Tests of common/element.h: each dtype's bytes as NumPy lays them out, and
// values every dtype holds exactly surviving a round trip.
#include "common/element.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace matmul {
namespace {

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                             DType::kBFloat16};

TEST(ElementTest, StoresTheLittleEndianBytesOfEachDType) {
  char out[8] = {};
  StoreElement(DType::kFloat64, 1.5, out);
  EXPECT_EQ(std::string(out, 8), std::string("\0\0\0\0\0\0\xf8\x3f", 8));
  StoreElement(DType::kFloat32, -2.0, out);
  EXPECT_EQ(std::string(out, 4), std::string("\0\0\0\xc0", 4));
  StoreElement(DType::kFloat16, 1.0, out);
  EXPECT_EQ(std::string(out, 2), std::string("\0\x3c", 2));
  StoreElement(DType::kBFloat16, 1.0, out);
  EXPECT_EQ(std::string(out, 2), std::string("\x80\x3f", 2));
}

TEST(ElementTest, LoadsWhatItStored) {
  for (DType dtype : kDTypes) {
    for (double v : {0.0, -0.0, 1.0, -30.5, 0.125, 256.0, -65280.0}) {
      char bytes[8] = {};
      StoreElement(dtype, v, bytes);
      const double got = LoadElement(dtype, bytes);
      EXPECT_EQ(got, v) << DTypeName(dtype) << " " << v;
      EXPECT_EQ(std::signbit(got), std::signbit(v))
          << DTypeName(dtype) << " " << v;
    }
  }
}

TEST(ElementTest, RoundsToTheNearestValueOfTheDType) {
  char bytes[8] = {};
  StoreElement(DType::kFloat16, 1.0 + 1.0 / 4096, bytes);  // a quarter step up
  EXPECT_EQ(LoadElement(DType::kFloat16, bytes), 1.0);
  // 1.5 steps above 1: a tie, rounded to the even mantissa.
  StoreElement(DType::kBFloat16, 1.0 + 3.0 / 256, bytes);
  EXPECT_EQ(LoadElement(DType::kBFloat16, bytes), 1.0 + 2.0 / 128);
  StoreElement(DType::kFloat16, 1e6, bytes);  // beyond float16's range
  EXPECT_TRUE(std::isinf(LoadElement(DType::kFloat16, bytes)));
  StoreElement(DType::kFloat32, std::nan(""), bytes);
  EXPECT_TRUE(std::isnan(LoadElement(DType::kFloat32, bytes)));
}

}  // namespace
}  // namespace matmul
