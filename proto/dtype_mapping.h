// Mapping between the API's enums (matmul.v1) and the engine's (common/
// dtype.h), shared by the server and the clients.
#ifndef MATMUL_PROTO_DTYPE_MAPPING_H_
#define MATMUL_PROTO_DTYPE_MAPPING_H_

#include <optional>

#include "common/dtype.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

inline v1::Dtype DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat64:
      return v1::DTYPE_FLOAT64;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

// nullopt for values outside the API (DTYPE_UNSPECIFIED, unknown numbers).
inline std::optional<DType> DTypeFromProto(v1::Dtype dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_FLOAT64:
      return DType::kFloat64;
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    default:
      return std::nullopt;
  }
}

inline v1::ComputeMode ComputeModeToProto(ComputeMode mode) {
  return mode == ComputeMode::kTf32 ? v1::COMPUTE_MODE_TF32
                                    : v1::COMPUTE_MODE_STRICT;
}

}  // namespace matmul

#endif  // MATMUL_PROTO_DTYPE_MAPPING_H_
