// Tests of MatmulClient against a fake MatmulService (in-process, port 0),
// so that error codes, deadlines, channel rotation and malformed replies can
// be driven precisely; plus the HostTensor <-> proto and dtype conversions.
// The real server is exercised end to end by cli_e2e_test.py.
#include "client/matmul_client.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/dtype_conversion.h"
#include "client/host_tensor.h"
#include "client/tensor_proto.h"
#include "common/float16.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

HostTensor Float32(std::vector<int64_t> shape, std::vector<float> values) {
  HostTensor t;
  t.shape = std::move(shape);
  t.dtype = DType::kFloat32;
  t.data.assign(reinterpret_cast<const char*>(values.data()),
                values.size() * sizeof(float));
  return t;
}

std::vector<float> Values(const HostTensor& t) {
  std::vector<float> out(t.data.size() / sizeof(float));
  std::memcpy(out.data(), t.data.data(), t.data.size());
  return out;
}

// A MatmulService that multiplies 2-D float32 operands naively, or answers
// with whatever the test scripted. Thread-safe.
class FakeService final : public v1::MatmulService::CallbackService {
 public:
  grpc::ServerUnaryReactor* Multiply(grpc::CallbackServerContext* context,
                                     const v1::MultiplyRequest* request,
                                     v1::MultiplyResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    grpc::Status status;
    absl::Duration delay;
    bool malformed;
    {
      absl::MutexLock lock(&mu_);
      peers_.insert(context->peer());
      ++calls_;
      status = status_;
      delay = delay_;
      malformed = malformed_;
    }
    // Only the deadline test sets a delay; blocking a callback thread is
    // acceptable in a fake.
    if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
    if (!status.ok()) {
      reactor->Finish(status);
      return reactor;
    }
    const v1::Tensor& a = request->a();
    const v1::Tensor& b = request->b();
    const int64_t m = a.shape(0), k = a.shape(1), n = b.shape(1);
    std::vector<float> av(m * k), bv(k * n), cv(m * n, 0.0f);
    std::memcpy(av.data(), a.data().data(), a.data().size());
    std::memcpy(bv.data(), b.data().data(), b.data().size());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t p = 0; p < k; ++p) {
          cv[i * n + j] += av[i * k + p] * bv[p * n + j];
        }
      }
    }
    v1::Tensor* c = response->mutable_c();
    c->add_shape(m);
    c->add_shape(n);
    c->set_dtype(v1::DTYPE_FLOAT32);
    c->set_data(reinterpret_cast<const char*>(cv.data()),
                cv.size() * sizeof(float) - (malformed ? 1 : 0));
    response->mutable_placement()->set_device(-1);
    response->mutable_placement()->set_stream(7);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* context, const v1::GetServerInfoRequest*,
      v1::GetServerInfoResponse* response) override {
    response->set_engine("fake");
    response->set_version("9.9");
    response->add_dtypes(v1::DTYPE_FLOAT32);
    response->mutable_limits()->set_max_message_bytes(1234);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  void Fail(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
  }
  void Delay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }
  void Malformed() {
    absl::MutexLock lock(&mu_);
    malformed_ = true;
  }
  std::set<std::string> peers() {
    absl::MutexLock lock(&mu_);
    return peers_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
  bool malformed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> peers_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

ClientOptions Channels(int n) {
  ClientOptions options;
  options.channels = n;
  return options;
}

class MatmulClientTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer("127.0.0.1:0"); }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  void StartServer(const std::string& address) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(64 << 20);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = address.rfind("unix:", 0) == 0
                  ? address
                  : absl::StrCat("127.0.0.1:", port_);
  }

  std::unique_ptr<MatmulClient> NewClient(ClientOptions options = {}) {
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(target_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  FakeService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string target_;
  // [[1, 2, 3], [4, 5, 6]] . [[1, 0], [0, 1], [1, 1]] = [[4, 5], [10, 11]]
  const HostTensor a_ = Float32({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor b_ = Float32({3, 2}, {1, 0, 0, 1, 1, 1});
};

TEST_F(MatmulClientTest, MultiplySync) {
  std::unique_ptr<MatmulClient> client = NewClient();
  absl::StatusOr<HostTensor> c = client->Multiply(a_, b_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c->dtype, DType::kFloat32);
  EXPECT_THAT(Values(*c), ::testing::ElementsAre(4, 5, 10, 11));
}

TEST_F(MatmulClientTest, MultiplyRawSendsTheOptionsAndReturnsPlacement) {
  std::unique_ptr<MatmulClient> client = NewClient();
  MultiplyOptions options;
  options.transpose_a = true;
  options.compute = ComputeMode::kTf32;
  absl::StatusOr<v1::MultiplyRequest> request =
      MakeMultiplyRequest(a_, b_, options);
  ASSERT_TRUE(request.ok());
  EXPECT_TRUE(request->transpose_a());
  EXPECT_FALSE(request->transpose_b());
  EXPECT_EQ(request->compute_mode(), v1::COMPUTE_MODE_TF32);
  EXPECT_EQ(request->a().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_THAT(request->b().shape(), ::testing::ElementsAre(3, 2));
  request->set_transpose_a(false);  // the fake does not transpose
  absl::StatusOr<v1::MultiplyResponse> response = client->MultiplyRaw(*request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->placement().device(), -1);
  EXPECT_EQ(response->placement().stream(), 7);
}

TEST_F(MatmulClientTest, ErrorsKeepTheServersCodeAndMessage) {
  std::unique_ptr<MatmulClient> client = NewClient();
  for (grpc::StatusCode code :
       {grpc::StatusCode::INVALID_ARGUMENT,
        grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::UNAVAILABLE,
        grpc::StatusCode::INTERNAL}) {
    service_.Fail(grpc::Status(code, "scripted failure"));
    absl::StatusOr<HostTensor> c = client->Multiply(a_, b_);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(static_cast<int>(c.status().code()), static_cast<int>(code));
    EXPECT_EQ(c.status().message(), "scripted failure");
  }
}

TEST_F(MatmulClientTest, InvalidTensorsFailBeforeTheWire) {
  std::unique_ptr<MatmulClient> client = NewClient();
  HostTensor bad = a_;
  bad.data.pop_back();
  absl::StatusOr<HostTensor> c = client->Multiply(bad, b_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr("a: shape [2, 3] of float32 needs 24 bytes of data, "
                        "got 23"));
  c = client->Multiply(a_, bad);
  EXPECT_THAT(c.status().message(), HasSubstr("b: "));

  absl::Notification done;
  absl::Status async_status;
  client->MultiplyAsync(bad, b_, {}, [&](absl::StatusOr<HostTensor> result) {
    async_status = result.status();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(async_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.calls(), 0);
}

TEST_F(MatmulClientTest, MalformedResponseIsInternal) {
  service_.Malformed();
  std::unique_ptr<MatmulClient> client = NewClient();
  absl::StatusOr<HostTensor> c = client->Multiply(a_, b_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(c.status().message(), HasSubstr("malformed"));
}

TEST_F(MatmulClientTest, TimeoutBecomesTheDeadline) {
  service_.Delay(absl::Milliseconds(500));
  std::unique_ptr<MatmulClient> client = NewClient();
  MultiplyOptions options;
  options.timeout = absl::Milliseconds(50);
  absl::StatusOr<HostTensor> c = client->Multiply(a_, b_, options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);

  absl::Notification done;
  absl::Status async_status;
  client->MultiplyAsync(a_, b_, options,
                        [&](absl::StatusOr<HostTensor> result) {
                          async_status = result.status();
                          done.Notify();
                        });
  done.WaitForNotification();
  EXPECT_EQ(async_status.code(), absl::StatusCode::kDeadlineExceeded);

  options.timeout = absl::Seconds(30);
  EXPECT_TRUE(client->Multiply(a_, b_, options).ok());
}

TEST_F(MatmulClientTest, MultiplyAsyncManyInFlight) {
  std::unique_ptr<MatmulClient> client = NewClient();
  constexpr int kCalls = 32;
  absl::BlockingCounter pending(kCalls);
  std::atomic<int> good{0};
  for (int i = 0; i < kCalls; ++i) {
    client->MultiplyAsync(a_, b_, {}, [&](absl::StatusOr<HostTensor> c) {
      if (c.ok() && Values(*c) == std::vector<float>{4, 5, 10, 11}) ++good;
      pending.DecrementCount();
    });
  }
  pending.Wait();
  EXPECT_EQ(good.load(), kCalls);
}

TEST_F(MatmulClientTest, MultiplyRawAsyncSharesOneRequest) {
  std::unique_ptr<MatmulClient> client = NewClient();
  absl::StatusOr<v1::MultiplyRequest> request = MakeMultiplyRequest(a_, b_, {});
  ASSERT_TRUE(request.ok());
  constexpr int kCalls = 16;
  absl::BlockingCounter pending(kCalls);
  std::atomic<int> good{0};
  for (int i = 0; i < kCalls; ++i) {
    client->MultiplyRawAsync(
        *request, {}, [&](absl::StatusOr<v1::MultiplyResponse> response) {
          if (response.ok() && response->c().shape_size() == 2) ++good;
          pending.DecrementCount();
        });
  }
  pending.Wait();
  EXPECT_EQ(good.load(), kCalls);
}

TEST_F(MatmulClientTest, ConcurrentSyncCallsFromManyThreads) {
  std::unique_ptr<MatmulClient> client = NewClient(Channels(2));
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        if (client->Multiply(a_, b_).ok()) ++good;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(good.load(), 80);
}

TEST_F(MatmulClientTest, ChannelsAreSeparateConnections) {
  {
    std::unique_ptr<MatmulClient> client = NewClient(Channels(3));
    EXPECT_EQ(client->channel_count(), 3);
    for (int i = 0; i < 12; ++i) ASSERT_TRUE(client->Multiply(a_, b_).ok());
  }
  // Three connections, hence three client ports as the server sees them.
  EXPECT_EQ(service_.peers().size(), 3u);
}

TEST_F(MatmulClientTest, OneChannelIsOneConnection) {
  std::unique_ptr<MatmulClient> client = NewClient();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client->Multiply(a_, b_).ok());
  EXPECT_EQ(service_.peers().size(), 1u);
}

TEST_F(MatmulClientTest, RoundRobinPolicy) {
  ClientOptions options;
  options.load_balancing_policy = "round_robin";
  absl::StatusOr<std::unique_ptr<MatmulClient>> client =
      MatmulClient::Create(absl::StrCat("ipv4:127.0.0.1:", port_), options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Multiply(a_, b_).ok());
}

TEST_F(MatmulClientTest, MaxMessageBytesLimitsWhatIsSent) {
  ClientOptions options;
  options.max_message_bytes = 1000;
  std::unique_ptr<MatmulClient> client = NewClient(options);
  const HostTensor big = Float32({1, 300}, std::vector<float>(300, 1.0f));
  const HostTensor col = Float32({300, 1}, std::vector<float>(300, 1.0f));
  absl::StatusOr<HostTensor> c = client->Multiply(big, col);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted)
      << c.status();
  // Small messages still pass.
  EXPECT_TRUE(client->Multiply(a_, b_).ok());
}

TEST_F(MatmulClientTest, GetServerInfo) {
  std::unique_ptr<MatmulClient> client = NewClient();
  absl::StatusOr<v1::GetServerInfoResponse> info =
      client->GetServerInfo(absl::Seconds(10));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->engine(), "fake");
  EXPECT_EQ(info->version(), "9.9");
  EXPECT_EQ(info->limits().max_message_bytes(), 1234);
}

TEST_F(MatmulClientTest, NoServerIsUnavailable) {
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_.reset();
  std::unique_ptr<MatmulClient> client = NewClient();
  absl::StatusOr<HostTensor> c = client->Multiply(a_, b_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
}

TEST(MatmulClientUnixTest, UnixSocketTarget) {
  const std::string path =
      absl::StrCat("/tmp/matmul_client_test.", getpid(), ".sock");
  FakeService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<MatmulClient>> client =
      MatmulClient::Create("unix:" + path);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<v1::GetServerInfoResponse> info =
      (*client)->GetServerInfo(absl::Seconds(10));
  EXPECT_TRUE(info.ok()) << info.status();
  server->Shutdown(absl::ToChronoTime(absl::Now()));
  unlink(path.c_str());
}

TEST(MatmulClientCreateTest, RejectsBadOptions) {
  struct Case {
    std::string target;
    ClientOptions options;
    const char* message;
  };
  ClientOptions zero_channels;
  zero_channels.channels = 0;
  ClientOptions zero_limit;
  zero_limit.max_message_bytes = 0;
  ClientOptions huge_limit;
  huge_limit.max_message_bytes = int64_t{1} << 31;
  ClientOptions unknown_policy;
  unknown_policy.load_balancing_policy = "no_such_policy";
  ClientOptions bad_name;
  bad_name.load_balancing_policy = "round_robin\"}";
  const Case cases[] = {
      {"", {}, "the target is empty"},
      {"localhost:1", zero_channels, "channels must be in [1, 1024], got 0"},
      {"localhost:1", zero_limit, "max_message_bytes must be in"},
      {"localhost:1", huge_limit, "got 2147483648"},
      {"localhost:1", unknown_policy, "no_such_policy"},
      {"localhost:1", bad_name, "is not a load-balancing policy name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(c.target, c.options);
    ASSERT_FALSE(client.ok());
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(client.status().message(), HasSubstr(c.message));
  }
}

TEST(FromGrpcStatusTest, SameCodeSameMessage) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  const absl::Status s = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "too slow"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "too slow");
}

// --- HostTensor <-> v1::Tensor -------------------------------------------

TEST(TensorProtoTest, RoundTripsEveryDtype) {
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    HostTensor t;
    t.shape = {2, 1, 3};
    t.dtype = dtype;
    t.data.assign(6 * DTypeSize(dtype), '\x5a');
    v1::Tensor proto;
    ASSERT_TRUE(ToProto(t, &proto).ok());
    EXPECT_EQ(proto.dtype(), DTypeToProto(dtype));
    EXPECT_EQ(DTypeFromProto(proto.dtype()), dtype);
    absl::StatusOr<HostTensor> copy = FromProto(proto);
    ASSERT_TRUE(copy.ok()) << copy.status();
    EXPECT_EQ(copy->shape, t.shape);
    EXPECT_EQ(copy->dtype, t.dtype);
    EXPECT_EQ(copy->data, t.data);
    absl::StatusOr<HostTensor> moved = FromProto(std::move(proto));
    ASSERT_TRUE(moved.ok());
    EXPECT_EQ(moved->data, t.data);
    v1::Tensor again;
    ASSERT_TRUE(ToProto(std::move(*moved), &again).ok());
    EXPECT_EQ(again.data(), t.data);
  }
}

TEST(TensorProtoTest, ScalarAndEmpty) {
  HostTensor scalar = Float32({}, {3.5f});
  v1::Tensor proto;
  ASSERT_TRUE(ToProto(scalar, &proto).ok());
  EXPECT_EQ(proto.shape_size(), 0);
  EXPECT_TRUE(FromProto(proto).ok());
  HostTensor empty = Float32({0, 4}, {});
  ASSERT_TRUE(ToProto(empty, &proto).ok());
  EXPECT_TRUE(FromProto(proto).ok());
}

TEST(TensorProtoTest, RejectsMismatches) {
  HostTensor t = Float32({2, 2}, {1, 2, 3});
  v1::Tensor proto;
  absl::Status s = ToProto(t, &proto);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs 16 bytes of data, got 12"));
  EXPECT_EQ(proto.shape_size(), 0);  // untouched

  proto.add_shape(2);
  proto.set_dtype(v1::DTYPE_FLOAT64);
  proto.set_data(std::string(8, '\0'));
  absl::StatusOr<HostTensor> back = FromProto(proto);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(back.status().message(),
              HasSubstr("shape [2] and dtype float64 needs 16 bytes of data, "
                        "got 8"));

  proto.set_dtype(v1::DTYPE_UNSPECIFIED);
  back = FromProto(proto);
  EXPECT_THAT(back.status().message(), HasSubstr("DTYPE_UNSPECIFIED"));

  proto.set_dtype(v1::DTYPE_FLOAT32);
  proto.set_shape(0, -2);
  back = FromProto(proto);
  EXPECT_THAT(back.status().message(), HasSubstr("negative"));

  proto.clear_shape();
  proto.add_shape(int64_t{1} << 62);
  proto.add_shape(8);
  back = FromProto(proto);
  EXPECT_THAT(back.status().message(), HasSubstr("overflows int64"));
}

// --- dtype conversion ------------------------------------------------------

uint16_t Bits16(const HostTensor& t, size_t i) {
  uint16_t v;
  std::memcpy(&v, t.data.data() + 2 * i, 2);
  return v;
}

HostTensor Float64(std::vector<double> values) {
  HostTensor t;
  t.shape = {static_cast<int64_t>(values.size())};
  t.dtype = DType::kFloat64;
  t.data.assign(reinterpret_cast<const char*>(values.data()),
                values.size() * sizeof(double));
  return t;
}

TEST(DTypeConversionTest, Float32ToBfloat16RoundsToNearestEven) {
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: goes to 1 (even).
  // 1 + 3 * 2^-8 is a tie between 1 + 2^-7 and 1 + 2^-6: goes to 1 + 2^-6.
  const HostTensor t = Float32({4}, {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f,
                                     1.0f + 0x1p-8f + 0x1p-20f});
  absl::StatusOr<HostTensor> bf = ConvertDType(t, DType::kBFloat16);
  ASSERT_TRUE(bf.ok());
  EXPECT_EQ(bf->dtype, DType::kBFloat16);
  EXPECT_EQ(bf->data.size(), 8u);
  EXPECT_EQ(Bits16(*bf, 0), 0x3f80);
  EXPECT_EQ(Bits16(*bf, 1), 0x3f82);
  EXPECT_EQ(Bits16(*bf, 2), 0xc020);
  EXPECT_EQ(Bits16(*bf, 3), 0x3f81);
  // Widening back is exact.
  absl::StatusOr<HostTensor> f = ConvertDType(*bf, DType::kFloat32);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(Values(*f), ::testing::ElementsAre(1.0f, 1.0f + 0x1p-6f, -2.5f,
                                                 1.0f + 0x1p-7f));
}

TEST(DTypeConversionTest, Float64NarrowingRoundsOnce) {
  // Just above a tie of the 16-bit format, by less than float32 resolves:
  // float64 -> float32 -> 16-bit with two round-to-nearest steps would land
  // on the tie and go to even (down); rounding once goes up.
  const HostTensor t = Float64({1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8 + 0x1p-40,
                                -(1.0 + 0x1p-11 + 0x1p-40)});
  absl::StatusOr<HostTensor> h = ConvertDType(t, DType::kFloat16);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(Bits16(*h, 0), 0x3c01);
  EXPECT_EQ(Bits16(*h, 2), 0xbc01);
  absl::StatusOr<HostTensor> bf = ConvertDType(t, DType::kBFloat16);
  ASSERT_TRUE(bf.ok());
  EXPECT_EQ(Bits16(*bf, 1), 0x3f81);
}

TEST(DTypeConversionTest, SpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const HostTensor t = Float64(
      {1e300, -1e300, inf, std::nan(""), 1e-300, 0.0, -0.0, 65504.0, 65520.0});
  absl::StatusOr<HostTensor> h = ConvertDType(t, DType::kFloat16);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(Bits16(*h, 0), 0x7c00);
  EXPECT_EQ(Bits16(*h, 1), 0xfc00);
  EXPECT_EQ(Bits16(*h, 2), 0x7c00);
  EXPECT_EQ(Bits16(*h, 3) & 0x7c00, 0x7c00);
  EXPECT_NE(Bits16(*h, 3) & 0x03ff, 0);  // NaN
  EXPECT_EQ(Bits16(*h, 4), 0x0000);
  EXPECT_EQ(Bits16(*h, 5), 0x0000);
  EXPECT_EQ(Bits16(*h, 6), 0x8000);
  EXPECT_EQ(Bits16(*h, 7), 0x7bff);  // largest half
  EXPECT_EQ(Bits16(*h, 8), 0x7c00);  // the tie above it overflows
  absl::StatusOr<HostTensor> bf = ConvertDType(t, DType::kBFloat16);
  ASSERT_TRUE(bf.ok());
  EXPECT_EQ(Bits16(*bf, 0), 0x7f80);
  EXPECT_EQ(Bits16(*bf, 4), 0x0000);
  absl::StatusOr<HostTensor> f = ConvertDType(t, DType::kFloat32);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(std::isinf(Values(*f)[0]));
  EXPECT_TRUE(std::isnan(Values(*f)[3]));
}

TEST(DTypeConversionTest, WideningIsExactAndShapeIsKept) {
  HostTensor h;
  h.shape = {2, 2};
  h.dtype = DType::kFloat16;
  const uint16_t bits[] = {0x3c00, 0x0001, 0xfbff, 0x3555};
  h.data.assign(reinterpret_cast<const char*>(bits), sizeof bits);
  absl::StatusOr<HostTensor> d = ConvertDType(h, DType::kFloat64);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->shape, h.shape);
  std::vector<double> v(4);
  std::memcpy(v.data(), d->data.data(), 32);
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[1], 0x1p-24);
  EXPECT_EQ(v[2], -65504.0);
  EXPECT_EQ(v[3], HalfToFloat(0x3555));
  absl::StatusOr<HostTensor> back = ConvertDType(*d, DType::kFloat16);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data, h.data);
}

TEST(DTypeConversionTest, RejectsInconsistentTensor) {
  HostTensor t = Float32({3}, {1, 2});
  EXPECT_EQ(ConvertDType(t, DType::kFloat64).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace matmul
