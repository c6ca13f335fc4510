// The unary Multiply RPC: a raw method whose request is decoded straight
// from gRPC's receive buffers (server/rpc/multiply_wire.h), so operand bytes
// are copied once, into the engine's pinned staging, and the product is sent
// from staging as a slice of the response without a copy. Operands may also
// be stored tensors (Upload, or products kept with keep_result) named by
// handle.
#ifndef MATMUL_SERVER_RPC_MULTIPLY_H_
#define MATMUL_SERVER_RPC_MULTIPLY_H_

#include <grpcpp/grpcpp.h>

#include "server/rpc/service_state.h"

namespace matmul {

// Starts one Multiply call; gRPC owns the returned reactor.
grpc::ServerUnaryReactor* StartMultiply(ServiceState& state,
                                        grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_MULTIPLY_H_
