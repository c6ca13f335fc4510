// HostTensor: a dense array in host memory, the client-side counterpart of
// matmul.v1.Tensor. It is what the .npy reader produces, what MatmulClient
// sends and returns, and what matmul-cli converts between dtypes.
//
// A plain value type: copyable and movable; not synchronized (share a const
// one between threads freely, guard a mutated one yourself).
#ifndef MATMUL_CLIENT_LIB_HOST_TENSOR_H_
#define MATMUL_CLIENT_LIB_HOST_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace matmul {

struct HostTensor {
  // Dimensions, outermost first. Empty for a scalar (rank 0, one element).
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  // product(shape) * DTypeSize(dtype) bytes: little-endian, row-major (C
  // order). For kBFloat16 each element is the upper 16 bits of a binary32.
  std::string data;
};

// Elements described by `shape` (1 for rank 0). INVALID_ARGUMENT if a
// dimension is negative or the product overflows int64.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape);

// Bytes `shape` of `dtype` occupies, with the same errors as NumElements
// (and for the byte count overflowing).
absl::StatusOr<int64_t> NumBytes(absl::Span<const int64_t> shape, DType dtype);

// OK if t.data holds exactly the bytes its shape and dtype call for;
// otherwise INVALID_ARGUMENT saying what was expected and what was found.
absl::Status CheckHostTensor(const HostTensor& t);

// "[2, 3, 4]"; "[]" for a scalar.
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_HOST_TENSOR_H_
