// A failed device takes the pod out of the rotation: a real MatmulServer on
// 127.0.0.1:0 over an engine whose devices fail on the test's word (as the
// CUDA engine fails a device on a sticky error; tests/gpu covers that part
// on a GPU), checked with a real grpc.health.v1 client, real Multiply calls
// and a real scrape of /metrics.
//
//   one device of two fails   health stays SERVING, the other device takes
//                             every request, matmul_device_healthy shows 0
//                             for the failed one (with its UUID)
//   every device fails        readiness, "" and the service go NOT_SERVING,
//                             liveness stays SERVING; requests are answered
//                             UNAVAILABLE and counted as reason="no_device"
//   ... for long enough       liveness goes NOT_SERVING too
//                             (ServerOptions::unhealthy_restart_after)
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gpu/host/host_engine.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/matmul_server.h"
#include "tests/health_check.h"
#include "tests/metrics/scrape_client.h"

namespace matmul {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using testing::HttpGet;
using testing::ParseScrape;
using testing::ScrapeUntil;

// The host engine, seen as `devices` devices ("0", "1", ... with GPU-style
// UUIDs) that the test can fail. Like the CUDA engine, it sends no job to a
// failed device, and answers UNAVAILABLE when none is left.
class FailableEngine final : public Engine {
 public:
  FailableEngine(std::unique_ptr<Engine> inner, int devices)
      : inner_(std::move(inner)), healthy_(devices) {
    for (auto& h : healthy_) h.store(true);
    info_ = inner_->info();
    info_.name = "failable";
    info_.devices.clear();
    for (int d = 0; d < devices; ++d) {
      DeviceInfo device;
      device.index = d;
      device.uuid = Uuid(d);
      info_.devices.push_back(device);
    }
  }

  static std::string Uuid(int d) {
    return absl::StrCat("GPU-0000000", d, "-aaaa-bbbb-cccc-dddddddddddd");
  }

  void SetHealthy(int device, bool healthy) { healthy_[device].store(healthy); }

  const EngineInfo& info() const override { return info_; }
  absl::Status CheckFits(const MatmulSpec& spec) const override {
    return inner_->CheckFits(spec);
  }
  void Submit(std::unique_ptr<MatmulJob> job) override {
    for (const auto& h : healthy_) {
      if (h.load()) {
        inner_->Submit(std::move(job));
        return;
      }
    }
    job->Done(absl::UnavailableError(
        "no healthy GPU can take the request (see the server log)"));
  }
  EngineStats stats() const override {
    const EngineStats inner = inner_->stats();
    EngineStats out;
    for (size_t d = 0; d < healthy_.size(); ++d) {
      DeviceStats device = inner.devices.at(0);
      device.label = absl::StrCat(d);
      device.uuid = Uuid(static_cast<int>(d));
      device.healthy = healthy_[d].load();
      out.devices.push_back(std::move(device));
    }
    return out;
  }
  std::vector<StreamSpan> RecentSpans(absl::Duration window) const override {
    return inner_->RecentSpans(window);
  }
  absl::StatusOr<HostBuffer> AllocateHostBuffer(int64_t bytes) override {
    return inner_->AllocateHostBuffer(bytes);
  }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  const std::unique_ptr<Engine> inner_;
  std::vector<std::atomic<bool>> healthy_;
  EngineInfo info_;
};

struct Fixture {
  std::unique_ptr<MatmulServer> server;
  FailableEngine* engine = nullptr;
  std::shared_ptr<grpc::Channel> channel;
};

Fixture StartServer(int devices, absl::Duration restart_after) {
  Fixture f;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  options.drain_timeout = absl::Seconds(10);
  options.health_check_interval = absl::Milliseconds(10);
  options.unhealthy_restart_after = restart_after;
  FailableEngine** out = &f.engine;
  absl::StatusOr<std::unique_ptr<MatmulServer>> server = MatmulServer::Start(
      options, [out, devices]() -> absl::StatusOr<std::unique_ptr<Engine>> {
        absl::StatusOr<std::unique_ptr<HostEngine>> host =
            HostEngine::Create(HostEngineOptions{2});
        if (!host.ok()) return host.status();
        auto engine =
            std::make_unique<FailableEngine>(std::move(*host), devices);
        *out = engine.get();
        return std::unique_ptr<Engine>(std::move(engine));
      });
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return f;
  f.server = std::move(*server);
  f.channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", f.server->port()),
                                  grpc::InsecureChannelCredentials());
  return f;
}

using testing::Health;

// Asks until `service` reports `want`, at most 10 s (the monitor looks
// every 10 ms); the last answer.
HealthCheckResponse::ServingStatus AwaitHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
    HealthCheckResponse::ServingStatus want) {
  HealthCheckResponse::ServingStatus got = Health(channel, service);
  for (int i = 0; i < 1000 && got != want; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    got = Health(channel, service);
  }
  return got;
}

grpc::StatusCode MultiplyOnes(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::MatmulService::NewStub(channel);
  v1::MultiplyRequest request;
  for (v1::Tensor* t : {request.mutable_a(), request.mutable_b()}) {
    t->add_shape(8);
    t->add_shape(8);
    t->set_dtype(v1::DTYPE_FLOAT32);
    const float one = 1.0f;
    std::string data;
    for (int i = 0; i < 64; ++i) {
      data.append(reinterpret_cast<const char*>(&one), sizeof one);
    }
    t->set_data(data);
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  v1::MultiplyResponse response;
  return stub->Multiply(&context, request, &response).error_code();
}

std::string HealthyKey(int device) {
  return absl::StrCat(R"(matmul_device_healthy{device=")", device,
                      R"(",uuid=")", FailableEngine::Uuid(device), R"("})");
}

constexpr auto kServing = HealthCheckResponse::SERVING;
constexpr auto kNotServing = HealthCheckResponse::NOT_SERVING;

TEST(DeviceHealthTest, OneFailedDeviceOfTwoShrinksCapacityAndShows) {
  Fixture f = StartServer(2, absl::Hours(1));
  ASSERT_NE(f.server, nullptr);
  const int metrics = f.server->metrics_port();
  std::map<std::string, double> s =
      ParseScrape(HttpGet(metrics, "/metrics").body);
  EXPECT_EQ(s.at(HealthyKey(0)), 1);
  EXPECT_EQ(s.at(HealthyKey(1)), 1);

  f.engine->SetHealthy(1, false);
  s = ScrapeUntil(metrics, [](const auto& s) {
    return s.count(HealthyKey(1)) == 1 && s.at(HealthyKey(1)) == 0;
  });
  EXPECT_EQ(s.at(HealthyKey(0)), 1);
  EXPECT_EQ(s.at(HealthyKey(1)), 0);
  // The device is in the other per-device series too, under its UUID.
  EXPECT_EQ(s.count(absl::StrCat(R"(matmul_streams{device="1",uuid=")",
                                 FailableEngine::Uuid(1), R"("})")),
            1u);
  // Several looks of the monitor later, the pod is still in the rotation.
  absl::SleepFor(absl::Milliseconds(100));
  for (const char* service :
       {"", kServiceName, kReadinessService, kLivenessService}) {
    EXPECT_EQ(Health(f.channel, service), kServing) << service;
  }
  EXPECT_EQ(MultiplyOnes(f.channel), grpc::StatusCode::OK);
}

TEST(DeviceHealthTest, NoHealthyDeviceTurnsReadinessNotServing) {
  Fixture f = StartServer(1, absl::Hours(1));
  ASSERT_NE(f.server, nullptr);
  EXPECT_EQ(Health(f.channel, kReadinessService), kServing);
  EXPECT_EQ(MultiplyOnes(f.channel), grpc::StatusCode::OK);

  f.engine->SetHealthy(0, false);
  EXPECT_EQ(AwaitHealth(f.channel, kReadinessService, kNotServing),
            kNotServing);
  EXPECT_EQ(Health(f.channel, ""), kNotServing);
  EXPECT_EQ(Health(f.channel, kServiceName), kNotServing);
  // The process itself is fine: liveness waits for unhealthy_restart_after.
  EXPECT_EQ(Health(f.channel, kLivenessService), kServing);
  // A request that still comes is answered UNAVAILABLE (retryable
  // elsewhere) and counted apart from the drain.
  EXPECT_EQ(MultiplyOnes(f.channel), grpc::StatusCode::UNAVAILABLE);
  const int metrics = f.server->metrics_port();
  std::map<std::string, double> s = ScrapeUntil(metrics, [](const auto& s) {
    return testing::Sum(s, "matmul_requests_total",
                        {R"(code="UNAVAILABLE")"}) >= 1;
  });
  EXPECT_EQ(s.at(HealthyKey(0)), 0);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="no_device"})"), 1);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="draining"})"), 0);

  // Should the device come back, so does the pod.
  f.engine->SetHealthy(0, true);
  EXPECT_EQ(AwaitHealth(f.channel, kReadinessService, kServing), kServing);
  EXPECT_EQ(Health(f.channel, ""), kServing);
  EXPECT_EQ(MultiplyOnes(f.channel), grpc::StatusCode::OK);
}

TEST(DeviceHealthTest, LivenessFailsOnceUnhealthyForTheConfiguredTime) {
  Fixture f = StartServer(1, absl::Milliseconds(200));
  ASSERT_NE(f.server, nullptr);
  EXPECT_EQ(Health(f.channel, kLivenessService), kServing);
  f.engine->SetHealthy(0, false);
  EXPECT_EQ(AwaitHealth(f.channel, kLivenessService, kNotServing), kNotServing);
  EXPECT_EQ(Health(f.channel, kReadinessService), kNotServing);
}

// unhealthy_restart_after zero: readiness follows the devices, liveness
// never fails for them.
TEST(DeviceHealthTest, ZeroRestartAfterKeepsLivenessUp) {
  Fixture f = StartServer(1, absl::ZeroDuration());
  ASSERT_NE(f.server, nullptr);
  f.engine->SetHealthy(0, false);
  EXPECT_EQ(AwaitHealth(f.channel, kReadinessService, kNotServing),
            kNotServing);
  absl::SleepFor(absl::Milliseconds(100));  // ten looks of the monitor
  EXPECT_EQ(Health(f.channel, kLivenessService), kServing);
}

// The drain's NOT_SERVING is not undone by the monitor, and a drain ends a
// pod without a healthy device as it ends any other.
TEST(DeviceHealthTest, ShutdownWithAFailedDeviceDrainsCleanly) {
  Fixture f = StartServer(1, absl::Hours(1));
  ASSERT_NE(f.server, nullptr);
  f.engine->SetHealthy(0, false);
  EXPECT_EQ(AwaitHealth(f.channel, kReadinessService, kNotServing),
            kNotServing);
  f.server->Shutdown();
  f.server.reset();
}

}  // namespace
}  // namespace matmul
