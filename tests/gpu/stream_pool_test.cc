// StreamPool: one stream per slot, each with its own cuBLAS handle bound to
// it; on a device that does not exist it fails to create. Needs a GPU except
// for the last case (covered in cuda_status_test).
#include "gpu/cuda/stream_pool.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <set>

#include "gpu/cuda/device_registry.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

TEST(StreamPoolTest, EveryStreamHasItsOwnBoundHandleAndWorkspace) {
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU";
  absl::StatusOr<std::unique_ptr<StreamPool>> pool =
      StreamPool::Create(0, 3, size_t{1} << 20);
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ((*pool)->size(), 3);
  EXPECT_EQ((*pool)->device(), 0);
  std::set<cudaStream_t> streams;
  std::set<cublasHandle_t> handles;
  for (int i = 0; i < 3; ++i) {
    PooledStream& s = (*pool)->at(i);
    EXPECT_EQ(s.index, i);
    streams.insert(s.stream.get());
    handles.insert(s.cublas.get());
    cudaStream_t bound = nullptr;
    ASSERT_EQ(cublasGetStream(s.cublas.get(), &bound), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(bound, s.stream.get());
    EXPECT_EQ(s.workspace.size(), size_t{1} << 20);
    EXPECT_EQ(cudaStreamQuery(s.stream.get()), cudaSuccess);  // idle
  }
  EXPECT_EQ(streams.size(), 3u);
  EXPECT_EQ(handles.size(), 3u);
}

}  // namespace
}  // namespace matmul
