#include "client/lib/host_tensor.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace matmul {

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeString(shape), ": dimension ", i, " is negative"));
    }
    // Keep going after an overflow: a later zero makes the product 0.
    if (d == 0) return int64_t{0};
    if (overflow || n > std::numeric_limits<int64_t>::max() / d) {
      overflow = true;
    } else {
      n *= d;
    }
  }
  if (overflow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeString(shape), ": element count overflows int64"));
  }
  return n;
}

absl::StatusOr<int64_t> NumBytes(absl::Span<const int64_t> shape, DType dtype) {
  absl::StatusOr<int64_t> n = NumElements(shape);
  if (!n.ok()) return n.status();
  const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
  if (*n > std::numeric_limits<int64_t>::max() / size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeString(shape), " of ", std::string(DTypeName(dtype)),
        ": byte count overflows int64"));
  }
  return *n * size;
}

absl::Status CheckHostTensor(const HostTensor& t) {
  absl::StatusOr<int64_t> bytes = NumBytes(t.shape, t.dtype);
  if (!bytes.ok()) return bytes.status();
  if (static_cast<uint64_t>(*bytes) != t.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeString(t.shape), " of ", std::string(DTypeName(t.dtype)),
        " needs ", *bytes, " bytes of data, got ", t.data.size()));
  }
  return absl::OkStatus();
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace matmul
