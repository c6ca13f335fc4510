#include "client/lib/shared_memory_object.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace matmul {
namespace {

std::atomic<uint64_t> next_region{0};

absl::Status ErrnoStatus(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

absl::StatusOr<SharedMemoryObject> SharedMemoryObject::Create(
    int64_t bytes, const SharedMemoryObjectOptions& options) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory: the size must be more than zero, got ", bytes));
  }
  if (static_cast<uint64_t>(bytes) > static_cast<uint64_t>(SIZE_MAX) ||
      bytes > static_cast<int64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: ", bytes, " bytes cannot be mapped"));
  }
  const std::string& prefix = options.name_prefix;
  if (prefix.size() < 2 || prefix[0] != '/' ||
      prefix.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: the name prefix \"", prefix,
                     "\" must be a slash followed by a name with no slash"));
  }
  SharedMemoryObject region;
  // O_EXCL: a name left by a process that died, or taken by another
  // process, is skipped, never reused.
  for (int attempt = 0; attempt < 64; ++attempt) {
    std::string name =
        absl::StrCat(prefix, "-", getpid(), "-", next_region.fetch_add(1));
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
                            options.mode);
    if (fd >= 0) {
      region.fd_ = fd;
      region.name_ = std::move(name);
      region.linked_ = true;
      break;
    }
    if (errno != EEXIST) {
      return ErrnoStatus(errno,
                         absl::StrCat("shared memory: shm_open(", name, ")"));
    }
  }
  if (region.fd_ < 0) {
    return absl::AlreadyExistsError(
        "shared memory: 64 names in a row exist already");
  }
  // The umask may have cleared bits of the requested mode; the mode is what
  // decides who may open it, so set it as asked.
  if (fchmod(region.fd_, options.mode) != 0) {
    return ErrnoStatus(
        errno, absl::StrCat("shared memory: fchmod(", region.name_, ")"));
  }
  if (ftruncate(region.fd_, static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("shared memory: ftruncate(",
                                           region.name_, ", ", bytes, ")"));
  }
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                    MAP_SHARED, region.fd_, 0);
  if (data == MAP_FAILED) {
    return ErrnoStatus(errno, absl::StrCat("shared memory: mmap(", region.name_,
                                           ", ", bytes, ")"));
  }
  region.data_ = static_cast<char*>(data);
  region.size_ = bytes;
  return region;
}

SharedMemoryObject::SharedMemoryObject(SharedMemoryObject&& other) noexcept
    : name_(std::move(other.name_)),
      size_(std::exchange(other.size_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      fd_(std::exchange(other.fd_, -1)),
      linked_(std::exchange(other.linked_, false)) {}

SharedMemoryObject& SharedMemoryObject::operator=(
    SharedMemoryObject&& other) noexcept {
  if (this != &other) {
    Release();
    name_ = std::move(other.name_);
    size_ = std::exchange(other.size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    fd_ = std::exchange(other.fd_, -1);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

SharedMemoryObject::~SharedMemoryObject() { Release(); }

void SharedMemoryObject::Release() {
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  if (fd_ >= 0) close(fd_);
  if (linked_) shm_unlink(name_.c_str());
  data_ = nullptr;
  fd_ = -1;
  linked_ = false;
  size_ = 0;
}

absl::Status SharedMemoryObject::Unlink() {
  if (!linked_) return absl::OkStatus();
  linked_ = false;
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno,
                       absl::StrCat("shared memory: shm_unlink(", name_, ")"));
  }
  return absl::OkStatus();
}

}  // namespace matmul
