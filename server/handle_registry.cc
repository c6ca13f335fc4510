#include "server/handle_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bounded_text.h"
#include "common/capability_id.h"
#include "common/handle_id.h"

namespace matmul {

HandleRegistry::Reservation& HandleRegistry::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    if (registry_ != nullptr) registry_->Unreserve(owner_, bytes_);
    registry_ = std::exchange(other.registry_, nullptr);
    id_ = std::move(other.id_);
    owner_ = std::move(other.owner_);
    bytes_ = other.bytes_;
  }
  return *this;
}

HandleRegistry::Reservation::~Reservation() {
  if (registry_ != nullptr) registry_->Unreserve(owner_, bytes_);
}

HandleRegistry::HandleRegistry(const HandleLimits& limits,
                               absl::Duration sweep_period)
    : limits_(limits), max_bytes_total_(limits.max_bytes_total) {
  sweeper_ = std::thread([this, sweep_period] { SweepLoop(sweep_period); });
}

HandleRegistry::~HandleRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_cv_.Signal();
  }
  sweeper_.join();
  Clear();
}

HandleLimits HandleRegistry::limits() const {
  HandleLimits limits = limits_;
  absl::MutexLock lock(&mu_);
  limits.max_bytes_total = max_bytes_total_;
  if (limits.max_bytes_total > 0) {
    limits.max_bytes_per_client =
        std::min(limits.max_bytes_per_client, limits.max_bytes_total);
  }
  return limits;
}

void HandleRegistry::SetDefaultTotalBytes(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (max_bytes_total_ <= 0) max_bytes_total_ = std::max<int64_t>(bytes, 1);
}

void HandleRegistry::SetHome(std::string address) {
  absl::MutexLock lock(&mu_);
  home_ = std::move(address);
}

std::string HandleRegistry::home() const {
  absl::MutexLock lock(&mu_);
  return home_;
}

absl::StatusOr<HandleRegistry::Reservation> HandleRegistry::Reserve(
    const std::string& owner, int64_t bytes) {
  // Drawn before the quota is charged, outside the lock: a failure here
  // charges nothing.
  absl::StatusOr<std::string> id = NewCapabilityId(kHandleIdNoHomePrefix);
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  const auto existing = usage_.find(owner);
  const Usage usage = existing == usage_.end() ? Usage{} : existing->second;
  if (usage.handles + 1 > limits_.max_handles_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "client ", BoundedForMessage(owner), " already holds ", usage.handles,
        " stored tensors, the most allowed per client "
        "(--max-handles-per-client); delete some first"));
  }
  if (bytes > limits_.max_bytes_per_client - usage.bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "client ", BoundedForMessage(owner), " holds ", usage.bytes,
        " bytes in stored tensors; this one needs ", bytes,
        " more, over the limit of ", limits_.max_bytes_per_client,
        " bytes per client (--max-stored-bytes-per-client); delete some "
        "first"));
  }
  if (max_bytes_total_ > 0 && bytes > max_bytes_total_ - charged_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server holds ", charged_bytes_,
        " bytes in stored tensors for all clients; this one needs ", bytes,
        " more, over the server's limit of ", max_bytes_total_,
        " bytes (--max-stored-bytes); retry after tensors are deleted or "
        "expire"));
  }
  Usage& charged = usage_[owner];
  charged.bytes += bytes;
  charged.handles += 1;
  charged_bytes_ += bytes;
  Reservation r;
  r.registry_ = this;
  r.id_ = std::move(*id);
  r.owner_ = owner;
  r.bytes_ = bytes;
  return r;
}

void HandleRegistry::Unreserve(const std::string& owner, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(owner);
  if (it == usage_.end()) return;
  it->second.bytes -= bytes;
  it->second.handles -= 1;
  charged_bytes_ -= bytes;
  if (it->second.handles == 0) usage_.erase(it);
}

absl::StatusOr<absl::Duration> HandleRegistry::Ttl(
    int64_t requested_seconds) const {
  if (requested_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ttl: expected 0 (the default) or a positive number of seconds, got ",
        requested_seconds));
  }
  if (requested_seconds == 0) return limits_.default_ttl;
  const absl::Duration ttl = absl::Seconds(requested_seconds);
  if (ttl > limits_.max_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ttl: ", requested_seconds, " s is over the server's maximum of ",
        absl::ToInt64Seconds(limits_.max_ttl), " s"));
  }
  return ttl;
}

HandleRegistry::Entry HandleRegistry::Add(
    Reservation reservation, std::shared_ptr<ResidentTensor> tensor,
    std::vector<int64_t> shape, absl::Duration ttl) {
  Entry entry;
  entry.id = std::move(reservation.id_);
  entry.owner = reservation.owner_;
  entry.tensor = std::move(tensor);
  entry.shape = std::move(shape);
  entry.expires = absl::Now() + ttl;
  // The reservation's charge now belongs to the entry.
  reservation.registry_ = nullptr;
  absl::MutexLock lock(&mu_);
  if (!home_.empty()) {
    // The random part stays as drawn; the home goes in front.
    entry.id = ComposeHandleId(
        home_, entry.tensor->device(),
        absl::string_view(entry.id).substr(sizeof(kHandleIdNoHomePrefix) - 1));
  }
  stored_bytes_ += entry.tensor->bytes();
  // The reserved byte count and the tensor's size are the same number: the
  // caller reserved tensor bytes.
  entries_[entry.id] = entry;
  return entry;
}

absl::StatusOr<HandleRegistry::Entry> HandleRegistry::Get(
    const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.expires <= absl::Now()) {
    return absl::NotFoundError(
        absl::StrCat("no stored tensor \"", BoundedForMessage(id),
                     "\" (never existed, deleted or expired)"));
  }
  return it->second;
}

std::shared_ptr<ResidentTensor> HandleRegistry::EraseLocked(
    const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  std::shared_ptr<ResidentTensor> tensor = std::move(it->second.tensor);
  const int64_t bytes = tensor->bytes();
  stored_bytes_ -= bytes;
  auto usage = usage_.find(it->second.owner);
  if (usage != usage_.end()) {
    usage->second.bytes -= bytes;
    usage->second.handles -= 1;
    charged_bytes_ -= bytes;
    if (usage->second.handles == 0) usage_.erase(usage);
  }
  entries_.erase(it);
  return tensor;
}

absl::Status HandleRegistry::Delete(const std::string& id) {
  std::shared_ptr<ResidentTensor> freed;
  {
    absl::MutexLock lock(&mu_);
    freed = EraseLocked(id);
  }
  if (freed == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no stored tensor \"", BoundedForMessage(id),
                     "\" (never existed, deleted or expired)"));
  }
  return absl::OkStatus();
}

void HandleRegistry::Clear() {
  std::vector<std::shared_ptr<ResidentTensor>> freed;
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, entry] : entries_) ids.push_back(id);
  for (const std::string& id : ids) freed.push_back(EraseLocked(id));
  // `freed` goes after the lock is released (declared before it).
}

void HandleRegistry::SweepLoop(absl::Duration period) {
  while (true) {
    std::vector<std::shared_ptr<ResidentTensor>> freed;
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_) stop_cv_.WaitWithTimeout(&mu_, period);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      std::vector<std::string> expired;
      for (const auto& [id, entry] : entries_) {
        if (entry.expires <= now) expired.push_back(id);
      }
      for (const std::string& id : expired) freed.push_back(EraseLocked(id));
    }
  }
}

int64_t HandleRegistry::stored_bytes() const {
  absl::MutexLock lock(&mu_);
  return stored_bytes_;
}

int64_t HandleRegistry::stored_handles() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace matmul
