// The shared-memory RPCs (server/shared_memory/region_registry.h holds the
// regions):
//
//   RegisterSharedMemory    server-streaming: maps and registers a region,
//                           answers one message describing it, and keeps the
//                           call open; the region lives until the call ends:
//                           the client cancels it (or disconnects), calls
//                           UnregisterSharedMemory (which ends it with OK),
//                           or the server drains (UNAVAILABLE, at the
//                           drain's start, so an open registration never
//                           holds a drain up).
//   UnregisterSharedMemory  unary: ends one of the caller's registrations.
//   ListSharedMemory        unary: the caller's regions, oldest first.
//
// All three only for peers on the server's Unix socket (the peer address
// starts "unix:"): PERMISSION_DENIED over TCP, since a region names memory
// on the server's host. Raw callback methods like the others
// (server/rpc/raw_messages.h parses their requests); none waits on a thread.
#ifndef MATMUL_SERVER_RPC_SHARED_MEMORY_H_
#define MATMUL_SERVER_RPC_SHARED_MEMORY_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "server/rpc/service_state.h"

namespace matmul {

// OK for a peer on the Unix socket; PERMISSION_DENIED, saying why, for any
// other (TCP, whatever its address).
absl::Status CheckSameHostPeer(const grpc::CallbackServerContext& context);

// Each starts one call; gRPC owns the returned reactor.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartRegisterSharedMemory(
    ServiceState& state, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request);
grpc::ServerUnaryReactor* UnregisterSharedMemory(
    ServiceState& state, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request, grpc::ByteBuffer* response);
grpc::ServerUnaryReactor* ListSharedMemory(ServiceState& state,
                                           grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_SHARED_MEMORY_H_
