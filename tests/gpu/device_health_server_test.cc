// The whole path of a GPU failure on a real GPU: a MatmulServer on
// 127.0.0.1:0 over the CUDA engine, whose device a sticky error (injected
// through FaultInjector::Point::kContext) fails while a request runs. The
// request fails INTERNAL; the server's health, asked by a real
// grpc.health.v1 client, turns NOT_SERVING (liveness stays up until
// unhealthy_restart_after); /metrics shows matmul_device_healthy at 0 under
// the GPU's UUID; the next request is answered UNAVAILABLE and counted as
// reason="no_device". GTEST_SKIP without a GPU.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/device_registry.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/matmul_server.h"
#include "tests/health_check.h"
#include "tests/metrics/scrape_client.h"

namespace matmul {
namespace {

using ::grpc::health::v1::HealthCheckResponse;

// Once armed, breaks the context at the next job's completion.
class ArmedContextFault final : public FaultInjector {
 public:
  void Arm() { armed_.store(true); }
  absl::Status Inject(Point point, int64_t) override {
    if (point == Point::kContext && armed_.exchange(false)) {
      return absl::InternalError(
          "injected: cudaErrorIllegalAddress (sticky; the context is lost)");
    }
    return absl::OkStatus();
  }

 private:
  std::atomic<bool> armed_{false};
};

using testing::Health;

grpc::Status MultiplyOnes(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::MatmulService::NewStub(channel);
  v1::MultiplyRequest request;
  for (v1::Tensor* t : {request.mutable_a(), request.mutable_b()}) {
    t->add_shape(256);
    t->add_shape(256);
    t->set_dtype(v1::DTYPE_FLOAT32);
    const float one = 1.0f;
    std::string data;
    for (int i = 0; i < 256 * 256; ++i) {
      data.append(reinterpret_cast<const char*>(&one), sizeof one);
    }
    t->set_data(data);
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  v1::MultiplyResponse response;
  return stub->Multiply(&context, request, &response);
}

TEST(DeviceHealthServerTest, FailedGpuTurnsHealthNotServingAndGaugeZero) {
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU";
  ArmedContextFault fault;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  options.drain_timeout = absl::Seconds(10);
  options.health_check_interval = absl::Milliseconds(10);
  options.unhealthy_restart_after = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<MatmulServer>> server = MatmulServer::Start(
      options, [&fault]() -> absl::StatusOr<std::unique_ptr<Engine>> {
        CudaEngineOptions cuda;
        cuda.devices = {0};  // one device: its failure leaves none
        cuda.streams_per_device = 2;
        cuda.pinned_pool_bytes = int64_t{256} << 20;
        cuda.fault_injector = &fault;
        absl::StatusOr<std::unique_ptr<CudaEngine>> engine =
            CudaEngine::Create(cuda);
        if (!engine.ok()) return engine.status();
        return std::unique_ptr<Engine>(std::move(*engine));
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string uuid = (*server)->engine().info().devices.at(0).uuid;
  ASSERT_EQ(uuid.rfind("GPU-", 0), 0u) << uuid;
  const std::string gauge =
      absl::StrCat(R"(matmul_device_healthy{device="0",uuid=")", uuid, R"("})");
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                          grpc::InsecureChannelCredentials());
  const int metrics = (*server)->metrics_port();

  ASSERT_TRUE(MultiplyOnes(channel).ok());
  EXPECT_EQ(Health(channel, kReadinessService), HealthCheckResponse::SERVING);
  EXPECT_EQ(testing::ParseScrape(testing::HttpGet(metrics, "/metrics").body)
                .at(gauge),
            1);

  fault.Arm();
  const grpc::Status broken = MultiplyOnes(channel);
  EXPECT_EQ(broken.error_code(), grpc::StatusCode::INTERNAL)
      << broken.error_message();
  EXPECT_NE(broken.error_message().find("GPU 0 failed"), std::string::npos)
      << broken.error_message();

  HealthCheckResponse::ServingStatus ready = Health(channel, kReadinessService);
  for (int i = 0; i < 1000 && ready != HealthCheckResponse::NOT_SERVING; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    ready = Health(channel, kReadinessService);
  }
  EXPECT_EQ(ready, HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(channel, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(channel, kLivenessService), HealthCheckResponse::SERVING);

  EXPECT_EQ(MultiplyOnes(channel).error_code(), grpc::StatusCode::UNAVAILABLE);
  const std::map<std::string, double> s =
      testing::ScrapeUntil(metrics, [](const auto& s) {
        return testing::Sum(s, "matmul_requests_total",
                            {R"(code="UNAVAILABLE")"}) >= 1;
      });
  EXPECT_EQ(s.at(gauge), 0);
  EXPECT_EQ(s.at(R"(matmul_rejected_requests_total{reason="no_device"})"), 1);
  EXPECT_EQ(s.at(R"(matmul_requests_total{code="INTERNAL",method="Multiply"})"),
            1);
  std::printf("device 0 %s failed: health NOT_SERVING, gauge 0\n",
              uuid.c_str());
}

}  // namespace
}  // namespace matmul
