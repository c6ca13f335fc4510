// HandleRegistry: the tensors clients keep on the server (Upload, and
// products kept with keep_result), by handle id. Each entry holds a
// ResidentTensor, the client it is charged to, and an expiry; a sweeper
// thread frees expired entries. Quotas per client bound the bytes and the
// number of entries. Handle ids carry 128 bits from the kernel's
// cryptographic generator (common/capability_id.h): whoever holds an id may
// use or delete it (capability semantics); quota is charged to the creator.
// With a home set (SetHome: the address the server advertises) they name it
// and the tensor's device ahead of the random part, "h1.ADDRESS.DEVICE.HEX"
// (common/handle_id.h), so that clients find this server; without one they
// are "h-HEX".
//
// Thread-safe. Clear() (or destruction) must happen before the engine that
// made the tensors is destroyed.
#ifndef MATMUL_SERVER_HANDLE_REGISTRY_H_
#define MATMUL_SERVER_HANDLE_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/engine.h"
#include "server/peer_credentials.h"

namespace matmul {

struct HandleLimits {
  int64_t max_bytes_per_client = int64_t{64} << 30;
  // Bytes of stored tensors for all clients together (client ids are
  // self-declared, so the per-client quota alone bounds nothing). 0: set
  // when the engine is known (SetDefaultTotalBytes), from its memory. The
  // per-client quota in effect never exceeds it.
  int64_t max_bytes_total = 0;
  int64_t max_handles_per_client = 4096;
  // Shared-memory regions one client may hold registered at once
  // (server/shared_memory/region_registry.h); their bytes count against the
  // byte quotas above, and each as one stored tensor.
  int64_t max_shared_memory_regions_per_client = 64;
  // Who may use shared memory besides the server's own user
  // (--shared-memory-peers; see server/peer_credentials.h).
  PeerAllowList shared_memory_peers;
  absl::Duration default_ttl = absl::Minutes(10);
  absl::Duration max_ttl = absl::Hours(24);
};

class HandleRegistry {
 public:
  struct Entry {
    std::string id;
    std::string owner;
    std::shared_ptr<ResidentTensor> tensor;
    std::vector<int64_t> shape;  // as the API shows it: 2-D or 3-D
    absl::Time expires;
  };

  // Quota held for a tensor being made; returned unless Add consumes it.
  // Move-only.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept { *this = std::move(other); }
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();

   private:
    friend class HandleRegistry;
    HandleRegistry* registry_ = nullptr;
    std::string id_;  // the entry's id, drawn by Reserve
    std::string owner_;
    int64_t bytes_ = 0;
  };

  explicit HandleRegistry(const HandleLimits& limits,
                          absl::Duration sweep_period = absl::Seconds(1));
  ~HandleRegistry();
  HandleRegistry(const HandleRegistry&) = delete;
  HandleRegistry& operator=(const HandleRegistry&) = delete;

  // The limits in effect: max_bytes_total as set (or its default), and
  // max_bytes_per_client no larger than it.
  HandleLimits limits() const;

  // The total when the limits gave none (0 there): `bytes` (at least 1).
  // Called once the engine's memory is known, before any Reserve.
  void SetDefaultTotalBytes(int64_t bytes);

  // The address handle ids name from now on (CheckAdvertiseAddress must
  // pass); empty: none ("h-" ids). Set once the server knows it, before any
  // Add.
  void SetHome(std::string address);
  std::string home() const;

  // Charges `bytes` and one handle to `owner`; RESOURCE_EXHAUSTED, with the
  // numbers and the limit's flag, when that would exceed the client's
  // quota or the server's total; UNAVAILABLE if the kernel gives no random
  // bits for the id.
  absl::StatusOr<Reservation> Reserve(const std::string& owner, int64_t bytes);

  // The lifetime a request asked for (0: the default); INVALID_ARGUMENT if
  // negative or over the maximum.
  absl::StatusOr<absl::Duration> Ttl(int64_t requested_seconds) const;

  // Stores `tensor` under the reservation's id, with the home and the
  // tensor's device in front when a home is set, consuming the reservation.
  Entry Add(Reservation reservation, std::shared_ptr<ResidentTensor> tensor,
            std::vector<int64_t> shape, absl::Duration ttl);

  // NOT_FOUND for an unknown, deleted or expired id.
  absl::StatusOr<Entry> Get(const std::string& id) const;
  absl::Status Delete(const std::string& id);

  // Frees every entry (shutdown).
  void Clear();

  int64_t stored_bytes() const;
  int64_t stored_handles() const;

 private:
  struct Usage {
    int64_t bytes = 0;
    int64_t handles = 0;
  };
  void Unreserve(const std::string& owner, int64_t bytes);
  void SweepLoop(absl::Duration period);
  // Removes `id`; the tensor is released by the caller, outside the lock.
  std::shared_ptr<ResidentTensor> EraseLocked(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // As given; max_bytes_total there may be 0 (see max_bytes_total_).
  const HandleLimits limits_;
  mutable absl::Mutex mu_;
  // The total in effect: the given one, or the default once it is set.
  int64_t max_bytes_total_ ABSL_GUARDED_BY(mu_);
  // SetHome's address; empty: none.
  std::string home_ ABSL_GUARDED_BY(mu_);
  // Reserved or stored, all clients (the sum of usage_'s bytes).
  int64_t charged_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Usage> usage_ ABSL_GUARDED_BY(mu_);
  int64_t stored_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar stop_cv_;
  std::thread sweeper_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_HANDLE_REGISTRY_H_
