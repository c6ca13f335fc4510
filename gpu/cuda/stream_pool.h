// StreamPool: one device's CUDA streams, each with its own cuBLAS handle
// bound to it and its own cuBLAS workspace, so that GEMMs on different
// streams never share state and can run concurrently.
#ifndef MATMUL_GPU_CUDA_STREAM_POOL_H_
#define MATMUL_GPU_CUDA_STREAM_POOL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/cuda/cuda_resources.h"

namespace matmul {

// One stream of the pool and what belongs to it.
struct PooledStream {
  int index = 0;
  CudaStream stream;
  CublasHandle cublas;
  DeviceBuffer workspace;
};

// Created and destroyed by one thread; the streams are then used by one lane
// thread each. Destroy before the device is reset.
class StreamPool {
 public:
  // `streams` non-blocking streams on `device`, each with a cuBLAS handle
  // whose workspace is `workspace_bytes` (cublasSetWorkspace).
  static absl::StatusOr<std::unique_ptr<StreamPool>> Create(
      int device, int streams, size_t workspace_bytes);
  ~StreamPool();

  int device() const { return device_; }
  int size() const { return static_cast<int>(streams_.size()); }
  PooledStream& at(int i) { return streams_[i]; }

 private:
  explicit StreamPool(int device) : device_(device) {}
  const int device_;
  std::vector<PooledStream> streams_;
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_STREAM_POOL_H_
