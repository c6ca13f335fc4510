#include "gpu/cuda/stream_pool.h"

#include "common/status_macros.h"
#include "gpu/cuda/cuda_status.h"

namespace matmul {

absl::StatusOr<std::unique_ptr<StreamPool>> StreamPool::Create(
    int device, int streams, size_t workspace_bytes) {
  ScopedDevice scoped(device);
  RETURN_IF_ERROR(scoped.status());
  std::unique_ptr<StreamPool> pool(new StreamPool(device));
  for (int i = 0; i < streams; ++i) {
    PooledStream s;
    s.index = i;
    ASSIGN_OR_RETURN(s.stream, CreateStream());
    ASSIGN_OR_RETURN(s.cublas, CreateCublasHandle());
    ASSIGN_OR_RETURN(s.workspace, DeviceBuffer::Allocate(workspace_bytes));
    CUBLAS_RETURN_IF_ERROR_AT((CudaSite{device, i}),
                              cublasSetStream(s.cublas.get(), s.stream.get()));
    CUBLAS_RETURN_IF_ERROR_AT(
        (CudaSite{device, i}),
        cublasSetWorkspace(s.cublas.get(), s.workspace.data(),
                           s.workspace.size()));
    // Strict by default: TF32 only where a request's compute type asks.
    // Reductions (split-K) stay in the float32 accumulator: without this,
    // cuBLAS may sum float16/bfloat16 partial products in the output type,
    // which the H200 soak caught as errors of several bfloat16 ulps.
    CUBLAS_RETURN_IF_ERROR_AT(
        (CudaSite{device, i}),
        cublasSetMathMode(
            s.cublas.get(),
            static_cast<cublasMath_t>(
                CUBLAS_DEFAULT_MATH |
                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    pool->streams_.push_back(std::move(s));
  }
  return pool;
}

StreamPool::~StreamPool() {
  ScopedDevice scoped(device_);
  CUDA_LOG_IF_ERROR_STATUS(scoped.status());
  for (PooledStream& s : streams_) {
    CUDA_LOG_IF_ERROR_AT((CudaSite{device_, s.index}),
                         cudaStreamSynchronize(s.stream.get()));
  }
  streams_.clear();
}

}  // namespace matmul
