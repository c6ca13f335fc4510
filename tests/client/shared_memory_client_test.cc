// SharedMemorySession against a real MatmulServer in this process (host
// engine, or MATMUL_TEST_ENGINE), listening on 127.0.0.1:0 and on a Unix
// socket in a fresh folder: products computed from and into a registered
// region checked against a float64 product computed here; listing,
// unregistering and the end of a session seen from another connection; the
// refusal over TCP.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lib/dtype_conversion.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "client/lib/shared_memory_session.h"
#include "gmock/gmock.h"
#include "gpu/engine_factory.h"
#include "gtest/gtest.h"
#include "server/matmul_server.h"
#include "tests/client/client_test_support.h"

namespace matmul {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

using testing::AsDoubles;
using testing::Provider;
using testing::Random;

// Relative Frobenius error of C = op(a) . op(b) (2-D, or 3-D with equal
// batches) against a float64 product.
double ProductError(const HostTensor& a, const HostTensor& b,
                    const HostTensor& c, bool ta, bool tb) {
  const std::vector<double> av = AsDoubles(a), bv = AsDoubles(b),
                            cv = AsDoubles(c);
  const size_t r = a.shape.size();
  const int64_t batch = r == 3 ? a.shape[0] : 1;
  const int64_t ar = a.shape[r - 2], ac = a.shape[r - 1];
  const int64_t br = b.shape[r - 2], bc = b.shape[r - 1];
  const int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  double diff = 0, norm = 0;
  for (int64_t p = 0; p < batch; ++p) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t q = 0; q < k; ++q) {
          const double x = av[p * ar * ac + (ta ? q * ac + i : i * ac + q)];
          const double y = bv[p * br * bc + (tb ? j * bc + q : q * bc + j)];
          want += x * y;
        }
        const double got = cv[(p * m + i) * n + j];
        diff += (got - want) * (got - want);
        norm += want * want;
      }
    }
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

#if defined(__SANITIZE_THREAD__)
#define MATMUL_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MATMUL_UNDER_TSAN 1
#endif
#endif

class SharedMemoryClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef MATMUL_UNDER_TSAN
    GTEST_SKIP() << "in-process gRPC server and channels: not under TSan";
#endif
    char folder[] = "/tmp/matmul-shm-test-XXXXXX";
    ASSERT_NE(mkdtemp(folder), nullptr);
    folder_ = folder;
    socket_ = absl::StrCat(folder_, "/matmul.sock");
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.unix_socket = socket_;
    options.drain_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<MatmulServer>> server =
        MatmulServer::Start(options, Provider());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    if (!socket_.empty()) unlink(socket_.c_str());
    if (!folder_.empty()) rmdir(folder_.c_str());
  }

  std::unique_ptr<MatmulClient> Client(const std::string& client_id,
                                       bool tcp = false) {
    ClientOptions options;
    options.client_id = client_id;
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(tcp ? absl::StrCat("127.0.0.1:", server_->port())
                                 : absl::StrCat("unix:", socket_),
                             options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Polls ListSharedMemory (bounded) until it has `count` regions.
  void WaitForRegions(MatmulClient& client, size_t count) {
    for (int i = 0; i < 600; ++i) {
      absl::StatusOr<std::vector<v1::SharedMemoryRegion>> regions =
          SharedMemorySession::List(&client);
      ASSERT_TRUE(regions.ok()) << regions.status();
      if (regions->size() == count) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "the server still lists another number of regions than " << count;
  }

  std::string folder_;
  std::string socket_;
  std::unique_ptr<MatmulServer> server_;
  absl::BitGen gen_;
};

TEST_F(SharedMemoryClientTest, MultipliesInPlaceEveryDtypeAndLayout) {
  std::unique_ptr<MatmulClient> client = Client("shm-cc-multiply");
  absl::StatusOr<std::unique_ptr<SharedMemorySession>> session =
      SharedMemorySession::Create(client.get(), int64_t{1} << 20);
  ASSERT_TRUE(session.ok()) << session.status();
  SharedMemorySession& s = **session;
  EXPECT_FALSE(s.region_id().empty());
  EXPECT_EQ(s.info().name(), s.object().name());
  EXPECT_EQ(s.info().bytes(), int64_t{1} << 20);
  struct Case {
    DType dtype;
    std::vector<int64_t> a, b;
    bool ta, tb;
    double tolerance;
  };
  for (const Case& c : std::vector<Case>{
           {DType::kFloat32, {33, 17}, {17, 9}, false, false, 1e-5},
           {DType::kFloat64, {17, 33}, {9, 17}, true, true, 1e-12},
           {DType::kFloat16, {8, 16}, {16, 8}, false, false, 1e-2},
           {DType::kBFloat16, {8, 16}, {8, 16}, false, true, 1e-2},
           {DType::kFloat32, {3, 5, 7}, {3, 7, 4}, false, false, 1e-5}}) {
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " ", ShapeString(c.a), " ",
                              ShapeString(c.b)));
    s.Reset();
    const HostTensor a = Random(c.a, c.dtype, gen_);
    const HostTensor b = Random(c.b, c.dtype, gen_);
    absl::StatusOr<SharedTensor> a_at = s.Put(a);
    absl::StatusOr<SharedTensor> b_at = s.Put(b);
    ASSERT_TRUE(a_at.ok() && b_at.ok());
    absl::StatusOr<std::vector<int64_t>> c_shape =
        ProductShape(c.a, c.b, c.ta, c.tb);
    ASSERT_TRUE(c_shape.ok());
    absl::StatusOr<SharedTensor> c_place = s.Allocate(*c_shape, c.dtype);
    ASSERT_TRUE(c_place.ok()) << c_place.status();
    MultiplyOptions options;
    options.transpose_a = c.ta;
    options.transpose_b = c.tb;
    absl::StatusOr<SharedTensor> c_at =
        s.Multiply(*a_at, *b_at, c_place->offset, options);
    ASSERT_TRUE(c_at.ok()) << c_at.status();
    EXPECT_EQ(c_at->shape, *c_shape);
    EXPECT_EQ(c_at->offset, c_place->offset);
    absl::StatusOr<HostTensor> product = s.Get(*c_at);
    ASSERT_TRUE(product.ok());
    EXPECT_LT(ProductError(a, b, *product, c.ta, c.tb), c.tolerance);
  }
}

TEST_F(SharedMemoryClientTest, SpansFillAndReadInPlace) {
  std::unique_ptr<MatmulClient> client = Client("shm-cc-spans");
  absl::StatusOr<std::unique_ptr<SharedMemorySession>> session =
      SharedMemorySession::Create(client.get(), 4096);
  ASSERT_TRUE(session.ok()) << session.status();
  SharedMemorySession& s = **session;
  absl::StatusOr<SharedTensor> a = s.Allocate({2, 3}, DType::kFloat32);
  absl::StatusOr<SharedTensor> b = s.Allocate({3, 2}, DType::kFloat32);
  absl::StatusOr<SharedTensor> c = s.Allocate({2, 2}, DType::kFloat32);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(b->offset % kSharedTensorAlignment, 0);
  absl::Span<float> av = *s.Span<float>(*a);
  absl::Span<float> bv = *s.Span<float>(*b);
  for (int i = 0; i < 6; ++i) {
    av[i] = static_cast<float>(i + 1);  // [[1 2 3] [4 5 6]]
    bv[i] = static_cast<float>(i % 2);  // [[0 1] [0 1] [0 1]]
  }
  absl::StatusOr<SharedTensor> product = s.Multiply(*a, *b, c->offset);
  ASSERT_TRUE(product.ok()) << product.status();
  EXPECT_THAT(*s.Span<float>(*product), ElementsAre(0, 6, 0, 15));
  // Refilled in place and multiplied again.
  av[0] = 10;
  ASSERT_TRUE(s.Multiply(*a, *b, c->offset).ok());
  EXPECT_THAT(*s.Span<float>(*c), ElementsAre(0, 15, 0, 15));
}

TEST_F(SharedMemoryClientTest, ListedUntilTheSessionEnds) {
  std::unique_ptr<MatmulClient> owner = Client("shm-cc-owner");
  std::unique_ptr<MatmulClient> watcher = Client("shm-cc-owner");
  std::unique_ptr<MatmulClient> other = Client("shm-cc-other");
  std::string name;
  {
    absl::StatusOr<std::unique_ptr<SharedMemorySession>> session =
        SharedMemorySession::Create(owner.get(), 8192);
    ASSERT_TRUE(session.ok()) << session.status();
    name = (*session)->object().name();
    // Unlinked once the server has mapped it.
    EXPECT_FALSE((*session)->object().linked());
    absl::StatusOr<std::vector<v1::SharedMemoryRegion>> listed =
        SharedMemorySession::List(watcher.get());
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ((*listed)[0].id(), (*session)->region_id());
    EXPECT_EQ((*listed)[0].name(), name);
    EXPECT_EQ((*listed)[0].bytes(), 8192);
    absl::StatusOr<std::vector<v1::SharedMemoryRegion>> others =
        SharedMemorySession::List(other.get());
    ASSERT_TRUE(others.ok());
    EXPECT_THAT(*others, IsEmpty());
    EXPECT_EQ(SharedMemorySession::UnregisterById(other.get(),
                                                  (*session)->region_id())
                  .code(),
              absl::StatusCode::kNotFound);
    EXPECT_TRUE((*session)->registration_status().ok());
  }
  // The destructor cancelled the registration.
  WaitForRegions(*watcher, 0);
}

TEST_F(SharedMemoryClientTest, UnregisterEndsTheRegistration) {
  std::unique_ptr<MatmulClient> client = Client("shm-cc-unregister");
  absl::StatusOr<std::unique_ptr<SharedMemorySession>> session =
      SharedMemorySession::Create(client.get(), 4096);
  ASSERT_TRUE(session.ok()) << session.status();
  SharedMemorySession& s = **session;
  absl::StatusOr<SharedTensor> a = s.Put(Random({4, 4}, DType::kFloat32, gen_));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(s.Unregister().ok());
  EXPECT_EQ(s.registration_status().code(),
            absl::StatusCode::kFailedPrecondition);
  WaitForRegions(*client, 0);
  EXPECT_EQ(s.Multiply(*a, *a, 2048).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(
      SharedMemorySession::UnregisterById(client.get(), s.region_id()).code(),
      absl::StatusCode::kNotFound);
}

TEST_F(SharedMemoryClientTest, ClientSideChecksComeFirst) {
  std::unique_ptr<MatmulClient> client = Client("shm-cc-checks");
  absl::StatusOr<std::unique_ptr<SharedMemorySession>> session =
      SharedMemorySession::Create(client.get(), 4096);
  ASSERT_TRUE(session.ok()) << session.status();
  SharedMemorySession& s = **session;
  const SharedTensor a{{2, 2}, DType::kFloat32, 0};
  // C would run past the end.
  EXPECT_EQ(s.Multiply(a, a, 4090).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A past the end.
  EXPECT_EQ(s.Multiply(SharedTensor{{64, 64}, DType::kFloat32, 0}, a, 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Allocate({64, 64}, DType::kFloat32).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Still fine afterwards.
  EXPECT_TRUE(s.Multiply(a, a, 1024).ok());
}

TEST_F(SharedMemoryClientTest, TcpIsRefused) {
  std::unique_ptr<MatmulClient> client = Client("shm-cc-tcp", /*tcp=*/true);
  SharedMemoryOptions options;
  options.unlink_when_registered = true;
  absl::StatusOr<std::unique_ptr<SharedMemorySession>> session =
      SharedMemorySession::Create(client.get(), 4096, options);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kPermissionDenied)
      << session.status();
}

}  // namespace
}  // namespace matmul
