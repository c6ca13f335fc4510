// The chunked stored-tensor RPCs: UploadStream stores a tensor whose bytes
// come in TensorChunks, DownloadStream sends one back in chunks, so that no
// message bounds a stored tensor's size. Both go through the admission core
// as Upload and Download do (same quota, the same checks, in that order);
// each chunk is its own engine job (an upload into, or a download out of,
// the tensor), a few in flight at a time.
#ifndef MATMUL_SERVER_RPC_STORED_TENSOR_STREAMS_H_
#define MATMUL_SERVER_RPC_STORED_TENSOR_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "server/rpc/service_state.h"

namespace matmul {

// Largest TensorChunk an UploadStream takes (INVALID_ARGUMENT past it), and
// the most chunk bytes it reads ahead of the engine: an upload holds at most
// twice this in the server besides the tensor itself, which is what it is
// admitted for.
inline constexpr int64_t kUploadStreamMaxChunkBytes = int64_t{64} << 20;
// A DownloadStream's chunks when the request names no size, and how many
// of them it has in flight (being read out of the tensor or written).
inline constexpr int64_t kDownloadStreamDefaultChunkBytes = int64_t{4} << 20;
inline constexpr int kDownloadStreamChunksInFlight = 3;

// Each starts one call; gRPC owns the returned reactor. Messages are raw:
// UploadStreamRequests in and an UploadStreamResponse out; a
// DownloadStreamRequest in and DownloadStreamResponses out.
grpc::ServerReadReactor<grpc::ByteBuffer>* StartUploadStream(
    ServiceState& state, grpc::CallbackServerContext* context,
    grpc::ByteBuffer* response);
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartDownloadStream(
    ServiceState& state, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_STORED_TENSOR_STREAMS_H_
