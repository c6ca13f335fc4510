#include "server/server_metrics.h"

#include <string>
#include <utility>

namespace matmul {
namespace {

prometheus::MetricFamily Family(std::string name, std::string help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

prometheus::ClientMetric WithLabels(
    std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  return metric;
}

// matmul_requests_total: finished RPCs by method and status code.
prometheus::MetricFamily RequestsFamily(const ServerMetrics& metrics) {
  prometheus::MetricFamily requests =
      Family("matmul_requests_total",
             "Finished RPCs of matmul.v1.MatmulService by method and gRPC "
             "status code.",
             prometheus::MetricType::Counter);
  for (int m = 0; m < kNumRpcMethods; ++m) {
    const std::string method(RpcMethodName(static_cast<RpcMethod>(m)));
    for (int c = 0; c < kNumStatusCodes; ++c) {
      const auto code = static_cast<grpc::StatusCode>(c);
      prometheus::ClientMetric metric = WithLabels(
          {{"code", std::string(StatusCodeName(code))}, {"method", method}});
      metric.counter.value = static_cast<double>(
          metrics.requests(static_cast<RpcMethod>(m), code));
      requests.metric.push_back(std::move(metric));
    }
  }
  return requests;
}

// matmul_rejected_requests_total: Multiply requests refused, by reason.
prometheus::MetricFamily RejectedFamily(const ServerMetrics& metrics) {
  prometheus::MetricFamily rejected =
      Family("matmul_rejected_requests_total",
             "Multiply requests answered without a result, by reason.",
             prometheus::MetricType::Counter);
  for (int r = 0; r < kNumRejectReasons; ++r) {
    prometheus::ClientMetric metric = WithLabels(
        {{"reason",
          std::string(RejectReasonName(static_cast<RejectReason>(r)))}});
    metric.counter.value =
        static_cast<double>(metrics.rejections(static_cast<RejectReason>(r)));
    rejected.metric.push_back(std::move(metric));
  }
  return rejected;
}

// matmul_payload_bytes_total: tensor bytes by path and direction.
prometheus::MetricFamily PayloadFamily(const ServerMetrics& metrics) {
  prometheus::MetricFamily payload = Family(
      "matmul_payload_bytes_total",
      "Tensor bytes moved between clients and the server, by path (inline: "
      "unary Multiply messages; stream: MultiplyStream chunks; handle: "
      "Upload and Download; shared_memory: read from or written into "
      "registered regions) and direction (in: to the server).",
      prometheus::MetricType::Counter);
  for (int p = 0; p < kNumPayloadPaths; ++p) {
    for (int d = 0; d < 2; ++d) {
      const auto path = static_cast<PayloadPath>(p);
      const auto direction = static_cast<PayloadDirection>(d);
      prometheus::ClientMetric metric =
          WithLabels({{"direction", d == 0 ? "in" : "out"},
                      {"path", std::string(PayloadPathName(path))}});
      metric.counter.value =
          static_cast<double>(metrics.payload_bytes(path, direction));
      payload.metric.push_back(std::move(metric));
    }
  }
  return payload;
}

// matmul_stream_stripes_total: striped multiplies opened and joined.
prometheus::MetricFamily StripesFamily(const ServerMetrics& metrics) {
  prometheus::MetricFamily stripes = Family(
      "matmul_stream_stripes_total",
      "Striped MultiplyStream multiplies opened (kind=start), and the calls "
      "that joined them (kind=join).",
      prometheus::MetricType::Counter);
  for (const bool join : {false, true}) {
    prometheus::ClientMetric metric =
        WithLabels({{"kind", join ? "join" : "start"}});
    metric.counter.value = static_cast<double>(metrics.stripes(join));
    stripes.metric.push_back(std::move(metric));
  }
  return stripes;
}

// The shared-memory regions mapped now: their count and their bytes.
void AddSharedMemoryFamilies(const SharedMemoryGauges& gauges,
                             std::vector<prometheus::MetricFamily>& out) {
  prometheus::MetricFamily regions = Family(
      "matmul_shared_memory_regions",
      "Shared-memory regions mapped now: registered, or unregistered and "
      "still used by a multiply.",
      prometheus::MetricType::Gauge);
  prometheus::ClientMetric region_count;
  region_count.gauge.value =
      static_cast<double>(gauges.regions.load(std::memory_order_relaxed));
  regions.metric.push_back(std::move(region_count));
  out.push_back(std::move(regions));
  prometheus::MetricFamily region_bytes =
      Family("matmul_shared_memory_bytes",
             "Bytes of the shared-memory regions mapped now (pinned on the "
             "CUDA engine).",
             prometheus::MetricType::Gauge);
  prometheus::ClientMetric region_byte_count;
  region_byte_count.gauge.value =
      static_cast<double>(gauges.bytes.load(std::memory_order_relaxed));
  region_bytes.metric.push_back(std::move(region_byte_count));
  out.push_back(std::move(region_bytes));
}

}  // namespace

absl::string_view RpcMethodName(RpcMethod method) {
  switch (method) {
    case RpcMethod::kMultiply:
      return "Multiply";
    case RpcMethod::kGetServerInfo:
      return "GetServerInfo";
    case RpcMethod::kUpload:
      return "Upload";
    case RpcMethod::kDownload:
      return "Download";
    case RpcMethod::kDelete:
      return "Delete";
    case RpcMethod::kMultiplyStream:
      return "MultiplyStream";
    case RpcMethod::kRegisterSharedMemory:
      return "RegisterSharedMemory";
    case RpcMethod::kUnregisterSharedMemory:
      return "UnregisterSharedMemory";
    case RpcMethod::kListSharedMemory:
      return "ListSharedMemory";
    case RpcMethod::kRegisterCudaMemory:
      return "RegisterCudaMemory";
  }
  return "unknown";
}

absl::string_view PayloadPathName(PayloadPath path) {
  switch (path) {
    case PayloadPath::kInline:
      return "inline";
    case PayloadPath::kStream:
      return "stream";
    case PayloadPath::kHandle:
      return "handle";
    case PayloadPath::kSharedMemory:
      return "shared_memory";
    case PayloadPath::kCudaMemory:
      return "cuda_memory";
  }
  return "unknown";
}

absl::string_view StageName(Stage stage) {
  switch (stage) {
    case Stage::kQueue:
      return "queue";
    case Stage::kStageIn:
      return "stage_in";
    case Stage::kH2D:
      return "h2d";
    case Stage::kCompute:
      return "compute";
    case Stage::kD2H:
      return "d2h";
    case Stage::kReply:
      return "reply";
    case Stage::kEnqueue:
      return "enqueue";
  }
  return "unknown";
}

absl::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kInvalid:
      return "invalid";
    case RejectReason::kTooLarge:
      return "too_large";
    case RejectReason::kQuota:
      return "quota";
    case RejectReason::kOverloaded:
      return "overloaded";
    case RejectReason::kDeadline:
      return "deadline";
    case RejectReason::kDraining:
      return "draining";
    case RejectReason::kUnavailable:
      return "unavailable";
    case RejectReason::kCancelled:
      return "cancelled";
    case RejectReason::kNoDevice:
      return "no_device";
  }
  return "unknown";
}

absl::string_view StatusCodeName(grpc::StatusCode code) {
  static constexpr absl::string_view kNames[kNumStatusCodes] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  return index >= 0 && index < kNumStatusCodes ? kNames[index] : "UNKNOWN";
}

const std::vector<double>& RequestDurationBuckets() {
  static const std::vector<double>* const kBuckets = new std::vector<double>{
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
      0.1,   0.25,   0.5,    1,      2.5,  5,      10,   20,    30,    60};
  return *kBuckets;
}

const std::vector<double>& StageDurationBuckets() {
  static const std::vector<double>* const kBuckets = new std::vector<double>{
      10e-6,  25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3,
      2.5e-3, 5e-3,  10e-3, 25e-3,  50e-3,  0.1,    0.25,
      0.5,    1,     2.5,   5,      10,     30,     60};
  return *kBuckets;
}

ServerMetrics::ServerMetrics() {
  for (auto& h : durations_) {
    h = std::make_unique<AtomicHistogram>(RequestDurationBuckets());
  }
  for (auto& h : stages_) {
    h = std::make_unique<AtomicHistogram>(StageDurationBuckets());
  }
}

int ServerMetrics::RequestIndex(RpcMethod method, grpc::StatusCode code) {
  int c = static_cast<int>(code);
  if (c < 0 || c >= kNumStatusCodes) c = grpc::StatusCode::UNKNOWN;
  return static_cast<int>(method) * kNumStatusCodes + c;
}

void ServerMetrics::RecordRequest(RpcMethod method, grpc::StatusCode code,
                                  double seconds) {
  requests_[RequestIndex(method, code)].fetch_add(1, std::memory_order_relaxed);
  durations_[static_cast<int>(method)]->Observe(seconds);
}

void ServerMetrics::RecordStages(const StageTimings& timings) {
  RecordStage(Stage::kQueue, timings.queue);
  RecordStage(Stage::kStageIn, timings.stage_in);
  RecordStage(Stage::kH2D, timings.h2d);
  RecordStage(Stage::kCompute, timings.compute);
  RecordStage(Stage::kD2H, timings.d2h);
  RecordStage(Stage::kEnqueue, timings.enqueue);
}

void ServerMetrics::RecordStage(Stage stage, double seconds) {
  stages_[static_cast<int>(stage)]->Observe(seconds);
}

void ServerMetrics::RecordRejection(RejectReason reason) {
  rejections_[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
}

uint64_t ServerMetrics::requests(RpcMethod method,
                                 grpc::StatusCode code) const {
  return requests_[RequestIndex(method, code)].load(std::memory_order_relaxed);
}

uint64_t ServerMetrics::rejections(RejectReason reason) const {
  return rejections_[static_cast<int>(reason)].load(std::memory_order_relaxed);
}

std::vector<prometheus::MetricFamily> ServerMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  out.push_back(RequestsFamily(*this));
  prometheus::MetricFamily durations =
      Family("matmul_request_duration_seconds",
             "Server time of an RPC, from the handler's start to the end of "
             "the call (reply sent).",
             prometheus::MetricType::Histogram);
  for (int m = 0; m < kNumRpcMethods; ++m) {
    prometheus::ClientMetric metric = WithLabels(
        {{"method", std::string(RpcMethodName(static_cast<RpcMethod>(m)))}});
    metric.histogram = durations_[m]->Snapshot();
    durations.metric.push_back(std::move(metric));
  }
  out.push_back(std::move(durations));

  prometheus::MetricFamily stages =
      Family("matmul_stage_duration_seconds",
             "Time computed Multiply requests spent in each stage: queue, "
             "stage_in, h2d, compute, d2h (from the engine; device stages "
             "from CUDA events) and reply (engine completion to end of RPC).",
             prometheus::MetricType::Histogram);
  for (int s = 0; s < kNumStages; ++s) {
    prometheus::ClientMetric metric =
        WithLabels({{"stage", std::string(StageName(static_cast<Stage>(s)))}});
    metric.histogram = stages_[s]->Snapshot();
    stages.metric.push_back(std::move(metric));
  }
  out.push_back(std::move(stages));

  out.push_back(RejectedFamily(*this));
  out.push_back(PayloadFamily(*this));
  out.push_back(StripesFamily(*this));
  AddSharedMemoryFamilies(*shared_memory_gauges_, out);
  for (prometheus::MetricFamily& f : client_usage_.Collect()) {
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace matmul
