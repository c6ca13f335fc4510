// Admission: the one gate that every RPC's work passes, with no gRPC in it.
//
// An adapter (unary Multiply, a multiply inside a MultiplyStream, Upload,
// Download) validates its request into an engine spec, then describes the
// work as an Operation (what it is, the server memory it will hold, the
// bytes it will store, whose it is, its deadline) and asks Admit for a Lease.
// Admit refuses, with the exact code and a bounded message, and counts the
// refusal in matmul_rejected_requests_total:
//
//   draining             UNAVAILABLE          reason "draining"
//   engine not ready     UNAVAILABLE          reason "unavailable"
//   never fits a device  RESOURCE_EXHAUSTED   reason "too_large" (the
//                        (the engine's code;  request's fault, not load:
//                        else "invalid")      RequestFault)
//   deadline passed, or  DEADLINE_EXCEEDED    reason "deadline"
//   nearer than the
//   engine's lower bound
//   stored-tensor quota  RESOURCE_EXHAUSTED   reason "quota"
//   in-flight budget     RESOURCE_EXHAUSTED   reason "overloaded", with a
//                                             retry hint (RetryPushbackMs)
//
// in that order. A Lease holds the operation's in-flight bytes, one
// in-flight request and its quota reservation until it is destroyed (or
// until the reservation is taken to store the tensor): RAII, movable, not
// copyable.
//
// The in-flight budget (--max-inflight-bytes) bounds the server memory that
// admitted work holds: a unary Multiply holds its inline operands (in gRPC's
// buffers) and its product (in staging) until answered; a multiply inside a
// MultiplyStream is charged up front, at its start, from its declared
// shapes, with the most the stream can hold for it: its chunked operand
// bytes up to the stream's chunk window, plus its product up to the
// stream's result-chunk window (StreamMultiplyHeldBytes). That bound is
// never below what the multiply really holds, and it is known before any
// chunk arrives, so a streamed multiply is refused at once, exactly as a
// unary one, rather than half-way through its operands.
//
// Thread-safe: Admit, the Lease destructor and the metrics calls may run
// on any thread at once.
#ifndef MATMUL_SERVER_ADMISSION_ADMISSION_H_
#define MATMUL_SERVER_ADMISSION_ADMISSION_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gpu/engine.h"
#include "server/admission/inflight_bytes.h"
#include "server/handle_registry.h"
#include "server/server_metrics.h"

namespace matmul {

// The time Admit compares deadlines with. Tests inject their own.
class AdmissionClock {
 public:
  virtual ~AdmissionClock() = default;
  virtual absl::Time Now() const = 0;
  // absl::Now(); lives forever.
  static const AdmissionClock* Real();
};

enum class OperationKind { kMultiply, kStreamMultiply, kUpload, kDownload };

// A typed description of one piece of work to admit.
struct Operation {
  OperationKind kind = OperationKind::kMultiply;
  // The engine work, for the device-fit check and the deadline's lower
  // bound; null for work that has none to check.
  const MatmulSpec* spec = nullptr;
  // Server memory the operation holds from admission until its Lease goes.
  int64_t held_bytes = 0;
  // A tensor it will store (Upload, keep_result), charged to `client`'s
  // quota; nullopt when it stores nothing.
  std::optional<int64_t> stored_bytes;
  // Whose it is: the quota's key.
  std::string client;
  absl::Time deadline = absl::InfiniteFuture();
};

class Admission;

// What an admitted operation holds. Move-only; releases on destruction.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept { *this = std::move(other); }
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() { Release(); }

  // The engine to submit to (null for an empty lease).
  Engine* engine() const { return engine_; }
  int64_t held_bytes() const { return held_bytes_; }
  bool has_reservation() const { return reservation_.has_value(); }
  // The quota reservation, for HandleRegistry::Add; the lease keeps the
  // in-flight bytes.
  HandleRegistry::Reservation TakeReservation();
  // Gives everything back now (the destructor does the same).
  void Release();

 private:
  friend class Admission;
  Admission* admission_ = nullptr;
  Engine* engine_ = nullptr;
  int64_t held_bytes_ = 0;
  std::optional<HandleRegistry::Reservation> reservation_;
};

class Admission {
 public:
  // `handles` and `metrics` must outlive the Admission and every Lease.
  Admission(int64_t max_inflight_bytes, HandleRegistry* handles,
            ServerMetrics* metrics,
            const AdmissionClock* clock = AdmissionClock::Real());
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Installs the engine once it is ready; until then Admit answers
  // UNAVAILABLE. Null uninstalls it.
  void SetEngine(Engine* engine) {
    engine_.store(engine, std::memory_order_release);
  }
  Engine* engine() const { return engine_.load(std::memory_order_acquire); }

  // From now on Admit answers UNAVAILABLE: the server is going away.
  void StartDraining() { draining_.store(true, std::memory_order_relaxed); }
  bool draining() const { return draining_.load(std::memory_order_relaxed); }

  // A Lease for `op`, or the refusal (counted; see the table above).
  absl::StatusOr<Lease> Admit(const Operation& op);

  // The first two checks of Admit alone (draining, engine not ready), for
  // an adapter to refuse before it spends time decoding a request; the
  // refusal is counted. Admit checks them again.
  absl::Status CheckOpen();

  // A refusal that the adapter found before admission (a malformed request,
  // a handle that is gone): counted under `reason`, returned unchanged.
  absl::Status Refuse(RejectReason reason, absl::Status status);
  // An engine failure of admitted work: counted as the rejection it amounts
  // to (RejectionOf), if any.
  void RecordFailure(const absl::Status& status);
  void RecordRejection(RejectReason reason) {
    metrics_->RecordRejection(reason);
  }

  // Admitted and not yet released.
  int64_t inflight_requests() const {
    return inflight_requests_.load(std::memory_order_relaxed);
  }
  const InflightBytes& inflight_bytes() const { return inflight_bytes_; }

  ServerMetrics& metrics() const { return *metrics_; }
  const AdmissionClock& clock() const { return *clock_; }

 private:
  friend class Lease;
  // Draining and engine readiness: the engine, or the counted refusal.
  absl::StatusOr<Engine*> OpenEngine();
  void Release(int64_t held_bytes);

  InflightBytes inflight_bytes_;
  HandleRegistry* const handles_;
  ServerMetrics* const metrics_;
  const AdmissionClock* const clock_;
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> inflight_requests_{0};
};

// The retry hint of an in-flight-budget refusal (milliseconds), if `status`
// is one; adapters send it as grpc-retry-pushback-ms.
std::optional<int64_t> RetryPushbackMs(const absl::Status& status);

}  // namespace matmul

#endif  // MATMUL_SERVER_ADMISSION_ADMISSION_H_
