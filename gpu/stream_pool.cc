#include "gpu/stream_pool.h"

#include "common/status_macros.h"
#include "gpu/cuda_status.h"

namespace matmul {

absl::StatusOr<std::unique_ptr<StreamPool>> StreamPool::Create(
    int device, int streams, size_t workspace_bytes) {
  ScopedDevice scoped(device);
  std::unique_ptr<StreamPool> pool(new StreamPool(device));
  for (int i = 0; i < streams; ++i) {
    PooledStream s;
    s.index = i;
    ASSIGN_OR_RETURN(s.stream, CreateStream());
    ASSIGN_OR_RETURN(s.cublas, CreateCublasHandle());
    ASSIGN_OR_RETURN(s.workspace, DeviceBuffer::Allocate(workspace_bytes));
    CUBLAS_RETURN_IF_ERROR(cublasSetStream(s.cublas.get(), s.stream.get()));
    CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(
        s.cublas.get(), s.workspace.data(), s.workspace.size()));
    // Strict by default: TF32 only where a request's compute type asks.
    CUBLAS_RETURN_IF_ERROR(
        cublasSetMathMode(s.cublas.get(), CUBLAS_DEFAULT_MATH));
    pool->streams_.push_back(std::move(s));
  }
  return pool;
}

StreamPool::~StreamPool() {
  ScopedDevice scoped(device_);
  for (PooledStream& s : streams_) cudaStreamSynchronize(s.stream.get());
  streams_.clear();
}

}  // namespace matmul
