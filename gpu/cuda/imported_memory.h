// ImportedMemoryTable: the CUDA engine's opened CUDA IPC handles (another
// process's GPU memory, Engine::ImportDeviceMemory). A handle is opened
// once per process (cudaIpcOpenMemHandle with
// cudaIpcMemLazyEnablePeerAccess, on the device that holds it) however many
// regions name it, and closed (cudaIpcCloseMemHandle) when the last region
// and job using it let it go. Each import is checked against the
// allocation's true size (cuMemGetAddressRange), so that no job reads or
// writes past it.
//
// Thread-safe. Every import must be released before the engine's devices
// are torn down.
#ifndef MATMUL_GPU_CUDA_IMPORTED_MEMORY_H_
#define MATMUL_GPU_CUDA_IMPORTED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "gpu/engine.h"

namespace matmul {

// The 64 bytes of a cudaIpcMemHandle_t.
inline constexpr size_t kCudaIpcHandleBytes = 64;

class ImportedMemoryTable {
 public:
  ImportedMemoryTable() = default;
  ImportedMemoryTable(const ImportedMemoryTable&) = delete;
  ImportedMemoryTable& operator=(const ImportedMemoryTable&) = delete;

  // The first `bytes` of the allocation `ipc_handle` names, opened on
  // device `device` (an index this engine drives). FAILED_PRECONDITION
  // naming the CUDA error when the handle does not open; INVALID_ARGUMENT
  // when `bytes` runs past the allocation.
  absl::StatusOr<std::shared_ptr<ResidentTensor>> Import(
      int device, absl::Span<const std::byte> ipc_handle, int64_t bytes);

  // Handles open now (for tests and logs).
  int64_t open_handles() const;

 private:
  class Mapping;
  mutable absl::Mutex mu_;
  // By device and handle bytes; an entry expires with its last user.
  absl::flat_hash_map<std::string, std::weak_ptr<Mapping>> open_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_IMPORTED_MEMORY_H_
