// CudaResidentTensor: device memory kept between requests (an
// upload, or a product kept on the device). Its reservation against the
// device budget ends, and the memory is freed in stream order, when the last
// reference goes: after every job that used it has completed, since jobs
// hold references until then. Immutable; thread-safe. Must not outlive the
// engine's device.
#ifndef MATMUL_GPU_CUDA_RESIDENT_TENSOR_H_
#define MATMUL_GPU_CUDA_RESIDENT_TENSOR_H_

#include <cstdint>

#include "common/dtype.h"
#include "gpu/engine.h"

namespace matmul {

class Device;

class CudaResidentTensor final : public ResidentTensor {
 public:
  // Takes `data` (from the device's memory pool) and `reserved` bytes of the
  // device's memory budget.
  CudaResidentTensor(Device* device, DType dtype, int64_t batch, int64_t rows,
                     int64_t cols, void* data, int64_t reserved);
  ~CudaResidentTensor() override;

 private:
  Device* const device_;
  const int64_t reserved_;
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_RESIDENT_TENSOR_H_
