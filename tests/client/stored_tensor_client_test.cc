// MatmulClient's stored-tensor API (Upload, Download, Delete, handles as
// operands, MultiplyAndKeep, client ids) against a real MatmulServer in
// this process (host engine, or MATMUL_TEST_ENGINE), on 127.0.0.1:0, so
// that quotas and lifetimes can be set small. Products are checked against
// a float64 product computed here.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
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

}  // namespace
}  // namespace matmul
