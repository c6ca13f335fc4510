#include "gpu/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace matmul {
namespace {

// Failures logged per call site before it goes quiet.
constexpr int kLogsPerSite = 5;

// " on GPU 0 stream 2", " on GPU 0", or " on GPU ?" where even the current
// device cannot be read (no driver, a broken context).
std::string Where(CudaSite site) {
  int device = site.device;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    device = -1;
  }
  std::string out =
      device < 0 ? std::string(" on GPU ?") : absl::StrCat(" on GPU ", device);
  if (site.stream >= 0) absl::StrAppend(&out, " stream ", site.stream);
  return out;
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, const char* call, CudaSite site) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Clear the thread's error state first: a non-sticky error must not fail
  // the next unrelated check (nor the cudaGetDevice in Where).
  cudaGetLastError();
  std::string message =
      absl::StrCat(call, " failed", Where(site), ": ", cudaGetErrorName(error),
                   " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t status, const char* call,
                          CudaSite site) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  // cuBLAS reports a failed CUDA call of its own through the runtime's error
  // state too; clear it as CudaStatus does.
  cudaGetLastError();
  std::string message = absl::StrCat(call, " failed", Where(site), ": ",
                                     cublasGetStatusName(status), " (",
                                     cublasGetStatusString(status), ")");
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

void LogCudaFailure(const absl::Status& status, std::atomic<int>& count) {
  if (status.ok()) return;
  const int n = count.fetch_add(1, std::memory_order_relaxed);
  if (n < kLogsPerSite) {
    LogLine(absl::StrCat("error: ", status.message()));
  } else if (n == kLogsPerSite) {
    LogLine(absl::StrCat("error: ", status.message(),
                         " (further failures of this call are not logged)"));
  }
}

}  // namespace matmul
