// Error translation: CUDA and cuBLAS results become the Status their callers
// must see (code, call, device and stream in the message), the thread's
// error state is cleared, and logging where no Status can flow is bounded.
// The pure translations run anywhere the CUDA engine is built; the forced
// errors come from real CUDA calls (an invalid device ordinal), which fail
// whether or not a GPU is present.
#include "gpu/cuda/cuda_status.h"

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/device_registry.h"
#include "gpu/cuda/stream_pool.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "cudaFree(p)").ok());
  EXPECT_TRUE(CublasStatus(CUBLAS_STATUS_SUCCESS, "cublasCreate").ok());
}

TEST(CudaStatusTest, MessageNamesTheCallDeviceStreamAndError) {
  const absl::Status status = CudaStatus(
      cudaErrorIllegalAddress, "cudaMemcpyAsync(dst, src, n)", {3, 1});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("cudaMemcpyAsync(dst, src, n)"));
  EXPECT_THAT(status.message(), HasSubstr("on GPU 3 stream 1"));
  EXPECT_THAT(status.message(), HasSubstr("cudaErrorIllegalAddress"));
}

TEST(CudaStatusTest, DeviceWithoutStreamLeavesTheStreamOut) {
  const absl::Status status =
      CudaStatus(cudaErrorLaunchFailure, "cudaEventRecord", {2});
  EXPECT_THAT(status.message(), HasSubstr("on GPU 2:"));
  EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("stream")));
}

TEST(CudaStatusTest, UnknownDeviceIsReadBackOrMarked) {
  // With a GPU the current device is named; without one, "GPU ?".
  const absl::Status status = CudaStatus(cudaErrorInvalidValue, "cudaCall");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("cudaCall failed on GPU "));
}

TEST(CudaStatusTest, CodesFollowTheError) {
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc", {0}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidDevice, "cudaSetDevice", {0}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "cudaGetDevice", {0}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "cudaFree", {0}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "cudaMemcpy", {0}).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(CudaStatus(cudaErrorIllegalAddress, "cudaStreamQuery", {0}).code(),
            absl::StatusCode::kInternal);
}

TEST(CudaStatusTest, CublasCodesAndMessage) {
  const absl::Status alloc =
      CublasStatus(CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate(&h)", {1, 0});
  EXPECT_EQ(alloc.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(alloc.message(),
              HasSubstr("cublasCreate(&h) failed on GPU 1 "
                        "stream 0: CUBLAS_STATUS_ALLOC_FAILED"));
  EXPECT_EQ(
      CublasStatus(CUBLAS_STATUS_EXECUTION_FAILED, "cublasGemmEx", {0}).code(),
      absl::StatusCode::kInternal);
}

absl::Status ReturnsThrough(cudaError_t error) {
  CUDA_RETURN_IF_ERROR_AT((CudaSite{5, 2}), error);
  return absl::OkStatus();
}

TEST(CudaStatusTest, ReturnMacroPassesTheStatusUp) {
  EXPECT_TRUE(ReturnsThrough(cudaSuccess).ok());
  const absl::Status status = ReturnsThrough(cudaErrorMemoryAllocation);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("error failed on GPU 5 stream 2"));
}

// A real CUDA error: an ordinal past the last device. With a GPU it is
// cudaErrorInvalidDevice, a non-sticky error that must not linger for the
// next call; without one it is cudaErrorNoDevice or
// cudaErrorInsufficientDriver, which the runtime reports again on every
// call (nothing can clear it). Every one is FAILED_PRECONDITION.
TEST(CudaStatusTest, InvalidDeviceOrdinalIsFailedPreconditionAndCleared) {
  const int ordinal = VisibleCudaDevices() + 7;
  const absl::Status status =
      CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice", {ordinal});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("cudaSetDevice failed on GPU"));
  if (VisibleCudaDevices() > 0) {
    EXPECT_THAT(status.message(), HasSubstr("cudaErrorInvalidDevice"));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    // The context is fine: the next call succeeds.
    EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  }
}

TEST(CudaStatusTest, ScopedDeviceReportsAnInvalidOrdinal) {
  const int ordinal = VisibleCudaDevices() + 7;
  ScopedDevice scoped(ordinal);
  EXPECT_EQ(scoped.status().code(), absl::StatusCode::kFailedPrecondition)
      << scoped.status();
}

TEST(CudaStatusTest, StreamPoolOnAnInvalidOrdinalFailsToCreate) {
  absl::StatusOr<std::unique_ptr<StreamPool>> pool =
      StreamPool::Create(VisibleCudaDevices() + 7, 2, 1 << 20);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition)
      << pool.status();
}

TEST(CudaStatusTest, LoggingIsBoundedPerCallSite) {
  std::atomic<int> count{0};
  const absl::Status failure =
      CudaStatus(cudaErrorInvalidValue, "cudaFreeAsync(p, s)", {0, 0});
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 20; ++i) LogCudaFailure(failure, count);
  LogCudaFailure(absl::OkStatus(), count);  // OK is never logged
  const std::string logged = ::testing::internal::GetCapturedStderr();
  int lines = 0;
  for (char c : logged) lines += c == '\n';
  EXPECT_EQ(lines, 6) << logged;  // five, then the one that says it stops
  EXPECT_THAT(logged,
              HasSubstr("cudaFreeAsync(p, s) failed on GPU 0 stream 0"));
  EXPECT_THAT(logged,
              HasSubstr("further failures of this call are not logged"));
  EXPECT_EQ(count.load(), 20);
}

TEST(CudaStatusTest, LogMacroLogsAFailedCall) {
  ::testing::internal::CaptureStderr();
  CUDA_LOG_IF_ERROR_AT(CudaSite{0}, cudaErrorInvalidValue);
  CUDA_LOG_IF_ERROR(cudaSuccess);
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(logged,
              HasSubstr("error: cudaErrorInvalidValue failed on GPU 0"));
  int lines = 0;
  for (char c : logged) lines += c == '\n';
  EXPECT_EQ(lines, 1) << logged;
}

// The error state a failed call leaves is cleared by the check: with a GPU,
// a real non-sticky failure (an ordinal past the end) leaves cudaGetLastError
// clean.
TEST(CudaStatusTest, CheckedFailureLeavesNoErrorBehind) {
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU";
  const absl::Status status = CudaStatus(cudaSetDevice(VisibleCudaDevices()),
                                         "cudaSetDevice(past the end)");
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
}

}  // namespace
}  // namespace matmul
