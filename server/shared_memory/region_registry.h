// SharedMemoryRegistry: the POSIX shared-memory regions same-host clients
// registered (RegisterSharedMemory), by region id. Only peers the
// allow-list admits may register (the server's own user and
// --shared-memory-peers: CheckPeer), and only objects their own uid owns.
// Registering opens the object by name (shm_open, read-write, no symbolic
// link followed), checks its owner on the opened descriptor, maps it
// MAP_SHARED and registers the mapping with the engine
// (pinned with cudaHostRegister on the CUDA engine), so that multiplies read
// their operands from it and write their products into it with no copy on
// the wire and, where both operands are in regions, none into staging.
//
// A region's bytes are charged to its client's stored-bytes quota, through
// the HandleRegistry (per client and in total: RESOURCE_EXHAUSTED), as one
// stored tensor; and a client holds at most max_regions_per_client regions.
// A region is a shared_ptr: a multiply using it holds a reference
// (SharedMemoryRegion::Use), so a region unregistered (or whose register call
// ended) while a multiply uses it leaves the registry at once but is
// unpinned, unmapped and uncharged only when that multiply is done.
//
// Region ids are "shm-" and 128 bits from the kernel's cryptographic
// generator (common/capability_id.h), and only the client that registered a
// region (ClientKey) may use, list or unregister it: another client's id is
// NOT_FOUND, as an unknown one.
//
// Thread-safe. Clear() (or destruction) must happen before the engine that
// registered the memory is destroyed, and after every job using it is done.
#ifndef MATMUL_SERVER_SHARED_MEMORY_REGION_REGISTRY_H_
#define MATMUL_SERVER_SHARED_MEMORY_REGION_REGISTRY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/engine.h"
#include "server/handle_registry.h"
#include "server/peer_credentials.h"
#include "server/server_metrics.h"

namespace matmul {

struct SharedMemoryLimits {
  // Regions one client may hold at once (RESOURCE_EXHAUSTED past it).
  int64_t max_regions_per_client = 64;
  // Peers allowed besides the server's own user.
  PeerAllowList peers;
};

// The longest name accepted, leading slash included (NAME_MAX).
inline constexpr size_t kMaxSharedMemoryNameBytes = 255;

// One registered region: a mapped POSIX shared-memory object (kSystem) or
// a client's GPU memory opened through its CUDA IPC handle (kCuda).
// Immutable but for the in-flight count; thread-safe.
class SharedMemoryRegion {
 public:
  enum class Kind { kSystem, kCuda };

  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& id() const { return id_; }
  const std::string& name() const { return name_; }
  const std::string& owner() const { return owner_; }
  int64_t bytes() const { return bytes_; }
  bool pinned() const { return registration_.pinned(); }
  Kind kind() const { return kind_; }
  // The mapping (kSystem); null for a kCuda region.
  std::byte* data() const { return data_; }
  // The engine memory of a kCuda region (raw: seen through ResidentViews),
  // on its GPU; null for a kSystem region.
  const std::shared_ptr<ResidentTensor>& device_memory() const {
    return device_memory_;
  }
  // kCuda: the GPU's UUID as nvidia-smi spells it; empty otherwise.
  const std::string& device_uuid() const { return device_uuid_; }
  int64_t multiplies_in_flight() const {
    return in_flight_.load(std::memory_order_relaxed);
  }

  // FAILED_PRECONDITION if the object has been truncated below the region
  // since it was registered (touching the lost pages would fault). The
  // client could still shrink it later: see docs/SECURITY.md.
  absl::Status CheckStillMapped() const;

  // A multiply's hold on a region: keeps it mapped and counts the multiply
  // in multiplies_in_flight until destroyed. Move-only.
  class Use {
   public:
    Use() = default;
    explicit Use(std::shared_ptr<SharedMemoryRegion> region);
    Use(Use&& other) noexcept = default;
    Use& operator=(Use&& other) noexcept;
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ~Use() { Reset(); }

    SharedMemoryRegion* get() const { return region_.get(); }
    explicit operator bool() const { return region_ != nullptr; }
    void Reset();

   private:
    std::shared_ptr<SharedMemoryRegion> region_;
  };

 private:
  friend class SharedMemoryRegistry;
  SharedMemoryRegion() = default;

  std::string id_;
  Kind kind_ = Kind::kSystem;
  std::string name_;
  std::shared_ptr<ResidentTensor> device_memory_;
  std::string device_uuid_;
  std::string owner_;
  int fd_ = -1;
  std::byte* data_ = nullptr;
  int64_t bytes_ = 0;
  uint64_t sequence_ = 0;  // registration order, for listing
  HostMemoryRegistration registration_;
  HandleRegistry::Reservation reservation_;
  std::shared_ptr<SharedMemoryGauges> gauges_;
  std::atomic<int64_t> in_flight_{0};
};

class SharedMemoryRegistry {
 public:
  // Called once when a region leaves the registry: `unregistered` is true
  // for UnregisterSharedMemory, false when its register call ended (Remove)
  // or the server is clearing (Clear).
  using OnRemoved = absl::AnyInvocable<void(bool unregistered) &&>;

  // `handles` (for the quota) must outlive the registry and every region.
  // Mapped regions are counted in `gauges` (ServerMetrics's).
  SharedMemoryRegistry(HandleRegistry* handles,
                       const SharedMemoryLimits& limits,
                       std::shared_ptr<SharedMemoryGauges> gauges);
  ~SharedMemoryRegistry() { Clear(); }
  SharedMemoryRegistry(const SharedMemoryRegistry&) = delete;
  SharedMemoryRegistry& operator=(const SharedMemoryRegistry&) = delete;

  // OK for a peer the allow-list admits (limits.peers and the server's own
  // user); PERMISSION_DENIED naming its uid and who is allowed otherwise.
  absl::Status CheckPeer(const PeerCredentials& peer) const;

  // Opens `name`, maps its first `bytes` and registers them with `engine`,
  // for `owner`, whose connection has `peer`'s credentials. INVALID_ARGUMENT
  // for a bad name (not one leading slash and no other, empty, or longer
  // than kMaxSharedMemoryNameBytes), bytes <= 0 or an object smaller than
  // `bytes`; NOT_FOUND when no such object exists; PERMISSION_DENIED for a
  // peer CheckPeer refuses, an object that is a symbolic link, one another
  // uid than the peer's owns, or one the server may not open;
  // RESOURCE_EXHAUSTED past the client's region count or the stored-bytes
  // quotas; the engine's error if it cannot register the memory.
  // `on_removed` is called once, outside the registry's lock, when the
  // region leaves the registry (never if this fails).
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> Register(
      const std::string& owner, const PeerCredentials& peer,
      const std::string& name, int64_t bytes, Engine& engine,
      OnRemoved on_removed);

  // Registers `bytes` of a client's GPU memory, from the allocation that
  // `ipc_handle` (a CUDA IPC handle) names, on the GPU whose 16-byte UUID is
  // `device_uuid`: the engine opens it (Engine::ImportDeviceMemory) and
  // keeps it open until the region goes and no multiply uses it. Region ids
  // are "cuda-" and 128 random bits. PERMISSION_DENIED for a peer CheckPeer
  // refuses; INVALID_ARGUMENT for bytes <= 0; RESOURCE_EXHAUSTED past the
  // client's region count or the stored-bytes quotas (checked before the
  // handle is opened); the engine's error otherwise (FAILED_PRECONDITION on
  // the host engine, for a GPU the server does not use, or a handle that
  // does not open). `on_removed` as Register's.
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> RegisterCuda(
      const std::string& owner, const PeerCredentials& peer,
      const std::string& ipc_handle, int64_t bytes,
      const std::string& device_uuid, Engine& engine, OnRemoved on_removed);

  // `owner`'s region `id`; NOT_FOUND for an unknown id or another client's.
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> Find(
      const std::string& owner, const std::string& id) const;

  // Removes `owner`'s region `id` (its on_removed gets true); NOT_FOUND as
  // Find. The mapping goes when the last multiply using it is done.
  absl::Status Unregister(const std::string& owner, const std::string& id);

  // Removes region `id` whoever owns it (its register call ended); no-op if
  // it is gone already.
  void Remove(const std::string& id);

  // `owner`'s regions, oldest first.
  std::vector<std::shared_ptr<SharedMemoryRegion>> List(
      const std::string& owner) const;

  // Removes every region (shutdown).
  void Clear();

  // Registered regions (not counting unregistered ones still in use).
  int64_t registered() const;
  const SharedMemoryGauges& gauges() const { return *gauges_; }

 private:
  struct Entry {
    std::shared_ptr<SharedMemoryRegion> region;
    OnRemoved on_removed;
  };
  // Counts a registration under way against `owner`'s region limit;
  // RESOURCE_EXHAUSTED past it.
  absl::Status BeginRegistration(const std::string& owner);
  // Ends a registration begun with BeginRegistration: adds `region` to the
  // registry, or, if `status` is not OK, drops it and uncounts it.
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> EndRegistration(
      const std::string& owner, std::shared_ptr<SharedMemoryRegion> region,
      absl::Status status, OnRemoved on_removed);
  // Removes `id` and hands back its entry (empty region if none).
  Entry TakeLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  HandleRegistry* const handles_;
  const SharedMemoryLimits limits_;
  const std::shared_ptr<SharedMemoryGauges> gauges_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Regions per owner: registered, plus registrations under way.
  absl::flat_hash_map<std::string, int64_t> per_owner_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_SHARED_MEMORY_REGION_REGISTRY_H_
