// Integration tests of the metrics port: a real MatmulServer on 127.0.0.1:0
// with its metrics on another free port, real gRPC calls, real HTTP
// requests. The scrape is checked series by series and with
// `promtool check metrics` (Debian package prometheus).
#include <arpa/inet.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/lib/matmul_client.h"
#include "gmock/gmock.h"
#include "gpu/host/host_engine.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/matmul_server.h"
#include "tests/channel_ready.h"
#include "tests/fake_engine.h"
#include "tests/metrics/scrape_client.h"

namespace matmul {
namespace {

using testing::FakeEngine;
using ::testing::HasSubstr;
using testing::HttpGet;
using testing::HttpReply;
using testing::HttpRequestRaw;
using testing::ParseScrape;
using testing::Promtool;
using testing::ScrapeUntil;
using testing::Sum;

constexpr int kLanes = 4;

MatmulServer::EngineProvider HostProvider() {
  return []() -> absl::StatusOr<std::unique_ptr<Engine>> {
    HostEngineOptions options;
    options.lanes = kLanes;
    absl::StatusOr<std::unique_ptr<HostEngine>> engine =
        HostEngine::Create(options);
    if (!engine.ok()) return engine.status();
    return std::unique_ptr<Engine>(std::move(*engine));
  };
}

MatmulServer::EngineProvider FakeProvider(FakeEngine** out) {
  return [out]() -> absl::StatusOr<std::unique_ptr<Engine>> {
    auto engine = std::make_unique<FakeEngine>();
    *out = engine.get();
    return std::unique_ptr<Engine>(std::move(engine));
  };
}

ServerOptions LocalOptions() {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  options.drain_timeout = absl::Seconds(10);
  return options;
}

// Connected (bounded): a fresh channel's first connect can fail by chance
// (tests/channel_ready.h), and these tests count the server's answers.
std::unique_ptr<v1::MatmulService::Stub> Stub(int port) {
  return v1::MatmulService::NewStub(testing::Connected(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials())));
}

// An n x n float32 product of ones (dims may be made to mismatch).
v1::MultiplyRequest Ones(int64_t m, int64_t k, int64_t k2, int64_t n) {
  v1::MultiplyRequest r;
  for (auto [tensor, rows, cols] :
       {std::tuple{r.mutable_a(), m, k}, std::tuple{r.mutable_b(), k2, n}}) {
    tensor->add_shape(rows);
    tensor->add_shape(cols);
    tensor->set_dtype(v1::DTYPE_FLOAT32);
    const float one = 1.0f;
    std::string data;
    for (int64_t i = 0; i < rows * cols; ++i) {
      data.append(reinterpret_cast<const char*>(&one), sizeof one);
    }
    tensor->set_data(data);
  }
  return r;
}

grpc::Status Multiply(
    v1::MatmulService::Stub& stub, const v1::MultiplyRequest& request,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(30000)) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::MultiplyResponse response;
  return stub.Multiply(&context, request, &response);
}

TEST(MetricsEndpointTest, ScrapeAfterMultipliesHasTheExpectedSeries) {
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(LocalOptions(), HostProvider());
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = (*server)->metrics_port();
  ASSERT_GT(metrics_port, 0);
  ASSERT_NE(metrics_port, (*server)->port());
  auto stub = Stub((*server)->port());

  // Five good products from several threads, so several lanes work.
  std::vector<std::future<grpc::Status>> calls;
  for (int i = 0; i < 5; ++i) {
    calls.push_back(std::async(std::launch::async, [&stub] {
      return Multiply(*stub, Ones(64, 64, 64, 64));
    }));
  }
  for (auto& c : calls) ASSERT_TRUE(c.get().ok());
  EXPECT_EQ(Multiply(*stub, Ones(2, 3, 4, 5)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  {
    grpc::ClientContext context;
    v1::GetServerInfoResponse info;
    ASSERT_TRUE(
        stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  }

  const std::map<std::string, double> s =
      ScrapeUntil(metrics_port, [](const auto& s) {
        return Sum(s, "matmul_request_duration_seconds_count",
                   {"method=\"Multiply\""}) >= 6;
      });
  EXPECT_EQ(s.at(R"(matmul_requests_total{code="OK",method="Multiply"})"), 5);
  EXPECT_EQ(
      s.at(
          R"(matmul_requests_total{code="INVALID_ARGUMENT",method="Multiply"})"),
      1);
  EXPECT_EQ(s.at(R"(matmul_requests_total{code="OK",method="GetServerInfo"})"),
            1);
  EXPECT_EQ(Sum(s, "matmul_requests_total"), 7);
  EXPECT_EQ(s.at(R"(matmul_request_duration_seconds_count{method="Multiply"})"),
            6);
  EXPECT_GT(s.at(R"(matmul_request_duration_seconds_sum{method="Multiply"})"),
            0);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="invalid"})"), 1);
  EXPECT_EQ(Sum(s, "matmul_rejected_requests_total"), 1);
  for (const char* stage :
       {"queue", "stage_in", "h2d", "compute", "d2h", "reply", "enqueue"}) {
    EXPECT_EQ(
        s.at(absl::StrCat(R"(matmul_stage_duration_seconds_count{stage=")",
                          stage, "\"}")),
        5)
        << stage;
  }
  EXPECT_GT(s.at(R"(matmul_stage_duration_seconds_sum{stage="compute"})"), 0);
  EXPECT_GT(s.at(R"(matmul_stage_duration_seconds_sum{stage="reply"})"), 0);

  // Engine counters, pulled from HostEngine::stats() at scrape time.
  EXPECT_EQ(s.at(R"(matmul_streams{device="host",uuid="host"})"), kLanes);
  EXPECT_EQ(Sum(s, "matmul_stream_jobs_total", {"device=\"host\""}), 5);
  EXPECT_GT(Sum(s, "matmul_stream_busy_seconds_total", {"device=\"host\""}), 0);
  for (int lane = 0; lane < kLanes; ++lane) {
    EXPECT_EQ(s.count(absl::StrCat(
                  R"(matmul_stream_busy_seconds_total{device="host",stream=")",
                  lane, R"(",uuid="host"})")),
              1u);
  }
  EXPECT_GT(
      s.at(R"(matmul_device_busy_seconds_total{device="host",uuid="host"})"),
      0);
  EXPECT_EQ(
      s.at(R"(matmul_flops_total{device="host",dtype="float32",uuid="host"})"),
      5 * 2.0 * 64 * 64 * 64);
  EXPECT_EQ(s.at(R"(matmul_queued_requests{device="host",uuid="host"})"), 0);
  EXPECT_EQ(
      s.count(
          R"(matmul_transfer_bytes_total{device="host",direction="h2d",uuid="host"})"),
      1u);
  EXPECT_EQ(
      s.count(R"(matmul_pinned_bytes{device="host",state="free",uuid="host"})"),
      1u);
  EXPECT_EQ(
      s.count(R"(matmul_device_memory_used_bytes{device="host",uuid="host"})"),
      1u);
  EXPECT_EQ(
      s.count(
          R"(matmul_device_copy_compute_overlap_seconds_total{device="host",uuid="host"})"),
      1u);
  EXPECT_EQ(s.at("matmul_inflight_requests"), 0);
  EXPECT_EQ(s.at("matmul_inflight_bytes"), 0);
  // Answered, though a call may still be leaving the registry.
  EXPECT_GE(s.at("matmul_oldest_request_seconds"), 0);
  EXPECT_LT(s.at("matmul_oldest_request_seconds"), 10);
  EXPECT_EQ(Sum(s, "matmul_build_info", {"version=\"", "cuda=\""}), 1);

  const HttpReply reply = HttpGet(metrics_port, "/metrics");
  ASSERT_EQ(reply.status, 200);
  EXPECT_THAT(reply.headers,
              HasSubstr("Content-Type: text/plain; version=0.0.4"));
  const auto [status, output] = Promtool(reply.body);
  EXPECT_EQ(status, 0) << "promtool check metrics:\n" << output;
  EXPECT_EQ(output, "") << "promtool check metrics has findings";
}

TEST(MetricsEndpointTest, TimelineServesChromeTraceJson) {
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(LocalOptions(), HostProvider());
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->metrics_port();
  auto stub = Stub((*server)->port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Multiply(*stub, Ones(32, 32, 32, 32)).ok());
  }
  HttpReply reply = HttpGet(port, "/timeline?seconds=30");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_THAT(reply.headers, HasSubstr("Content-Type: application/json"));
  EXPECT_TRUE(absl::StartsWith(reply.body, R"({"traceEvents":[)"));
  EXPECT_THAT(reply.body, HasSubstr(R"("name":"gemm","cat":"compute")"));
  EXPECT_THAT(reply.body, HasSubstr(R"("engine":"host","window_seconds":30)"));
  size_t spans = 0;
  for (size_t at = reply.body.find(R"("ph":"X")"); at != std::string::npos;
       at = reply.body.find(R"("ph":"X")", at + 1)) {
    ++spans;
  }
  EXPECT_EQ(spans, 3u);

  EXPECT_THAT(HttpGet(port, "/timeline").body,
              HasSubstr(R"("window_seconds":2)"));
  EXPECT_THAT(HttpGet(port, "/timeline?seconds=600").body,
              HasSubstr(R"("window_seconds":60)"));
  EXPECT_EQ(HttpGet(port, "/timeline?seconds=soon").status, 400);
  EXPECT_EQ(HttpGet(port, "/nothing-here").status, 404);
  EXPECT_EQ(HttpGet(port, "/").status, 200);
  EXPECT_EQ(HttpRequestRaw(port,
                           "POST /metrics HTTP/1.1\r\n"
                           "Content-Length: 0\r\n\r\n")
                .status,
            405);
  const HttpReply head =
      HttpRequestRaw(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(HttpRequestRaw(port, "nonsense\r\n\r\n").status, 400);
}

// Waits (at most 5 s) until no Multiply holds in-flight bytes.
void WaitUntilIdle(MatmulServer& server) {
  for (int i = 0; i < 500 && server.service().inflight_requests() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(server.service().inflight_requests(), 0);
}

TEST(MetricsEndpointTest, RejectionsAreCountedByReason) {
  FakeEngine* engine = nullptr;
  ServerOptions options = LocalOptions();
  options.limits.max_inflight_bytes = 4096;  // one 16x16 request fits
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(options, FakeProvider(&engine));
  ASSERT_TRUE(server.ok()) << server.status();
  const ServerMetrics& metrics = *(*server)->service().metrics();
  auto stub = Stub((*server)->port());
  const v1::MultiplyRequest request = Ones(16, 16, 16, 16);

  // overloaded: the first holds the byte budget, the second does not fit.
  auto first =
      std::async(std::launch::async, [&] { return Multiply(*stub, request); });
  engine->WaitForHeld(1);
  EXPECT_EQ(Multiply(*stub, request).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // A device fault is an error, not a rejection.
  engine->ReleaseOne(absl::InternalError("device fault"));
  EXPECT_EQ(first.get().error_code(), grpc::StatusCode::INTERNAL);
  // Its bytes stay reserved until the RPC is done on the server too.
  WaitUntilIdle(**server);

  // deadline: queued past the deadline. The deadline leaves the request
  // ample time to reach the engine on a loaded machine under sanitizers (a
  // request that never got there would not be counted).
  {
    auto call = std::async(std::launch::async, [&] {
      return Multiply(*stub, request, std::chrono::seconds(2));
    });
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (engine->held() == 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(engine->held(), 1u) << "the request never reached the engine";
    EXPECT_EQ(call.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // The server's deadline comes a little after the client's (it counts from
  // the request's arrival); a job released before it would simply run.
  for (int i = 0; i < 500 && metrics.rejections(RejectReason::kDeadline) == 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  engine->ReleaseOne();
  WaitUntilIdle(**server);

  // cancelled: the client gives up while the job is held.
  {
    const uint64_t cancelled = metrics.rejections(RejectReason::kCancelled);
    grpc::ClientContext context;
    v1::MultiplyResponse response;
    auto call = std::async(std::launch::async, [&] {
      return stub->Multiply(&context, request, &response);
    });
    engine->WaitForHeld(1);
    context.TryCancel();
    EXPECT_EQ(call.get().error_code(), grpc::StatusCode::CANCELLED);
    // The client knows at once; the server when the cancel arrives. A job
    // released before that would simply run.
    for (int i = 0;
         i < 500 && metrics.rejections(RejectReason::kCancelled) == cancelled;
         ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    engine->ReleaseOne();
  }

  // draining: refused once the server is going away.
  (*server)->service().StartDraining();
  EXPECT_EQ(Multiply(*stub, request).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  const std::map<std::string, double> s = ScrapeUntil(
      (*server)->metrics_port(),
      [](const auto& s) { return Sum(s, "matmul_requests_total") >= 5; });
  EXPECT_EQ(metrics.rejections(RejectReason::kOverloaded), 1u);
  EXPECT_EQ(metrics.rejections(RejectReason::kDeadline), 1u);
  EXPECT_EQ(metrics.rejections(RejectReason::kCancelled), 1u);
  EXPECT_EQ(metrics.rejections(RejectReason::kDraining), 1u);
  EXPECT_EQ(metrics.rejections(RejectReason::kInvalid), 0u);
  EXPECT_EQ(metrics.rejections(RejectReason::kUnavailable), 0u);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="overloaded"})"), 1);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="draining"})"), 1);
  EXPECT_EQ(s.at(R"(matmul_requests_total{code="INTERNAL",method="Multiply"})"),
            1);
  EXPECT_EQ(
      s.at(
          R"(matmul_requests_total{code="RESOURCE_EXHAUSTED",method="Multiply"})"),
      1);
  EXPECT_EQ(
      s.at(R"(matmul_requests_total{code="UNAVAILABLE",method="Multiply"})"),
      1);
  // The server answers CANCELLED both to the cancel and to the deadline
  // (the client reports the latter as DEADLINE_EXCEEDED).
  EXPECT_EQ(Sum(s, "matmul_requests_total", {"method=\"Multiply\""}), 5);
  // The fake engine reports no devices.
  EXPECT_EQ(s.count(R"(matmul_streams{device="0"})"), 0u);
}

// A multiply inside a MultiplyStream passes the same admission core as a
// unary Multiply: it holds the in-flight byte budget while it is open (and
// the scrape shows it), is refused with RESOURCE_EXHAUSTED when the budget
// is spent, and with DEADLINE_EXCEEDED when its deadline cannot be met.
TEST(MetricsEndpointTest, StreamedMultipliesTakeTheSameBudgetAndDeadline) {
  FakeEngine* engine = nullptr;
  ServerOptions options = LocalOptions();
  options.limits.max_inflight_bytes = 4096;  // one 16x16 multiply fits
  absl::StatusOr<std::unique_ptr<MatmulServer>> server = MatmulServer::Start(
      options, [&engine]() -> absl::StatusOr<std::unique_ptr<Engine>> {
        auto fake = std::make_unique<FakeEngine>();
        // Any finite deadline shorter than this is hopeless.
        fake->minimum_duration_ = absl::Seconds(30);
        engine = fake.get();
        return std::unique_ptr<Engine>(std::move(fake));
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const ServerMetrics& metrics = *(*server)->service().metrics();
  const int metrics_port = (*server)->metrics_port();
  auto stub = Stub((*server)->port());
  const v1::MultiplyRequest request = Ones(16, 16, 16, 16);
  auto start = [&](uint64_t id) {
    v1::MultiplyStreamRequest m;
    m.set_request_id(id);
    v1::MultiplyRequest* r = m.mutable_start()->mutable_request();
    *r = request;
    r->mutable_a()->clear_data();
    r->mutable_b()->clear_data();
    return m;
  };
  using Stream = grpc::ClientReaderWriter<v1::MultiplyStreamRequest,
                                          v1::MultiplyStreamResponse>;
  auto read_error = [](Stream& stream, uint64_t id) {
    v1::MultiplyStreamResponse r;
    while (stream.Read(&r)) {
      if (r.request_id() == id && r.has_error()) return r.error();
    }
    ADD_FAILURE() << "no error for request " << id;
    return v1::MultiplyStreamError();
  };

  // Budget: multiply 1 is admitted and held (its allocation waits in the
  // engine): A and B (2 KiB) plus its result chunks in flight (1 KiB).
  {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = stub->MultiplyStream(&context);
    ASSERT_TRUE(stream->Write(start(1)));
    engine->WaitForHeld(1);
    EXPECT_EQ((*server)->service().inflight_bytes().used(), 3072);
    const std::map<std::string, double> held = ScrapeUntil(
        metrics_port,
        [](const auto& s) { return s.count("matmul_inflight_bytes") > 0; });
    ASSERT_EQ(held.count("matmul_inflight_bytes"), 1u);
    EXPECT_EQ(held.at("matmul_inflight_bytes"), 3072);

    // Multiply 2 on the same stream and a unary one: neither fits.
    ASSERT_TRUE(stream->Write(start(2)));
    const v1::MultiplyStreamError refused = read_error(*stream, 2);
    EXPECT_EQ(refused.code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.message(),
                HasSubstr("3072 of 4096 in-flight bytes are in use and this "
                          "streamed multiply needs 3072"));
    grpc::ClientContext unary_context;
    v1::MultiplyResponse unary_response;
    const grpc::Status unary =
        stub->Multiply(&unary_context, request, &unary_response);
    EXPECT_EQ(unary.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(unary.error_message(),
                HasSubstr("3072 of 4096 in-flight bytes are in use and this "
                          "request needs 3072"));
    EXPECT_EQ(metrics.rejections(RejectReason::kOverloaded), 2u);

    // Multiply 1 fails once the server sees the client close its side
    // before sending the operands; its allocation then ends, and its bytes
    // come back.
    stream->WritesDone();
    const v1::MultiplyStreamError closed = read_error(*stream, 1);
    EXPECT_THAT(closed.message(), HasSubstr("closed the stream"));
    engine->ReleaseOne();
    v1::MultiplyStreamResponse rest;
    while (stream->Read(&rest)) {
    }
    EXPECT_TRUE(stream->Finish().ok());
  }
  WaitUntilIdle(**server);
  EXPECT_EQ((*server)->service().inflight_bytes().used(), 0);

  // Deadline: 10 s left, and the engine needs at least 30 s: refused at
  // once, streamed or unary, with the same code and reason.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    std::unique_ptr<Stream> stream = stub->MultiplyStream(&context);
    ASSERT_TRUE(stream->Write(start(3)));
    const v1::MultiplyStreamError refused = read_error(*stream, 3);
    EXPECT_EQ(refused.code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_THAT(refused.message(), HasSubstr("the deadline cannot be met"));
    stream->WritesDone();
    v1::MultiplyStreamResponse rest;
    while (stream->Read(&rest)) {
    }
    EXPECT_TRUE(stream->Finish().ok());
  }
  const grpc::Status unary =
      Multiply(*stub, request, std::chrono::milliseconds(10000));
  EXPECT_EQ(unary.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(unary.error_message(), HasSubstr("the deadline cannot be met"));
  EXPECT_EQ(metrics.rejections(RejectReason::kDeadline), 2u);
  EXPECT_EQ(engine->held(), 0u);  // nothing refused reached the engine

  const std::map<std::string, double> s =
      ScrapeUntil(metrics_port, [](const auto& s) {
        return Sum(s, "matmul_rejected_requests_total") >= 4;
      });
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="overloaded"})"), 2);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="deadline"})"), 2);
  EXPECT_EQ(s.at("matmul_inflight_bytes"), 0);
}

// Refusals that are the request's own doing are counted apart from the
// server's load: a request over the limits is `too_large`, one over its
// client's quota `quota`, a malformed one `invalid`; none is `overloaded`
// (which pages an operator).
TEST(MetricsEndpointTest, RequestFaultsAreCountedApartFromLoad) {
  ServerOptions options = LocalOptions();
  options.limits.max_elements_per_operand = 100;
  options.handle_limits.max_bytes_per_client = 64;
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(options, HostProvider());
  ASSERT_TRUE(server.ok()) << server.status();
  const ServerMetrics& metrics = *(*server)->service().metrics();
  auto stub = Stub((*server)->port());

  const grpc::Status too_large = Multiply(*stub, Ones(16, 16, 16, 16));
  EXPECT_EQ(too_large.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(too_large.error_message(), HasSubstr("over the server's limit"));
  const grpc::Status invalid = Multiply(*stub, Ones(4, 4, 5, 4));
  EXPECT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::UploadRequest upload;
  *upload.mutable_tensor() = Ones(8, 8, 8, 8).a();  // 256 bytes
  grpc::ClientContext context;
  v1::UploadResponse uploaded;
  const grpc::Status quota = stub->Upload(&context, upload, &uploaded);
  EXPECT_EQ(quota.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(quota.error_message(), HasSubstr("64 bytes per client"));

  const std::map<std::string, double> s = ScrapeUntil(
      (*server)->metrics_port(),
      [](const auto& s) { return Sum(s, "matmul_requests_total") >= 3; });
  EXPECT_EQ(metrics.rejections(RejectReason::kTooLarge), 1u);
  EXPECT_EQ(metrics.rejections(RejectReason::kInvalid), 1u);
  EXPECT_EQ(metrics.rejections(RejectReason::kQuota), 1u);
  EXPECT_EQ(metrics.rejections(RejectReason::kOverloaded), 0u);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="too_large"})"), 1);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="quota"})"), 1);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="invalid"})"), 1);
  EXPECT_EQ(
      s.at(
          R"(matmul_requests_total{code="RESOURCE_EXHAUSTED",method="Upload"})"),
      1);
}

// The standard process_* series, read from /proc at scrape time, with
// values that fit this very process.
TEST(MetricsEndpointTest, ProcessSeriesDescribeThisProcess) {
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(LocalOptions(), HostProvider());
  ASSERT_TRUE(server.ok()) << server.status();
  const HttpReply reply = HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_EQ(reply.status, 200);
  const std::map<std::string, double> s = ParseScrape(reply.body);
  EXPECT_THAT(reply.body,
              HasSubstr("# TYPE process_cpu_seconds_total counter"));
  EXPECT_THAT(reply.body,
              HasSubstr("# TYPE process_resident_memory_bytes gauge"));
  EXPECT_GT(s.at("process_cpu_seconds_total"), 0);
  // A gRPC server with a host engine holds more than a few MiB...
  EXPECT_GT(s.at("process_resident_memory_bytes"), 4 << 20);
  EXPECT_GE(s.at("process_virtual_memory_bytes"),
            s.at("process_resident_memory_bytes"));
  // ...and, at least, its listening sockets and stdio open.
  EXPECT_GE(s.at("process_open_fds"), 5);
  EXPECT_LT(s.at("process_open_fds"), s.at("process_max_fds"));
  // It started before this scrape, and not before this test binary did.
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(s.at("process_start_time_seconds"), now + 1);
  EXPECT_GT(s.at("process_start_time_seconds"), now - 3600);
  const auto [status, output] = Promtool(reply.body);
  EXPECT_EQ(status, 0) << "promtool check metrics:\n" << output;
}

// GPU time and bus bytes are charged to the client that asked (the
// x-matmul-client id here), for unary calls and streamed multiplies alike;
// with --metrics-top-clients=2 two clients have labels and the third is
// counted as "other".
TEST(MetricsEndpointTest, UsageIsChargedPerClientAndBoundedByOther) {
  ServerOptions options = LocalOptions();
  options.metrics_top_clients = 2;
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(options, HostProvider());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = absl::StrCat("127.0.0.1:", (*server)->port());
  auto client_for = [&target](const std::string& id) {
    ClientOptions o;
    o.client_id = id;
    absl::StatusOr<std::unique_ptr<MatmulClient>> c =
        MatmulClient::Create(target, o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return std::unique_ptr<MatmulClient>();
    const absl::Status connected =
        (*c)->WaitForConnected(absl::FromChrono(testing::kConnectTimeout));
    EXPECT_TRUE(connected.ok()) << connected;
    return std::move(*c);
  };
  HostTensor t;  // 64 x 64 float32 ones: 16384 bytes
  t.shape = {64, 64};
  t.dtype = DType::kFloat32;
  const float one = 1.0f;
  for (int i = 0; i < 64 * 64; ++i) {
    t.data.append(reinterpret_cast<const char*>(&one), sizeof one);
  }
  constexpr double kBytes = 64 * 64 * 4;

  // alice: two products, an upload and its download.
  auto alice = client_for("alice");
  ASSERT_NE(alice, nullptr);
  ASSERT_TRUE(alice->Multiply(t, t).ok());
  ASSERT_TRUE(alice->Multiply(t, t).ok());
  absl::StatusOr<StoredTensor> stored = alice->Upload(t);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_TRUE(alice->Download(stored->id).ok());
  // bob: one streamed product in 4 KiB chunks (operands uploaded into a
  // device buffer, the product kept there and downloaded).
  auto bob = client_for("bob");
  ASSERT_NE(bob, nullptr);
  absl::StatusOr<HostTensor> streamed = bob->MultiplyStreamed(t, t, {}, 4096);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  // carol: one product, beyond the two labelled clients.
  auto carol = client_for("carol");
  ASSERT_NE(carol, nullptr);
  ASSERT_TRUE(carol->Multiply(t, t).ok());

  // Usage is recorded when the job is done, before the reply goes out.
  // Which two clients are the heaviest depends on measured times; that
  // there are two, "other" beside them, and that the series sum to every
  // client's bytes does not.
  const std::map<std::string, double> s =
      ParseScrape(HttpGet((*server)->metrics_port(), "/metrics").body);
  std::vector<std::string> labels;
  const std::string prefix = R"(matmul_client_gpu_seconds_total{client=")";
  for (const auto& [key, value] : s) {
    if (key.rfind(prefix, 0) != 0) continue;
    labels.push_back(key.substr(prefix.size(), key.size() - prefix.size() - 2));
    EXPECT_GE(value, 0) << key;
  }
  ASSERT_EQ(labels.size(), 3u);
  EXPECT_NE(std::find(labels.begin(), labels.end(), "other"), labels.end());
  auto bytes = [&s](const std::string& client, const char* direction) {
    return s.at(absl::StrCat(R"(matmul_client_bytes_total{client=")", client,
                             R"(",direction=")", direction, R"("})"));
  };
  double h2d = 0;
  double d2h = 0;
  for (const std::string& client : labels) {
    h2d += bytes(client, "h2d");
    d2h += bytes(client, "d2h");
  }
  // alice 2 x (A, B) + an upload, bob (A, B), carol (A, B); products back
  // to alice twice (and her download), to bob and to carol once.
  EXPECT_EQ(h2d, (2 * 2 + 1 + 2 + 2) * kBytes);
  EXPECT_EQ(d2h, (2 + 1 + 1 + 1) * kBytes);
}

TEST(MetricsEndpointTest, NoAddressNoMetricsPort) {
  ServerOptions options = LocalOptions();
  options.metrics_address.clear();
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(options, HostProvider());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->metrics_port(), 0);
}

TEST(MetricsEndpointTest, MetricsPortInUseFailsStart) {
  absl::StatusOr<std::unique_ptr<MatmulServer>> first =
      MatmulServer::Start(LocalOptions(), HostProvider());
  ASSERT_TRUE(first.ok()) << first.status();
  ServerOptions options = LocalOptions();
  options.metrics_address =
      absl::StrCat("127.0.0.1:", (*first)->metrics_port());
  absl::StatusOr<std::unique_ptr<MatmulServer>> second =
      MatmulServer::Start(options, HostProvider());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("cannot serve metrics"));
}

}  // namespace
}  // namespace matmul
