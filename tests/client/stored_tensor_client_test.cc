// MatmulClient's stored-tensor API (Upload, Download, Delete, handles as
// operands, MultiplyAndKeep, client ids) against a real MatmulServer in
// this process (host engine, or MATMUL_TEST_ENGINE), on 127.0.0.1:0, so
// that quotas and lifetimes can be set small. Products are checked against
// a float64 product computed here.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/lib/dtype_conversion.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "gmock/gmock.h"
#include "gpu/engine_factory.h"
#include "gtest/gtest.h"
#include "server/matmul_server.h"
#include "tests/channel_ready.h"
#include "tests/client/client_test_support.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

using testing::AsDoubles;
using testing::EngineUnderTest;
using testing::Provider;
using testing::Random;

// op(a) . op(b) in float64 with numpy.matmul's broadcasting over a batch.
HostTensor Reference(const HostTensor& a, const HostTensor& b) {
  const bool a3 = a.shape.size() == 3, b3 = b.shape.size() == 3;
  const int64_t ab = a3 ? a.shape[0] : 1, bb = b3 ? b.shape[0] : 1;
  const int64_t batch = std::max(ab, bb);
  const int64_t m = a.shape[a.shape.size() - 2];
  const int64_t k = a.shape.back();
  const int64_t n = b.shape.back();
  const std::vector<double> av = AsDoubles(a), bv = AsDoubles(b);
  std::vector<double> c(batch * m * n, 0.0);
  for (int64_t p = 0; p < batch; ++p) {
    const double* ap = av.data() + (ab == 1 ? 0 : p) * m * k;
    const double* bp = bv.data() + (bb == 1 ? 0 : p) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t q = 0; q < k; ++q) {
        for (int64_t j = 0; j < n; ++j) {
          c[(p * m + i) * n + j] += ap[i * k + q] * bp[q * n + j];
        }
      }
    }
  }
  HostTensor out;
  out.shape =
      a3 || b3 ? std::vector<int64_t>{batch, m, n} : std::vector<int64_t>{m, n};
  out.dtype = DType::kFloat64;
  out.data.assign(reinterpret_cast<const char*>(c.data()), c.size() * 8);
  return out;
}

// Relative Frobenius error of `got` against `want`.
double RelativeError(const HostTensor& got, const HostTensor& want) {
  EXPECT_EQ(got.shape, want.shape);
  const std::vector<double> g = AsDoubles(got), w = AsDoubles(want);
  if (g.size() != w.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 1e-12;
    case DType::kFloat32:
      return 1e-5;
    default:
      return 1e-2;
  }
}

#if defined(__SANITIZE_THREAD__)
#define MATMUL_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MATMUL_UNDER_TSAN 1
#endif
#endif

class StoredTensorClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef MATMUL_UNDER_TSAN
    // Like server_test and matmul_client_test (scripts/sanitize.sh,
    // TSAN_EXCLUDED): Debian's gRPC is not instrumented.
    GTEST_SKIP() << "in-process gRPC server and channels: not under TSan";
#endif
    Start(ServerOptions());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  void Start(ServerOptions options) {
    if (server_ != nullptr) server_->Shutdown();
    options.listen_address = "127.0.0.1:0";
    options.drain_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<MatmulServer>> server =
        MatmulServer::Start(options, Provider());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    target_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  // Connected (bounded): a fresh channel's first connect can fail by chance
  // (tests/channel_ready.h), and these tests look at the server's answers.
  std::unique_ptr<MatmulClient> NewClient(const std::string& client_id = "") {
    ClientOptions options;
    options.client_id = client_id;
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(target_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    const absl::Status connected =
        (*client)->WaitForConnected(absl::FromChrono(testing::kConnectTimeout));
    EXPECT_TRUE(connected.ok()) << connected;
    return *std::move(client);
  }

  int64_t StoredBytes() { return server_->service().handles().stored_bytes(); }
  int64_t StoredHandles() {
    return server_->service().handles().stored_handles();
  }

  std::unique_ptr<MatmulServer> server_;
  std::string target_;
  absl::BitGen gen_;
};

TEST_F(StoredTensorClientTest, UploadDownloadRoundTripsEveryDtype) {
  std::unique_ptr<MatmulClient> client = NewClient();
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{1, 1}, std::vector<int64_t>{17, 5},
          std::vector<int64_t>{3, 4, 7}}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", ShapeString(shape)));
      const HostTensor t = Random(shape, dtype, gen_);
      UploadOptions options;
      options.ttl = absl::Seconds(100);
      const absl::Time before = absl::Now();
      absl::StatusOr<StoredTensor> stored = client->Upload(t, options);
      ASSERT_TRUE(stored.ok()) << stored.status();
      // The server on 127.0.0.1 names itself in its handles.
      EXPECT_THAT(stored->id, ::testing::StartsWith(absl::StrCat(
                                  "h1.", target_, ".", stored->device, ".")));
      EXPECT_EQ(stored->shape, shape);
      EXPECT_EQ(stored->dtype, dtype);
      EXPECT_EQ(stored->bytes, static_cast<int64_t>(t.data.size()));
      EXPECT_GE(stored->expire_time, before + absl::Seconds(99));
      EXPECT_LE(stored->expire_time, absl::Now() + absl::Seconds(101));
      absl::StatusOr<HostTensor> back = client->Download(stored->id);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->shape, t.shape);
      EXPECT_EQ(back->dtype, t.dtype);
      EXPECT_EQ(back->data, t.data);  // bit for bit
      EXPECT_TRUE(client->Delete(stored->id).ok());
    }
  }
  EXPECT_EQ(StoredHandles(), 0);
  EXPECT_EQ(StoredBytes(), 0);
}

TEST_F(StoredTensorClientTest, DefaultTtlIsTheServers) {
  std::unique_ptr<MatmulClient> client = NewClient();
  absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  const int64_t ttl = info->limits().default_handle_ttl_seconds();
  ASSERT_GT(ttl, 0);
  absl::StatusOr<StoredTensor> stored =
      client->Upload(Random({2, 2}, DType::kFloat32, gen_));
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_NEAR(absl::ToDoubleSeconds(stored->expire_time - absl::Now()),
              static_cast<double>(ttl), 5);
  EXPECT_TRUE(client->Delete(stored->id).ok());
}

TEST_F(StoredTensorClientTest, HandlesInEveryMixAndChains) {
  std::unique_ptr<MatmulClient> client = NewClient("chains");
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const HostTensor a = Random({2, 9, 13}, dtype, gen_);
    const HostTensor b = Random({13, 6}, dtype, gen_);
    const HostTensor d = Random({6, 4}, dtype, gen_);
    const HostTensor ab = Reference(a, b);
    absl::StatusOr<StoredTensor> ha = client->Upload(a);
    absl::StatusOr<StoredTensor> hb = client->Upload(b);
    ASSERT_TRUE(ha.ok() && hb.ok());

    // Stored x inline, inline x stored, stored x stored.
    for (auto [x, y] : {std::pair<Operand, Operand>(*ha, b),
                        std::pair<Operand, Operand>(a, *hb),
                        std::pair<Operand, Operand>(*ha, *hb),
                        std::pair<Operand, Operand>(Operand::Handle(ha->id),
                                                    Operand::Handle(hb->id))}) {
      absl::StatusOr<HostTensor> c = client->Multiply(x, y);
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ(c->dtype, dtype);
      EXPECT_LT(RelativeError(*c, ab), Tolerance(dtype));
    }

    // Kept, then chained: (A.B) kept, times D inline, returned.
    MultiplyOptions options;
    options.result_ttl = absl::Seconds(60);
    absl::StatusOr<StoredTensor> kept = client->MultiplyAndKeep(*ha, *hb);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(kept->shape, (std::vector<int64_t>{2, 9, 6}));
    EXPECT_EQ(kept->dtype, dtype);
    EXPECT_EQ(kept->bytes, 2 * 9 * 6 * static_cast<int64_t>(DTypeSize(dtype)));
    absl::StatusOr<HostTensor> kept_data = client->Download(kept->id);
    ASSERT_TRUE(kept_data.ok()) << kept_data.status();
    EXPECT_LT(RelativeError(*kept_data, ab), Tolerance(dtype));
    absl::StatusOr<HostTensor> abd = client->Multiply(*kept, d);
    ASSERT_TRUE(abd.ok()) << abd.status();
    // The reference of the chain starts from the stored product as it is.
    EXPECT_LT(RelativeError(*abd, Reference(*kept_data, d)), Tolerance(dtype));
    // A kept product of a kept product.
    absl::StatusOr<StoredTensor> kept2 =
        client->MultiplyAndKeep(*kept, d, options);
    ASSERT_TRUE(kept2.ok()) << kept2.status();
    absl::StatusOr<HostTensor> kept2_data = client->Download(kept2->id);
    ASSERT_TRUE(kept2_data.ok());
    EXPECT_LT(RelativeError(*kept2_data, Reference(*kept_data, d)),
              Tolerance(dtype));

    for (const std::string& id : {ha->id, hb->id, kept->id, kept2->id}) {
      EXPECT_TRUE(client->Delete(id).ok()) << id;
    }
  }
  EXPECT_EQ(StoredHandles(), 0);
}

TEST_F(StoredTensorClientTest, TransposesApplyToStoredOperands) {
  std::unique_ptr<MatmulClient> client = NewClient();
  const HostTensor a = Random({7, 5}, DType::kFloat32, gen_);  // A^T: 5x7
  const HostTensor b = Random({3, 7}, DType::kFloat32, gen_);  // B^T: 7x3
  absl::StatusOr<StoredTensor> ha = client->Upload(a);
  ASSERT_TRUE(ha.ok());
  MultiplyOptions options;
  options.transpose_a = true;
  options.transpose_b = true;
  absl::StatusOr<HostTensor> c = client->Multiply(*ha, b, options);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->shape, (std::vector<int64_t>{5, 3}));
  const std::vector<double> av = AsDoubles(a), bv = AsDoubles(b),
                            cv = AsDoubles(*c);
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 3; ++j) {
      double want = 0;
      for (int q = 0; q < 7; ++q) want += av[q * 5 + i] * bv[j * 7 + q];
      EXPECT_NEAR(cv[i * 3 + j], want, 1e-5);
    }
  }
  EXPECT_TRUE(client->Delete(ha->id).ok());
}

TEST_F(StoredTensorClientTest, AsyncCalls) {
  std::unique_ptr<MatmulClient> client = NewClient();
  const HostTensor a = Random({16, 8}, DType::kFloat32, gen_);
  const HostTensor b = Random({8, 4}, DType::kFloat32, gen_);
  constexpr int kCalls = 16;
  std::vector<absl::StatusOr<StoredTensor>> uploads(kCalls);
  {
    std::vector<absl::Notification> done(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      client->UploadAsync(a, {}, [&, i](absl::StatusOr<StoredTensor> s) {
        uploads[i] = std::move(s);
        done[i].Notify();
      });
    }
    for (auto& d : done) d.WaitForNotification();
  }
  std::vector<absl::StatusOr<StoredTensor>> kept(kCalls);
  {
    std::vector<absl::Notification> done(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      ASSERT_TRUE(uploads[i].ok()) << uploads[i].status();
      client->MultiplyAndKeepAsync(*uploads[i], b, {},
                                   [&, i](absl::StatusOr<StoredTensor> s) {
                                     kept[i] = std::move(s);
                                     done[i].Notify();
                                   });
    }
    for (auto& d : done) d.WaitForNotification();
  }
  const HostTensor ab = Reference(a, b);
  std::vector<absl::StatusOr<HostTensor>> downloads(kCalls);
  {
    std::vector<absl::Notification> done(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      ASSERT_TRUE(kept[i].ok()) << kept[i].status();
      client->DownloadAsync(kept[i]->id, absl::Seconds(30),
                            [&, i](absl::StatusOr<HostTensor> t) {
                              downloads[i] = std::move(t);
                              done[i].Notify();
                            });
    }
    for (auto& d : done) d.WaitForNotification();
  }
  for (auto& d : downloads) {
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_LT(RelativeError(*d, ab), 1e-5);
  }
  std::atomic<int> deleted{0};
  {
    std::vector<absl::Notification> done(2 * kCalls);
    for (int i = 0; i < kCalls; ++i) {
      for (int j = 0; j < 2; ++j) {
        const std::string& id = j == 0 ? uploads[i]->id : kept[i]->id;
        client->DeleteAsync(id, absl::Seconds(30), [&, i, j](absl::Status s) {
          if (s.ok()) ++deleted;
          done[2 * i + j].Notify();
        });
      }
    }
    for (auto& d : done) d.WaitForNotification();
  }
  EXPECT_EQ(deleted.load(), 2 * kCalls);
  EXPECT_EQ(StoredHandles(), 0);
}

TEST_F(StoredTensorClientTest, GoneHandlesAreNotFound) {
  std::unique_ptr<MatmulClient> client = NewClient();
  const HostTensor a = Random({4, 4}, DType::kFloat32, gen_);
  absl::StatusOr<StoredTensor> stored = client->Upload(a);
  ASSERT_TRUE(stored.ok());
  ASSERT_TRUE(client->Delete(stored->id).ok());
  absl::Status deleted = client->Delete(stored->id);
  EXPECT_EQ(deleted.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(deleted.message(), HasSubstr(stored->id));
  EXPECT_EQ(client->Download(stored->id).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<HostTensor> c = client->Multiply(*stored, a);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("a_handle"));
  c = client->Multiply(a, Operand::Handle("h-never-was"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("b_handle"));
  EXPECT_EQ(client->MultiplyAndKeep(*stored, a).status().code(),
            absl::StatusCode::kNotFound);

  // Expired: a one-second TTL.
  UploadOptions short_lived;
  short_lived.ttl = absl::Milliseconds(300);  // rounded up to 1 s
  stored = client->Upload(a, short_lived);
  ASSERT_TRUE(stored.ok());
  EXPECT_LE(stored->expire_time, absl::Now() + absl::Seconds(1));
  EXPECT_TRUE(client->Download(stored->id).ok());
  absl::SleepFor(stored->expire_time - absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(client->Download(stored->id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Multiply(*stored, a).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoredTensorClientTest, BadRequestsAreInvalidArgument) {
  std::unique_ptr<MatmulClient> client = NewClient();
  const HostTensor a = Random({4, 4}, DType::kFloat32, gen_);
  absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  UploadOptions too_long;
  too_long.ttl = absl::Seconds(info->limits().max_handle_ttl_seconds() + 1);
  absl::StatusOr<StoredTensor> s = client->Upload(a, too_long);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("ttl"));
  UploadOptions no_device;
  no_device.device = 977;
  s = client->Upload(a, no_device);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("device"));
  MultiplyOptions keep_too_long;
  keep_too_long.result_ttl = too_long.ttl;
  EXPECT_EQ(client->MultiplyAndKeep(a, a, keep_too_long).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Stored operand of another dtype than the inline one.
  s = client->Upload(a);
  ASSERT_TRUE(s.ok());
  const HostTensor f64 = Random({4, 4}, DType::kFloat64, gen_);
  EXPECT_EQ(client->Multiply(*s, f64).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Shapes that do not chain.
  const HostTensor wrong = Random({5, 2}, DType::kFloat32, gen_);
  EXPECT_EQ(client->Multiply(*s, wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(client->Delete(s->id).ok());
  EXPECT_EQ(StoredHandles(), 0);
}

TEST_F(StoredTensorClientTest, QuotasAreChargedToTheClientId) {
  ServerOptions options;
  options.handle_limits.max_bytes_per_client = 1000;
  options.handle_limits.max_handles_per_client = 3;
  Start(options);
  std::unique_ptr<MatmulClient> alice = NewClient("alice");
  std::unique_ptr<MatmulClient> bob = NewClient("bob");
  const HostTensor small = Random({4, 4}, DType::kFloat32, gen_);  // 64 B
  const HostTensor big = Random({16, 16}, DType::kFloat32, gen_);  // 1 KiB

  // Bytes: 1024 > 1000 for anyone.
  absl::StatusOr<StoredTensor> s = alice->Upload(big);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("alice"));

  // Handles: three each.
  std::vector<std::string> alices;
  for (int i = 0; i < 3; ++i) {
    s = alice->Upload(small);
    ASSERT_TRUE(s.ok()) << s.status();
    alices.push_back(s->id);
  }
  s = alice->Upload(small);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("alice"));
  // A kept product needs a handle too.
  absl::StatusOr<StoredTensor> kept =
      alice->MultiplyAndKeep(Operand::Handle(alices[0]), small);
  EXPECT_EQ(kept.status().code(), absl::StatusCode::kResourceExhausted);
  // Using handles costs nothing, and returning products neither.
  EXPECT_TRUE(alice->Multiply(Operand::Handle(alices[0]), small).ok());

  // Bob has his own quota, and may use alice's handles (ids are
  // capabilities).
  kept = bob->MultiplyAndKeep(Operand::Handle(alices[0]),
                              Operand::Handle(alices[1]));
  ASSERT_TRUE(kept.ok()) << kept.status();
  // A per-call id charges that client, through alice's channel.
  UploadOptions as_bob;
  as_bob.client_id = "bob";
  s = alice->Upload(small, as_bob);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string bobs_upload = s->id;
  MultiplyOptions keep_as_carol;
  keep_as_carol.client_id = "carol";
  absl::StatusOr<StoredTensor> carols =
      alice->MultiplyAndKeep(small, small, keep_as_carol);
  ASSERT_TRUE(carols.ok()) << carols.status();

  // Deleting frees the quota.
  ASSERT_TRUE(alice->Delete(alices.back()).ok());
  alices.pop_back();
  s = alice->Upload(small);
  ASSERT_TRUE(s.ok()) << s.status();
  alices.push_back(s->id);

  for (const std::string& id : alices) EXPECT_TRUE(alice->Delete(id).ok());
  EXPECT_TRUE(bob->Delete(kept->id).ok());
  EXPECT_TRUE(bob->Delete(bobs_upload).ok());
  EXPECT_TRUE(alice->Delete(carols->id).ok());
  EXPECT_EQ(StoredHandles(), 0);
  EXPECT_EQ(StoredBytes(), 0);
}

TEST_F(StoredTensorClientTest, ConcurrentChainsFromManyThreads) {
  constexpr int kThreads = 8;
  constexpr int kChains = 5;
  // Each chain's first failure, named, so that a failed run says which
  // step failed and how.
  absl::Mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<MatmulClient> client =
          NewClient(absl::StrCat("thread-", t));
      absl::BitGen gen;
      auto fail = [&](int i, absl::string_view step,
                      const absl::Status& status) {
        absl::MutexLock lock(&mu);
        failures.push_back(absl::StrCat("thread ", t, " chain ", i, ": ", step,
                                        ": ", status.ToString()));
      };
      for (int i = 0; i < kChains; ++i) {
        const HostTensor a = Random({1 + t, 6}, DType::kFloat32, gen);
        const HostTensor b = Random({6, 5}, DType::kFloat32, gen);
        const HostTensor c = Random({5, 3}, DType::kFloat32, gen);
        absl::StatusOr<StoredTensor> ha = client->Upload(a);
        if (!ha.ok()) {
          fail(i, "Upload", ha.status());
          continue;
        }
        absl::StatusOr<StoredTensor> ab = client->MultiplyAndKeep(*ha, b);
        if (!ab.ok()) {
          fail(i, "MultiplyAndKeep", ab.status());
          continue;
        }
        absl::StatusOr<HostTensor> abc = client->Multiply(*ab, c);
        const absl::Status deleted_a = client->Delete(ha->id);
        const absl::Status deleted_ab = client->Delete(ab->id);
        if (!abc.ok()) {
          fail(i, "Multiply", abc.status());
        } else if (!deleted_a.ok() || !deleted_ab.ok()) {
          fail(i, "Delete", deleted_a.ok() ? deleted_ab : deleted_a);
        } else if (RelativeError(*abc, Reference(Reference(a, b), c)) >= 1e-5) {
          fail(i, "product", absl::DataLossError("wrong values"));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  EXPECT_EQ(StoredHandles(), 0);
}

// A channel and stub of its own, for the raw protocol.
std::unique_ptr<v1::MatmulService::Stub> RawStub(const std::string& target) {
  return v1::MatmulService::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

// Bytes that no two offsets share in practice (a 64-bit mix per 8 bytes),
// cheap enough for a tensor of a gigabyte.
HostTensor Patterned(std::vector<int64_t> shape, DType dtype, uint64_t seed) {
  HostTensor t;
  t.shape = std::move(shape);
  t.dtype = dtype;
  const int64_t bytes = *NumBytes(t.shape, dtype);
  t.data.resize(static_cast<size_t>(bytes));
  uint64_t x = seed;
  for (int64_t i = 0; i + 8 <= bytes; i += 8) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(t.data.data() + i, &z, 8);
  }
  for (int64_t i = bytes / 8 * 8; i < bytes; ++i) {
    t.data[static_cast<size_t>(i)] = static_cast<char>(i * 131 + seed);
  }
  return t;
}

TEST_F(StoredTensorClientTest, ChunkedUploadAndDownloadRoundTrip) {
  std::unique_ptr<MatmulClient> client = NewClient("chunks");
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{1, 1}, std::vector<int64_t>{37, 29},
          std::vector<int64_t>{3, 40, 17}}) {
      for (int64_t chunk : {int64_t{1}, int64_t{100}, int64_t{1} << 20}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", ShapeString(shape),
                                  " chunks of ", chunk));
        const HostTensor t = Random(shape, dtype, gen_);
        UploadOptions options;
        options.chunk_bytes = chunk;  // rounded up to one element at least
        options.ttl = absl::Seconds(100);
        absl::StatusOr<StoredTensor> stored = client->Upload(t, options);
        ASSERT_TRUE(stored.ok()) << stored.status();
        EXPECT_EQ(stored->shape, shape);
        EXPECT_EQ(stored->dtype, dtype);
        EXPECT_EQ(stored->bytes, static_cast<int64_t>(t.data.size()));
        EXPECT_GE(stored->expire_time, absl::Now() + absl::Seconds(98));
        absl::StatusOr<HostTensor> back = client->Download(stored->id);
        ASSERT_TRUE(back.ok()) << back.status();
        EXPECT_EQ(back->shape, t.shape);
        EXPECT_EQ(back->dtype, t.dtype);
        EXPECT_EQ(back->data, t.data);  // bit for bit
        // And as an operand, like any stored tensor.
        if (shape.size() == 2 && dtype == DType::kFloat32) {
          absl::StatusOr<HostTensor> product =
              client->Multiply(*stored, Random({shape[1], 2}, dtype, gen_));
          EXPECT_TRUE(product.ok()) << product.status();
        }
        EXPECT_TRUE(client->Delete(stored->id).ok());
      }
    }
  }
  EXPECT_EQ(StoredHandles(), 0);
  EXPECT_EQ(StoredBytes(), 0);
}

TEST_F(StoredTensorClientTest, TensorsOverTheMessageLimitTravelInChunks) {
  // A server whose messages are small: the tensor is over its limit, and
  // Upload (chunked), Download (always chunked) and the async calls get it
  // there and back; the unary RPCs alone could not.
  ServerOptions options;
  options.limits.max_message_bytes = 1 << 20;
  Start(options);
  std::unique_ptr<MatmulClient> client = NewClient();
  const HostTensor t =
      Patterned({3, 300, 1000}, DType::kFloat32, 7);  // 3.4 MiB
  UploadOptions chunked;
  chunked.chunk_bytes = 256 << 10;
  absl::StatusOr<StoredTensor> stored = client->Upload(t, chunked);
  ASSERT_TRUE(stored.ok()) << stored.status();
  absl::StatusOr<HostTensor> back = client->Download(stored->id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape, t.shape);
  EXPECT_TRUE(back->data == t.data);
  // Under kUploadChunkedAboveBytes the blocking Upload tries one message,
  // which this server refuses, then chunks.
  absl::StatusOr<StoredTensor> retried = client->Upload(t);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_TRUE(client->Delete(retried->id).ok());

  absl::Notification uploaded;
  absl::StatusOr<StoredTensor> async_stored;
  client->UploadAsync(t, chunked, [&](absl::StatusOr<StoredTensor> s) {
    async_stored = std::move(s);
    uploaded.Notify();
  });
  uploaded.WaitForNotification();
  ASSERT_TRUE(async_stored.ok()) << async_stored.status();
  absl::Notification downloaded;
  absl::StatusOr<HostTensor> async_back;
  client->DownloadAsync(async_stored->id, absl::Seconds(60),
                        [&](absl::StatusOr<HostTensor> d) {
                          async_back = std::move(d);
                          downloaded.Notify();
                        });
  downloaded.WaitForNotification();
  ASSERT_TRUE(async_back.ok()) << async_back.status();
  EXPECT_TRUE(async_back->data == t.data);

  // The unary Download refuses it, naming the limit.
  std::unique_ptr<v1::MatmulService::Stub> stub = RawStub(target_);
  grpc::ClientContext context;
  v1::DownloadRequest request;
  request.set_handle(stored->id);
  v1::DownloadResponse response;
  const grpc::Status unary = stub->Download(&context, request, &response);
  EXPECT_EQ(unary.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(unary.error_message(), HasSubstr("max message size"));
  EXPECT_TRUE(client->Delete(stored->id).ok());
  EXPECT_TRUE(client->Delete(async_stored->id).ok());
}

// What a 1.2 GiB tensor costs here: the tensor, its copy on the server and
// the one downloaded (3.6 GiB).
TEST_F(StoredTensorClientTest, A12GiBTensorRoundTripsBitExact) {
  std::unique_ptr<MatmulClient> client = NewClient("big");
  // 19661 x 16384 float32: 1.2 GiB, over the server's 1 GiB messages.
  const std::vector<int64_t> shape = {19661, 16384};
  const HostTensor t = Patterned(shape, DType::kFloat32, 12);
  ASSERT_GT(t.data.size(), size_t{1} << 30);
  const absl::Time start = absl::Now();
  absl::StatusOr<StoredTensor> stored = client->Upload(t);  // chunked by size
  ASSERT_TRUE(stored.ok()) << stored.status();
  const absl::Time uploaded = absl::Now();
  EXPECT_EQ(StoredBytes(), static_cast<int64_t>(t.data.size()));
  EXPECT_EQ(stored->shape, shape);
  absl::StatusOr<HostTensor> back = client->Download(stored->id);
  const absl::Time downloaded = absl::Now();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape, shape);
  EXPECT_TRUE(back->data == t.data);  // bit for bit
  EXPECT_TRUE(client->Delete(stored->id).ok());
  EXPECT_EQ(StoredBytes(), 0);
  std::printf("1.2 GiB: upload %.2f s, download %.2f s\n",
              absl::ToDoubleSeconds(uploaded - start),
              absl::ToDoubleSeconds(downloaded - uploaded));
}

// An UploadStream call driven by hand: `messages` written in order, then
// the close; its status.
grpc::Status RawUpload(v1::MatmulService::Stub& stub,
                       const std::vector<v1::UploadStreamRequest>& messages,
                       const std::string& client_id = "",
                       v1::UploadStreamResponse* response = nullptr) {
  grpc::ClientContext context;
  if (!client_id.empty()) context.AddMetadata("x-matmul-client", client_id);
  v1::UploadStreamResponse ignored;
  std::unique_ptr<grpc::ClientWriter<v1::UploadStreamRequest>> writer =
      stub.UploadStream(&context, response != nullptr ? response : &ignored);
  for (const v1::UploadStreamRequest& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

v1::UploadStreamRequest StartOf(std::vector<int64_t> shape,
                                v1::Dtype dtype = v1::DTYPE_FLOAT32) {
  v1::UploadStreamRequest m;
  for (int64_t d : shape) m.mutable_start()->mutable_tensor()->add_shape(d);
  m.mutable_start()->mutable_tensor()->set_dtype(dtype);
  return m;
}

v1::UploadStreamRequest ChunkOf(int64_t offset, int64_t bytes) {
  v1::UploadStreamRequest m;
  m.mutable_chunk()->set_offset(offset);
  m.mutable_chunk()->set_data(std::string(static_cast<size_t>(bytes), 'x'));
  return m;
}

TEST_F(StoredTensorClientTest, ChunksThatDoNotAddUpAreInvalidArgument) {
  ServerOptions options;
  options.handle_limits.max_bytes_per_client = 1000;
  Start(options);
  std::unique_ptr<v1::MatmulService::Stub> stub = RawStub(target_);
  struct Case {
    const char* what;
    std::vector<v1::UploadStreamRequest> messages;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"no start", {}, "closed before its first message"},
      {"a chunk first", {ChunkOf(0, 16)}, "first message must be a start"},
      {"bytes missing",
       {StartOf({4, 4}), ChunkOf(0, 32)},
       "32 of the tensor's 64"},
      {"a gap",
       {StartOf({4, 4}), ChunkOf(0, 16), ChunkOf(20, 16)},
       "offset 20; expected 16"},
      {"an overlap",
       {StartOf({4, 4}), ChunkOf(0, 16), ChunkOf(8, 16)},
       "offset 8; expected 16"},
      {"past the end",
       {StartOf({4, 4}), ChunkOf(0, 48), ChunkOf(48, 32)},
       "runs past the tensor's end"},
      {"part of an element",
       {StartOf({4, 4}), ChunkOf(0, 6)},
       "whole number of 4-byte elements"},
      {"an empty chunk",
       {StartOf({4, 4}), ChunkOf(0, 0)},
       "whole number of 4-byte elements"},
      {"a second start",
       {StartOf({4, 4}), ChunkOf(0, 16), StartOf({4, 4})},
       "a second start"},
      {"data in the start",
       {[] {
         v1::UploadStreamRequest m = StartOf({2, 2});
         m.mutable_start()->mutable_tensor()->set_data(std::string(16, 'x'));
         return m;
       }()},
       "follow in TensorChunks"},
      {"a bad shape", {StartOf({4})}, "expected 2 dimensions"},
      {"no dtype", {StartOf({4, 4}, v1::DTYPE_UNSPECIFIED)}, "dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const grpc::Status status = RawUpload(*stub, c.messages, "raw");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(c.says));
  }
  // Over the quota, before any chunk is read.
  const grpc::Status over =
      RawUpload(*stub, {StartOf({16, 16}), ChunkOf(0, 1024)}, "raw");
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("raw"));
  // Nothing stored, nothing charged: the whole quota is free.
  EXPECT_EQ(StoredHandles(), 0);
  EXPECT_EQ(StoredBytes(), 0);
  v1::UploadStreamResponse response;
  const grpc::Status whole =
      RawUpload(*stub, {StartOf({10, 25}), ChunkOf(0, 600), ChunkOf(600, 400)},
                "raw", &response);
  ASSERT_TRUE(whole.ok()) << whole.error_message();
  EXPECT_EQ(response.handle().bytes(), 1000);
  EXPECT_EQ(StoredBytes(), 1000);
}

TEST_F(StoredTensorClientTest, CancelledChunkedUploadStoresAndChargesNothing) {
  ServerOptions options;
  options.handle_limits.max_bytes_per_client = 4 << 20;
  Start(options);
  std::unique_ptr<MatmulClient> client = NewClient("quitter");
  std::unique_ptr<v1::MatmulService::Stub> stub = RawStub(target_);
  {
    // Half the bytes, then the client cancels.
    grpc::ClientContext context;
    context.AddMetadata("x-matmul-client", "quitter");
    v1::UploadStreamResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadStreamRequest>> writer =
        stub->UploadStream(&context, &response);
    ASSERT_TRUE(writer->Write(StartOf({1024, 1024})));
    ASSERT_TRUE(writer->Write(ChunkOf(0, 2 << 20)));
    context.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  {
    // The client's deadline passes midway.
    grpc::ClientContext context;
    context.AddMetadata("x-matmul-client", "quitter");
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(500));
    v1::UploadStreamResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadStreamRequest>> writer =
        stub->UploadStream(&context, &response);
    // On a busy machine the deadline may pass before a write: the call
    // then ends as it does after one, which is what this checks.
    if (writer->Write(StartOf({1024, 1024}))) {
      (void)writer->Write(ChunkOf(0, 1 << 20));
    }
    absl::SleepFor(absl::Seconds(1));
    EXPECT_EQ(writer->Finish().error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  {
    // The library's call, cancelled through its canceller.
    auto canceller = std::make_shared<CallCanceller>();
    UploadOptions cancelled;
    cancelled.canceller = canceller;
    cancelled.chunk_bytes = 4096;
    absl::Notification done;
    absl::StatusOr<StoredTensor> result;
    client->UploadAsync(Patterned({1024, 1024}, DType::kFloat32, 1), cancelled,
                        [&](absl::StatusOr<StoredTensor> s) {
                          result = std::move(s);
                          done.Notify();
                        });
    canceller->Cancel();
    done.WaitForNotification();
    EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  }
  // The server lets go of the calls; then nothing is stored and the whole
  // quota (4 MiB: exactly one tensor) is free.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((server_->service().calls_in_progress() > 0 ||
          server_->service().inflight_requests() > 0) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(StoredHandles(), 0);
  EXPECT_EQ(StoredBytes(), 0);
  UploadOptions chunked;
  chunked.chunk_bytes = 1 << 20;
  absl::StatusOr<StoredTensor> whole =
      client->Upload(Patterned({1024, 1024}, DType::kFloat32, 2), chunked);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(client->Delete(whole->id).ok());
}

TEST_F(StoredTensorClientTest, DownloadStreamSendsChunksInOrder) {
  std::unique_ptr<MatmulClient> client = NewClient();
  const HostTensor t = Patterned({5, 7, 3}, DType::kFloat16, 3);  // 210 B
  absl::StatusOr<StoredTensor> stored = client->Upload(t);
  ASSERT_TRUE(stored.ok()) << stored.status();
  std::unique_ptr<v1::MatmulService::Stub> stub = RawStub(target_);
  for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}}) {
    SCOPED_TRACE(chunk);
    grpc::ClientContext context;
    v1::DownloadStreamRequest request;
    request.set_handle(stored->id);
    request.set_chunk_bytes(chunk);
    std::unique_ptr<grpc::ClientReader<v1::DownloadStreamResponse>> reader =
        stub->DownloadStream(&context, request);
    v1::DownloadStreamResponse message;
    ASSERT_TRUE(reader->Read(&message));
    ASSERT_TRUE(message.has_handle());
    EXPECT_EQ(message.handle().id(), stored->id);
    EXPECT_EQ(message.handle().bytes(), 210);
    std::string data;
    const int64_t expected =
        chunk == 0 ? 210 : std::max<int64_t>(2, chunk / 2 * 2);
    while (reader->Read(&message)) {
      ASSERT_TRUE(message.has_chunk());
      EXPECT_EQ(message.chunk().offset(), static_cast<int64_t>(data.size()));
      EXPECT_LE(static_cast<int64_t>(message.chunk().data().size()), expected);
      data += message.chunk().data();
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(data, t.data);
  }
  // Errors are the unary Download's.
  for (auto [handle, chunk, code] :
       {std::tuple<std::string, int64_t, grpc::StatusCode>{
            "h-gone", 0, grpc::StatusCode::NOT_FOUND},
        {stored->id, -1, grpc::StatusCode::INVALID_ARGUMENT}}) {
    grpc::ClientContext context;
    v1::DownloadStreamRequest request;
    request.set_handle(handle);
    request.set_chunk_bytes(chunk);
    std::unique_ptr<grpc::ClientReader<v1::DownloadStreamResponse>> reader =
        stub->DownloadStream(&context, request);
    v1::DownloadStreamResponse message;
    EXPECT_FALSE(reader->Read(&message));
    EXPECT_EQ(reader->Finish().error_code(), code);
  }
  EXPECT_TRUE(client->Delete(stored->id).ok());
}

}  // namespace
}  // namespace matmul
