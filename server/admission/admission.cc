#include "server/admission/admission.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace matmul {
namespace {

// The payload that marks an in-flight-budget refusal and carries its hint.
constexpr absl::string_view kPushbackPayload = "matmul.v1/retry-pushback-ms";

class RealClock final : public AdmissionClock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

const AdmissionClock* AdmissionClock::Real() {
  static const RealClock* const clock = new RealClock;
  return clock;
}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    admission_ = std::exchange(other.admission_, nullptr);
    engine_ = std::exchange(other.engine_, nullptr);
    held_bytes_ = std::exchange(other.held_bytes_, 0);
    reservation_ = std::move(other.reservation_);
    other.reservation_.reset();
  }
  return *this;
}

HandleRegistry::Reservation Lease::TakeReservation() {
  HandleRegistry::Reservation r = std::move(*reservation_);
  reservation_.reset();
  return r;
}

void Lease::Release() {
  reservation_.reset();  // unreserved unless taken
  if (admission_ != nullptr) {
    std::exchange(admission_, nullptr)->Release(held_bytes_);
    held_bytes_ = 0;
  }
}

Admission::Admission(int64_t max_inflight_bytes, HandleRegistry* handles,
                     ServerMetrics* metrics, const AdmissionClock* clock)
    : inflight_bytes_(max_inflight_bytes),
      handles_(handles),
      metrics_(metrics),
      clock_(clock) {}

absl::StatusOr<Engine*> Admission::OpenEngine() {
  if (draining()) {
    return Refuse(RejectReason::kDraining,
                  absl::UnavailableError("the server is shutting down"));
  }
  // Read once: SetEngine may run meanwhile.
  Engine* engine = this->engine();
  if (engine == nullptr) {
    return Refuse(RejectReason::kUnavailable,
                  absl::UnavailableError("the engine is still starting"));
  }
  return engine;
}

absl::Status Admission::CheckOpen() { return OpenEngine().status(); }

absl::StatusOr<Lease> Admission::Admit(const Operation& op) {
  absl::StatusOr<Engine*> open = OpenEngine();
  if (!open.ok()) return open.status();
  Engine* engine = *open;
  if (op.spec != nullptr) {
    // Work that could never fit a device is the request's fault, not load.
    if (absl::Status fits = engine->CheckFits(*op.spec); !fits.ok()) {
      return Refuse(RequestFault(fits), fits);
    }
  }
  if (op.deadline != absl::InfiniteFuture()) {
    const absl::Duration left = op.deadline - clock_->Now();
    if (left <= absl::ZeroDuration()) {
      return Refuse(RejectReason::kDeadline,
                    absl::DeadlineExceededError(
                        "the deadline passed before the request was admitted"));
    }
    if (op.spec != nullptr) {
      const absl::Duration needed = engine->MinimumDuration(*op.spec);
      if (needed > left) {
        return Refuse(
            RejectReason::kDeadline,
            absl::DeadlineExceededError(absl::StrCat(
                "the deadline cannot be met: ", absl::FormatDuration(left),
                " left, and this request needs at least ",
                absl::FormatDuration(needed), " on an idle ",
                engine->info().name, " engine")));
      }
    }
  }
  Lease lease;
  if (op.stored_bytes.has_value()) {
    absl::StatusOr<HandleRegistry::Reservation> reservation =
        handles_->Reserve(op.client, *op.stored_bytes);
    if (!reservation.ok()) {
      return Refuse(RejectReason::kQuota, reservation.status());
    }
    lease.reservation_ = std::move(*reservation);
  }
  const int64_t bytes = std::max<int64_t>(op.held_bytes, 1);
  if (!inflight_bytes_.TryAcquire(bytes)) {
    // Roughly how long the bytes in flight take to drain at a few GB/s.
    const int64_t pushback_ms =
        std::clamp<int64_t>(inflight_bytes_.used() / 4'000'000, 10, 2000);
    absl::Status busy = absl::ResourceExhaustedError(absl::StrCat(
        "server busy: ", inflight_bytes_.used(), " of ",
        inflight_bytes_.limit(), " in-flight bytes are in use and this ",
        op.kind == OperationKind::kStreamMultiply ? "streamed multiply"
                                                  : "request",
        " needs ", bytes, "; retry after ", pushback_ms, " ms"));
    busy.SetPayload(kPushbackPayload, absl::Cord(absl::StrCat(pushback_ms)));
    return Refuse(RejectReason::kOverloaded, std::move(busy));
  }
  inflight_requests_.fetch_add(1, std::memory_order_relaxed);
  lease.admission_ = this;
  lease.engine_ = engine;
  lease.held_bytes_ = bytes;
  return lease;
}

absl::Status Admission::Refuse(RejectReason reason, absl::Status status) {
  metrics_->RecordRejection(reason);
  return status;
}

void Admission::RecordFailure(const absl::Status& status) {
  if (std::optional<RejectReason> reason = RejectionOf(status)) {
    metrics_->RecordRejection(*reason);
  }
}

void Admission::Release(int64_t held_bytes) {
  inflight_bytes_.Release(held_bytes);
  inflight_requests_.fetch_sub(1, std::memory_order_relaxed);
}

std::optional<int64_t> RetryPushbackMs(const absl::Status& status) {
  const auto payload = status.GetPayload(kPushbackPayload);
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms)) {
    return std::nullopt;
  }
  return ms;
}

}  // namespace matmul
