// GetServerInfo: the engine, its devices and dtypes, and the limits a
// client must respect. Answered on the gRPC thread; no engine work.
#ifndef MATMUL_SERVER_RPC_SERVER_INFO_H_
#define MATMUL_SERVER_RPC_SERVER_INFO_H_

#include <grpcpp/grpcpp.h>

#include "matmul/v1/matmul.pb.h"
#include "server/rpc/service_state.h"

namespace matmul {

grpc::ServerUnaryReactor* GetServerInfo(ServiceState& state,
                                        grpc::CallbackServerContext* context,
                                        v1::GetServerInfoResponse* response);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_SERVER_INFO_H_
