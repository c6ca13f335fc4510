// Integration tests: a real MatmulServer on 127.0.0.1:0, real gRPC clients.
// Every status code the server can return is provoked here.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gpu/engine_factory.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/matmul_server.h"
#include "server/request_validation.h"
#include "server/server_metrics.h"
#include "server/staging_copier.h"
#include "tests/channel_ready.h"
#include "tests/engine_under_test.h"
#include "tests/fake_engine.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using testing::FakeEngine;
using ::testing::HasSubstr;

// The engine these tests run against (tests/engine_under_test.h).
using testing::EngineUnderTest;

MatmulServer::EngineProvider HostProvider(int lanes = 4) {
  return testing::EngineUnderTestProvider(lanes, int64_t{1} << 30);
}

// Host engine results report device -1; GPUs report their index.
void ExpectPlacement(const v1::MultiplyResponse& response) {
  if (EngineUnderTest() == "host") {
    EXPECT_EQ(response.placement().device(), -1);
  } else {
    EXPECT_GE(response.placement().device(), 0);
  }
}

// Hands a FakeEngine to the server while the test keeps a pointer to it.
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
  options.drain_timeout = absl::Seconds(10);
  return options;
}

std::unique_ptr<MatmulServer> StartOrDie(const ServerOptions& options,
                                         MatmulServer::EngineProvider p) {
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(options, std::move(p));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// A plaintext channel to 127.0.0.1:`port`, not yet connected: for tests of
// what happens when it cannot connect.
std::shared_ptr<grpc::Channel> UnconnectedChannel(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

// The same, connected (bounded): a fresh channel's first connect can fail
// by chance (tests/channel_ready.h), and these tests look at the server's
// answers.
std::shared_ptr<grpc::Channel> Channel(int port) {
  return testing::Connected(UnconnectedChannel(port));
}

v1::Tensor RandomTensor(DType dtype, std::vector<int64_t> shape,
                        absl::BitGen& gen) {
  v1::Tensor t;
  int64_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= d;
  }
  t.set_dtype(DTypeToProto(dtype));
  t.set_data(testing::RandomBytes(dtype, n, gen));
  return t;
}

v1::MultiplyRequest RandomRequest(DType dtype, std::vector<int64_t> a_shape,
                                  std::vector<int64_t> b_shape,
                                  absl::BitGen& gen) {
  v1::MultiplyRequest r;
  *r.mutable_a() = RandomTensor(dtype, a_shape, gen);
  *r.mutable_b() = RandomTensor(dtype, b_shape, gen);
  return r;
}

// Checks a response against the float64 reference.
void ExpectCorrect(const v1::MultiplyRequest& request,
                   const v1::MultiplyResponse& response) {
  absl::StatusOr<MatmulSpec> spec =
      ValidateMultiplyRequest(request, RequestLimits());
  ASSERT_TRUE(spec.ok()) << spec.status();
  const DType dtype = spec->dtype;
  std::vector<int64_t> want_shape;
  if (spec->c_is_3d) want_shape.push_back(spec->batch);
  want_shape.push_back(spec->m);
  want_shape.push_back(spec->n);
  EXPECT_THAT(response.c().shape(), ::testing::ElementsAreArray(want_shape));
  EXPECT_EQ(response.c().dtype(), request.a().dtype());
  ASSERT_EQ(static_cast<int64_t>(response.c().data().size()), spec->c_bytes());
  // Against the size of the terms: the cases include one-element products
  // of random dot products, which can cancel to near zero.
  EXPECT_LT(testing::ProductError(
                *spec,
                testing::ToDoubles(dtype, request.a().data().data(),
                                   spec->a_elements()),
                testing::ToDoubles(dtype, request.b().data().data(),
                                   spec->b_elements()),
                testing::ToDoubles(dtype, response.c().data().data(),
                                   spec->c_elements())),
            testing::Tolerance(dtype, spec->compute));
}

HealthCheckResponse::ServingStatus Health(grpc::Channel& channel,
                                          const std::string& service,
                                          grpc::StatusCode* code = nullptr) {
  auto stub = grpc::health::v1::Health::NewStub(
      std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (code != nullptr) *code = status.error_code();
  return response.status();
}

grpc::Status Multiply(
    v1::MatmulService::Stub& stub, const v1::MultiplyRequest& request,
    v1::MultiplyResponse* response,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(30000)) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  return stub.Multiply(&context, request, response);
}

// `threads` clients on one channel, each sending the `per_thread`
// requests `make(thread, i, gen)` one after another and checking every
// product; returns how many were answered OK.
int MultiplyFromThreads(
    const std::shared_ptr<grpc::Channel>& channel, int threads, int per_thread,
    const std::function<v1::MultiplyRequest(int, int, absl::BitGen&)>& make) {
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&, t] {
      auto stub = v1::MatmulService::NewStub(channel);
      absl::BitGen gen;
      for (int i = 0; i < per_thread; ++i) {
        const v1::MultiplyRequest request = make(t, i, gen);
        v1::MultiplyResponse response;
        grpc::Status status = Multiply(*stub, request, &response);
        EXPECT_TRUE(status.ok()) << status.error_message();
        ExpectCorrect(request, response);
        if (status.ok()) ++ok;
      }
    });
  }
  for (std::thread& c : clients) c.join();
  return ok.load();
}

TEST(ServerTest, MultipliesEveryDtypeAndShapeCorrectly) {
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  struct Case {
    std::vector<int64_t> a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{1, 1}, {1, 1}, false, false},       {{1, 17}, {17, 1}, false, false},
      {{31, 7}, {7, 29}, false, false},     {{7, 31}, {29, 7}, true, true},
      {{3, 5, 6}, {3, 6, 4}, false, false}, {{3, 5, 6}, {6, 4}, false, false},
      {{5, 6}, {3, 6, 4}, false, false},    {{1, 6, 5}, {3, 4, 6}, true, true},
  };
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (const Case& c : cases) {
      v1::MultiplyRequest request = RandomRequest(dtype, c.a, c.b, gen);
      request.set_transpose_a(c.ta);
      request.set_transpose_b(c.tb);
      v1::MultiplyResponse response;
      grpc::Status status = Multiply(*stub, request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      ExpectCorrect(request, response);
      ExpectPlacement(response);
    }
  }
}

TEST(ServerTest, ConcurrentRequestsFromManyThreadsAreAllCorrect) {
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(server, nullptr);
  const int ok = MultiplyFromThreads(
      Channel(server->port()), 8, 10, [](int t, int i, absl::BitGen& gen) {
        const int64_t m = 1 + (t * 7 + i * 13) % 40;
        const int64_t k = 1 + (t * 3 + i * 5) % 30;
        const int64_t n = 1 + (t * 11 + i) % 50;
        return RandomRequest(DType::kFloat32, {m, k}, {k, n}, gen);
      });
  EXPECT_EQ(ok, 80);
  // The last reactors go just after their replies reach the clients.
  for (int i = 0; i < 100 && server->service().inflight_requests() != 0; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server->service().inflight_requests(), 0);
  EXPECT_EQ(server->service().inflight_bytes().used(), 0);
}

TEST(ServerTest, GetServerInfoDescribesEngineAndLimits) {
  ServerOptions options = LocalOptions();
  options.limits.max_message_bytes = 123456789;
  options.limits.max_inflight_bytes = 987654321;
  std::unique_ptr<MatmulServer> server = StartOrDie(options, HostProvider(3));
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  grpc::ClientContext context;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(
      stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.engine(), EngineUnderTest());
  EXPECT_FALSE(info.version().empty());
  EXPECT_EQ(info.streams_per_device(), 3);
  ASSERT_GE(info.devices_size(), 1);
  EXPECT_EQ(info.devices(0).index(), EngineUnderTest() == "host" ? -1 : 0);
  EXPECT_FALSE(info.devices(0).name().empty());
  EXPECT_EQ(info.dtypes_size(), 4);
  EXPECT_EQ(info.limits().max_message_bytes(), 123456789);
  EXPECT_EQ(info.limits().max_inflight_bytes(), 987654321);
  EXPECT_EQ(info.limits().max_elements_per_operand(),
            RequestLimits().max_elements_per_operand);
  EXPECT_EQ(info.limits().max_dimension(), RequestLimits().max_dimension);
  // No --max-stored-bytes: the default follows the engine's memory, and the
  // per-client quota in effect (64 GiB asked) is never above it.
  EXPECT_EQ(info.limits().max_stored_bytes(),
            DefaultStoredBytes(server->engine().info()));
  EXPECT_GT(info.limits().max_stored_bytes(), 0);
  EXPECT_LE(info.limits().max_stored_bytes_per_client(),
            info.limits().max_stored_bytes());
}

TEST(ServerTest, HealthIsNotServingUntilTheEngineIsReady) {
  absl::Notification listening;
  absl::Notification engine_may_start;
  std::atomic<int> port{0};
  ServerOptions options = LocalOptions();
  options.on_listening = [&](int p) {
    port = p;
    listening.Notify();
  };
  auto started = std::async(std::launch::async, [&] {
    return MatmulServer::Start(
        options, [&]() -> absl::StatusOr<std::unique_ptr<Engine>> {
          engine_may_start.WaitForNotification();
          return HostProvider()();
        });
  });
  listening.WaitForNotification();
  auto channel = Channel(port);
  EXPECT_EQ(Health(*channel, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(*channel, kServiceName), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(*channel, kReadinessService),
            HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(*channel, kLivenessService), HealthCheckResponse::SERVING);
  auto stub = v1::MatmulService::NewStub(channel);
  absl::BitGen gen;
  v1::MultiplyResponse response;
  grpc::Status status = Multiply(
      *stub, RandomRequest(DType::kFloat32, {2, 2}, {2, 2}, gen), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("engine is still starting"));
  grpc::ClientContext info_context;
  v1::GetServerInfoResponse info;
  EXPECT_EQ(stub->GetServerInfo(&info_context, {}, &info).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  engine_may_start.Notify();
  absl::StatusOr<std::unique_ptr<MatmulServer>> server = started.get();
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(Health(*channel, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(*channel, kServiceName), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(*channel, kReadinessService), HealthCheckResponse::SERVING);
  grpc::StatusCode code;
  Health(*channel, "no.such.Service", &code);
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
}

TEST(ServerTest, EngineThatFailsToStartFailsStart) {
  absl::StatusOr<std::unique_ptr<MatmulServer>> server = MatmulServer::Start(
      LocalOptions(), []() -> absl::StatusOr<std::unique_ptr<Engine>> {
        return absl::FailedPreconditionError("no GPU");
      });
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ServerTest, PortInUseFailsStart) {
  std::unique_ptr<MatmulServer> first =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(first, nullptr);
  ServerOptions options = LocalOptions();
  options.listen_address = absl::StrCat("127.0.0.1:", first->port());
  absl::StatusOr<std::unique_ptr<MatmulServer>> second =
      MatmulServer::Start(options, HostProvider());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("cannot listen on"));
}

TEST(ServerTest, InvalidRequestsGetInvalidArgumentAndTheServerKeepsServing) {
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  v1::MultiplyResponse response;

  grpc::Status empty = Multiply(*stub, v1::MultiplyRequest(), &response);
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty.error_message(), HasSubstr("a and b: required"));

  grpc::Status inner = Multiply(
      *stub, RandomRequest(DType::kFloat32, {3, 4}, {5, 6}, gen), &response);
  EXPECT_EQ(inner.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(inner.error_message(), HasSubstr("inner dimensions differ"));

  v1::MultiplyRequest short_data =
      RandomRequest(DType::kFloat64, {3, 4}, {4, 5}, gen);
  short_data.mutable_b()->mutable_data()->pop_back();
  grpc::Status bytes = Multiply(*stub, short_data, &response);
  EXPECT_EQ(bytes.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bytes.error_message(), HasSubstr("b.data: expected 160 bytes"));

  v1::MultiplyRequest mixed =
      RandomRequest(DType::kFloat32, {2, 2}, {2, 2}, gen);
  mixed.mutable_b()->set_dtype(v1::DTYPE_FLOAT16);
  grpc::Status dtypes = Multiply(*stub, mixed, &response);
  EXPECT_EQ(dtypes.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(dtypes.error_message(), HasSubstr("b.dtype"));

  v1::MultiplyRequest good =
      RandomRequest(DType::kFloat32, {4, 4}, {4, 4}, gen);
  ASSERT_TRUE(Multiply(*stub, good, &response).ok());
  ExpectCorrect(good, response);
}

TEST(ServerTest, OversizedRequestsGetResourceExhausted) {
  ServerOptions options = LocalOptions();
  options.limits.max_message_bytes = 1 << 20;
  options.limits.max_elements_per_operand = 10000;
  std::unique_ptr<MatmulServer> server = StartOrDie(options, HostProvider());
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  v1::MultiplyResponse response;

  // Over the element limit: refused by validation, with the numbers.
  grpc::Status elements =
      Multiply(*stub, RandomRequest(DType::kFloat32, {101, 100}, {100, 2}, gen),
               &response);
  EXPECT_EQ(elements.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(elements.error_message(),
              HasSubstr("10100 elements, over the server's limit of 10000"));

  // Over the message limit: refused by gRPC before any parsing.
  v1::MultiplyRequest big;
  big.mutable_a()->set_data(std::string(2 << 20, 'x'));
  grpc::Status message = Multiply(*stub, big, &response);
  EXPECT_EQ(message.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  v1::MultiplyRequest good =
      RandomRequest(DType::kFloat32, {8, 8}, {8, 8}, gen);
  ASSERT_TRUE(Multiply(*stub, good, &response).ok());
  ExpectCorrect(good, response);
}

TEST(ServerTest, EngineRefusalPassesThrough) {
  FakeEngine* engine = nullptr;
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  engine->fits_status_ = absl::ResourceExhaustedError(
      "needs 200 GiB of device memory; the largest GPU has 141 GiB");
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  v1::MultiplyResponse response;
  grpc::Status status = Multiply(
      *stub, RandomRequest(DType::kFloat32, {2, 2}, {2, 2}, gen), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("200 GiB"));
}

TEST(ServerTest, InflightByteBudgetRefusesWhatDoesNotFit) {
  FakeEngine* engine = nullptr;
  ServerOptions options = LocalOptions();
  // One 16x16 float32 request holds 3 KiB (A, B and C); two do not fit.
  options.limits.max_inflight_bytes = 4096;
  std::unique_ptr<MatmulServer> server =
      StartOrDie(options, FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  auto channel = Channel(server->port());
  auto stub = v1::MatmulService::NewStub(channel);
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat32, {16, 16}, {16, 16}, gen);
  v1::MultiplyResponse first_response;
  auto first = std::async(std::launch::async, [&] {
    return Multiply(*stub, request, &first_response);
  });
  engine->WaitForHeld(1);
  EXPECT_EQ(server->service().inflight_bytes().used(), 3072);

  v1::MultiplyResponse response;
  grpc::Status second = Multiply(*stub, request, &response);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.error_message(),
              HasSubstr("3072 of 4096 in-flight bytes are in use and this "
                        "request needs 3072"));

  engine->ReleaseOne();
  ASSERT_TRUE(first.get().ok());
  ExpectCorrect(request, first_response);
  // OnDone runs just after the client sees the reply.
  for (int i = 0; i < 100 && server->service().inflight_bytes().used() != 0;
       ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server->service().inflight_bytes().used(), 0);
  EXPECT_EQ(server->service().inflight_requests(), 0);
}

TEST(ServerTest, DeviceFaultFailsOneRequestWithInternal) {
  FakeEngine* engine = nullptr;
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat32, {8, 8}, {8, 8}, gen);
  v1::MultiplyResponse bad_response;
  auto bad = std::async(std::launch::async, [&] {
    return Multiply(*stub, request, &bad_response);
  });
  engine->WaitForHeld(1);
  v1::MultiplyResponse good_response;
  auto good = std::async(std::launch::async, [&] {
    return Multiply(*stub, request, &good_response);
  });
  engine->WaitForHeld(2);
  engine->ReleaseOne(absl::InternalError(
      "cublasGemmEx failed: CUBLAS_STATUS_EXECUTION_FAILED"));
  engine->ReleaseOne();
  grpc::Status bad_status = bad.get();
  EXPECT_EQ(bad_status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(bad_status.error_message(), HasSubstr("CUBLAS_STATUS_EXECUTION"));
  ASSERT_TRUE(good.get().ok());
  ExpectCorrect(request, good_response);
}

TEST(ServerTest, DeadlineExceededWhileQueued) {
  FakeEngine* engine = nullptr;
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));  // connected
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat32, {8, 8}, {8, 8}, gen);
  v1::MultiplyResponse response;
  // The deadline leaves the request ample time to reach the engine on a
  // loaded machine under sanitizers (it once had 300 ms, first connect
  // included); the engine then holds it past the deadline.
  auto call = std::async(std::launch::async, [&] {
    return Multiply(*stub, request, &response, std::chrono::seconds(2));
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (engine->held() == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(engine->held(), 1u) << "the request never reached the engine";
  const grpc::Status status = call.get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << status.error_message();
  // The engine then finds the job abandoned and drops it unstaged.
  EXPECT_EQ(engine->held(), 1u);
  engine->ReleaseOne();
  for (int i = 0; i < 100 && server->service().inflight_requests() != 0; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server->service().inflight_requests(), 0);
  EXPECT_EQ(server->service().inflight_bytes().used(), 0);
}

TEST(ServerTest, ClientCancellationFreesTheRequest) {
  FakeEngine* engine = nullptr;
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat32, {8, 8}, {8, 8}, gen);
  grpc::ClientContext context;
  v1::MultiplyResponse response;
  auto call = std::async(std::launch::async, [&] {
    return stub->Multiply(&context, request, &response);
  });
  engine->WaitForHeld(1);
  context.TryCancel();
  EXPECT_EQ(call.get().error_code(), grpc::StatusCode::CANCELLED);
  engine->ReleaseOne();
  for (int i = 0; i < 100 && server->service().inflight_requests() != 0; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server->service().inflight_requests(), 0);
  EXPECT_EQ(server->service().inflight_bytes().used(), 0);
}

TEST(ServerTest, ShutdownDrainsInflightAndRefusesNewRequests) {
  FakeEngine* engine = nullptr;
  ServerOptions options = LocalOptions();
  // The health checks below must all be answered inside the grace: ample
  // on a loaded machine under sanitizers (500 ms was not always). The
  // test waits the rest of it out before the refusal.
  options.drain_grace = absl::Seconds(3);
  std::unique_ptr<MatmulServer> server =
      StartOrDie(options, FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  auto channel = Channel(server->port());
  auto stub = v1::MatmulService::NewStub(channel);
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat32, {32, 32}, {32, 32}, gen);
  v1::MultiplyResponse inflight_response;
  auto inflight = std::async(std::launch::async, [&] {
    return Multiply(*stub, request, &inflight_response);
  });
  engine->WaitForHeld(1);

  auto shutdown = std::async(std::launch::async, [&] { server->Shutdown(); });
  // During the grace period health says NOT_SERVING (liveness stays up) so
  // that load balancers stop sending here.
  HealthCheckResponse::ServingStatus readiness = HealthCheckResponse::SERVING;
  for (int i = 0; i < 100 && readiness == HealthCheckResponse::SERVING; ++i) {
    readiness = Health(*channel, kReadinessService);
  }
  EXPECT_EQ(readiness, HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(*channel, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(*channel, kLivenessService), HealthCheckResponse::SERVING);
  EXPECT_FALSE(server->service().draining());
  // Then new work is refused while the in-flight request is still running.
  while (!server->service().draining()) absl::SleepFor(absl::Milliseconds(1));
  v1::MultiplyResponse refused_response;
  grpc::Status refused = Multiply(*stub, request, &refused_response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(shutdown.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout);

  engine->ReleaseOne();
  grpc::Status done = inflight.get();
  ASSERT_TRUE(done.ok()) << done.error_message();
  ExpectCorrect(request, inflight_response);
  shutdown.get();
}

// A job the engine never finishes cannot hold the server up: after the
// drain timeout its RPC is cancelled and Shutdown returns; the engine's
// late result is then dropped.
TEST(ServerTest, StuckJobDoesNotBlockShutdownPastTheDrainTimeout) {
  FakeEngine* engine = nullptr;
  ServerOptions options = LocalOptions();
  options.drain_timeout = absl::Milliseconds(300);
  std::unique_ptr<MatmulServer> server =
      StartOrDie(options, FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  v1::MultiplyResponse response;
  auto stuck = std::async(std::launch::async, [&] {
    return Multiply(*stub, RandomRequest(DType::kFloat32, {8, 8}, {8, 8}, gen),
                    &response);
  });
  engine->WaitForHeld(1);
  const absl::Time start = absl::Now();
  server->Shutdown();  // runs the held job (FakeEngine::Shutdown) at the end
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Cut by the drain: UNAVAILABLE, which a client retries (gRPC's own cut
  // would be CANCELLED).
  const grpc::Status cut = stuck.get();
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::UNAVAILABLE)
      << cut.error_message();
  EXPECT_THAT(cut.error_message(), HasSubstr("shutting down"));
  EXPECT_EQ(server->service().inflight_requests(), 0);
}

// A request held in the engine shows as the age of the oldest request in
// progress (matmul_oldest_request_seconds), which grows while it is held
// and falls back to zero once it is answered.
TEST(ServerTest, OldestRequestAgeShowsAHeldRequest) {
  FakeEngine* engine = nullptr;
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->service().oldest_request_age(), absl::ZeroDuration());
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat32, {8, 8}, {8, 8}, gen);
  v1::MultiplyResponse response;
  auto held = std::async(std::launch::async,
                         [&] { return Multiply(*stub, request, &response); });
  engine->WaitForHeld(1);
  const absl::Duration first = server->service().oldest_request_age();
  EXPECT_GT(first, absl::ZeroDuration());
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Duration later = server->service().oldest_request_age();
  EXPECT_GE(later - first, absl::Milliseconds(100));
  engine->ReleaseOne();
  const grpc::Status done = held.get();
  ASSERT_TRUE(done.ok()) << done.error_message();
  ExpectCorrect(request, response);
  // The call leaves the registry when gRPC is done with it, a moment after
  // the client has its answer.
  absl::Duration after = server->service().oldest_request_age();
  for (int i = 0; i < 500 && after > absl::ZeroDuration(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    after = server->service().oldest_request_age();
  }
  EXPECT_EQ(after, absl::ZeroDuration());
}

// The Multiply path copies each operand byte once (gRPC's buffers into
// staging) and no result byte (the product is sent from staging).
TEST(ServerTest, MultiplyCopiesOperandsOnceAndResultsNever) {
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  int64_t operand_bytes = 0;
  for (int i = 0; i < 5; ++i) {
    const v1::MultiplyRequest request =
        RandomRequest(DType::kFloat32, {300, 200 + i}, {200 + i, 100}, gen);
    operand_bytes += static_cast<int64_t>(request.a().data().size() +
                                          request.b().data().size());
    v1::MultiplyResponse response;
    ASSERT_TRUE(Multiply(*stub, request, &response).ok());
    ExpectCorrect(request, response);
  }
  EXPECT_EQ(server->service().copied_operand_bytes(), operand_bytes);
  EXPECT_EQ(server->service().copied_result_bytes(), 0);

  // The counter is live: a Download copies its tensor out of staging into
  // the response, and is counted.
  const v1::MultiplyRequest stored =
      RandomRequest(DType::kFloat32, {30, 20}, {20, 10}, gen);
  v1::UploadRequest upload;
  *upload.mutable_tensor() = stored.a();
  v1::UploadResponse uploaded;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Upload(&context, upload, &uploaded).ok());
  }
  v1::DownloadRequest download;
  download.set_handle(uploaded.handle().id());
  v1::DownloadResponse downloaded;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Download(&context, download, &downloaded).ok());
  }
  EXPECT_EQ(downloaded.tensor().data(), stored.a().data());
  EXPECT_EQ(server->service().copied_result_bytes(),
            static_cast<int64_t>(stored.a().data().size()));
}

// With staging-copy helpers and a split low
// enough for every request here, operands copied partly by helpers still
// give exact products, from many clients at once (one copy has the helpers
// at a time; the rest copy alone), and the copier's counters move.
TEST(ServerTest, StagingCopyHelpersKeepEveryProductExact) {
  ServerOptions options = LocalOptions();
  options.staging_copy = StagingCopyOptions{2, 4096, 4096};
  std::unique_ptr<MatmulServer> server = StartOrDie(options, HostProvider());
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->service().staging_copier().helpers(), 2);
  std::atomic<int64_t> operand_bytes{0};
  const int ok = MultiplyFromThreads(
      Channel(server->port()), 4, 6, [&](int t, int i, absl::BitGen& gen) {
        const int64_t m = 64 + 37 * t + 11 * i;
        const int64_t k = 96 + 13 * i;
        const int64_t n = 80 + 7 * t;
        const DType dtype = i % 2 == 0 ? DType::kFloat32 : DType::kFloat64;
        v1::MultiplyRequest request = RandomRequest(dtype, {m, k}, {k, n}, gen);
        operand_bytes += static_cast<int64_t>(request.a().data().size() +
                                              request.b().data().size());
        return request;
      });
  EXPECT_EQ(ok, 24);
  EXPECT_EQ(server->service().copied_operand_bytes(), operand_bytes.load());
  const StagingCopier& copier = server->service().staging_copier();
  EXPECT_GT(copier.shared_copies(), 0);
  EXPECT_LE(copier.helper_bytes(), operand_bytes.load());
}

TEST(ServerTest, StreamingStoresKeepEveryProductExact) {
  // Streaming stores (the CUDA engine's staging copies): operands of every size
  // (a few bytes off 16-byte edges), staged alone and with the helpers.
  ServerOptions options = LocalOptions();
  options.staging_copy = StagingCopyOptions{2, 4096, 4096};
  options.staging_copy.streaming_stores = true;
  std::unique_ptr<MatmulServer> server = StartOrDie(options, HostProvider());
  ASSERT_NE(server, nullptr);
  const int ok = MultiplyFromThreads(
      Channel(server->port()), 3, 6, [&](int t, int i, absl::BitGen& gen) {
        const int64_t m = 1 + 29 * t + 17 * i;
        const int64_t k = 3 + 13 * i;
        const int64_t n = 5 + 7 * t;
        const DType dtype = i % 2 == 0 ? DType::kFloat32 : DType::kFloat64;
        return RandomRequest(dtype, {m, k}, {k, n}, gen);
      });
  EXPECT_EQ(ok, 18);
  EXPECT_GT(server->service().staging_copier().shared_copies(), 0);
}

TEST(ServerTest, OverloadAnswersWithARetryHint) {
  FakeEngine* engine = nullptr;
  ServerOptions options = LocalOptions();
  options.limits.max_inflight_bytes = 4096;
  std::unique_ptr<MatmulServer> server =
      StartOrDie(options, FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat32, {16, 16}, {16, 16}, gen);
  v1::MultiplyResponse first_response;
  auto first = std::async(std::launch::async, [&] {
    return Multiply(*stub, request, &first_response);
  });
  engine->WaitForHeld(1);
  grpc::ClientContext context;
  v1::MultiplyResponse response;
  grpc::Status refused = stub->Multiply(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  const auto& trailers = context.GetServerTrailingMetadata();
  auto pushback = trailers.find("grpc-retry-pushback-ms");
  ASSERT_NE(pushback, trailers.end());
  EXPECT_GE(
      std::stoi(std::string(pushback->second.data(), pushback->second.size())),
      10);
  engine->ReleaseOne();
  EXPECT_TRUE(first.get().ok());
}

TEST(ServerTest, HopelessDeadlineIsRefusedAtOnce) {
  FakeEngine* engine = nullptr;
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), FakeProvider(&engine));
  ASSERT_NE(server, nullptr);
  engine->minimum_duration_ = absl::Seconds(30);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  v1::MultiplyResponse response;
  const absl::Time start = absl::Now();
  grpc::Status status =
      Multiply(*stub, RandomRequest(DType::kFloat32, {8, 8}, {8, 8}, gen),
               &response, std::chrono::seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr("cannot be met"));
  EXPECT_EQ(engine->held(), 0u);
}

grpc::Status Upload(v1::MatmulService::Stub& stub, const v1::Tensor& tensor,
                    v1::TensorHandle* handle, int64_t ttl_seconds = 0,
                    const char* client = nullptr) {
  grpc::ClientContext context;
  if (client != nullptr) context.AddMetadata("x-matmul-client", client);
  v1::UploadRequest request;
  *request.mutable_tensor() = tensor;
  request.set_ttl_seconds(ttl_seconds);
  v1::UploadResponse response;
  grpc::Status status = stub.Upload(&context, request, &response);
  *handle = response.handle();
  return status;
}

grpc::Status Download(v1::MatmulService::Stub& stub, const std::string& id,
                      v1::Tensor* tensor) {
  grpc::ClientContext context;
  v1::DownloadRequest request;
  request.set_handle(id);
  v1::DownloadResponse response;
  grpc::Status status = stub.Download(&context, request, &response);
  *tensor = response.tensor();
  return status;
}

grpc::Status Delete(v1::MatmulService::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  v1::DeleteRequest request;
  request.set_handle(id);
  v1::DeleteResponse response;
  return stub.Delete(&context, request, &response);
}

// What a client sends is cut before it is echoed: a status message stays
// under 1 KiB, so the client sees the real error, not its own metadata
// limit (RESOURCE_EXHAUSTED "received initial metadata size exceeds limit").
TEST(ServerTest, ErrorMessagesStayBoundedWhateverTheRequestHolds) {
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  const std::string huge_id(100'000, 'h');
  auto expect_bounded = [](const grpc::Status& status, grpc::StatusCode code,
                           const std::string& text) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_LT(status.error_message().size(), 1024u);
    EXPECT_THAT(status.error_message(), HasSubstr(text));
  };

  v1::Tensor none;
  expect_bounded(Download(*stub, huge_id, &none), grpc::StatusCode::NOT_FOUND,
                 "more bytes)");
  expect_bounded(Delete(*stub, huge_id), grpc::StatusCode::NOT_FOUND,
                 "more bytes)");

  v1::MultiplyRequest by_handle;
  by_handle.set_a_handle(huge_id);
  by_handle.set_b_handle(huge_id);
  v1::MultiplyResponse response;
  expect_bounded(Multiply(*stub, by_handle, &response),
                 grpc::StatusCode::NOT_FOUND, "a_handle");

  // A shape of 3,000 dimensions.
  v1::MultiplyRequest wide;
  for (v1::Tensor* t : {wide.mutable_a(), wide.mutable_b()}) {
    for (int i = 0; i < 3000; ++i) t->add_shape(1);
    t->set_dtype(v1::DTYPE_FLOAT32);
    t->set_data(std::string(4, '\0'));
  }
  expect_bounded(Multiply(*stub, wide, &response),
                 grpc::StatusCode::INVALID_ARGUMENT, "(2992 more)");

  // A client id of 4,000 bytes (gRPC's metadata limit is 8 KiB) over its
  // quota.
  v1::Tensor big;
  big.add_shape(1024);
  big.add_shape(1024);
  big.set_dtype(v1::DTYPE_FLOAT64);
  big.set_data(std::string(8 << 20, '\0'));
  ServerOptions small_quota = LocalOptions();
  small_quota.handle_limits.max_bytes_per_client = 1024;
  std::unique_ptr<MatmulServer> quota_server =
      StartOrDie(small_quota, HostProvider());
  ASSERT_NE(quota_server, nullptr);
  auto quota_stub = v1::MatmulService::NewStub(Channel(quota_server->port()));
  v1::TensorHandle handle;
  const std::string long_client(4000, 'c');
  expect_bounded(Upload(*quota_stub, big, &handle, 0, long_client.c_str()),
                 grpc::StatusCode::RESOURCE_EXHAUSTED, "bytes per client");
}

// Stored tensors: upload, multiply with handles and inline operands in any
// mix, keep a product on the engine, chain it, download it, delete it.
TEST(ServerTest, StoredTensorsEndToEnd) {
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  const v1::Tensor a = RandomTensor(DType::kFloat32, {2, 40, 30}, gen);
  const v1::Tensor b = RandomTensor(DType::kFloat32, {30, 20}, gen);
  const v1::Tensor d = RandomTensor(DType::kFloat32, {20, 10}, gen);

  v1::TensorHandle ha;
  ASSERT_TRUE(Upload(*stub, a, &ha).ok());
  EXPECT_THAT(ha.shape(), ::testing::ElementsAre(2, 40, 30));
  EXPECT_EQ(ha.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(ha.bytes(), 2 * 40 * 30 * 4);
  EXPECT_GT(ha.expire_time_unix_ms(), absl::ToUnixMillis(absl::Now()));

  // Stored A × inline B, product kept.
  v1::MultiplyRequest keep;
  keep.set_a_handle(ha.id());
  *keep.mutable_b() = b;
  keep.set_keep_result(true);
  v1::MultiplyResponse kept;
  ASSERT_TRUE(Multiply(*stub, keep, &kept).ok());
  EXPECT_FALSE(kept.has_c());
  ASSERT_TRUE(kept.has_c_handle());
  EXPECT_THAT(kept.c_handle().shape(), ::testing::ElementsAre(2, 40, 20));

  // The kept product, downloaded, is A·B.
  v1::MultiplyRequest inline_ab;
  *inline_ab.mutable_a() = a;
  *inline_ab.mutable_b() = b;
  v1::Tensor c;
  ASSERT_TRUE(Download(*stub, kept.c_handle().id(), &c).ok());
  v1::MultiplyResponse as_response;
  *as_response.mutable_c() = c;
  ExpectCorrect(inline_ab, as_response);

  // Chained: stored product × inline D, returned inline.
  v1::MultiplyRequest chain;
  chain.set_a_handle(kept.c_handle().id());
  *chain.mutable_b() = d;
  v1::MultiplyResponse chained;
  ASSERT_TRUE(Multiply(*stub, chain, &chained).ok());
  v1::MultiplyRequest inline_cd;
  *inline_cd.mutable_a() = c;
  *inline_cd.mutable_b() = d;
  ExpectCorrect(inline_cd, chained);

  // Inline A × stored B.
  v1::TensorHandle hb;
  ASSERT_TRUE(Upload(*stub, b, &hb).ok());
  v1::MultiplyRequest mixed;
  *mixed.mutable_a() = a;
  mixed.set_b_handle(hb.id());
  v1::MultiplyResponse mixed_response;
  ASSERT_TRUE(Multiply(*stub, mixed, &mixed_response).ok());
  ExpectCorrect(inline_ab, mixed_response);

  EXPECT_GT(server->service().handles().stored_bytes(), 0);
  for (const std::string& id : {ha.id(), hb.id(), kept.c_handle().id()}) {
    EXPECT_TRUE(Delete(*stub, id).ok());
  }
  EXPECT_EQ(server->service().handles().stored_bytes(), 0);
  EXPECT_EQ(server->service().handles().stored_handles(), 0);

  // Deleted handles are gone.
  grpc::Status gone = Multiply(*stub, chain, &chained);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(gone.error_message(), HasSubstr("a_handle: no stored tensor"));
  EXPECT_EQ(Delete(*stub, ha.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::Tensor none;
  EXPECT_EQ(Download(*stub, ha.id(), &none).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(ServerTest, StoredTensorErrors) {
  ServerOptions options = LocalOptions();
  options.handle_limits.max_bytes_per_client = 10000;
  options.handle_limits.max_ttl = absl::Seconds(100);
  std::unique_ptr<MatmulServer> server = StartOrDie(options, HostProvider());
  ASSERT_NE(server, nullptr);
  auto stub = v1::MatmulService::NewStub(Channel(server->port()));
  absl::BitGen gen;
  const v1::Tensor small = RandomTensor(DType::kFloat32, {20, 20}, gen);
  v1::TensorHandle h;
  ASSERT_TRUE(Upload(*stub, small, &h, 0, "alice").ok());

  // Both a and a_handle.
  v1::MultiplyRequest both;
  *both.mutable_a() = small;
  both.set_a_handle(h.id());
  *both.mutable_b() = small;
  v1::MultiplyResponse response;
  grpc::Status s = Multiply(*stub, both, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("a and a_handle are both set"));

  // Unknown handle.
  v1::MultiplyRequest unknown;
  unknown.set_a_handle("h-nope");
  *unknown.mutable_b() = small;
  EXPECT_EQ(Multiply(*stub, unknown, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // Over the per-client quota (1600 held, 9600 more asked), not for others.
  const v1::Tensor big = RandomTensor(DType::kFloat32, {40, 60}, gen);
  v1::TensorHandle h2;
  s = Upload(*stub, big, &h2, 0, "alice");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("over the limit of 10000 bytes"));
  EXPECT_TRUE(Upload(*stub, big, &h2, 0, "bob").ok());

  // TTL over the maximum; malformed tensor; unknown device.
  EXPECT_EQ(Upload(*stub, small, &h2, 101, "carol").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::Tensor bad = small;
  bad.mutable_data()->pop_back();
  s = Upload(*stub, bad, &h2, 0, "carol");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("tensor.data: expected 1600"));
  grpc::ClientContext context;
  v1::UploadRequest on_device;
  *on_device.mutable_tensor() = small;
  on_device.set_device(7);
  v1::UploadResponse upload_response;
  EXPECT_EQ(stub->Upload(&context, on_device, &upload_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // A short TTL expires and the tensor is freed.
  v1::TensorHandle brief;
  ASSERT_TRUE(Upload(*stub, small, &brief, 1, "dave").ok());
  v1::Tensor expired;
  grpc::StatusCode code = grpc::StatusCode::OK;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (code == grpc::StatusCode::OK && absl::Now() < give_up) {
    code = Download(*stub, brief.id(), &expired).error_code();
    if (code == grpc::StatusCode::OK) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
}

// Certificates made at test time with openssl: a CA, a server certificate
// for 127.0.0.1, a client certificate signed by the CA, and one signed by
// another CA.
struct TestPki {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string rogue_cert, rogue_key;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::optional<TestPki> MakePki() {
  char pattern[] = "/tmp/matmul-pki-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return std::nullopt;
  TestPki pki;
  pki.dir = pattern;
  const std::string d = pki.dir;
  {
    std::ofstream script(d + "/make.sh");
    script << "set -e\ncd " << d << "\nexec >/dev/null 2>&1\n"
           << "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > "
              "san.ext\n"
           << "for ca in ca rogue; do openssl req -x509 -newkey rsa:2048 "
              "-nodes -days 2 -subj /CN=$ca -keyout $ca.key -out $ca.pem; "
              "done\n"
           << "openssl req -newkey rsa:2048 -nodes -subj /CN=server -keyout "
              "server.key -out server.csr\n"
           << "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key "
              "-CAcreateserial -days 2 -extfile san.ext -out server.pem\n"
           << "for c in client:ca roguecl:rogue; do n=${c%%:*}; s=${c##*:}; "
              "openssl req -newkey rsa:2048 -nodes -subj /CN=$n -keyout "
              "$n.key -out $n.csr; openssl x509 -req -in $n.csr -CA $s.pem "
              "-CAkey $s.key -CAcreateserial -days 2 -out $n.pem; done\n";
  }
  if (std::system(absl::StrCat("sh ", d, "/make.sh").c_str()) != 0) {
    return std::nullopt;
  }
  pki.ca = ReadAll(d + "/ca.pem");
  pki.server_cert = ReadAll(d + "/server.pem");
  pki.server_key = ReadAll(d + "/server.key");
  pki.client_cert = ReadAll(d + "/client.pem");
  pki.client_key = ReadAll(d + "/client.key");
  pki.rogue_cert = ReadAll(d + "/roguecl.pem");
  pki.rogue_key = ReadAll(d + "/roguecl.key");
  return pki;
}

std::shared_ptr<grpc::Channel> TlsChannel(int port, const TestPki& pki,
                                          const std::string& cert,
                                          const std::string& key) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pki.ca;
  ssl.pem_cert_chain = cert;
  ssl.pem_private_key = key;
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                             grpc::SslCredentials(ssl));
}

// Mutual TLS: a client with a certificate from the server's CA is served;
// one without a certificate, one with another CA's certificate, and a
// plaintext client are refused. Probes use the plaintext health-only port,
// which serves nothing but health.
TEST(ServerTest, MutualTlsAndAPlaintextHealthPort) {
  std::optional<TestPki> pki = MakePki();
  if (!pki.has_value()) GTEST_SKIP() << "openssl is not available";
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_key_cert_pairs.push_back({pki->server_key, pki->server_cert});
  ssl.pem_root_certs = pki->ca;
  ServerOptions options = LocalOptions();
  options.credentials = grpc::SslServerCredentials(ssl);
  options.health_address = "127.0.0.1:0";
  options.handle_limits.max_handles_per_client = 1;
  std::unique_ptr<MatmulServer> server = StartOrDie(options, HostProvider());
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->health_port(), 0);
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat32, {16, 8}, {8, 4}, gen);

  auto trusted = v1::MatmulService::NewStub(testing::Connected(
      TlsChannel(server->port(), *pki, pki->client_cert, pki->client_key)));
  v1::MultiplyResponse response;
  grpc::Status ok = Multiply(*trusted, request, &response);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ExpectCorrect(request, response);

  // Stored tensors are charged to the certificate's identity (CN=client),
  // whatever client id the caller writes: a second id gets no new quota.
  v1::TensorHandle first;
  ASSERT_TRUE(Upload(*trusted, request.a(), &first, 0, "alice").ok());
  v1::TensorHandle second;
  const grpc::Status over = Upload(*trusted, request.a(), &second, 0, "bob");
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("client cert:client "));

  for (const auto& [cert, key] : {std::pair{std::string(), std::string()},
                                  std::pair{pki->rogue_cert, pki->rogue_key}}) {
    auto refused =
        v1::MatmulService::NewStub(TlsChannel(server->port(), *pki, cert, key));
    EXPECT_EQ(Multiply(*refused, request, &response, std::chrono::seconds(5))
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  // Never connects (the server wants TLS): not waited for.
  auto plaintext =
      v1::MatmulService::NewStub(UnconnectedChannel(server->port()));
  EXPECT_EQ(Multiply(*plaintext, request, &response, std::chrono::seconds(5))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);

  auto health_channel = Channel(server->health_port());
  EXPECT_EQ(Health(*health_channel, kReadinessService),
            HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(*health_channel, kLivenessService),
            HealthCheckResponse::SERVING);
  auto on_health_port = v1::MatmulService::NewStub(health_channel);
  EXPECT_EQ(Multiply(*on_health_port, request, &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  std::system(absl::StrCat("rm -rf ", pki->dir).c_str());
}

TEST(ServerTest, UnixSocketServesBesideTcp) {
  const std::string path = absl::StrCat("/tmp/matmul-test-", getpid(), ".sock");
  ServerOptions options = LocalOptions();
  options.unix_socket = path;
  std::unique_ptr<MatmulServer> server = StartOrDie(options, HostProvider());
  ASSERT_NE(server, nullptr);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto stub = v1::MatmulService::NewStub(testing::Connected(
      grpc::CreateCustomChannel(absl::StrCat("unix:", path),
                                grpc::InsecureChannelCredentials(), args)));
  absl::BitGen gen;
  const v1::MultiplyRequest request =
      RandomRequest(DType::kFloat64, {33, 17}, {17, 9}, gen);
  v1::MultiplyResponse response;
  ASSERT_TRUE(Multiply(*stub, request, &response).ok());
  ExpectCorrect(request, response);
}

// Server reflection answers list_services with our service in it. The
// request is hand-encoded (field 7, list_services = ""), so the test needs
// no reflection stubs.
TEST(ServerTest, ReflectionListsTheService) {
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(server, nullptr);
  grpc::GenericStub stub(Channel(server->port()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  const char list_services[] = {0x3a, 0x00};
  grpc::Slice slice(list_services, sizeof list_services);
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  call->WritesDone(reinterpret_cast<void*>(4));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_THAT(bytes, HasSubstr("matmul.v1.MatmulService"));
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// One unary call through the generic stub: `bytes` go out as they are, and
// the reply's bytes come back in `reply`.
grpc::Status CallRaw(grpc::GenericStub& stub, const std::string& method,
                     const std::string& bytes, std::string* reply = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::Slice slice(bytes.data(), bytes.size());
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/matmul.v1.MatmulService/" + method,
                 grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(status); });
  // Bounded by the call's deadline.
  grpc::Status status = done.get_future().get();
  if (reply != nullptr) {
    reply->clear();
    std::vector<grpc::Slice> slices;
    if (status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        reply->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
  }
  return status;
}

// Bytes that are not a protobuf message get INVALID_ARGUMENT naming the
// message that could not be parsed, on every unary method (gRPC's typed
// handlers answered UNIMPLEMENTED with an empty message), counted as an
// invalid request of that method; valid bytes still work.
TEST(ServerTest, UndecodableBytesGetInvalidArgumentOnEveryUnaryMethod) {
  std::unique_ptr<MatmulServer> server =
      StartOrDie(LocalOptions(), HostProvider());
  ASSERT_NE(server, nullptr);
  grpc::GenericStub stub(Channel(server->port()));
  const ServerMetrics& metrics = *server->service().metrics();
  // A length-delimited field 1 whose length runs past the end, and a key
  // whose varint never ends.
  const std::string garbage[] = {std::string("\x0a\xff\xff\xff\xff\x0f", 6),
                                 std::string("\xff\xff", 2)};
  struct Method {
    std::string name;
    RpcMethod rpc;
    std::string message;  // what the answer says, before the byte count
  };
  const Method methods[] = {
      {"Upload", RpcMethod::kUpload, "could not parse the UploadRequest"},
      {"Download", RpcMethod::kDownload, "could not parse the DownloadRequest"},
      {"Delete", RpcMethod::kDelete, "could not parse the DeleteRequest"},
      {"GetServerInfo", RpcMethod::kGetServerInfo,
       "could not parse the GetServerInfoRequest"},
      {"Multiply", RpcMethod::kMultiply, "malformed request message"},
  };
  for (const Method& method : methods) {
    for (const std::string& bytes : garbage) {
      SCOPED_TRACE(method.name + " " + std::to_string(bytes.size()));
      const grpc::Status status = CallRaw(stub, method.name, bytes);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(status.error_message(), HasSubstr(method.message));
      if (method.rpc != RpcMethod::kMultiply) {
        EXPECT_THAT(status.error_message(),
                    HasSubstr(absl::StrCat("(", bytes.size(), " bytes)")));
        EXPECT_THAT(status.error_message(),
                    HasSubstr("not a valid protobuf message"));
      }
    }
  }
  // Counted when each call is done, which may come after its answer.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  auto counted = [&] {
    for (const Method& method : methods) {
      if (metrics.requests(method.rpc, grpc::StatusCode::INVALID_ARGUMENT) !=
          2) {
        return false;
      }
    }
    return metrics.rejections(RejectReason::kInvalid) == 10;
  };
  while (!counted() && absl::Now() < until)
    absl::SleepFor(absl::Milliseconds(5));
  for (const Method& method : methods) {
    EXPECT_EQ(metrics.requests(method.rpc, grpc::StatusCode::INVALID_ARGUMENT),
              2u)
        << method.name;
    EXPECT_EQ(metrics.requests(method.rpc, grpc::StatusCode::UNIMPLEMENTED), 0u)
        << method.name;
  }
  EXPECT_EQ(metrics.rejections(RejectReason::kInvalid), 10u);

  // Valid bytes, one call of each.
  std::string reply;
  ASSERT_TRUE(CallRaw(stub, "GetServerInfo", "", &reply).ok());
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(info.ParseFromString(reply));
  EXPECT_FALSE(info.engine().empty());
  EXPECT_GT(info.limits().max_message_bytes(), 0);

  absl::BitGen gen;
  v1::UploadRequest upload;
  *upload.mutable_tensor() = RandomTensor(DType::kFloat32, {3, 5}, gen);
  ASSERT_TRUE(CallRaw(stub, "Upload", upload.SerializeAsString(), &reply).ok());
  v1::UploadResponse uploaded;
  ASSERT_TRUE(uploaded.ParseFromString(reply));
  ASSERT_FALSE(uploaded.handle().id().empty());
  EXPECT_THAT(uploaded.handle().shape(), ::testing::ElementsAre(3, 5));

  v1::DownloadRequest download;
  download.set_handle(uploaded.handle().id());
  ASSERT_TRUE(
      CallRaw(stub, "Download", download.SerializeAsString(), &reply).ok());
  v1::DownloadResponse downloaded;
  ASSERT_TRUE(downloaded.ParseFromString(reply));
  EXPECT_THAT(downloaded.tensor().shape(), ::testing::ElementsAre(3, 5));
  EXPECT_EQ(downloaded.tensor().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(downloaded.tensor().data(), upload.tensor().data());

  v1::DeleteRequest remove;
  remove.set_handle(uploaded.handle().id());
  ASSERT_TRUE(CallRaw(stub, "Delete", remove.SerializeAsString(), &reply).ok());
  v1::DeleteResponse deleted;
  EXPECT_TRUE(deleted.ParseFromString(reply));
  const grpc::Status gone =
      CallRaw(stub, "Download", download.SerializeAsString());
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(gone.error_message(), HasSubstr("handle: "));
}

}  // namespace
}  // namespace matmul
