// The stored-tensor RPCs: Upload and Download move one tensor into or out
// of engine memory as an engine job, through the admission core (the
// upload's bytes are charged to its client's quota); Delete drops a handle.
#ifndef MATMUL_SERVER_RPC_TRANSFERS_H_
#define MATMUL_SERVER_RPC_TRANSFERS_H_

#include <grpcpp/grpcpp.h>

#include "matmul/v1/matmul.pb.h"
#include "server/rpc/service_state.h"

namespace matmul {

// Each starts one call; gRPC owns the returned reactor. The request and the
// response are raw: an UploadRequest, DownloadRequest or DeleteRequest in,
// parsed here (server/rpc/raw_messages.h: bytes that are not one get
// INVALID_ARGUMENT), and its response out.
grpc::ServerUnaryReactor* StartUpload(ServiceState& state,
                                      grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response);
grpc::ServerUnaryReactor* StartDownload(ServiceState& state,
                                        grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response);
grpc::ServerUnaryReactor* DeleteHandle(ServiceState& state,
                                       grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_TRANSFERS_H_
