// The header dictionary of a .npy file (its descr, fortran_order and shape),
// parsed and checked the way numpy.lib.format does: a recursive-descent
// parser for the Python literals the dictionary is written in, and the
// element types this project reads. Part of matmul_npy (npy.h is its
// interface); pure functions, thread-safe.
#ifndef MATMUL_CLIENT_TOOLS_NPY_HEADER_PARSER_H_
#define MATMUL_CLIENT_TOOLS_NPY_HEADER_PARSER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace matmul::npy {

// `text` quoted for an error message: C-escaped, cut after 200 bytes.
std::string Quote(absl::string_view text);

// An element type as a descr names it.
struct Descr {
  std::string text;  // as written, e.g. ">f4"
  DType dtype = DType::kFloat32;
  bool raw_uint16 = false;
  bool byte_swap = false;  // stored big-endian
  // Integers ('i1'..'i8', 'u1'..'u8'; 'u2' also sets raw_uint16): their
  // size in bytes, else 0.
  size_t int_size = 0;
  bool int_signed = false;
};

// NumPy's name of an integer descr: "int64", "uint8".
std::string IntegerName(const Descr& d);

// The header dictionary, checked the way numpy.lib.format does.
struct Header {
  Descr descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the dictionary text between a .npy file's length field and its
// data. INVALID_ARGUMENT for malformed text, a missing or unexpected key, or
// an unsupported dtype; the message quotes what was found.
absl::StatusOr<Header> ParseHeader(absl::string_view text);

}  // namespace matmul::npy

#endif  // MATMUL_CLIENT_TOOLS_NPY_HEADER_PARSER_H_
