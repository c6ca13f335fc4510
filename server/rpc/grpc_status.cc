#include "server/rpc/grpc_status.h"

#include <chrono>
#include <string>

#include "common/bounded_text.h"

namespace matmul {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // The last bound: whatever a message echoes, it stays far under the
  // client's metadata limit.
  return grpc::Status(
      static_cast<grpc::StatusCode>(status.code()),
      BoundedForMessage(status.message(), kMaxStatusMessageBytes - 32));
}

absl::Time DeadlineOf(const grpc::ServerContextBase& context) {
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

}  // namespace matmul
