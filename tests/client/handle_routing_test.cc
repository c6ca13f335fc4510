// Handles that name their server (issue 58 item 2): three MatmulServers in
// this process (host engine) on 127.0.0.1:0, and clients through one
// "ipv4:A,B,C" target that spreads (round_robin). Every call naming a
// handle must reach the server holding it; a handle whose server is gone is
// NOT_FOUND, saying so. Products are of small integers, so exact.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "client/lib/multiply_encoding.h"
#include "common/handle_id.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/matmul_server.h"
#include "tests/channel_ready.h"
#include "tests/client/client_test_support.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

#if defined(__SANITIZE_THREAD__)
#define MATMUL_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MATMUL_UNDER_TSAN 1
#endif
#endif

constexpr int kServers = 3;

// A float64 matrix of small integers from `seed` (exact products).
HostTensor Integers(int64_t rows, int64_t cols, int seed) {
  HostTensor t;
  t.shape = {rows, cols};
  t.dtype = DType::kFloat64;
  std::vector<double> v(rows * cols);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<double>((seed * 7 + static_cast<int>(i) * 3) % 11 - 5);
  }
  t.data.assign(reinterpret_cast<const char*>(v.data()), v.size() * 8);
  return t;
}

HostTensor Product(const HostTensor& a, const HostTensor& b) {
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[1];
  std::vector<double> av(m * k), bv(k * n), c(m * n, 0.0);
  std::memcpy(av.data(), a.data.data(), a.data.size());
  std::memcpy(bv.data(), b.data.data(), b.data.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t q = 0; q < k; ++q) {
      for (int64_t j = 0; j < n; ++j)
        c[i * n + j] += av[i * k + q] * bv[q * n + j];
    }
  }
  HostTensor out;
  out.shape = {m, n};
  out.dtype = DType::kFloat64;
  out.data.assign(reinterpret_cast<const char*>(c.data()), c.size() * 8);
  return out;
}

void ExpectExact(const absl::StatusOr<HostTensor>& got, const HostTensor& want,
                 const std::string& what) {
  ASSERT_TRUE(got.ok()) << what << ": " << got.status();
  EXPECT_EQ(got->shape, want.shape) << what;
  EXPECT_TRUE(got->data == want.data) << what << ": the product differs";
}

class HandleRoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef MATMUL_UNDER_TSAN
    GTEST_SKIP() << "in-process gRPC servers and channels: not under TSan";
#endif
    std::vector<std::string> addresses;
    for (int i = 0; i < kServers; ++i) {
      servers_.push_back(StartServer(ServerOptions()));
      ASSERT_NE(servers_.back(), nullptr);
      addresses.push_back(absl::StrCat("127.0.0.1:", servers_.back()->port()));
    }
    target_ = absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
  }
  void TearDown() override {
    for (auto& server : servers_) {
      if (server != nullptr) server->Shutdown();
    }
  }

  static std::unique_ptr<MatmulServer> StartServer(ServerOptions options) {
    if (options.listen_address == ServerOptions().listen_address) {
      options.listen_address = "127.0.0.1:0";
    }
    options.drain_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<MatmulServer>> server =
        MatmulServer::Start(options, testing::Provider());
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  std::unique_ptr<MatmulClient> NewClient(ClientOptions options = {}) {
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(target_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    const absl::Status connected =
        (*client)->WaitForConnected(absl::FromChrono(testing::kConnectTimeout));
    EXPECT_TRUE(connected.ok()) << connected;
    // round_robin sends calls only to the connections that are up, and
    // WaitForConnected waits for the first: a while of calls lets the others
    // come up, so that uploads spread.
    const absl::Time end = absl::Now() + absl::Milliseconds(300);
    while (absl::Now() < end) (void)(*client)->GetServerInfo(absl::Seconds(5));
    return *std::move(client);
  }

  // The server holding `id`, by its advertised address; -1 if none.
  int ServerOf(const std::string& id) {
    std::optional<HandleHome> home = HandleHomeOf(id);
    if (!home.has_value()) return -1;
    for (int i = 0; i < kServers; ++i) {
      if (home->address == absl::StrCat("127.0.0.1:", servers_[i]->port())) {
        return i;
      }
    }
    return -1;
  }

  std::vector<std::unique_ptr<MatmulServer>> servers_;
  std::string target_;
};

TEST_F(HandleRoutingTest, HandlesNameTheServerAndDeviceTheyLiveOn) {
  std::unique_ptr<MatmulClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<StoredTensor> stored = client->Upload(Integers(4, 4, 1));
  ASSERT_TRUE(stored.ok()) << stored.status();
  std::optional<HandleHome> home = HandleHomeOf(stored->id);
  ASSERT_TRUE(home.has_value()) << stored->id;
  EXPECT_EQ(home->device, stored->device);
  const int holder = ServerOf(stored->id);
  ASSERT_GE(holder, 0) << stored->id;
  EXPECT_EQ(servers_[holder]->service().handles().stored_handles(), 1);
  // The random part keeps its 128 bits.
  EXPECT_EQ(stored->id.size() - stored->id.rfind('.') - 1, 32u);
}

// Issue 58's test (b): 30 tensors uploaded through the spread, each
// multiplied with 10 times through it: no NOT_FOUND, every product exact.
TEST_F(HandleRoutingTest, UploadsSpreadAndEveryCallFindsItsHandle) {
  std::unique_ptr<MatmulClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  constexpr int kTensors = 30, kMultiplies = 10;
  std::vector<HostTensor> tensors;
  std::vector<StoredTensor> stored;
  int per_server[kServers] = {};
  for (int i = 0; i < kTensors; ++i) {
    tensors.push_back(Integers(6, 5, i));
    absl::StatusOr<StoredTensor> s = client->Upload(tensors.back());
    ASSERT_TRUE(s.ok()) << s.status();
    const int holder = ServerOf(s->id);
    ASSERT_GE(holder, 0) << s->id;
    ++per_server[holder];
    stored.push_back(*s);
  }
  // The uploads themselves spread (round_robin over ready connections).
  int servers_used = 0;
  for (int n : per_server) servers_used += n > 0 ? 1 : 0;
  EXPECT_GE(servers_used, 2)
      << per_server[0] << " " << per_server[1] << " " << per_server[2];
  const HostTensor b = Integers(5, 3, 99);
  for (int round = 0; round < kMultiplies; ++round) {
    for (int i = 0; i < kTensors; ++i) {
      ExpectExact(client->Multiply(stored[i], b), Product(tensors[i], b),
                  absl::StrCat("tensor ", i, " round ", round));
    }
  }
  for (int i = 0; i < kTensors; ++i) {
    ExpectExact(client->Download(stored[i].id), tensors[i],
                absl::StrCat("download ", i));
    EXPECT_TRUE(client->Delete(stored[i].id).ok()) << i;
  }
  for (const auto& server : servers_) {
    EXPECT_EQ(server->service().handles().stored_handles(), 0);
  }
}

TEST_F(HandleRoutingTest, EveryCallThatNamesAHandleIsRouted) {
  std::unique_ptr<MatmulClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  const HostTensor a = Integers(8, 6, 3), b = Integers(6, 4, 4);
  const HostTensor c = Integers(4, 5, 5);
  const HostTensor ab = Product(a, b);
  for (int i = 0; i < 3 * kServers; ++i) {
    absl::StatusOr<StoredTensor> sa = client->Upload(a);
    ASSERT_TRUE(sa.ok()) << sa.status();
    // Either side, and a kept product, which lives where its operand does.
    ExpectExact(
        client->Multiply(a, Operand::Handle(client->Upload(b).value().id)), ab,
        "b stored");
    absl::StatusOr<StoredTensor> kept = client->MultiplyAndKeep(*sa, b);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(ServerOf(kept->id), ServerOf(sa->id));
    ExpectExact(client->Multiply(*kept, c), Product(ab, c), "chained");
    // Prebuilt and encoded requests.
    absl::StatusOr<v1::MultiplyRequest> request =
        MakeMultiplyRequest(*sa, b, MultiplyOptions());
    ASSERT_TRUE(request.ok());
    absl::StatusOr<v1::MultiplyResponse> raw = client->MultiplyRaw(*request);
    EXPECT_TRUE(raw.ok()) << raw.status();
    absl::StatusOr<v1::MultiplyResponse> encoded =
        client->MultiplyEncoded(EncodeMultiplyRequest(*request));
    EXPECT_TRUE(encoded.ok()) << encoded.status();
    // Streamed: one call, and striped over two.
    ExpectExact(client->MultiplyStreamed(*sa, b), ab, "streamed");
    StreamOptions two;
    two.stripes = 2;
    ExpectExact(client->MultiplyStreamed(*sa, b, MultiplyOptions(), two), ab,
                "striped");
    // Asynchronous.
    absl::Notification multiplied, downloaded, deleted;
    client->MultiplyAsync(*sa, b, MultiplyOptions(),
                          [&](absl::StatusOr<HostTensor> got) {
                            ExpectExact(got, ab, "async");
                            multiplied.Notify();
                          });
    multiplied.WaitForNotification();
    client->DownloadAsync(kept->id, absl::InfiniteDuration(),
                          [&](absl::StatusOr<HostTensor> got) {
                            ExpectExact(got, ab, "download async");
                            downloaded.Notify();
                          });
    downloaded.WaitForNotification();
    client->DeleteAsync(kept->id, absl::InfiniteDuration(),
                        [&](absl::Status s) {
                          EXPECT_TRUE(s.ok()) << s;
                          deleted.Notify();
                        });
    deleted.WaitForNotification();
    EXPECT_TRUE(client->Delete(sa->id).ok());
  }
}

TEST_F(HandleRoutingTest, OperandsOnTwoServersAreInvalidArgument) {
  std::unique_ptr<MatmulClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  std::vector<StoredTensor> by_server(kServers);
  for (int i = 0; i < 60; ++i) {
    absl::StatusOr<StoredTensor> s = client->Upload(Integers(4, 4, i));
    ASSERT_TRUE(s.ok());
    by_server[ServerOf(s->id)] = *s;
    if (!by_server[0].id.empty() && !by_server[1].id.empty()) break;
  }
  if (by_server[0].id.empty() || by_server[1].id.empty()) {
    GTEST_SKIP() << "the uploads did not reach two servers";
  }
  absl::StatusOr<HostTensor> c = client->Multiply(by_server[0], by_server[1]);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("different servers"));
}

TEST_F(HandleRoutingTest, AnUploadNearAHandleLandsOnItsServer) {
  std::unique_ptr<MatmulClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  std::vector<int> landed(kServers, 0);
  for (int i = 0; i < 12; ++i) {
    const HostTensor a = Integers(6, 5, i), b = Integers(5, 4, i + 100);
    absl::StatusOr<StoredTensor> sa = client->Upload(a);
    ASSERT_TRUE(sa.ok()) << sa.status();
    UploadOptions near;
    near.near = sa->id;
    // One message, in chunks (UploadStream), and asynchronously.
    absl::StatusOr<StoredTensor> sb;
    if (i % 3 == 0) {
      sb = client->Upload(b, near);
    } else if (i % 3 == 1) {
      near.chunk_bytes = 40;
      sb = client->Upload(b, near);
    } else {
      absl::Notification done;
      client->UploadAsync(b, near, [&](absl::StatusOr<StoredTensor> s) {
        sb = std::move(s);
        done.Notify();
      });
      done.WaitForNotification();
    }
    ASSERT_TRUE(sb.ok()) << sb.status();
    ASSERT_GE(ServerOf(sa->id), 0);
    EXPECT_EQ(ServerOf(sb->id), ServerOf(sa->id)) << "upload " << i;
    ++landed[ServerOf(sa->id)];
    ExpectExact(client->Multiply(*sa, *sb), Product(a, b),
                absl::StrCat("pair ", i));
  }
  // The first uploads themselves spread.
  EXPECT_GE(*std::max_element(landed.begin(), landed.end()), 1);
  EXPECT_LT(*std::max_element(landed.begin(), landed.end()), 12);
}

TEST_F(HandleRoutingTest, AnUploadNearAGoneServerIsNotFound) {
  std::unique_ptr<MatmulClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<StoredTensor> stored = client->Upload(Integers(4, 4, 1));
  ASSERT_TRUE(stored.ok());
  const int holder = ServerOf(stored->id);
  ASSERT_GE(holder, 0);
  servers_[holder]->Shutdown();
  servers_[holder].reset();
  UploadOptions near;
  near.near = stored->id;
  absl::StatusOr<StoredTensor> b = client->Upload(Integers(4, 4, 2), near);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound) << b.status();
  EXPECT_THAT(b.status().message(), HasSubstr("not reachable"));
}

TEST_F(HandleRoutingTest, AHandleWhoseServerIsGoneIsNotFoundSayingSo) {
  std::unique_ptr<MatmulClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  const HostTensor a = Integers(4, 4, 1);
  absl::StatusOr<StoredTensor> stored = client->Upload(a);
  ASSERT_TRUE(stored.ok());
  const int holder = ServerOf(stored->id);
  ASSERT_GE(holder, 0);
  const std::string address = HandleHomeOf(stored->id)->address;
  ExpectExact(client->Multiply(*stored, a), Product(a, a), "before");
  servers_[holder]->Shutdown();
  servers_[holder].reset();
  absl::StatusOr<HostTensor> c = client->Multiply(*stored, a);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("not reachable"));
  EXPECT_THAT(c.status().message(), HasSubstr(address));
  EXPECT_EQ(client->Download(stored->id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Delete(stored->id).code(), absl::StatusCode::kNotFound);
  // Calls without handles go on over the others.
  for (int i = 0; i < 10; ++i) {
    ExpectExact(client->Multiply(a, a), Product(a, a), "spread");
  }
}

TEST_F(HandleRoutingTest, HandlesWithoutAHomeGoOverTheSpread) {
  // A server on the wildcard address has nothing to advertise: "h-" ids,
  // sent like any other call (this one target names only it).
  ServerOptions options;
  options.listen_address = "0.0.0.0:0";
  std::unique_ptr<MatmulServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  target_ = absl::StrCat("127.0.0.1:", server->port());
  std::unique_ptr<MatmulClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  const HostTensor a = Integers(4, 4, 2);
  absl::StatusOr<StoredTensor> stored = client->Upload(a);
  ASSERT_TRUE(stored.ok());
  EXPECT_THAT(stored->id, StartsWith("h-"));
  ExpectExact(client->Multiply(*stored, a), Product(a, a), "no home");
  server->Shutdown();
}

TEST_F(HandleRoutingTest, TheAdvertisedAddressIsTheOneGiven) {
  ServerOptions options;
  options.advertise_address = "10.9.8.7:1234";
  std::unique_ptr<MatmulServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->service().handles().home(), "10.9.8.7:1234");
  server->Shutdown();
  // A host alone (Kubernetes' status.podIP) gets the bound port.
  options.advertise_address = "fd00::7";
  server = StartServer(options);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->service().handles().home(),
            absl::StrCat("[fd00::7]:", server->port()));
  server->Shutdown();
  options.advertise_address = "not an address";
  absl::StatusOr<std::unique_ptr<MatmulServer>> bad =
      MatmulServer::Start(options, testing::Provider());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--advertise-address"));
}

}  // namespace
}  // namespace matmul
