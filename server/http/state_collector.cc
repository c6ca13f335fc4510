#include "server/http/state_collector.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/build_info.h"
#include "common/dtype.h"
#include "server/rpc/matmul_service.h"
#include "server/staging_copier.h"

namespace matmul {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

void AddCounter(MetricFamily& family, std::vector<ClientMetric::Label> labels,
                double value) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.counter.value = value;
  family.metric.push_back(std::move(metric));
}

void AddGauge(MetricFamily& family, std::vector<ClientMetric::Label> labels,
              double value) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

}  // namespace

std::string BuildCudaVersion() { return std::string(CudaVersion()); }

// The batching engine's launches by the requests each carried (1: a
// request that went out alone).
MetricFamily BatchSizeFamily(const BatchSizeCounts& sizes) {
  MetricFamily family = Family(
      "matmul_batch_size",
      "Requests per job the batching engine handed to the device: 1 when a "
      "request went out alone (a free slot), more when requests of one shape "
      "gathered while the device was busy.",
      MetricType::Histogram);
  ClientMetric metric;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < sizes.counts.size(); ++i) {
    cumulative += static_cast<uint64_t>(sizes.counts[i]);
    ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound = i < kBatchSizeBounds.size()
                             ? static_cast<double>(kBatchSizeBounds[i])
                             : std::numeric_limits<double>::infinity();
    metric.histogram.bucket.push_back(bucket);
  }
  metric.histogram.sample_count = static_cast<uint64_t>(sizes.launches);
  metric.histogram.sample_sum = static_cast<double>(sizes.requests);
  family.metric.push_back(std::move(metric));
  return family;
}

namespace {

// The per-device families, in the order /metrics lists them.
struct DeviceFamilies {
  MetricFamily queued;
  MetricFamily streams;
  MetricFamily stream_busy;
  MetricFamily stream_jobs;
  MetricFamily device_busy;
  MetricFamily compute_busy;
  MetricFamily copy_busy;
  MetricFamily overlap;
  MetricFamily transfer;
  MetricFamily flops;
  MetricFamily pinned;
  MetricFamily memory;
  MetricFamily graph_jobs;
  MetricFamily graphs_recorded;
  MetricFamily graphs_evicted;
  MetricFamily healthy;

  std::vector<MetricFamily*> InOrder() {
    return {&queued,      &streams,         &stream_busy,    &stream_jobs,
            &device_busy, &compute_busy,    &copy_busy,      &overlap,
            &transfer,    &flops,           &pinned,         &memory,
            &graph_jobs,  &graphs_recorded, &graphs_evicted, &healthy};
  }
};

DeviceFamilies MakeDeviceFamilies() {
  DeviceFamilies f;
  f.queued = Family("matmul_queued_requests",
                    "Jobs submitted to the engine and waiting for a stream.",
                    MetricType::Gauge);
  f.streams =
      Family("matmul_streams",
             "Streams in the device's pool (host engine: worker lanes).",
             MetricType::Gauge);
  f.stream_busy = Family(
      "matmul_stream_busy_seconds_total",
      "Time the stream had work (CUDA engine: from events, first H2D start "
      "to last D2H end of each job); rate() is the stream's utilization.",
      MetricType::Counter);
  f.stream_jobs = Family("matmul_stream_jobs_total",
                         "Jobs that ran on the stream.", MetricType::Counter);
  f.device_busy =
      Family("matmul_device_busy_seconds_total",
             "Time at least one of the device's streams had work (union over "
             "streams); rate() is the device's utilization.",
             MetricType::Counter);
  f.compute_busy =
      Family("matmul_device_compute_busy_seconds_total",
             "Time at least one GEMM ran on the device (union over streams).",
             MetricType::Counter);
  f.copy_busy =
      Family("matmul_device_copy_busy_seconds_total",
             "Time at least one H2D or D2H copy ran on the device (union over "
             "streams).",
             MetricType::Counter);
  f.overlap =
      Family("matmul_device_copy_compute_overlap_seconds_total",
             "Time copies and GEMMs ran at the same time on the device.",
             MetricType::Counter);
  f.transfer =
      Family("matmul_transfer_bytes_total",
             "Bytes copied between host and device, by direction (h2d, d2h).",
             MetricType::Counter);
  f.flops =
      Family("matmul_flops_total",
             "Floating-point operations done (2*m*n*k per product), by dtype.",
             MetricType::Counter);
  f.pinned =
      Family("matmul_pinned_bytes",
             "Pinned staging memory of the device, used or free (host engine: "
             "staging in use; it has no fixed pool, so free is 0).",
             MetricType::Gauge);
  f.memory =
      Family("matmul_device_memory_used_bytes",
             "Device memory reserved by jobs in flight (host engine: 0).",
             MetricType::Gauge);
  f.graph_jobs =
      Family("matmul_device_graph_jobs_total",
             "Jobs launched by replaying a CUDA graph recorded for their "
             "stream and shape (0 on the host engine).",
             MetricType::Counter);
  f.graphs_recorded =
      Family("matmul_device_graphs_recorded_total",
             "CUDA graphs recorded, one per stream and shape first seen or "
             "seen again after its eviction.",
             MetricType::Counter);
  f.graphs_evicted =
      Family("matmul_device_graphs_evicted_total",
             "CUDA graphs dropped while still replayable: the least recently "
             "used free one, for a shape a stream had no room for, or idle "
             "ones, for a job's device memory or staging. Evictions that "
             "keep pace with recordings mean the graphs are re-recorded "
             "rather than replayed.",
             MetricType::Counter);
  f.healthy =
      Family("matmul_device_healthy",
             "1 while the device takes jobs, 0 once it has failed (a sticky "
             "CUDA error broke its context; the pod needs a restart).",
             MetricType::Gauge);
  return f;
}

// One device's series in each of the families.
void AddDevice(DeviceFamilies& f, const DeviceStats& d) {
  // Every per-device series carries the device's UUID beside its index
  // (last, so that labels stay in name order), for joins with the DCGM
  // exporter's series.
  const ClientMetric::Label device{"device", d.label};
  const ClientMetric::Label uuid{"uuid", d.uuid};
  AddGauge(f.queued, {device, uuid}, static_cast<double>(d.queued_jobs));
  AddGauge(f.streams, {device, uuid}, static_cast<double>(d.streams.size()));
  for (size_t s = 0; s < d.streams.size(); ++s) {
    const ClientMetric::Label stream{"stream", absl::StrCat(s)};
    AddCounter(f.stream_busy, {device, stream, uuid},
               d.streams[s].busy_seconds);
    AddCounter(f.stream_jobs, {device, stream, uuid},
               static_cast<double>(d.streams[s].jobs));
  }
  AddCounter(f.device_busy, {device, uuid}, d.busy_seconds);
  AddCounter(f.compute_busy, {device, uuid}, d.compute_busy_seconds);
  AddCounter(f.copy_busy, {device, uuid}, d.copy_busy_seconds);
  AddCounter(f.overlap, {device, uuid}, d.copy_compute_overlap_seconds);
  AddCounter(f.transfer, {device, {"direction", "h2d"}, uuid},
             static_cast<double>(d.h2d_bytes));
  AddCounter(f.transfer, {device, {"direction", "d2h"}, uuid},
             static_cast<double>(d.d2h_bytes));
  for (int t = 0; t < kNumDTypes; ++t) {
    AddCounter(f.flops,
               {device,
                {"dtype", std::string(DTypeName(static_cast<DType>(t)))},
                uuid},
               d.flops[t]);
  }
  AddGauge(f.pinned, {device, {"state", "used"}, uuid},
           static_cast<double>(d.staging_used_bytes));
  AddGauge(f.pinned, {device, {"state", "free"}, uuid},
           static_cast<double>(std::max<int64_t>(
               0, d.staging_total_bytes - d.staging_used_bytes)));
  AddGauge(f.memory, {device, uuid},
           static_cast<double>(d.device_memory_used_bytes));
  AddCounter(f.graph_jobs, {device, uuid}, static_cast<double>(d.graph_jobs));
  AddCounter(f.graphs_recorded, {device, uuid},
             static_cast<double>(d.graphs_recorded));
  AddCounter(f.graphs_evicted, {device, uuid},
             static_cast<double>(d.graphs_evicted));
  AddGauge(f.healthy, {device, uuid}, d.healthy ? 1 : 0);
}

}  // namespace

std::vector<MetricFamily> EngineFamilies(const EngineStats& stats) {
  DeviceFamilies families = MakeDeviceFamilies();
  for (const DeviceStats& d : stats.devices) AddDevice(families, d);
  std::vector<MetricFamily> out;
  for (MetricFamily* f : families.InOrder()) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  if (stats.batching) out.push_back(BatchSizeFamily(stats.batch_sizes));
  return out;
}

StateCollector::StateCollector(const MatmulServiceImpl* service,
                               std::string version, std::string cuda)
    : service_(service), version_(std::move(version)), cuda_(std::move(cuda)) {}

std::vector<MetricFamily> StateCollector::Collect() const {
  std::vector<MetricFamily> out;

  MetricFamily build = Family(
      "matmul_build_info",
      "Always 1; labels: server version and the CUDA toolkit it was built "
      "with (none: host engine only).",
      MetricType::Gauge);
  AddGauge(build, {{"cuda", cuda_}, {"version", version_}}, 1);
  out.push_back(std::move(build));

  MetricFamily inflight = Family(
      "matmul_inflight_requests",
      "Multiply requests admitted and not yet answered.", MetricType::Gauge);
  AddGauge(inflight, {}, static_cast<double>(service_->inflight_requests()));
  out.push_back(std::move(inflight));

  MetricFamily oldest = Family(
      "matmul_oldest_request_seconds",
      "How long the oldest Multiply, Upload or Download call still in "
      "progress (queued or running) has been; 0 when none. One that keeps "
      "growing is a stuck request.",
      MetricType::Gauge);
  AddGauge(oldest, {}, absl::ToDoubleSeconds(service_->oldest_request_age()));
  out.push_back(std::move(oldest));

  MetricFamily inflight_bytes =
      Family("matmul_inflight_bytes",
             "Operand and result bytes reserved by admitted requests "
             "(admission limit: --max-inflight-bytes).",
             MetricType::Gauge);
  AddGauge(inflight_bytes, {},
           static_cast<double>(service_->inflight_bytes().used()));
  out.push_back(std::move(inflight_bytes));

  MetricFamily stored = Family(
      "matmul_stored_tensors",
      "Tensors clients keep on the server (Upload, keep_result) and have not "
      "deleted; they expire after their TTL.",
      MetricType::Gauge);
  AddGauge(stored, {},
           static_cast<double>(service_->handles().stored_handles()));
  out.push_back(std::move(stored));

  MetricFamily stored_bytes =
      Family("matmul_stored_bytes",
             "Bytes of engine memory held by stored tensors (also counted in "
             "matmul_device_memory_used_bytes).",
             MetricType::Gauge);
  AddGauge(stored_bytes, {},
           static_cast<double>(service_->handles().stored_bytes()));
  out.push_back(std::move(stored_bytes));

  const StagingCopier& copier = service_->staging_copier();
  MetricFamily copy_helpers =
      Family("matmul_staging_copy_helpers",
             "Threads that take part in large copies of inline operands into "
             "staging (0 below 4 usable cores).",
             MetricType::Gauge);
  AddGauge(copy_helpers, {}, copier.helpers());
  out.push_back(std::move(copy_helpers));
  MetricFamily shared_copies = Family(
      "matmul_staging_copies_shared_total",
      "Copies of a request's inline operands into staging that the helpers "
      "were offered (at least 256 KiB, while no other copy had them).",
      MetricType::Counter);
  AddCounter(shared_copies, {}, static_cast<double>(copier.shared_copies()));
  out.push_back(std::move(shared_copies));
  MetricFamily helper_bytes = Family(
      "matmul_staging_copy_helper_bytes_total",
      "Of those copies' bytes, the ones the helpers copied (the rest: the "
      "thread that dispatched the request).",
      MetricType::Counter);
  AddCounter(helper_bytes, {}, static_cast<double>(copier.helper_bytes()));
  out.push_back(std::move(helper_bytes));

  if (const Engine* engine = service_->engine(); engine != nullptr) {
    for (MetricFamily& f : EngineFamilies(engine->stats())) {
      out.push_back(std::move(f));
    }
  }
  return out;
}

}  // namespace matmul
