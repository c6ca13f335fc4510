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
//   RegisterCudaMemory      as RegisterSharedMemory, for a range of the
//                           client's GPU memory (a CUDA IPC handle).
//
// All four only for peers on the server's Unix socket
// (server/unix_socket_listener.h), PERMISSION_DENIED over TCP since a
// region names memory on the server's host, and only for peers whose
// credentials (SO_PEERCRED) the allow-list admits: the server's own user
// and --shared-memory-peers. Raw callback methods like the others
// (server/rpc/raw_messages.h parses their requests); none waits on a thread.
#ifndef MATMUL_SERVER_RPC_SHARED_MEMORY_H_
#define MATMUL_SERVER_RPC_SHARED_MEMORY_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "server/peer_credentials.h"
#include "server/rpc/service_state.h"
#include "server/shared_memory/region_registry.h"

namespace matmul {

// The credentials of a peer on the Unix socket that `regions` allows;
// PERMISSION_DENIED, saying why, for any other peer (TCP, whatever its
// address, or a user not allowed).
absl::StatusOr<PeerCredentials> SharedMemoryPeer(
    const grpc::CallbackServerContext& context,
    const SharedMemoryRegistry& regions);

// Each starts one call; gRPC owns the returned reactor.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartRegisterSharedMemory(
    ServiceState& state, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request);
// RegisterCudaMemory: as RegisterSharedMemory, for a range of the client's
// GPU memory (SharedMemoryRegistry::RegisterCuda).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartRegisterCudaMemory(
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
