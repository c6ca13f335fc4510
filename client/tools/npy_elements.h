// What the .npy reader does to the elements after the header (part of
// matmul_npy; npy.h is its interface): big-endian to little-endian, Fortran
// (column-major) to C (row-major) order, integers to a float dtype. Pure
// functions, thread-safe.
#ifndef MATMUL_CLIENT_TOOLS_NPY_ELEMENTS_H_
#define MATMUL_CLIENT_TOOLS_NPY_ELEMENTS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

// Elements are kept little-endian in memory and parsed with memcpy; the
// project targets little-endian hosts only.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .npy reader assumes a little-endian host");

namespace matmul::npy {

// Reverses the bytes of each `item_size`-byte element (2, 4 or 8; 1 leaves
// `data` as it is).
void ByteSwap(std::string& data, size_t item_size);

// `src`, elements of `item_size` bytes (1, 2, 4 or 8) in Fortran order of
// `shape` (any rank), in C order.
std::string FortranToC(const std::string& src,
                       const std::vector<int64_t>& shape, size_t item_size);

// `data`, little-endian integers of `int_size` bytes (1, 2, 4 or 8), signed
// or not, as `to`: each rounded to nearest even as NumPy's astype does
// (through float64 for float16 and bfloat16: exact for magnitudes below
// 2^53).
std::string ConvertIntegers(const std::string& data, size_t int_size,
                            bool int_signed, DType to);

}  // namespace matmul::npy

#endif  // MATMUL_CLIENT_TOOLS_NPY_ELEMENTS_H_
