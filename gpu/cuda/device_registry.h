// Device discovery: every GPU this process can see, described for
// GetServerInfo, the start-up log and the metrics labels.
#ifndef MATMUL_GPU_CUDA_DEVICE_REGISTRY_H_
#define MATMUL_GPU_CUDA_DEVICE_REGISTRY_H_

#include <vector>

#include "absl/status/statusor.h"
#include "gpu/engine.h"

namespace matmul {

// Number of visible CUDA devices; 0 when there is no driver or no device.
int VisibleCudaDevices();

// Every visible device (index, name, UUID, memory, SMs, copy engines,
// compute capability). FAILED_PRECONDITION when there is none.
absl::StatusOr<std::vector<DeviceInfo>> DiscoverCudaDevices();

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_DEVICE_REGISTRY_H_
