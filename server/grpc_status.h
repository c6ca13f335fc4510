// The one place where an absl::Status becomes a grpc::Status.
#ifndef MATMUL_SERVER_GRPC_STATUS_H_
#define MATMUL_SERVER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace matmul {

// Same code (absl and gRPC share the canonical code numbers), same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace matmul

#endif  // MATMUL_SERVER_GRPC_STATUS_H_
