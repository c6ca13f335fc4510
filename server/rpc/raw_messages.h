// The unary methods are raw callback methods (server/rpc/matmul_service.h):
// gRPC's typed handlers answer bytes that do not parse with UNIMPLEMENTED
// and no message, before any of our code runs. Their requests are parsed
// here instead, and their responses serialized.
#ifndef MATMUL_SERVER_RPC_RAW_MESSAGES_H_
#define MATMUL_SERVER_RPC_RAW_MESSAGES_H_

#include <google/protobuf/message_lite.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "server/server_metrics.h"

namespace matmul {

// OK when the request's bytes arrived. gRPC still calls a raw handler whose
// request never fully arrived (the client cancelled, or its deadline passed
// mid-upload), with an empty buffer: that is the client's cancellation
// (CANCELLED or DEADLINE_EXCEEDED), not a malformed request.
absl::Status RequestArrived(const grpc::ByteBuffer& request,
                            const grpc::ServerContextBase& context);

// RequestArrived, then parses the request into `message` and frees its
// bytes, as gRPC's typed handlers do (the message holds its own copy: an
// upload is not held twice). INVALID_ARGUMENT, naming the message and the
// byte count, when the bytes are not a `message`.
absl::Status ParseRequest(const grpc::ServerContextBase& context,
                          const grpc::ByteBuffer* request,
                          google::protobuf::MessageLite& message);

// The rejection a failure of RequestArrived or ParseRequest counts as.
RejectReason RequestRejection(const absl::Status& status);

// `message`, serialized into `response` as gRPC's typed handlers would.
absl::Status SerializeResponse(const google::protobuf::MessageLite& message,
                               grpc::ByteBuffer* response);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_RAW_MESSAGES_H_
