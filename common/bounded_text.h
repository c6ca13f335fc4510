// Values a client sent, cut before they go into an error message: a 100 KB
// handle id or a shape of 3,000 dimensions must not make a status message
// larger than the client's metadata limit (gRPC's default is 8 KiB, and a
// message over it reaches the client as RESOURCE_EXHAUSTED "received
// initial metadata size exceeds limit" instead of the real error).
#ifndef MATMUL_COMMON_BOUNDED_TEXT_H_
#define MATMUL_COMMON_BOUNDED_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace matmul {

// Most bytes of one echoed value in a message.
inline constexpr size_t kMaxEchoedBytes = 128;
// Most bytes of a whole status message the server sends.
inline constexpr size_t kMaxStatusMessageBytes = 1000;

// `text` cut to at most `max` bytes, with a note of how much was left out.
inline std::string BoundedForMessage(absl::string_view text,
                                     size_t max = kMaxEchoedBytes) {
  if (text.size() <= max) return std::string(text);
  return absl::StrCat(text.substr(0, max), "... (", text.size() - max,
                      " more bytes)");
}

// "[2, 3, 4]"; past `max_dims` dimensions, "[1, 1, ..., (2992 more)]".
inline std::string BoundedShape(absl::Span<const int64_t> shape,
                                size_t max_dims = 8) {
  if (shape.size() <= max_dims) {
    return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  }
  return absl::StrCat("[", absl::StrJoin(shape.subspan(0, max_dims), ", "),
                      ", ... (", shape.size() - max_dims, " more)]");
}

}  // namespace matmul

#endif  // MATMUL_COMMON_BOUNDED_TEXT_H_
