#include "server/shared_memory/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"
#include "common/capability_id.h"

namespace matmul {
namespace {

absl::Status CheckName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos ||
      name.find('\0') != std::string::npos ||
      name.size() > kMaxSharedMemoryNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: expected a POSIX shared-memory name: one leading slash, then "
        "1 to ",
        kMaxSharedMemoryNameBytes - 1, " characters with no slash, got \"",
        BoundedForMessage(name), "\""));
  }
  return absl::OkStatus();
}

absl::Status ErrnoStatus(int error, absl::string_view what,
                         const std::string& name) {
  const std::string message = absl::StrCat(what, " \"", BoundedForMessage(name),
                                           "\": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(
          absl::StrCat(message, " (no such shared-memory object)"));
    case ELOOP:
      return absl::PermissionDeniedError(
          absl::StrCat(message, " (a symbolic link; the server follows none)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(
          message, " (the server's user may not open it read-write)"));
    case ENAMETOOLONG:
    case EINVAL:
      return absl::InvalidArgumentError(message);
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EAGAIN:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

SharedMemoryRegion::~SharedMemoryRegion() {
  // Unpinned before it is unmapped; the quota goes with reservation_. GPU
  // memory is closed here unless a job still holds a view of it (then when
  // that job is done).
  registration_ = HostMemoryRegistration();
  device_memory_.reset();
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(bytes_));
  if (fd_ >= 0) close(fd_);
  if (gauges_ != nullptr) {
    gauges_->regions.fetch_sub(1, std::memory_order_relaxed);
    gauges_->bytes.fetch_sub(bytes_, std::memory_order_relaxed);
  }
}

absl::Status SharedMemoryRegion::CheckStillMapped() const {
  // GPU memory cannot be truncated under us: it stays allocated while open.
  if (kind_ == Kind::kCuda) return absl::OkStatus();
  struct stat st;
  if (fstat(fd_, &st) != 0) {
    return absl::InternalError(
        absl::StrCat("fstat of region ", id_, ": ", std::strerror(errno)));
  }
  if (st.st_size < bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat("region ", id_, " (\"", BoundedForMessage(name_),
                     "\") was registered with ", bytes_,
                     " bytes but its object has been truncated to ", st.st_size,
                     "; unregister it and register it again"));
  }
  return absl::OkStatus();
}

SharedMemoryRegion::Use::Use(std::shared_ptr<SharedMemoryRegion> region)
    : region_(std::move(region)) {
  if (region_ != nullptr) {
    region_->in_flight_.fetch_add(1, std::memory_order_relaxed);
  }
}

SharedMemoryRegion::Use& SharedMemoryRegion::Use::operator=(
    Use&& other) noexcept {
  if (this != &other) {
    Reset();
    region_ = std::move(other.region_);
  }
  return *this;
}

void SharedMemoryRegion::Use::Reset() {
  if (region_ != nullptr) {
    region_->in_flight_.fetch_sub(1, std::memory_order_relaxed);
    region_.reset();
  }
}

SharedMemoryRegistry::SharedMemoryRegistry(
    HandleRegistry* handles, const SharedMemoryLimits& limits,
    std::shared_ptr<SharedMemoryGauges> gauges)
    : handles_(handles), limits_(limits), gauges_(std::move(gauges)) {}

absl::StatusOr<std::shared_ptr<SharedMemoryRegion>>
SharedMemoryRegistry::Register(const std::string& owner,
                               const PeerCredentials& peer,
                               const std::string& name, int64_t bytes,
                               Engine& engine, OnRemoved on_removed) {
  if (absl::Status ok = CheckPeer(peer); !ok.ok()) return ok;
  if (absl::Status ok = CheckName(name); !ok.ok()) return ok;
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes: expected a positive number of bytes to map, got ", bytes));
  }
  if (absl::Status begun = BeginRegistration(owner); !begun.ok()) {
    return begun;
  }
  auto region = std::shared_ptr<SharedMemoryRegion>(new SharedMemoryRegion);
  absl::Status status = [&]() -> absl::Status {
    region->name_ = name;
    region->owner_ = owner;
    // The server's user may open more than the peer may (root, or a
    // shared user): the owner check below, on the descriptor itself (no
    // window for a swap between a check and the open), is what confines a
    // peer to its own objects. O_NOFOLLOW: a link to another's object or
    // to a file elsewhere is refused (ELOOP), never followed.
    region->fd_ = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (region->fd_ < 0) return ErrnoStatus(errno, "shm_open", name);
    struct stat st;
    if (fstat(region->fd_, &st) != 0) {
      return ErrnoStatus(errno, "fstat", name);
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("name: \"", BoundedForMessage(name),
                       "\" is not a shared-memory object"));
    }
    if (st.st_uid != peer.uid) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the shared-memory object \"", BoundedForMessage(name),
          "\" is owned by uid ", st.st_uid, ", not by the caller's uid ",
          peer.uid, "; a client may register only objects it owns"));
    }
    if (st.st_size < bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bytes: the shared-memory object \"", BoundedForMessage(name),
          "\" is ", st.st_size, " bytes, smaller than the ", bytes,
          " asked for; ftruncate it first"));
    }
    // The quota before the memory: a client over it maps nothing.
    absl::StatusOr<HandleRegistry::Reservation> reservation =
        handles_->Reserve(owner, bytes);
    if (!reservation.ok()) return reservation.status();
    region->reservation_ = std::move(*reservation);
    void* data = mmap(nullptr, static_cast<size_t>(bytes),
                      PROT_READ | PROT_WRITE, MAP_SHARED, region->fd_, 0);
    if (data == MAP_FAILED) return ErrnoStatus(errno, "mmap", name);
    region->data_ = static_cast<std::byte*>(data);
    region->bytes_ = bytes;
    region->gauges_ = gauges_;
    gauges_->regions.fetch_add(1, std::memory_order_relaxed);
    gauges_->bytes.fetch_add(bytes, std::memory_order_relaxed);
    absl::StatusOr<HostMemoryRegistration> registration =
        engine.RegisterHostMemory(data, bytes);
    if (!registration.ok()) {
      return absl::Status(
          registration.status().code(),
          absl::StrCat("the engine cannot register the region's memory: ",
                       registration.status().message()));
    }
    region->registration_ = std::move(*registration);
    absl::StatusOr<std::string> id = NewCapabilityId("shm-");
    if (!id.ok()) return id.status();
    region->id_ = std::move(*id);
    return absl::OkStatus();
  }();
  return EndRegistration(owner, std::move(region), std::move(status),
                         std::move(on_removed));
}

absl::StatusOr<std::shared_ptr<SharedMemoryRegion>>
SharedMemoryRegistry::RegisterCuda(const std::string& owner,
                                   const PeerCredentials& peer,
                                   const std::string& ipc_handle, int64_t bytes,
                                   const std::string& device_uuid,
                                   Engine& engine, OnRemoved on_removed) {
  if (absl::Status ok = CheckPeer(peer); !ok.ok()) return ok;
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes: expected a positive number of bytes to use, got ", bytes));
  }
  if (absl::Status begun = BeginRegistration(owner); !begun.ok()) {
    return begun;
  }
  auto region = std::shared_ptr<SharedMemoryRegion>(new SharedMemoryRegion);
  absl::Status status = [&]() -> absl::Status {
    region->kind_ = SharedMemoryRegion::Kind::kCuda;
    region->owner_ = owner;
    // The quota before the memory: a client over it opens nothing.
    absl::StatusOr<HandleRegistry::Reservation> reservation =
        handles_->Reserve(owner, bytes);
    if (!reservation.ok()) return reservation.status();
    region->reservation_ = std::move(*reservation);
    absl::StatusOr<std::shared_ptr<ResidentTensor>> memory =
        engine.ImportDeviceMemory(
            absl::MakeConstSpan(
                reinterpret_cast<const std::byte*>(ipc_handle.data()),
                ipc_handle.size()),
            bytes,
            absl::MakeConstSpan(
                reinterpret_cast<const std::byte*>(device_uuid.data()),
                device_uuid.size()));
    if (!memory.ok()) return memory.status();
    region->device_memory_ = std::move(*memory);
    region->bytes_ = bytes;
    if (device_uuid.size() == 16) {
      unsigned char raw[16];
      std::memcpy(raw, device_uuid.data(), sizeof raw);
      region->device_uuid_ = FormatGpuUuid(raw);
    }
    region->gauges_ = gauges_;
    gauges_->regions.fetch_add(1, std::memory_order_relaxed);
    gauges_->bytes.fetch_add(bytes, std::memory_order_relaxed);
    absl::StatusOr<std::string> id = NewCapabilityId("cuda-");
    if (!id.ok()) return id.status();
    region->id_ = std::move(*id);
    return absl::OkStatus();
  }();
  return EndRegistration(owner, std::move(region), std::move(status),
                         std::move(on_removed));
}

absl::Status SharedMemoryRegistry::BeginRegistration(const std::string& owner) {
  absl::MutexLock lock(&mu_);
  int64_t& held = per_owner_[owner];
  if (held >= limits_.max_regions_per_client) {
    const int64_t count = held;
    if (held == 0) per_owner_.erase(owner);
    return absl::ResourceExhaustedError(absl::StrCat(
        "client ", BoundedForMessage(owner), " already holds ", count,
        " shared-memory regions, the most allowed per client; unregister "
        "some first"));
  }
  ++held;  // a registration under way
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedMemoryRegion>>
SharedMemoryRegistry::EndRegistration(
    const std::string& owner, std::shared_ptr<SharedMemoryRegion> region,
    absl::Status status, OnRemoved on_removed) {
  if (!status.ok()) {
    region.reset();  // unmaps (closes) what was opened, outside the lock
    absl::MutexLock lock(&mu_);
    if (--per_owner_[owner] == 0) per_owner_.erase(owner);
    return status;
  }
  absl::MutexLock lock(&mu_);
  region->sequence_ = next_sequence_++;
  entries_[region->id_] = Entry{region, std::move(on_removed)};
  return region;
}

absl::Status SharedMemoryRegistry::CheckPeer(
    const PeerCredentials& peer) const {
  if (limits_.peers.Allows(peer)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "shared memory: the caller (uid ", peer.uid, ", gid ", peer.gid, ", pid ",
      peer.pid, ") is not allowed; only ", limits_.peers.Describe(),
      " may use it (--shared-memory-peers)"));
}

absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> SharedMemoryRegistry::Find(
    const std::string& owner, const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.region->owner() != owner) {
    return absl::NotFoundError(absl::StrCat(
        "no shared-memory region \"", BoundedForMessage(id),
        "\" registered by this client (never registered, unregistered, or "
        "its register call ended)"));
  }
  return it->second.region;
}

SharedMemoryRegistry::Entry SharedMemoryRegistry::TakeLocked(
    const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return Entry{};
  Entry entry = std::move(it->second);
  entries_.erase(it);
  auto owner = per_owner_.find(entry.region->owner());
  if (owner != per_owner_.end() && --owner->second == 0) {
    per_owner_.erase(owner);
  }
  return entry;
}

absl::Status SharedMemoryRegistry::Unregister(const std::string& owner,
                                              const std::string& id) {
  Entry entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.region->owner() != owner) {
      return absl::NotFoundError(
          absl::StrCat("region_id: no shared-memory region \"",
                       BoundedForMessage(id), "\" registered by this client"));
    }
    entry = TakeLocked(id);
  }
  if (entry.on_removed) std::move(entry.on_removed)(true);
  return absl::OkStatus();
}

void SharedMemoryRegistry::Remove(const std::string& id) {
  Entry entry;
  {
    absl::MutexLock lock(&mu_);
    entry = TakeLocked(id);
  }
  if (entry.on_removed) std::move(entry.on_removed)(false);
}

std::vector<std::shared_ptr<SharedMemoryRegion>> SharedMemoryRegistry::List(
    const std::string& owner) const {
  std::vector<std::shared_ptr<SharedMemoryRegion>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : entries_) {
      if (entry.region->owner() == owner) out.push_back(entry.region);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
    return x->sequence_ < y->sequence_;
  });
  return out;
}

void SharedMemoryRegistry::Clear() {
  std::vector<Entry> taken;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> ids;
    for (const auto& [id, entry] : entries_) ids.push_back(id);
    for (const std::string& id : ids) taken.push_back(TakeLocked(id));
  }
  for (Entry& entry : taken) {
    if (entry.on_removed) std::move(entry.on_removed)(false);
  }
}

int64_t SharedMemoryRegistry::registered() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace matmul
