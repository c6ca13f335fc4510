#include "gpu/cuda/resident_tensor.h"

#include <cuda_runtime.h>

#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"

namespace matmul {

CudaResidentTensor::CudaResidentTensor(Device* device, DType dtype,
                                       int64_t batch, int64_t rows,
                                       int64_t cols, void* data,
                                       int64_t reserved)
    : ResidentTensor(device->index(), dtype, batch, rows, cols, data),
      device_(device),
      reserved_(reserved) {}

CudaResidentTensor::~CudaResidentTensor() {
  // A destructor: a failed free is logged; the memory then stays in the
  // device's pool, and its reservation goes all the same.
  ScopedDevice scoped(device_->index());
  CUDA_LOG_IF_ERROR_STATUS(scoped.status());
  CUDA_LOG_IF_ERROR_AT(
      CudaSite{device_->index()},
      cudaFreeAsync(const_cast<void*>(data()), device_->idle_stream()));
  device_->memory().Release(reserved_);
}

}  // namespace matmul
