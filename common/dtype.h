// Element types and compute modes shared by the engines, the server and the
// clients. Independent of the protobuf API so that gpu/ does not depend on it.
#ifndef MATMUL_COMMON_DTYPE_H_
#define MATMUL_COMMON_DTYPE_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace matmul {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16 };
inline constexpr int kNumDTypes = 4;

enum class ComputeMode {
  kStrict,  // full precision of the dtype (fp16/bf16 accumulate in fp32)
  kTf32,    // float32 inputs may be rounded to TF32 on tensor cores
};

constexpr std::size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

// Lower-case name as used on the command line and in metric labels.
constexpr absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

constexpr absl::string_view ComputeModeName(ComputeMode m) {
  return m == ComputeMode::kTf32 ? "tf32" : "strict";
}

}  // namespace matmul

#endif  // MATMUL_COMMON_DTYPE_H_
