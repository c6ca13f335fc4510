// Tests of client/tools/npy.h: round trips, the header formats NumPy writes
// (and reads), every malformed-file error, and a cross-check against NumPy
// itself
// (/usr/bin/python3 holds Debian's numpy; skipped where it does not).
#include "client/tools/npy.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/lib/dtype_conversion.h"
#include "common/element.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

// The value every generator below puts at flat index i: small enough that
// every dtype (bfloat16 included) holds it exactly.
double ValueAt(int64_t i) { return static_cast<double>(i % 61) - 30.5; }

// A C-order tensor with ValueAt(i) in each element (bfloat16: the bits of
// that value; raw uint16 files use the same representation).
HostTensor MakeTensor(std::vector<int64_t> shape, DType dtype) {
  HostTensor t;
  t.shape = std::move(shape);
  t.dtype = dtype;
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.data.resize(static_cast<size_t>(n) * DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    StoreElement(dtype, ValueAt(i), t.data.data() + i * DTypeSize(dtype));
  }
  return t;
}

// A .npy file by hand: any version, any header text, any payload.
std::string RawNpy(int major, const std::string& header,
                   const std::string& data, int minor = 0) {
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(static_cast<char>(minor));
  const size_t width = major == 1 ? 2 : 4;
  for (size_t i = 0; i < width; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header + data;
}

std::string Dict(const std::string& descr, bool fortran,
                 const std::string& shape) {
  return absl::StrCat("{'descr': '", descr,
                      "', 'fortran_order': ", fortran ? "True" : "False",
                      ", 'shape': ", shape, ", }\n");
}

// The elements of C-order `c_order` laid out in Fortran (column-major) order.
std::string FortranLayout(const HostTensor& c_order) {
  const size_t item = DTypeSize(c_order.dtype);
  const size_t rank = c_order.shape.size();
  std::string out(c_order.data.size(), '\0');
  const int64_t n = static_cast<int64_t>(c_order.data.size() / item);
  for (int64_t flat = 0; flat < n; ++flat) {
    // flat is a C-order index; decompose, then recompose column-major.
    int64_t rest = flat;
    std::vector<int64_t> index(rank);
    for (size_t k = rank; k-- > 0;) {
      index[k] = rest % c_order.shape[k];
      rest /= c_order.shape[k];
    }
    int64_t f = 0;
    for (size_t k = rank; k-- > 0;) f = f * c_order.shape[k] + index[k];
    std::memcpy(&out[f * item], &c_order.data[flat * item], item);
  }
  return out;
}

std::string Swapped(const std::string& data, size_t item) {
  std::string out = data;
  for (size_t i = 0; i < out.size(); i += item) {
    std::reverse(out.begin() + i, out.begin() + i + item);
  }
  return out;
}

std::string ShapeTuple(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                            DType::kBFloat16};
const std::vector<std::vector<int64_t>> kShapes = {
    {}, {5}, {3, 4}, {2, 3, 4}, {0}, {2, 0, 3}, {1, 1, 1}};

std::string DescrOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "f4";
    case DType::kFloat64:
      return "f8";
    case DType::kFloat16:
      return "f2";
    case DType::kBFloat16:
      return "u2";
  }
  return "";
}

void ExpectSame(const HostTensor& got, const HostTensor& want) {
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_TRUE(got.data == want.data) << "payload differs";
}

TEST(NpyTest, RoundTripsEveryDtypeAndRank) {
  for (DType dtype : kAllDTypes) {
    for (const auto& shape : kShapes) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype).data(), " ", ShapeString(shape)));
      const HostTensor t = MakeTensor(shape, dtype);
      absl::StatusOr<std::string> bytes = SerializeNpy(t);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      // Version 1.0, data 64-byte aligned.
      EXPECT_EQ((*bytes)[6], 1);
      absl::StatusOr<std::string> header = NpyHeader(t);
      ASSERT_TRUE(header.ok());
      EXPECT_EQ(header->size() % 64, 0u);
      EXPECT_EQ(bytes->size(), header->size() + t.data.size());
      absl::StatusOr<NpyArray> back = ParseNpy(*bytes);
      ASSERT_TRUE(back.ok()) << back.status();
      ExpectSame(back->tensor, t);
      EXPECT_EQ(back->raw_uint16, dtype == DType::kBFloat16);
    }
  }
}

TEST(NpyTest, HeaderIsByteForByteWhatNumpySaveWrites) {
  // np.save(f, np.zeros((2, 3), np.float32)) with NumPy 1.24.
  const std::string expected =
      std::string("\x93NUMPY\x01\x00v\x00", 10) +
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" +
      std::string(58, ' ') + "\n";
  HostTensor t;
  t.shape = {2, 3};
  t.dtype = DType::kFloat32;
  t.data.assign(24, '\0');
  absl::StatusOr<std::string> header = NpyHeader(t);
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(*header, expected);

  t.shape = {};
  t.data.assign(4, '\0');
  header = NpyHeader(t);
  ASSERT_TRUE(header.ok());
  EXPECT_THAT(*header, HasSubstr("'shape': (), }"));
  t.shape = {4};
  t.dtype = DType::kFloat64;
  t.data.assign(32, '\0');
  header = NpyHeader(t);
  ASSERT_TRUE(header.ok());
  EXPECT_THAT(*header, HasSubstr("{'descr': '<f8', 'fortran_order': False, "
                                 "'shape': (4,), }"));
}

TEST(NpyTest, WritesVersion2WhenTheHeaderNeedsIt) {
  HostTensor t;
  t.shape.assign(25000, 1);  // "(1, 1, ..." is ~75000 characters
  t.dtype = DType::kFloat64;
  t.data.assign(8, '\x01');
  absl::StatusOr<std::string> bytes = SerializeNpy(t);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ((*bytes)[6], 2);
  EXPECT_EQ((*bytes)[7], 0);
  EXPECT_EQ((bytes->size() - 8) % 64, 0u);
  absl::StatusOr<NpyArray> back = ParseNpy(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(back->tensor, t);
}

TEST(NpyTest, ReadsVersions1To3) {
  const HostTensor t = MakeTensor({2, 3}, DType::kFloat32);
  for (int major : {1, 2, 3}) {
    SCOPED_TRACE(major);
    absl::StatusOr<NpyArray> array =
        ParseNpy(RawNpy(major, Dict("<f4", false, "(2, 3)"), t.data));
    ASSERT_TRUE(array.ok()) << array.status();
    ExpectSame(array->tensor, t);
  }
}

TEST(NpyTest, AcceptsHeaderVariants) {
  const HostTensor t = MakeTensor({2, 3}, DType::kFloat32);
  const std::string headers[] = {
      // Keys in another order, double quotes, no trailing comma or newline.
      "{\"shape\": (2, 3), \"descr\": \"<f4\", \"fortran_order\": False}",
      // Python 2 longs and extra whitespace, as old NumPy wrote.
      "{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : (2L, 3L) }  ",
      // Native and not-applicable byte orders, and none at all.
      "{'descr': '=f4', 'fortran_order': False, 'shape': (2, 3)}",
      "{'descr': '|f4', 'fortran_order': False, 'shape': (2, 3)}",
      "{'descr': 'f4', 'fortran_order': False, 'shape': (2,3,)}",
  };
  for (const std::string& header : headers) {
    SCOPED_TRACE(header);
    absl::StatusOr<NpyArray> array = ParseNpy(RawNpy(1, header, t.data));
    ASSERT_TRUE(array.ok()) << array.status();
    ExpectSame(array->tensor, t);
  }
}

TEST(NpyTest, ConvertsFortranOrderOfAnyRank) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {7}, {3, 4}, {2, 3, 4}, {2, 3, 1, 5}, {4, 1}, {1, 4}, {3, 0, 2}};
  for (DType dtype : kAllDTypes) {
    for (const auto& shape : shapes) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype).data(), " ", ShapeString(shape)));
      const HostTensor t = MakeTensor(shape, dtype);
      const std::string file =
          RawNpy(1, Dict("<" + DescrOf(dtype), true, ShapeTuple(shape)),
                 FortranLayout(t));
      absl::StatusOr<NpyArray> array = ParseNpy(file);
      ASSERT_TRUE(array.ok()) << array.status();
      ExpectSame(array->tensor, t);
    }
  }
}

TEST(NpyTest, ConvertsFortranOrderTransposesA2dMatrix) {
  // [[1, 2, 3], [4, 5, 6]] stored column-major is 1 4 2 5 3 6.
  const float column_major[] = {1, 4, 2, 5, 3, 6};
  absl::StatusOr<NpyArray> array = ParseNpy(
      RawNpy(1, Dict("<f4", true, "(2, 3)"),
             std::string(reinterpret_cast<const char*>(column_major), 24)));
  ASSERT_TRUE(array.ok()) << array.status();
  float row_major[6];
  std::memcpy(row_major, array->tensor.data.data(), 24);
  EXPECT_THAT(row_major, ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(NpyTest, SwapsBigEndian) {
  for (DType dtype : kAllDTypes) {
    for (bool fortran : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype).data(), fortran));
      const HostTensor t = MakeTensor({2, 3, 2}, dtype);
      const std::string stored =
          Swapped(fortran ? FortranLayout(t) : t.data, DTypeSize(dtype));
      absl::StatusOr<NpyArray> array = ParseNpy(
          RawNpy(1, Dict(">" + DescrOf(dtype), fortran, "(2, 3, 2)"), stored));
      ASSERT_TRUE(array.ok()) << array.status();
      ExpectSame(array->tensor, t);
    }
  }
}

TEST(NpyTest, Uint16IsRawBfloat16Bits) {
  const uint16_t bits[] = {0x3f80, 0xc000, 0x7f80, 0x0001};
  absl::StatusOr<NpyArray> array = ParseNpy(
      RawNpy(1, Dict("<u2", false, "(4,)"),
             std::string(reinterpret_cast<const char*>(bits), sizeof bits)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_TRUE(array->raw_uint16);
  EXPECT_EQ(array->tensor.dtype, DType::kBFloat16);
  EXPECT_EQ(array->tensor.data,
            std::string(reinterpret_cast<const char*>(bits), sizeof bits));
}

// Little-endian bytes of `values` as type T.
template <typename T>
std::string IntBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

template <typename T>
void ExpectIntegersConverted(const std::string& descr,
                             const std::vector<T>& values) {
  for (DType to : kAllDTypes) {
    // uint16 to bfloat16: raw bits (Uint16StaysRawBitsForBfloat16).
    if (descr == "<u2" && to == DType::kBFloat16) continue;
    SCOPED_TRACE(absl::StrCat(descr, " to ", DTypeName(to).data()));
    NpyReadOptions options;
    options.integers_as = to;
    absl::StatusOr<NpyArray> array = ParseNpy(
        RawNpy(1, Dict(descr, false, absl::StrCat("(", values.size(), ",)")),
               IntBytes(values)),
        options);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_FALSE(array->raw_uint16);
    HostTensor want;
    want.shape = {static_cast<int64_t>(values.size())};
    want.dtype = DType::kFloat64;
    for (T v : values) {
      const double d = static_cast<double>(v);
      want.data.append(reinterpret_cast<const char*>(&d), 8);
    }
    absl::StatusOr<HostTensor> converted = ConvertDType(want, to);
    ASSERT_TRUE(converted.ok());
    ExpectSame(array->tensor, *converted);
  }
}

TEST(NpyTest, ConvertsEveryIntegerTypeWhenAskedTo) {
  ExpectIntegersConverted<int8_t>("|i1", {0, 1, -2, 127, -128});
  ExpectIntegersConverted<uint8_t>("|u1", {0, 1, 200, 255});
  ExpectIntegersConverted<int16_t>("<i2", {0, -300, 32767});
  ExpectIntegersConverted<uint16_t>("<u2", {0, 7, 65535});
  ExpectIntegersConverted<int32_t>("<i4", {0, -70000, 2147483647});
  ExpectIntegersConverted<uint32_t>("<u4", {0, 4000000000u});
  ExpectIntegersConverted<int64_t>("<i8", {0, 11, -5, int64_t{1} << 40});
  ExpectIntegersConverted<uint64_t>("<u8", {0, 3, uint64_t{1} << 50});
}

TEST(NpyTest, Int64ToFloat32RoundsOnceToNearestEven) {
  // 2^24 + 1 is a tie (to 2^24, even); 2^24 + 3 rounds up to 2^24 + 4;
  // 2^62 + 2^38 + 1 is just above a tie: up, as NumPy's astype rounds it.
  const std::vector<int64_t> values = {
      (int64_t{1} << 24) + 1, (int64_t{1} << 24) + 3,
      (int64_t{1} << 62) + (int64_t{1} << 38) + 1};
  NpyReadOptions options;
  options.integers_as = DType::kFloat32;
  absl::StatusOr<NpyArray> array = ParseNpy(
      RawNpy(1, Dict("<i8", false, "(3,)"), IntBytes(values)), options);
  ASSERT_TRUE(array.ok()) << array.status();
  ASSERT_EQ(array->tensor.data.size(), 12u);
  float got[3];
  std::memcpy(got, array->tensor.data.data(), 12);
  EXPECT_EQ(got[0], 16777216.0f);
  EXPECT_EQ(got[1], 16777220.0f);
  EXPECT_EQ(got[2], std::ldexp(1.0f, 62) + std::ldexp(1.0f, 39));
}

TEST(NpyTest, ConvertsBigEndianAndFortranOrderIntegers) {
  // [[1, 2, 3], [4, 5, 6]] as big-endian int32 in Fortran order.
  std::string stored;
  for (int32_t v : {1, 4, 2, 5, 3, 6}) {
    const uint32_t be = __builtin_bswap32(static_cast<uint32_t>(v));
    stored.append(reinterpret_cast<const char*>(&be), 4);
  }
  NpyReadOptions options;
  options.integers_as = DType::kFloat64;
  absl::StatusOr<NpyArray> array =
      ParseNpy(RawNpy(1, Dict(">i4", true, "(2, 3)"), stored), options);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->tensor.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(array->tensor.dtype, DType::kFloat64);
  double got[6];
  std::memcpy(got, array->tensor.data.data(), sizeof got);
  EXPECT_THAT(got, ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
  // int8 in Fortran order: items of one byte.
  array = ParseNpy(RawNpy(1, Dict("|i1", true, "(2, 2)"),
                          std::string("\x01\x03\x02\xfc", 4)),
                   options);
  ASSERT_TRUE(array.ok()) << array.status();
  std::memcpy(got, array->tensor.data.data(), 32);
  EXPECT_THAT(std::vector<double>(got, got + 4),
              ::testing::ElementsAre(1, 2, 3, -4));
}

TEST(NpyTest, Uint16StaysRawBitsForBfloat16) {
  const std::vector<uint16_t> bits = {0x3f80, 0xc000};
  NpyReadOptions options;
  options.integers_as = DType::kBFloat16;
  absl::StatusOr<NpyArray> array =
      ParseNpy(RawNpy(1, Dict("<u2", false, "(2,)"), IntBytes(bits)), options);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_TRUE(array->raw_uint16);
  EXPECT_EQ(array->tensor.data, IntBytes(bits));
}

TEST(NpyTest, IntegerDataLengthIsCheckedAtTheirSize) {
  NpyReadOptions options;
  options.integers_as = DType::kFloat32;
  absl::StatusOr<NpyArray> array = ParseNpy(
      RawNpy(1, Dict("<i8", false, "(3,)"), std::string(20, '\0')), options);
  ASSERT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(),
              HasSubstr("shape [3] of '<i8' needs 24 bytes of data, but 20"));
}

// Every malformed or unsupported file: INVALID_ARGUMENT with a message that
// says what is wrong.
struct BadFile {
  const char* name;
  std::string bytes;
  const char* message;
};

TEST(NpyTest, RejectsMalformedFiles) {
  const std::string f4x6(24, '\0');
  const std::vector<BadFile> cases = {
      {"empty", "", "not a .npy file"},
      {"bad magic", "PK\x03\x04 this is a zip file", "not a .npy file"},
      {"magic cut short", std::string("\x93NUM", 4), "truncated .npy file"},
      {"no version", std::string("\x93NUMPY", 6), "truncated .npy file"},
      {"text file", "hello world, not numpy", "magic string"},
      {"version 4.0", RawNpy(4, Dict("<f4", false, "(2, 3)"), f4x6),
       "unsupported .npy format version 4.0"},
      {"version 1.1", RawNpy(1, Dict("<f4", false, "(2, 3)"), f4x6, 1),
       "unsupported .npy format version 1.1"},
      {"version 0.0", RawNpy(0, Dict("<f4", false, "(2, 3)"), f4x6),
       "unsupported .npy format version 0.0"},
      {"length field cut", std::string("\x93NUMPY\x02\x00\x10\x00", 10),
       "header length field"},
      {"header cut", RawNpy(1, Dict("<f4", false, "(2, 3)"), "").substr(0, 30),
       "truncated .npy file: the header is"},
      {"header not a dict", RawNpy(1, "[1, 2, 3]\n", f4x6), "not a dictionary"},
      {"header garbage", RawNpy(1, "{'descr': <f4}\n", f4x6),
       "bad .npy header: unexpected character"},
      {"header unterminated string", RawNpy(1, "{'descr: 1}\n", f4x6),
       "unterminated string"},
      {"header unclosed dict", RawNpy(1, "{'descr': '<f4'\n", f4x6),
       "expected ',' or '}'"},
      {"header trailing text", RawNpy(1, "{} {}\n", f4x6),
       "unexpected text after the value"},
      {"header unknown name", RawNpy(1, "{'a': true}\n", f4x6),
       "unexpected name 'true'"},
      {"header too deep",
       RawNpy(1, std::string(100, '[') + std::string(100, ']'), f4x6),
       "nesting too deep"},
      {"missing shape",
       RawNpy(1, "{'descr': '<f4', 'fortran_order': False}\n", f4x6),
       "missing key 'shape'"},
      {"missing descr",
       RawNpy(1, "{'fortran_order': False, 'shape': (2, 3)}\n", f4x6),
       "missing key 'descr'"},
      {"extra key",
       RawNpy(1,
              "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), "
              "'extra': 1}\n",
              f4x6),
       "unexpected key 'extra'"},
      {"fortran_order not bool",
       RawNpy(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}\n",
              f4x6),
       "fortran_order is 0, not True or False"},
      {"shape a list", RawNpy(1, Dict("<f4", false, "[2, 3]"), f4x6),
       "shape is [2, 3], not a tuple"},
      {"shape an int", RawNpy(1, Dict("<f4", false, "(6)"), f4x6),
       "shape is (6), not a tuple"},
      {"negative dimension", RawNpy(1, Dict("<f4", false, "(-2, 3)"), f4x6),
       "not a non-negative integer: -2"},
      {"string dimension", RawNpy(1, Dict("<f4", false, "('2', 3)"), f4x6),
       "not a non-negative integer: '2'"},
      {"dimension overflow",
       RawNpy(1, Dict("<f4", false, "(99999999999999999999,)"), f4x6),
       "integer out of the int64 range"},
      {"element count overflow",
       RawNpy(1, Dict("<f4", false, "(4294967296, 4294967296)"), f4x6),
       "overflows int64"},
      {"int32 with no dtype to convert to",
       RawNpy(1, Dict("<i4", false, "(2, 3)"), f4x6),
       "dtype '<i4' (int32) is read only when converted to a float dtype"},
      {"int128", RawNpy(1, Dict("<i16", false, "(3,)"), f4x6),
       "unsupported dtype '<i16'"},
      {"complex", RawNpy(1, Dict(">c8", false, "(3,)"), f4x6),
       "unsupported dtype '>c8' (complex): matmul multiplies real matrices"},
      {"bool", RawNpy(1, Dict("|b1", false, "(6,)"), f4x6.substr(18)),
       "unsupported dtype '|b1' (bool)"},
      {"object", RawNpy(1, Dict("|O", false, "(3,)"), f4x6),
       "unsupported dtype '|O'"},
      {"structured",
       RawNpy(1,
              "{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': "
              "False, 'shape': (3,)}\n",
              f4x6),
       "unsupported dtype [('x', '<f4'), ('y', '<f4')]"},
      {"data short", RawNpy(1, Dict("<f4", false, "(2, 3)"), f4x6.substr(4)),
       "data length mismatch: shape [2, 3] of '<f4' needs 24 bytes of data, "
       "but 20 bytes follow the header"},
      {"data long", RawNpy(1, Dict(">f8", false, "(3,)"), f4x6 + "x"),
       "data length mismatch: shape [3] of '>f8' needs 24 bytes of data, but "
       "25 bytes follow the header"},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<NpyArray> array = ParseNpy(c.bytes);
    ASSERT_FALSE(array.ok());
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument)
        << array.status();
    EXPECT_THAT(array.status().message(), HasSubstr(c.message));
  }
}

TEST(NpyTest, SerializeRejectsInconsistentTensor) {
  HostTensor t = MakeTensor({2, 3}, DType::kFloat32);
  t.data.pop_back();
  absl::StatusOr<std::string> bytes = SerializeNpy(t);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bytes.status().message(),
              HasSubstr("needs 24 bytes of data, got 23"));
  t.shape = {-1};
  EXPECT_EQ(SerializeNpy(t).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class NpyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/npy_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }
  std::string Path(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }
  std::string dir_;
};

TEST_F(NpyFileTest, WriteThenRead) {
  for (DType dtype : kAllDTypes) {
    const HostTensor t = MakeTensor({3, 50, 70}, dtype);
    const std::string path = Path("t.npy");
    ASSERT_TRUE(WriteNpy(path, t).ok());
    absl::StatusOr<NpyArray> back = ReadNpy(path);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(back->tensor, t);
  }
}

TEST_F(NpyFileTest, FileErrorsNameThePath) {
  const std::string missing = Path("missing.npy");
  absl::StatusOr<NpyArray> array = ReadNpy(missing);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(array.status().message(), HasSubstr(missing));
  EXPECT_THAT(array.status().message(), HasSubstr("No such file"));

  array = ReadNpy(dir_);
  ASSERT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(), HasSubstr("Is a directory"));

  const std::string text = Path("text.npy");
  std::ofstream(text) << "not numpy";
  array = ReadNpy(text);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(),
              HasSubstr(absl::StrCat(text, ": not a .npy file")));

  absl::Status status =
      WriteNpy(Path("no/such/dir/c.npy"), MakeTensor({2}, DType::kFloat32));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("no/such/dir/c.npy"));
}

// Cross-check with NumPy: NumPy writes, we read; we write, NumPy reads and
// compares with np.save's own bytes.
constexpr char kPython[] = "/usr/bin/python3";

bool HaveNumpy() {
  return access(kPython, X_OK) == 0 &&
         std::system(
             absl::StrCat(kPython, " -c 'import numpy' 2>/dev/null").c_str()) ==
             0;
}

constexpr char kNumpyWriter[] = R"(
import sys, numpy as np
out = sys.argv[1]
def values(shape, descr):
    n = int(np.prod(shape, dtype=np.int64))
    v = (np.arange(n) % 61) - 30.5
    if descr[1:] == 'u2':  # raw bfloat16 bits of the same values
        v = (v.astype('<f4').view('<u4') >> 16).astype(np.uint16)
    return v.astype(descr).reshape(shape)
for descr in ['<f4', '>f4', '<f8', '>f8', '<f2', '>f2', '<u2', '>u2']:
    for shape in [(), (5,), (3, 4), (2, 3, 4), (2, 3, 1, 5)]:
        for order in 'CF':
            a = values(shape, descr)
            if order == 'F' and a.ndim >= 2:  # (asfortranarray makes a 0-d array 1-d)
                a = np.asfortranarray(a)
            name = '%s_%s_%d_%s.npy' % ('le' if descr[0] == '<' else 'be',
                                         descr[1:], len(shape), order)
            np.save(out + '/' + name, a)
)";

TEST_F(NpyFileTest, ReadsWhatNumpyWrites) {
  if (!HaveNumpy()) GTEST_SKIP() << kPython << " with numpy is not available";
  const std::string script = Path("writer.py");
  std::ofstream(script) << kNumpyWriter;
  ASSERT_EQ(std::system(absl::StrCat(kPython, " ", script, " ", dir_).c_str()),
            0);
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {5}, {3, 4}, {2, 3, 4}, {2, 3, 1, 5}};
  int files = 0;
  for (const char* order : {"le", "be"}) {
    for (DType dtype : kAllDTypes) {
      for (const auto& shape : shapes) {
        for (const char* layout : {"C", "F"}) {
          const std::string path =
              Path(absl::StrCat(order, "_", DescrOf(dtype), "_", shape.size(),
                                "_", layout, ".npy"));
          SCOPED_TRACE(path);
          absl::StatusOr<NpyArray> array = ReadNpy(path);
          ASSERT_TRUE(array.ok()) << array.status();
          ExpectSame(array->tensor, MakeTensor(shape, dtype));
          EXPECT_EQ(array->raw_uint16, dtype == DType::kBFloat16);
          ++files;
        }
      }
    }
  }
  EXPECT_EQ(files, 80);
}

constexpr char kNumpyReader[] = R"(
import io, sys, numpy as np
d = sys.argv[1]
for line in open(d + '/manifest.txt'):
    name, descr, shape = line.split()
    shape = tuple(int(x) for x in shape.strip('()').split(',') if x)
    a = np.load(d + '/' + name)
    assert a.dtype == np.dtype(descr), (name, a.dtype)
    assert a.shape == shape, (name, a.shape)
    n = int(np.prod(shape, dtype=np.int64))
    v = (np.arange(n) % 61) - 30.5
    if descr == '<u2':
        v = (v.astype('<f4').view('<u4') >> 16).astype(np.uint16)
    assert np.array_equal(a, v.astype(descr).reshape(shape)), name
    buf = io.BytesIO()
    np.save(buf, a)
    assert buf.getvalue() == open(d + '/' + name, 'rb').read(), name
print('ok')
)";

TEST_F(NpyFileTest, NumpyReadsWhatWeWrite) {
  if (!HaveNumpy()) GTEST_SKIP() << kPython << " with numpy is not available";
  std::ofstream manifest(Path("manifest.txt"));
  for (DType dtype : kAllDTypes) {
    for (const auto& shape : kShapes) {
      const std::string name =
          absl::StrCat(DescrOf(dtype), "_", absl::StrJoin(shape, "x"), ".npy");
      ASSERT_TRUE(WriteNpy(Path(name), MakeTensor(shape, dtype)).ok());
      manifest << name << " <" << DescrOf(dtype) << " ("
               << absl::StrJoin(shape, ",") << ")\n";
    }
  }
  manifest.close();
  const std::string script = Path("reader.py");
  std::ofstream(script) << kNumpyReader;
  EXPECT_EQ(std::system(absl::StrCat(kPython, " ", script, " ", dir_).c_str()),
            0);
}

}  // namespace
}  // namespace matmul
