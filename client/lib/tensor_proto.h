// Conversions between the client's HostTensor and the wire's
// matmul.v1.Tensor, and between the dtype and compute-mode enums of the two.
// Both directions check that the data holds exactly shape x dtype bytes.
//
// Pure functions; thread-safe.
#ifndef MATMUL_CLIENT_LIB_TENSOR_PROTO_H_
#define MATMUL_CLIENT_LIB_TENSOR_PROTO_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/lib/host_tensor.h"
#include "common/dtype.h"
#include "matmul/v1/matmul.pb.h"
#include "proto/dtype_mapping.h"

namespace matmul {

// Fills `out` from `tensor` (the payload is copied; the rvalue overload
// moves it instead). INVALID_ARGUMENT, leaving `out` untouched, if the
// tensor's data size does not match its shape and dtype.
absl::Status ToProto(const HostTensor& tensor, v1::Tensor* out);
absl::Status ToProto(HostTensor&& tensor, v1::Tensor* out);

// The HostTensor a v1::Tensor describes (the rvalue overload moves the
// payload out instead of copying it). INVALID_ARGUMENT for an unknown dtype,
// a negative dimension or a data size that does not match.
absl::StatusOr<HostTensor> FromProto(const v1::Tensor& tensor);
absl::StatusOr<HostTensor> FromProto(v1::Tensor&& tensor);

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_TENSOR_PROTO_H_
