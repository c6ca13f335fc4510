// Unit tests of the metrics pieces: AtomicHistogram, ServerMetrics,
// EngineFamilies, the timeline JSON and the HTTP server's query parsing.
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prometheus/text_serializer.h"
#include "server/atomic_histogram.h"
#include "server/http/http_server.h"
#include "server/http/state_collector.h"
#include "server/http/timeline.h"
#include "server/server_metrics.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

// "name{a="1",b="2"}" -> value, for every sample of `families`.
std::map<std::string, double> Samples(
    const std::vector<prometheus::MetricFamily>& families) {
  std::map<std::string, double> out;
  const std::string text = prometheus::TextSerializer().Serialize(families);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(AtomicHistogramTest, BucketsAreCumulativeWithLeSemantics) {
  AtomicHistogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 2.0, 4.0, 10.0, -3.0}) h.Observe(v);
  h.Observe(std::numeric_limits<double>::quiet_NaN());  // ignored
  const prometheus::ClientMetric::Histogram s = h.Snapshot();
  ASSERT_EQ(s.bucket.size(), 4u);
  EXPECT_EQ(s.bucket[0].cumulative_count, 3u);  // 0.5, 1.0, -3 (as 0)
  EXPECT_EQ(s.bucket[1].cumulative_count, 5u);  // + 1.5, 2.0
  EXPECT_EQ(s.bucket[2].cumulative_count, 6u);  // + 4.0
  EXPECT_EQ(s.bucket[3].cumulative_count, 7u);  // + 10
  EXPECT_TRUE(std::isinf(s.bucket[3].upper_bound));
  EXPECT_EQ(s.sample_count, 7u);
  EXPECT_DOUBLE_EQ(s.sample_sum, 0.5 + 1 + 1.5 + 2 + 4 + 10);
}

TEST(AtomicHistogramTest, ConcurrentObservationsAreAllCounted) {
  AtomicHistogram h(RequestDurationBuckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h] {
      for (int i = 0; i < 10000; ++i) h.Observe(1e-3);
    });
  }
  for (auto& t : threads) t.join();
  const auto s = h.Snapshot();
  EXPECT_EQ(s.sample_count, 40000u);
  EXPECT_NEAR(s.sample_sum, 40.0, 1e-6);
}

TEST(BucketsTest, CoverFiftyMicrosecondsToOneMinute) {
  const std::vector<double>& r = RequestDurationBuckets();
  EXPECT_DOUBLE_EQ(r.front(), 50e-6);
  EXPECT_DOUBLE_EQ(r.back(), 60);
  EXPECT_TRUE(std::is_sorted(r.begin(), r.end()));
  const std::vector<double>& s = StageDurationBuckets();
  EXPECT_DOUBLE_EQ(s.front(), 10e-6);
  EXPECT_DOUBLE_EQ(s.back(), 60);
  EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
}

TEST(ServerMetricsTest, EveryLabelCombinationExistsFromTheStart) {
  ServerMetrics metrics;
  const std::vector<prometheus::MetricFamily> families = metrics.Collect();
  std::map<std::string, size_t> sizes;
  for (const auto& f : families) sizes[f.name] = f.metric.size();
  EXPECT_EQ(sizes["matmul_requests_total"], size_t{kNumRpcMethods} * 17u);
  EXPECT_EQ(sizes["matmul_request_duration_seconds"], size_t{kNumRpcMethods});
  EXPECT_EQ(sizes["matmul_stage_duration_seconds"], size_t{kNumStages});
  EXPECT_EQ(sizes["matmul_rejected_requests_total"], size_t{kNumRejectReasons});
  const auto samples = Samples(families);
  EXPECT_EQ(
      samples.at(
          R"(matmul_requests_total{code="UNAUTHENTICATED",method="GetServerInfo"})"),
      0);
  EXPECT_EQ(samples.at(R"(matmul_rejected_requests_total{reason="draining"})"),
            0);
  EXPECT_EQ(samples.at(R"(matmul_stage_duration_seconds_count{stage="reply"})"),
            0);
}

TEST(ServerMetricsTest, RecordsLandInTheirSeries) {
  ServerMetrics metrics;
  metrics.RecordRequest(RpcMethod::kMultiply, grpc::StatusCode::OK, 0.002);
  metrics.RecordRequest(RpcMethod::kMultiply, grpc::StatusCode::OK, 0.004);
  metrics.RecordRequest(RpcMethod::kMultiply,
                        grpc::StatusCode::INVALID_ARGUMENT, 0.0001);
  metrics.RecordRequest(RpcMethod::kGetServerInfo, grpc::StatusCode::OK, 1e-5);
  // Out-of-range codes count as UNKNOWN rather than writing out of bounds.
  metrics.RecordRequest(RpcMethod::kMultiply, static_cast<grpc::StatusCode>(99),
                        0.1);
  StageTimings timings;
  timings.queue = 1e-4;
  timings.stage_in = 2e-4;
  timings.h2d = 3e-4;
  timings.compute = 4e-3;
  timings.d2h = 5e-4;
  metrics.RecordStages(timings);
  metrics.RecordStage(Stage::kReply, 6e-4);
  metrics.RecordRejection(RejectReason::kOverloaded);
  metrics.RecordRejection(RejectReason::kOverloaded);
  metrics.RecordRejection(RejectReason::kCancelled);

  EXPECT_EQ(metrics.requests(RpcMethod::kMultiply, grpc::StatusCode::OK), 2u);
  EXPECT_EQ(metrics.rejections(RejectReason::kOverloaded), 2u);
  const auto s = Samples(metrics.Collect());
  EXPECT_EQ(s.at(R"(matmul_requests_total{code="OK",method="Multiply"})"), 2);
  EXPECT_EQ(
      s.at(
          R"(matmul_requests_total{code="INVALID_ARGUMENT",method="Multiply"})"),
      1);
  EXPECT_EQ(s.at(R"(matmul_requests_total{code="UNKNOWN",method="Multiply"})"),
            1);
  EXPECT_EQ(s.at(R"(matmul_requests_total{code="OK",method="GetServerInfo"})"),
            1);
  EXPECT_EQ(s.at(R"(matmul_request_duration_seconds_count{method="Multiply"})"),
            4);
  EXPECT_NEAR(s.at(R"(matmul_request_duration_seconds_sum{method="Multiply"})"),
              0.1061, 1e-9);
  EXPECT_EQ(
      s.at(
          R"(matmul_request_duration_seconds_bucket{method="Multiply",le="0.0025"})"),
      2);
  EXPECT_EQ(
      s.at(
          R"(matmul_request_duration_seconds_bucket{method="Multiply",le="+Inf"})"),
      4);
  EXPECT_NEAR(s.at(R"(matmul_stage_duration_seconds_sum{stage="compute"})"),
              4e-3, 1e-12);
  EXPECT_EQ(s.at(R"(matmul_stage_duration_seconds_count{stage="d2h"})"), 1);
  EXPECT_NEAR(s.at(R"(matmul_stage_duration_seconds_sum{stage="reply"})"), 6e-4,
              1e-12);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="overloaded"})"), 2);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="cancelled"})"), 1);
}

EngineStats TwoGpuStats() {
  EngineStats stats;
  for (int d = 0; d < 2; ++d) {
    DeviceStats device;
    device.label = absl::StrCat(d);
    device.uuid =
        absl::StrCat("GPU-0000000", d, "-1111-2222-3333-444444444444");
    device.healthy = d == 0;
    device.streams = {{10, 1.5}, {20, 2.5}};
    device.busy_seconds = 3;
    device.compute_busy_seconds = 2;
    device.copy_busy_seconds = 1.5;
    device.copy_compute_overlap_seconds = 0.75;
    device.h2d_bytes = 1000;
    device.d2h_bytes = 500;
    device.flops[static_cast<int>(DType::kBFloat16)] = 4e12;
    device.staging_used_bytes = 1 << 20;
    device.staging_total_bytes = 4 << 20;
    device.device_memory_used_bytes = 123456;
    device.queued_jobs = 7;
    device.graph_jobs = 40 + d;
    device.graphs_recorded = 3;
    device.graphs_evicted = 2;
    stats.devices.push_back(device);
  }
  return stats;
}

TEST(EngineFamiliesTest, ExportsEveryCounterPerDeviceAndStream) {
  const auto s = Samples(EngineFamilies(TwoGpuStats()));
  EXPECT_EQ(
      s.at(
          R"(matmul_streams{device="1",uuid="GPU-00000001-1111-2222-3333-444444444444"})"),
      2);
  EXPECT_EQ(
      s.at(
          R"(matmul_queued_requests{device="0",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      7);
  EXPECT_EQ(
      s.at(
          R"(matmul_stream_busy_seconds_total{device="1",stream="1",uuid="GPU-00000001-1111-2222-3333-444444444444"})"),
      2.5);
  EXPECT_EQ(
      s.at(
          R"(matmul_stream_jobs_total{device="0",stream="0",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      10);
  EXPECT_EQ(
      s.at(
          R"(matmul_device_busy_seconds_total{device="0",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      3);
  EXPECT_EQ(
      s.at(
          R"(matmul_device_compute_busy_seconds_total{device="0",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      2);
  EXPECT_EQ(
      s.at(
          R"(matmul_device_copy_busy_seconds_total{device="0",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      1.5);
  EXPECT_EQ(
      s.at(
          R"(matmul_device_copy_compute_overlap_seconds_total{device="1",uuid="GPU-00000001-1111-2222-3333-444444444444"})"),
      0.75);
  EXPECT_EQ(
      s.at(
          R"(matmul_transfer_bytes_total{device="0",direction="h2d",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      1000);
  EXPECT_EQ(
      s.at(
          R"(matmul_transfer_bytes_total{device="0",direction="d2h",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      500);
  EXPECT_EQ(
      s.at(
          R"(matmul_flops_total{device="0",dtype="bfloat16",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      4e12);
  EXPECT_EQ(
      s.at(
          R"(matmul_flops_total{device="0",dtype="float64",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      0);
  EXPECT_EQ(
      s.at(
          R"(matmul_pinned_bytes{device="0",state="used",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      1 << 20);
  EXPECT_EQ(
      s.at(
          R"(matmul_pinned_bytes{device="0",state="free",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      3 << 20);
  EXPECT_EQ(
      s.at(
          R"(matmul_device_memory_used_bytes{device="1",uuid="GPU-00000001-1111-2222-3333-444444444444"})"),
      123456);
  EXPECT_EQ(
      s.at(
          R"(matmul_device_graph_jobs_total{device="1",uuid="GPU-00000001-1111-2222-3333-444444444444"})"),
      41);
  EXPECT_EQ(
      s.at(
          R"(matmul_device_graphs_recorded_total{device="0",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      3);
  EXPECT_EQ(
      s.at(
          R"(matmul_device_graphs_evicted_total{device="0",uuid="GPU-00000000-1111-2222-3333-444444444444"})"),
      2);
}

TEST(EngineFamiliesTest, HostEngineWithoutPoolHasNoNegativeFreeBytes) {
  EngineStats stats;
  DeviceStats host;
  host.label = "host";
  host.uuid = "host";
  host.streams = {{1, 0.1}};
  host.staging_used_bytes = 4096;  // no pool: total stays 0
  stats.devices.push_back(host);
  const auto s = Samples(EngineFamilies(stats));
  EXPECT_EQ(
      s.at(R"(matmul_pinned_bytes{device="host",state="free",uuid="host"})"),
      0);
  EXPECT_EQ(
      s.at(R"(matmul_pinned_bytes{device="host",state="used",uuid="host"})"),
      4096);
}

TEST(EngineFamiliesTest, NoDevicesNoFamilies) {
  EXPECT_TRUE(EngineFamilies(EngineStats{}).empty());
}

StageTimings DeviceSeconds(double h2d, double compute, double d2h) {
  StageTimings t;
  t.queue = 100;  // not device time: never charged
  t.stage_in = 100;
  t.h2d = h2d;
  t.compute = compute;
  t.d2h = d2h;
  return t;
}

// The series of `family` by client label, and their sum.
std::map<std::string, double> ClientSeries(
    const std::map<std::string, double>& samples, const std::string& family,
    const std::string& suffix = "") {
  std::map<std::string, double> out;
  const std::string prefix = family + R"({client=")";
  for (const auto& [key, value] : samples) {
    if (key.rfind(prefix, 0) != 0) continue;
    const size_t end = key.find('"', prefix.size());
    if (key.substr(end + 1) != suffix + "}") continue;
    out[key.substr(prefix.size(), end - prefix.size())] = value;
  }
  return out;
}

double Sum(const std::map<std::string, double>& series) {
  double sum = 0;
  for (const auto& [client, value] : series) sum += value;
  return sum;
}

// 1,000 client ids, the five heaviest last: the labels are those five and
// "other", whoever came first, and the series sum to all the use.
TEST(ClientUsageTest, TheHeaviestClientsHaveLabelsEvenWhenTheyCameLast) {
  ClientUsage usage(5);
  double seconds = 0;
  double h2d = 0;
  double d2h = 0;
  for (int i = 0; i < 1000; ++i) {
    const bool heavy = i >= 995;
    const double s = heavy ? 100 + i : 1;
    const BusBytes bytes = heavy ? BusBytes{1000, 100} : BusBytes{10, 1};
    usage.Record(absl::StrCat("c", i), DeviceSeconds(0, s, 0), bytes);
    seconds += s;
    h2d += static_cast<double>(bytes.h2d);
    d2h += static_cast<double>(bytes.d2h);
  }
  const auto s = Samples(usage.Collect());
  const auto gpu = ClientSeries(s, "matmul_client_gpu_seconds_total");
  std::vector<std::string> labels;
  for (const auto& [client, value] : gpu) labels.push_back(client);
  EXPECT_EQ(labels, (std::vector<std::string>{"c995", "c996", "c997", "c998",
                                              "c999", "other"}));
  for (int i = 995; i < 1000; ++i) {
    EXPECT_DOUBLE_EQ(gpu.at(absl::StrCat("c", i)), 100 + i) << i;
  }
  EXPECT_DOUBLE_EQ(gpu.at("other"), 995);
  EXPECT_DOUBLE_EQ(Sum(gpu), seconds);
  const auto h2d_series =
      ClientSeries(s, "matmul_client_bytes_total", R"(,direction="h2d")");
  const auto d2h_series =
      ClientSeries(s, "matmul_client_bytes_total", R"(,direction="d2h")");
  EXPECT_EQ(h2d_series.size(), 6u);
  EXPECT_EQ(d2h_series.size(), 6u);
  EXPECT_EQ(Sum(h2d_series), h2d);
  EXPECT_EQ(Sum(d2h_series), d2h);
  EXPECT_EQ(h2d_series.at("c999"), 1000);
  EXPECT_EQ(d2h_series.at("other"), 995);
}

// More ids than are tracked for ranking (one each, as a tool run per
// process makes): the heavy clients still get the labels, and the series
// still sum to all the use.
TEST(ClientUsageTest, ManyMoreIdsThanTrackedStillFindTheHeaviest) {
  ClientUsage usage(2);
  const int ids = static_cast<int>(usage.TrackedClients()) * 5;
  double seconds = 0;
  for (int i = 0; i < ids; ++i) {
    if (i == ids / 2) {
      usage.Record("second", DeviceSeconds(40, 0, 0), {});
      seconds += 40;
    }
    usage.Record(absl::StrCat("tool-", i), DeviceSeconds(1, 0, 0), {1, 0});
    seconds += 1;
  }
  usage.Record("heaviest", DeviceSeconds(50, 0, 0), {});
  seconds += 50;
  const auto gpu =
      ClientSeries(Samples(usage.Collect()), "matmul_client_gpu_seconds_total");
  ASSERT_EQ(gpu.size(), 3u);
  EXPECT_DOUBLE_EQ(gpu.at("heaviest"), 50);
  EXPECT_DOUBLE_EQ(gpu.at("second"), 40);
  EXPECT_DOUBLE_EQ(gpu.at("other"), ids);
  EXPECT_DOUBLE_EQ(Sum(gpu), seconds);
}

// A client that gives its label up to a heavier one adds its series to
// "other": no series ever goes down, and fewer labels (SetMaxClients)
// move the lightest into "other" the same way.
TEST(ClientUsageTest, AClientThatLosesItsLabelMovesIntoOther) {
  ClientUsage usage(2);
  usage.Record("alice", DeviceSeconds(1, 2, 3), {100, 10});
  usage.Record("bob", DeviceSeconds(0.5, 0, 0), {1, 2});
  usage.Record("carol", DeviceSeconds(4, 0, 0), {1000, 0});  // bob's label
  usage.Record("dave", DeviceSeconds(0, 1, 0), {0, 7});      // lighter
  usage.Record("alice", DeviceSeconds(0, 1, 0), {0, 5});
  auto s = Samples(usage.Collect());
  auto gpu = ClientSeries(s, "matmul_client_gpu_seconds_total");
  EXPECT_EQ(gpu, (std::map<std::string, double>{
                     {"alice", 7}, {"carol", 4}, {"other", 1.5}}));
  EXPECT_EQ(
      s.at(R"(matmul_client_bytes_total{client="alice",direction="d2h"})"), 15);
  EXPECT_EQ(
      s.at(R"(matmul_client_bytes_total{client="carol",direction="h2d"})"),
      1000);
  EXPECT_EQ(
      s.at(R"(matmul_client_bytes_total{client="other",direction="h2d"})"), 1);
  EXPECT_EQ(
      s.at(R"(matmul_client_bytes_total{client="other",direction="d2h"})"), 9);

  usage.SetMaxClients(1);  // carol, the lighter, gives hers up
  gpu =
      ClientSeries(Samples(usage.Collect()), "matmul_client_gpu_seconds_total");
  EXPECT_EQ(gpu, (std::map<std::string, double>{{"alice", 7}, {"other", 5.5}}));

  // A free label goes to the next client to record; its series counts
  // from then, and "other" keeps what it had.
  usage.SetMaxClients(3);
  usage.Record("carol", DeviceSeconds(0, 2, 0), {0, 0});
  usage.Record("erin", DeviceSeconds(0, 3, 0), {0, 0});
  gpu =
      ClientSeries(Samples(usage.Collect()), "matmul_client_gpu_seconds_total");
  EXPECT_EQ(gpu, (std::map<std::string, double>{
                     {"alice", 7}, {"carol", 2}, {"erin", 3}, {"other", 5.5}}));
}

// A request that ran as one of n in a batch carries the batch's times with
// share 1/n: the batch's device time is charged once over its members.
TEST(ClientUsageTest, ABatchMemberIsChargedItsShare) {
  ClientUsage usage(4);
  StageTimings batch = DeviceSeconds(0.1, 0.6, 0.2);
  batch.share = 1.0 / 3;
  usage.Record("alice", batch, {});
  usage.Record("alice", batch, {});
  usage.Record("bob", batch, {});
  auto s = Samples(usage.Collect());
  EXPECT_NEAR(s.at(R"(matmul_client_gpu_seconds_total{client="alice"})"), 0.6,
              1e-12);
  EXPECT_NEAR(s.at(R"(matmul_client_gpu_seconds_total{client="bob"})"), 0.3,
              1e-12);
}

TEST(ClientUsageTest, LongIdsAreCutAndZeroClientsMeansAllOther) {
  ClientUsage usage(0);
  usage.Record("alice", DeviceSeconds(1, 0, 0), {});
  auto s = Samples(usage.Collect());
  EXPECT_DOUBLE_EQ(s.at(R"(matmul_client_gpu_seconds_total{client="other"})"),
                   1);
  EXPECT_EQ(s.count(R"(matmul_client_gpu_seconds_total{client="alice"})"), 0u);

  ClientUsage one(1);
  const std::string id(1000, 'x');
  one.Record(id, DeviceSeconds(1, 0, 0), {});
  one.Record(id + "y", DeviceSeconds(1, 0, 0), {});  // same 128-char label
  s = Samples(one.Collect());
  EXPECT_DOUBLE_EQ(
      s.at(absl::StrCat(R"(matmul_client_gpu_seconds_total{client=")",
                        std::string(ClientUsage::kMaxClientLength, 'x'),
                        R"("})")),
      2);
}

// Bytes a job moves over the bus follow from its description alone.
TEST(ClientUsageTest, BusBytesOfEachOperation) {
  JobDescription multiply;
  multiply.spec.dtype = DType::kFloat32;
  multiply.spec.batch = multiply.spec.a_batch = multiply.spec.b_batch = 1;
  multiply.spec.m = 2;
  multiply.spec.k = 3;
  multiply.spec.n = 4;
  multiply.op = MultiplyOp{};
  BusBytes b = JobBusBytes(multiply);
  EXPECT_EQ(b.h2d, (2 * 3 + 3 * 4) * 4);
  EXPECT_EQ(b.d2h, 2 * 4 * 4);
  MultiplyOp keep;
  keep.keep_result = true;
  multiply.op = keep;
  b = JobBusBytes(multiply);
  EXPECT_EQ(b.h2d, (2 * 3 + 3 * 4) * 4);
  EXPECT_EQ(b.d2h, 0);
  multiply.op = AllocateOp{};
  b = JobBusBytes(multiply);
  EXPECT_EQ(b.h2d, 0);
  EXPECT_EQ(b.d2h, 0);
}

TEST(TimelineTest, ParsesTheWindow) {
  EXPECT_EQ(*ParseTimelineWindow(""), absl::Seconds(2));
  EXPECT_EQ(*ParseTimelineWindow("0.5"), absl::Milliseconds(500));
  EXPECT_EQ(*ParseTimelineWindow("3600"), absl::Seconds(60));
  for (const char* bad : {"0", "-1", "abc", "nan", "inf", "1e999"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseTimelineWindow(bad).status()))
        << bad;
  }
}

// The timeline's events whose "ph" is `ph` (parsed, so that the test says
// nothing of spacing or number spelling).
std::vector<nlohmann::json> Events(const nlohmann::json& trace,
                                   const std::string& ph) {
  std::vector<nlohmann::json> out;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

// The metadata event `name` ("process_name", "thread_name") of pid (and
// tid, unless negative); null if there is none.
nlohmann::json Meta(const nlohmann::json& trace, const std::string& name,
                    int pid, int tid = -1) {
  for (const nlohmann::json& e : Events(trace, "M")) {
    if (e.at("name") == name && e.at("pid") == pid &&
        (tid < 0 || e.at("tid") == tid)) {
      return e;
    }
  }
  return nullptr;
}

TEST(TimelineTest, SpansBecomeCompleteEventsRelativeToTheFirstStart) {
  EngineInfo info;
  info.name = "cuda";
  info.streams_per_device = 2;
  DeviceInfo gpu;
  gpu.index = 1;
  gpu.name = "NVIDIA \"H200\"";
  info.devices.push_back(gpu);
  const absl::Time t0 = absl::FromUnixMicros(1'700'000'000'000'000);
  std::vector<StreamSpan> spans;
  spans.push_back({1, 1, StreamSpan::Kind::kH2D, 42, t0 + absl::Microseconds(5),
                   t0 + absl::Microseconds(15)});
  spans.push_back({1, 1, StreamSpan::Kind::kCompute, 42,
                   t0 + absl::Microseconds(15), t0 + absl::Microseconds(40)});
  spans.push_back(
      {1, 0, StreamSpan::Kind::kD2H, 41, t0, t0 + absl::Nanoseconds(2500)});
  const std::string json = TimelineJson(info, spans, absl::Seconds(2));
  // The trace viewers and bench/tools/render_timeline.py look for this first.
  EXPECT_THAT(json, testing::StartsWith(R"({"traceEvents":[)"));
  const nlohmann::json trace = nlohmann::json::parse(json);

  EXPECT_EQ(Meta(trace, "process_name", 1).at("args").at("name"),
            "GPU 1: NVIDIA \"H200\"");
  EXPECT_EQ(Meta(trace, "process_sort_index", 1).at("args").at("sort_index"),
            1);
  for (int tid : {0, 1}) {
    EXPECT_EQ(Meta(trace, "thread_name", 1, tid).at("args").at("name"),
              absl::StrCat("stream ", tid));
    EXPECT_EQ(
        Meta(trace, "thread_sort_index", 1, tid).at("args").at("sort_index"),
        tid);
  }

  struct Want {
    const char* name;
    const char* cat;
    int tid;
    double ts;
    double dur;
    int job;
  };
  const Want want[] = {{"h2d", "copy", 1, 5.0, 10.0, 42},
                       {"gemm", "compute", 1, 15.0, 25.0, 42},
                       {"d2h", "copy", 0, 0.0, 2.5, 41}};
  const std::vector<nlohmann::json> x = Events(trace, "X");
  ASSERT_EQ(x.size(), 3u) << json;
  for (size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(x[i].dump());
    EXPECT_EQ(x[i].at("name"), want[i].name);
    EXPECT_EQ(x[i].at("cat"), want[i].cat);
    EXPECT_EQ(x[i].at("pid"), 1);
    EXPECT_EQ(x[i].at("tid"), want[i].tid);
    EXPECT_DOUBLE_EQ(x[i].at("ts").get<double>(), want[i].ts);
    EXPECT_DOUBLE_EQ(x[i].at("dur").get<double>(), want[i].dur);
    EXPECT_EQ(x[i].at("args").at("job"), want[i].job);
  }

  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");
  const nlohmann::json& other = trace.at("otherData");
  EXPECT_EQ(other.at("engine"), "cuda");
  EXPECT_DOUBLE_EQ(other.at("window_seconds").get<double>(), 2.0);
  EXPECT_EQ(other.at("start_unix_us").get<int64_t>(), 1'700'000'000'000'000);
  EXPECT_EQ(other.at("spans"), 3);
}

TEST(TimelineTest, HostDeviceIsPidZeroWithLanes) {
  EngineInfo info;
  info.name = "host";
  info.streams_per_device = 1;
  DeviceInfo host;
  host.index = -1;
  host.name = "CPU";
  info.devices.push_back(host);
  const absl::Time now = absl::Now();
  const nlohmann::json trace = nlohmann::json::parse(
      TimelineJson(info, {{-1, 0, StreamSpan::Kind::kCompute, 1, now, now}},
                   absl::Seconds(1)));
  EXPECT_EQ(Meta(trace, "process_name", 0).at("args").at("name"), "host: CPU");
  EXPECT_EQ(Meta(trace, "thread_name", 0, 0).at("args").at("name"), "lane 0");
  const std::vector<nlohmann::json> x = Events(trace, "X");
  ASSERT_EQ(x.size(), 1u);
  EXPECT_EQ(x[0].at("pid"), 0);
  EXPECT_EQ(x[0].at("tid"), 0);
  EXPECT_EQ(x[0].at("ts"), 0.0);
  EXPECT_EQ(x[0].at("dur"), 0.0);
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 0) << e.dump();
  }
}

TEST(TimelineTest, NamesThatAreNotUtf8StillMakeValidJson) {
  EngineInfo info;
  info.name = "cuda";
  info.streams_per_device = 1;
  DeviceInfo gpu;
  gpu.index = 0;
  gpu.name = "GPU \xff\x01";  // a stray byte and a control character
  info.devices.push_back(gpu);
  const std::string json = TimelineJson(info, {}, absl::Seconds(1));
  const nlohmann::json trace = nlohmann::json::parse(json);
  EXPECT_EQ(Meta(trace, "process_name", 0).at("args").at("name"),
            "GPU 0: GPU \xef\xbf\xbd\x01");  // U+FFFD in UTF-8
  EXPECT_THAT(json, HasSubstr(R"(\u0001)"));
  EXPECT_EQ(trace.at("otherData").at("spans"), 0);
}

TEST(HttpServerTest, QueryParameterDecodes) {
  EXPECT_EQ(QueryParameter("seconds=5", "seconds"), "5");
  EXPECT_EQ(QueryParameter("a=1&seconds=0%2E5&b", "seconds"), "0.5");
  EXPECT_EQ(QueryParameter("x=a+b%20c", "x"), "a b c");
  EXPECT_EQ(QueryParameter("seconds", "seconds"), "");
  EXPECT_EQ(QueryParameter("a=1", "seconds"), std::nullopt);
  EXPECT_EQ(QueryParameter("", "seconds"), std::nullopt);
  EXPECT_EQ(QueryParameter("x=%zz%4", "x"), "%zz%4");
}

}  // namespace
}  // namespace matmul
