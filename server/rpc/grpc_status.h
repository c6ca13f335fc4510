// The one place where the admission core's and the engine's types meet
// gRPC's: an absl::Status becomes a grpc::Status here, and a call's deadline
// becomes an absl::Time.
#ifndef MATMUL_SERVER_RPC_GRPC_STATUS_H_
#define MATMUL_SERVER_RPC_GRPC_STATUS_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace matmul {

// Same code (absl and gRPC share the canonical code numbers), same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The call's deadline; absl::InfiniteFuture() when it has none.
absl::Time DeadlineOf(const grpc::ServerContextBase& context);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_GRPC_STATUS_H_
