// SharedMemoryObject: a POSIX shared-memory object (shm_open) that this
// process created and mapped, for a matmul server on the same host to map
// too (MatmulService.RegisterSharedMemory, see shared_memory_session.h).
//
// Create() makes a new object under a unique name ("/matmul-<pid>-<n>",
// created with O_CREAT | O_EXCL, so an existing object is never reused),
// sizes it (ftruncate) and maps it read-write. The object is created with
// mode 0600: only processes of the same user can open it, so the server
// must run as the same uid, or the client widens the mode
// (SharedMemoryObjectOptions::mode, e.g. 0660 with a shared group). The
// destructor unmaps the memory, closes the descriptor and unlinks the name
// (unless Unlink() did already). Unlinking only removes the name: a server
// that has mapped the object keeps its mapping, and the memory is freed
// when the last mapping goes.
//
// Move-only; not synchronized: the bytes are plain memory, shared with the
// server, and whoever writes them coordinates with whoever reads them.
#ifndef MATMUL_CLIENT_LIB_SHARED_MEMORY_OBJECT_H_
#define MATMUL_CLIENT_LIB_SHARED_MEMORY_OBJECT_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace matmul {

struct SharedMemoryObjectOptions {
  // Permission bits the object is created with (before the umask).
  mode_t mode = 0600;
  // The name is "<prefix>-<pid>-<n>"; one slash, first, and no other.
  std::string name_prefix = "/matmul";
};

class SharedMemoryObject {
 public:
  // A new object of `bytes` bytes (more than zero), zero-filled and mapped.
  // INVALID_ARGUMENT for a size that is not positive or a bad prefix; the
  // errno of shm_open, ftruncate or mmap otherwise (e.g. RESOURCE_EXHAUSTED
  // when /dev/shm is full).
  static absl::StatusOr<SharedMemoryObject> Create(
      int64_t bytes, const SharedMemoryObjectOptions& options = {});

  SharedMemoryObject(SharedMemoryObject&& other) noexcept;
  SharedMemoryObject& operator=(SharedMemoryObject&& other) noexcept;
  SharedMemoryObject(const SharedMemoryObject&) = delete;
  SharedMemoryObject& operator=(const SharedMemoryObject&) = delete;
  ~SharedMemoryObject();

  // The name given to shm_open ("/matmul-4711-0").
  const std::string& name() const { return name_; }
  // Bytes mapped.
  int64_t size() const { return size_; }
  char* data() { return data_; }
  const char* data() const { return data_; }
  absl::Span<char> bytes() { return absl::MakeSpan(data_, size_); }
  absl::Span<const char> bytes() const {
    return absl::MakeConstSpan(data_, size_);
  }
  // Whether the name still exists (not unlinked yet).
  bool linked() const { return linked_; }

  // Removes the name now (the mapping stays). Once a server has mapped the
  // object, nothing needs the name any more, and an unlinked object cannot
  // outlive every process that maps it, whatever way they end. Idempotent.
  absl::Status Unlink();

 private:
  SharedMemoryObject() = default;
  void Release();

  std::string name_;
  int64_t size_ = 0;
  char* data_ = nullptr;
  int fd_ = -1;
  bool linked_ = false;
};

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_SHARED_MEMORY_OBJECT_H_
