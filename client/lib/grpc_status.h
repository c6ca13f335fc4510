// FromGrpcStatus: a gRPC status as an absl::Status, the way every call of
// the client library reports errors (same code, same message).
#ifndef MATMUL_CLIENT_LIB_GRPC_STATUS_H_
#define MATMUL_CLIENT_LIB_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace matmul {

// The absl::Status for a gRPC status: same code, same message.
inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_GRPC_STATUS_H_
