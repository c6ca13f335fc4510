#include "client/tools/npy_elements.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "client/lib/dtype_conversion.h"

namespace matmul::npy {
namespace {

template <size_t kSize>
void ByteSwapAll(std::string& data) {
  char* p = data.data();
  const size_t n = data.size() / kSize;
  for (size_t i = 0; i < n; ++i, p += kSize) {
    if constexpr (kSize == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      v = __builtin_bswap16(v);
      std::memcpy(p, &v, 2);
    } else if constexpr (kSize == 4) {
      uint32_t v;
      std::memcpy(&v, p, 4);
      v = __builtin_bswap32(v);
      std::memcpy(p, &v, 4);
    } else {
      uint64_t v;
      std::memcpy(&v, p, 8);
      v = __builtin_bswap64(v);
      std::memcpy(p, &v, 8);
    }
  }
}

// Fortran (column-major) order to C (row-major) order, any rank: walks the
// source in storage order (first axis fastest) and scatters each element to
// its row-major offset, kept up to date incrementally like an odometer.
template <size_t kSize>
std::string FortranToCTyped(const std::string& src,
                            const std::vector<int64_t>& shape) {
  std::string dst(src.size(), '\0');
  const size_t rank = shape.size();
  const size_t n = src.size() / kSize;
  if (n == 0) return dst;
  std::vector<size_t> c_stride(rank);  // in elements
  size_t stride = 1;
  for (size_t k = rank; k-- > 0;) {
    c_stride[k] = stride;
    stride *= static_cast<size_t>(shape[k]);
  }
  std::vector<int64_t> index(rank, 0);
  size_t out = 0;
  const char* in = src.data();
  char* base = dst.data();
  for (size_t i = 0; i < n; ++i, in += kSize) {
    std::memcpy(base + out * kSize, in, kSize);
    for (size_t k = 0; k < rank; ++k) {
      if (++index[k] < shape[k]) {
        out += c_stride[k];
        break;
      }
      out -= static_cast<size_t>(shape[k] - 1) * c_stride[k];
      index[k] = 0;
    }
  }
  return dst;
}

// `n` little-endian integers of type I at `in` as `to`, rounded to nearest
// even as NumPy's astype does (through float64 for float16 and bfloat16:
// exact for magnitudes below 2^53).
template <typename I>
void IntegersTo(const char* in, size_t n, DType to, char* out) {
  for (size_t i = 0; i < n; ++i) {
    I v;
    std::memcpy(&v, in + i * sizeof(I), sizeof(I));
    switch (to) {
      case DType::kFloat32: {
        const float f = static_cast<float>(v);
        std::memcpy(out + 4 * i, &f, 4);
        break;
      }
      case DType::kFloat64: {
        const double d = static_cast<double>(v);
        std::memcpy(out + 8 * i, &d, 8);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = DoubleToHalf(static_cast<double>(v));
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t h = DoubleToBFloat16(static_cast<double>(v));
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
    }
  }
}

}  // namespace

void ByteSwap(std::string& data, size_t item_size) {
  switch (item_size) {
    case 2:
      ByteSwapAll<2>(data);
      break;
    case 4:
      ByteSwapAll<4>(data);
      break;
    case 8:
      ByteSwapAll<8>(data);
      break;
  }
}

std::string FortranToC(const std::string& src,
                       const std::vector<int64_t>& shape, size_t item_size) {
  switch (item_size) {
    case 1:
      return FortranToCTyped<1>(src, shape);
    case 2:
      return FortranToCTyped<2>(src, shape);
    case 4:
      return FortranToCTyped<4>(src, shape);
    default:
      return FortranToCTyped<8>(src, shape);
  }
}

std::string ConvertIntegers(const std::string& data, size_t int_size,
                            bool int_signed, DType to) {
  const size_t n = data.size() / int_size;
  std::string out(n * DTypeSize(to), '\0');
  const char* in = data.data();
  char* dst = out.data();
  switch (int_size) {
    case 1:
      int_signed ? IntegersTo<int8_t>(in, n, to, dst)
                 : IntegersTo<uint8_t>(in, n, to, dst);
      break;
    case 2:
      int_signed ? IntegersTo<int16_t>(in, n, to, dst)
                 : IntegersTo<uint16_t>(in, n, to, dst);
      break;
    case 4:
      int_signed ? IntegersTo<int32_t>(in, n, to, dst)
                 : IntegersTo<uint32_t>(in, n, to, dst);
      break;
    default:
      int_signed ? IntegersTo<int64_t>(in, n, to, dst)
                 : IntegersTo<uint64_t>(in, n, to, dst);
      break;
  }
  return out;
}

}  // namespace matmul::npy
