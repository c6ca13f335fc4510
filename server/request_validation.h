// Validation of Multiply requests: turns a MultiplyRequest into a MatmulSpec,
// or explains precisely what is wrong with it. Pure functions, thread-safe.
#ifndef MATMUL_SERVER_REQUEST_VALIDATION_H_
#define MATMUL_SERVER_REQUEST_VALIDATION_H_

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "gpu/matmul_spec.h"
#include "matmul/v1/matmul.pb.h"
#include "proto/dtype_mapping.h"
#include "server/request_limits.h"

namespace matmul {

// What validation needs of one operand, however the request was decoded
// (a parsed protobuf message, or the zero-copy wire decoder).
struct OperandHeader {
  bool present = false;
  absl::Span<const int64_t> shape;
  int dtype = 0;  // raw matmul.v1.Dtype value, possibly out of range
  int64_t data_bytes = 0;
  // The bytes follow separately (MultiplyStream): data_bytes must be 0.
  bool data_follows = false;
};

struct MultiplyHeader {
  OperandHeader a;
  OperandHeader b;
  bool transpose_a = false;
  bool transpose_b = false;
  int compute_mode = 0;  // raw matmul.v1.ComputeMode value
};

// The header of a parsed message (spans point into `request`).
MultiplyHeader HeaderOf(const v1::MultiplyRequest& request);

// INVALID_ARGUMENT for a malformed request (missing operand, bad dtype or
// shape, wrong byte count, mismatched dimensions); RESOURCE_EXHAUSTED when a
// well-formed request exceeds `limits`. Messages name the field, the
// expected and the received value. Size arithmetic cannot overflow.
absl::StatusOr<MatmulSpec> ValidateMultiplyHeader(const MultiplyHeader& request,
                                                  const RequestLimits& limits);
absl::StatusOr<MatmulSpec> ValidateMultiplyRequest(
    const v1::MultiplyRequest& request, const RequestLimits& limits);

// One stored tensor's description, validated (Upload).
struct TensorDims {
  DType dtype = DType::kFloat32;
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  bool is_3d = false;
};

// Validates a tensor on its own (dtype, 2-D or 3-D shape, byte count,
// limits), with the same messages as for Multiply's operands.
absl::StatusOr<TensorDims> ValidateTensor(const OperandHeader& tensor,
                                          absl::string_view name,
                                          const RequestLimits& limits);

}  // namespace matmul

#endif  // MATMUL_SERVER_REQUEST_VALIDATION_H_
