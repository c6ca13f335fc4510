// GetServerInfo: the engine, its devices and dtypes, and the limits a
// client must respect. Answered on the gRPC thread; no engine work.
#ifndef MATMUL_SERVER_RPC_SERVER_INFO_H_
#define MATMUL_SERVER_RPC_SERVER_INFO_H_

#include <grpcpp/grpcpp.h>

#include "matmul/v1/matmul.pb.h"
#include "server/rpc/service_state.h"

namespace matmul {

// The request and response are raw: a GetServerInfoRequest in (bytes that
// are not one get INVALID_ARGUMENT), a GetServerInfoResponse out.
grpc::ServerUnaryReactor* GetServerInfo(ServiceState& state,
                                        grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_SERVER_INFO_H_
