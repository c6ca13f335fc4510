#include "server/rpc/raw_messages.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "server/rpc/call_helpers.h"

namespace matmul {

absl::Status RequestArrived(const grpc::ByteBuffer& request,
                            const grpc::ServerContextBase& context) {
  if (request.Valid() && !context.IsCancelled()) return absl::OkStatus();
  if (DeadlinePassed(context.deadline())) {
    return absl::DeadlineExceededError(
        "the deadline passed before the request arrived");
  }
  return absl::CancelledError("the request was cancelled before it arrived");
}

absl::Status ParseRequest(const grpc::ServerContextBase& context,
                          const grpc::ByteBuffer* request,
                          google::protobuf::MessageLite& message) {
  if (absl::Status arrived = RequestArrived(*request, context); !arrived.ok()) {
    return arrived;
  }
  const size_t bytes = request->Length();
  // The handler's call owns the buffer and nothing else reads it: like
  // gRPC's typed handlers, parsing consumes it (GenericDeserialize clears
  // it; the call's holder then has nothing left to free).
  const grpc::Status parsed =
      grpc::GenericDeserialize<grpc::ProtoBufferReader,
                               google::protobuf::MessageLite>(
          const_cast<grpc::ByteBuffer*>(request), &message);
  if (parsed.ok()) return absl::OkStatus();
  // The type name, without its package: "UploadRequest".
  std::string name = message.GetTypeName();
  if (const size_t dot = name.rfind('.'); dot != std::string::npos) {
    name.erase(0, dot + 1);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("could not parse the ", name, " (", bytes,
                   " bytes): not a valid protobuf message"));
}

RejectReason RequestRejection(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return RejectReason::kDeadline;
    case absl::StatusCode::kCancelled:
      return RejectReason::kCancelled;
    default:
      return RequestFault(status);
  }
}

absl::Status SerializeResponse(const google::protobuf::MessageLite& message,
                               grpc::ByteBuffer* response) {
  bool own_buffer = false;
  const grpc::Status serialized =
      grpc::GenericSerialize<grpc::ProtoBufferWriter,
                             google::protobuf::MessageLite>(message, response,
                                                            &own_buffer);
  if (serialized.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("could not serialize the ",
                                          message.GetTypeName(), ": ",
                                          serialized.error_message()));
}

}  // namespace matmul
