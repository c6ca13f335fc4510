// Reading and writing NumPy .npy files
// (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html),
// so that matmul-cli can take its operands from, and leave its result for,
// NumPy.
//
// Read: format versions 1.0, 2.0 and 3.0; dtypes float32 ('f4'), float64
// ('f8'), float16 ('f2') and uint16 ('u2', which this project uses to carry
// raw bfloat16 bits, NumPy having no bfloat16), in either byte order ('<',
// '>', and '=' or '|' for the host's); any rank; fortran_order True is
// converted to C order. The result is always little-endian, row-major.
// Integer arrays (int8..int64 'i1'..'i8', uint8..uint64 'u1'..'u8', what
// numpy.arange makes) are read only when NpyReadOptions::integers_as names
// a float dtype to convert them to; bool and complex ones never.
//
// Write: always '<' and C order; version 1.0, or 2.0 when the header does
// not fit 1.0's 16-bit length. The bytes match what numpy.save writes for the
// same array (NumPy >= 1.23 header padding).
//
// Every error is INVALID_ARGUMENT (malformed or unsupported content) or, for
// the file functions, the errno-derived code of the failing system call; the
// message says what was expected and what was found.
//
// Pure functions; thread-safe.
#ifndef MATMUL_CLIENT_TOOLS_NPY_H_
#define MATMUL_CLIENT_TOOLS_NPY_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/lib/host_tensor.h"
#include "common/dtype.h"

namespace matmul {

// The content of a .npy file.
struct NpyArray {
  // Shape, dtype and little-endian row-major bytes. A uint16 file comes
  // back as dtype kBFloat16 with raw_uint16 set (see below).
  HostTensor tensor;
  // The file's dtype was uint16. By this project's convention such a file
  // holds raw bfloat16 bits, so tensor.dtype is kBFloat16 and tensor.data
  // the 16-bit values untouched; a caller for whom the values are plain
  // integers can tell them apart with this flag.
  bool raw_uint16 = false;
};

struct NpyReadOptions {
  // Integer arrays are converted to this dtype, each element rounded to
  // nearest even as numpy's astype does (exact below 2^24 for float32, 2^53
  // for float64; beyond float16's range, infinity). uint16 arrays stay raw
  // bfloat16 bits (raw_uint16) when this is unset or kBFloat16. Unset: other
  // integer arrays are INVALID_ARGUMENT.
  std::optional<DType> integers_as;
};

// Parses a whole .npy file held in memory. Takes the bytes by value so that
// a caller who moves them in has the payload reused in place, not copied.
absl::StatusOr<NpyArray> ParseNpy(std::string bytes,
                                  const NpyReadOptions& options = {});

// Reads and parses the file at `path`; errors are prefixed with the path.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path,
                                 const NpyReadOptions& options = {});

// The .npy bytes for `tensor`: dtype float32/float64/float16 as '<f4',
// '<f8', '<f2'; bfloat16 as its raw bits, '<u2'. INVALID_ARGUMENT if the
// tensor's data does not match its shape and dtype.
absl::StatusOr<std::string> SerializeNpy(const HostTensor& tensor);

// The header (magic, version, length, dictionary and padding) SerializeNpy
// puts before the data.
absl::StatusOr<std::string> NpyHeader(const HostTensor& tensor);

// Writes SerializeNpy(tensor) to `path` (created or truncated), without
// copying the payload; errors are prefixed with the path.
absl::Status WriteNpy(const std::string& path, const HostTensor& tensor);

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_NPY_H_
