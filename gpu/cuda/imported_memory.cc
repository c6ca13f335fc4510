#include "gpu/cuda/imported_memory.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"

namespace matmul {

// One opened handle: the allocation mapped into this process.
class ImportedMemoryTable::Mapping {
 public:
  Mapping(int device, void* base, int64_t size)
      : device_(device), base_(base), size_(size) {}
  ~Mapping() {
    // Every job using it is done (its users are gone); a failure can only
    // be logged.
    ScopedDevice scoped(device_);
    CUDA_LOG_IF_ERROR_STATUS(scoped.status());
    CUDA_LOG_IF_ERROR_AT(CudaSite{device_}, cudaIpcCloseMemHandle(base_));
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  int device() const { return device_; }
  void* base() const { return base_; }
  int64_t size() const { return size_; }

 private:
  const int device_;
  void* const base_;
  const int64_t size_;
};

namespace {

// A region's view of a mapping: raw memory that keeps the mapping open.
class ImportedRegion final : public ResidentTensor {
 public:
  ImportedRegion(std::shared_ptr<const void> mapping, int device, void* data,
                 int64_t bytes)
      : ResidentTensor(device, bytes, data), mapping_(std::move(mapping)) {}

 private:
  const std::shared_ptr<const void> mapping_;
};

// cuMemGetAddressRange through the runtime's entry point: the engine links
// no libcuda of its own (a server on a host with no driver must still start,
// on the host engine).
absl::StatusOr<PFN_cuMemGetAddressRange_v3020> AddressRangeFunction() {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error = cudaGetDriverEntryPointByVersion(
      "cuMemGetAddressRange", &function, 3020, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess ||
      function == nullptr) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("the CUDA driver has no cuMemGetAddressRange: ",
                     cudaGetErrorName(error)));
  }
  return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(function);
}

absl::Status HandleDoesNotOpen(cudaError_t error, int device) {
  cudaGetLastError();  // not sticky: clear it for this thread's next call
  return absl::FailedPreconditionError(absl::StrCat(
      "ipc_handle: cudaIpcOpenMemHandle on GPU ", device,
      " failed: ", cudaGetErrorName(error), " (", cudaGetErrorString(error),
      "); the handle must come from cudaIpcGetMemHandle of a live "
      "allocation's base, in a process on this node, on that GPU"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<ResidentTensor>> ImportedMemoryTable::Import(
    int device, absl::Span<const std::byte> ipc_handle, int64_t bytes) {
  if (ipc_handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ipc_handle: expected the ", kCudaIpcHandleBytes,
        " bytes of a CUDA IPC memory handle, got ", ipc_handle.size()));
  }
  std::string key = absl::StrCat(device, ":");
  key.append(reinterpret_cast<const char*>(ipc_handle.data()),
             ipc_handle.size());
  absl::MutexLock lock(&mu_);
  absl::erase_if(open_,
                 [](const auto& entry) { return entry.second.expired(); });
  std::shared_ptr<Mapping> mapping;
  if (auto it = open_.find(key); it != open_.end()) {
    mapping = it->second.lock();
  }
  if (mapping == nullptr) {
    ScopedDevice scoped(device);
    if (!scoped.status().ok()) return scoped.status();
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, ipc_handle.data(), sizeof handle);
    void* base = nullptr;
    const cudaError_t error =
        cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
    if (error != cudaSuccess) return HandleDoesNotOpen(error, device);
    static const absl::StatusOr<PFN_cuMemGetAddressRange_v3020> address_range =
        AddressRangeFunction();
    if (!address_range.ok()) {
      CUDA_LOG_IF_ERROR_AT(CudaSite{device}, cudaIpcCloseMemHandle(base));
      return address_range.status();
    }
    CUdeviceptr range_base = 0;
    size_t range_size = 0;
    const CUresult range = (*address_range)(
        &range_base, &range_size, reinterpret_cast<CUdeviceptr>(base));
    if (range != CUDA_SUCCESS) {
      CUDA_LOG_IF_ERROR_AT(CudaSite{device}, cudaIpcCloseMemHandle(base));
      return absl::InternalError(absl::StrCat(
          "cuMemGetAddressRange of an opened IPC handle failed: CUresult ",
          static_cast<int>(range)));
    }
    const int64_t size = static_cast<int64_t>(
        range_size - (reinterpret_cast<CUdeviceptr>(base) - range_base));
    mapping = std::make_shared<Mapping>(device, base, size);
    open_[key] = mapping;
  }
  if (bytes <= 0 || bytes > mapping->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: ", bytes,
                     " bytes asked for, but the allocation the handle "
                     "names is ",
                     mapping->size(), " bytes; give 1 to that many"));
  }
  void* base = mapping->base();
  return std::shared_ptr<ResidentTensor>(std::make_shared<ImportedRegion>(
      std::move(mapping), device, base, bytes));
}

int64_t ImportedMemoryTable::open_handles() const {
  absl::MutexLock lock(&mu_);
  int64_t open = 0;
  for (const auto& [key, mapping] : open_) open += mapping.expired() ? 0 : 1;
  return open;
}

}  // namespace matmul
