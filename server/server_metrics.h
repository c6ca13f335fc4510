// ServerMetrics: the per-request metrics of the matmul service, recorded on
// the RPC hot path and exported at scrape time:
//
//   matmul_requests_total{method,code}            counter
//   matmul_request_duration_seconds{method}       histogram
//   matmul_stage_duration_seconds{stage}          histogram
//   matmul_rejected_requests_total{reason}        counter
//   matmul_client_gpu_seconds_total{client},
//   matmul_client_bytes_total{client,direction}   counters (ClientUsage)
//   matmul_payload_bytes_total{path,direction}    counter
//   matmul_stream_stripes_total{kind}             counter
//   matmul_shared_memory_regions,
//   matmul_shared_memory_bytes                    gauges
//
// Every label combination (each method with each of the 17 gRPC codes, each
// stage, each reason) exists from construction on, as an array slot indexed
// by enum: recording is an atomic add into a fixed slot, with no lock, no
// allocation and no label lookup. Engine counters and gauges are not here:
// StateCollector reads them from the engine when Prometheus scrapes.
// docs/METRICS.md describes every metric.
#ifndef MATMUL_SERVER_SERVER_METRICS_H_
#define MATMUL_SERVER_SERVER_METRICS_H_

#include <grpcpp/support/status.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gpu/engine.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/atomic_histogram.h"
#include "server/client_usage.h"

namespace matmul {

// The RPCs that are counted (label `method`).
enum class RpcMethod {
  kMultiply,
  kGetServerInfo,
  kUpload,
  kDownload,
  kDelete,
  kMultiplyStream,  // one multiply of a stream, not the whole call
  // Its duration is the registration's setup (to the one response), not
  // the call's life; its code is the call's final one.
  kRegisterSharedMemory,
  kUnregisterSharedMemory,
  kListSharedMemory,
  // As kRegisterSharedMemory.
  kRegisterCudaMemory,
};
inline constexpr int kNumRpcMethods = 10;
absl::string_view RpcMethodName(RpcMethod method);

// Where a Multiply spent its time (label `stage`). queue .. d2h come from the
// engine's StageTimings; reply is from the engine's completion to the end of
// the RPC (response serialized and handed to the transport). enqueue (the
// host's time making the job's device calls, StageTimings::enqueue)
// overlaps h2d and compute.
enum class Stage { kQueue, kStageIn, kH2D, kCompute, kD2H, kReply, kEnqueue };
inline constexpr int kNumStages = 7;
absl::string_view StageName(Stage stage);

// Why a request was answered without a result (label `reason`). The first
// three are the request's own doing; the others the server's state.
enum class RejectReason {
  kInvalid,      // malformed (INVALID_ARGUMENT, NOT_FOUND, ...)
  kTooLarge,     // beyond the limits or any device (RESOURCE_EXHAUSTED)
  kQuota,        // over its client's stored-tensor quota
  kOverloaded,   // in-flight byte budget or engine queue/pool full
  kDeadline,     // deadline passed before the job ran
  kDraining,     // the server is shutting down
  kUnavailable,  // the engine is not ready yet
  kCancelled,    // the client cancelled before the result was ready
  // The engine answered UNAVAILABLE: no healthy device could take the job
  // (failed GPUs), or the engine had stopped. A server fault, apart from
  // the drain's "draining".
  kNoDevice,
};
inline constexpr int kNumRejectReasons = 9;
absl::string_view RejectReasonName(RejectReason reason);

// A request refused for what it is rather than for the server's state:
// kTooLarge when it asks for more than the server can ever give
// (RESOURCE_EXHAUSTED), else kInvalid.
inline RejectReason RequestFault(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted
             ? RejectReason::kTooLarge
             : RejectReason::kInvalid;
}

// The rejection an engine's error amounts to, if any (INTERNAL is a fault,
// not a rejection). Only for errors of the engine: the admission core's own
// UNAVAILABLE refusals are counted as draining or unavailable.
inline std::optional<RejectReason> RejectionOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
      return RejectReason::kOverloaded;
    case absl::StatusCode::kDeadlineExceeded:
      return RejectReason::kDeadline;
    case absl::StatusCode::kCancelled:
      return RejectReason::kCancelled;
    case absl::StatusCode::kUnavailable:
      return RejectReason::kNoDevice;
    default:
      return std::nullopt;
  }
}

// How tensor bytes travel between clients and the server (label `path` of
// matmul_payload_bytes_total): inline in a unary Multiply's messages, in a
// MultiplyStream's chunks, as stored tensors (Upload in, Download out), or
// through a registered shared-memory region (read from it: in; written into
// it: out).
// kCudaMemory: bytes a multiply read from or wrote into a client's GPU
// memory (RegisterCudaMemory), which cross neither the wire nor host memory.
enum class PayloadPath {
  kInline,
  kStream,
  kHandle,
  kSharedMemory,
  kCudaMemory
};
inline constexpr int kNumPayloadPaths = 5;
absl::string_view PayloadPathName(PayloadPath path);
enum class PayloadDirection { kIn, kOut };

// The shared-memory regions mapped now (registered, or unregistered and
// still used by a multiply) and their bytes; kept by the region registry
// (server/shared_memory/region_registry.h), read at scrape time.
struct SharedMemoryGauges {
  std::atomic<int64_t> regions{0};
  std::atomic<int64_t> bytes{0};
};

// gRPC status codes 0..16; the `code` label is the canonical upper-case name
// (OK, INVALID_ARGUMENT, ...).
inline constexpr int kNumStatusCodes = 17;
absl::string_view StatusCodeName(grpc::StatusCode code);

// Bucket bounds, in seconds. Request durations: 50 us .. 60 s; stages start
// at 10 us because one small H2D copy takes a few microseconds.
const std::vector<double>& RequestDurationBuckets();
const std::vector<double>& StageDurationBuckets();

// Thread-safe. Record* are lock-free; Collect takes no lock either and may
// run concurrently with them (client_usage() has a lock of its own).
class ServerMetrics final : public prometheus::Collectable {
 public:
  ServerMetrics();

  // One finished RPC: its final code and its server time (handler start to
  // the end of the call).
  void RecordRequest(RpcMethod method, grpc::StatusCode code, double seconds);

  // The engine stages of one computed Multiply.
  void RecordStages(const StageTimings& timings);
  void RecordStage(Stage stage, double seconds);

  void RecordRejection(RejectReason reason);

  // Tensor bytes moved along `path` (see PayloadPath).
  void RecordPayload(PayloadPath path, PayloadDirection direction,
                     int64_t bytes) {
    payload_bytes_[PayloadIndex(path, direction)].fetch_add(
        static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  }
  uint64_t payload_bytes(PayloadPath path, PayloadDirection direction) const {
    return payload_bytes_[PayloadIndex(path, direction)].load(
        std::memory_order_relaxed);
  }
  // A striped MultiplyStream multiply opened (`join` false), or another
  // call joined one.
  void RecordStripe(bool join) {
    stripes_[join ? 1 : 0].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t stripes(bool join) const {
    return stripes_[join ? 1 : 0].load(std::memory_order_relaxed);
  }
  // Updated by the shared-memory regions themselves (they may outlive
  // their registry while a multiply uses them, hence shared).
  const std::shared_ptr<SharedMemoryGauges>& shared_memory_gauges() const {
    return shared_memory_gauges_;
  }

  // Per-client usage (its own lock; see server/client_usage.h).
  ClientUsage& client_usage() { return client_usage_; }

  // The families above, with every label combination.
  std::vector<prometheus::MetricFamily> Collect() const override;

  // For tests: current values.
  uint64_t requests(RpcMethod method, grpc::StatusCode code) const;
  uint64_t rejections(RejectReason reason) const;

 private:
  static int RequestIndex(RpcMethod method, grpc::StatusCode code);
  static int PayloadIndex(PayloadPath path, PayloadDirection direction) {
    return static_cast<int>(path) * 2 + static_cast<int>(direction);
  }

  std::array<std::atomic<uint64_t>, kNumRpcMethods * kNumStatusCodes>
      requests_{};
  std::array<std::unique_ptr<AtomicHistogram>, kNumRpcMethods> durations_;
  std::array<std::unique_ptr<AtomicHistogram>, kNumStages> stages_;
  std::array<std::atomic<uint64_t>, kNumRejectReasons> rejections_{};
  std::array<std::atomic<uint64_t>, kNumPayloadPaths * 2> payload_bytes_{};
  std::array<std::atomic<uint64_t>, 2> stripes_{};
  const std::shared_ptr<SharedMemoryGauges> shared_memory_gauges_ =
      std::make_shared<SharedMemoryGauges>();
  ClientUsage client_usage_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_SERVER_METRICS_H_
