#include "gpu/cuda/device_registry.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "gpu/cuda/cuda_status.h"

namespace matmul {
namespace {

std::string FormatUuid(const cudaUUID_t& uuid) {
  // nvidia-smi's spelling: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x",
                  static_cast<unsigned char>(uuid.bytes[i]));
    out += hex;
    if (i == 3 || i == 5 || i == 7 || i == 9) out += '-';
  }
  return out;
}

}  // namespace

int VisibleCudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the error for later calls
    return 0;
  }
  return count;
}

absl::StatusOr<std::vector<DeviceInfo>> DiscoverCudaDevices() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device is visible (",
        error == cudaSuccess ? "0 devices" : cudaGetErrorString(error), ")"));
  }
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    CUDA_RETURN_IF_ERROR_AT(CudaSite{i}, cudaGetDeviceProperties(&prop, i));
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.uuid = FormatUuid(prop.uuid);
    info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    info.multiprocessors = prop.multiProcessorCount;
    info.copy_engines = prop.asyncEngineCount;
    info.compute_capability = absl::StrCat(prop.major, ".", prop.minor);
    devices.push_back(std::move(info));
  }
  return devices;
}

}  // namespace matmul
