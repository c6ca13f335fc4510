// Integration tests of the shared-memory path (issue 21, server side): a
// real MatmulServer on the host engine (or a FakeEngine that holds jobs)
// listening on a Unix socket in a temporary directory, the generated
// v1::MatmulService::Stub over it, and POSIX shared-memory objects the test
// creates with shm_open and unlinks at the end.
#include <fcntl.h>
#include <grp.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/grpcpp.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gpu/engine_factory.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/matmul_server.h"
#include "server/peer_credentials.h"
#include "tests/engine_under_test.h"
#include "tests/fake_engine.h"
#include "tests/metrics/scrape_client.h"
#include "tests/reference_gemm.h"
#include "tests/shm_names.h"

namespace matmul {
namespace {

using testing::FakeEngine;
using ::testing::HasSubstr;

// A POSIX shared-memory object of `bytes`, created here and mapped; a test
// asserts ok() before it uses one. The name stays until the destructor
// unlinks it: the tests hand it to the server, which opens the object by
// name (and some open it again themselves).
//
// A test process that dies (a crash, a ctest timeout's kill) runs no
// destructor and leaves its names in /dev/shm, and pids come round again
// (pid_max is 32768 here): with names of only the pid and a counter, a
// later process given the same pid failed its O_EXCL shm_open and went on
// through MAP_FAILED (as mapped_copy_test did, e0720f2). So a name also
// carries a tag drawn at random once per process, a name that exists all
// the same is skipped (O_EXCL, bounded), never reused or unlinked, and a
// create that fails is a test failure with ok() false.
class ShmObject {
 public:
  static constexpr int kAttempts = testing::kFreshNameAttempts;

  explicit ShmObject(int64_t bytes) : bytes_(bytes) {
    const int fd =
        testing::CreateUnderFreshName([] { return Names().Next(); }, &name_);
    if (fd < 0) return;
    linked_ = true;
    if (ftruncate(fd, bytes) != 0) {
      ADD_FAILURE() << "ftruncate(" << name_ << "): " << std::strerror(errno);
      close(fd);
      return;
    }
    void* data = mmap(nullptr, static_cast<size_t>(bytes),
                      PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    close(fd);
    if (data == MAP_FAILED) {
      ADD_FAILURE() << "mmap(" << name_ << "): " << std::strerror(error);
      return;
    }
    data_ = static_cast<std::byte*>(data);
  }
  ~ShmObject() {
    if (data_ != nullptr) munmap(data_, static_cast<size_t>(bytes_));
    if (linked_) shm_unlink(name_.c_str());
  }
  ShmObject(const ShmObject&) = delete;
  ShmObject& operator=(const ShmObject&) = delete;

  // The names its constructions try, in order.
  static testing::NameSequence& Names() {
    static testing::NameSequence names(
        absl::StrCat("/matmul-test-", getpid(), "-", Tag(), "-"));
    return names;
  }

  bool ok() const { return data_ != nullptr; }
  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  // This process's tag: 8 hex digits, drawn on first use.
  static const std::string& Tag() {
    static const std::string tag = [] {
      absl::BitGen gen;
      return absl::StrCat(
          absl::Hex(absl::Uniform<uint32_t>(gen), absl::kZeroPad8));
    }();
    return tag;
  }

  std::string name_;
  int64_t bytes_;
  bool linked_ = false;  // name_ is ours, to unlink
  std::byte* data_ = nullptr;
};

// The engine these tests run against (tests/engine_under_test.h; with
// "cuda" regions are pinned and the copy engines read and write them).
using testing::EngineUnderTest;

MatmulServer::EngineProvider HostProvider() {
  return testing::EngineUnderTestProvider(2);
}

MatmulServer::EngineProvider FakeProvider(FakeEngine** out) {
  return [out]() -> absl::StatusOr<std::unique_ptr<Engine>> {
    auto engine = std::make_unique<FakeEngine>();
    *out = engine.get();
    return std::unique_ptr<Engine>(std::move(engine));
  };
}

// A server on 127.0.0.1:0 and on a Unix socket in a temporary directory,
// with metrics on 127.0.0.1:0.
class SharedMemoryServer {
 public:
  explicit SharedMemoryServer(MatmulServer::EngineProvider provider,
                              ServerOptions options = {}) {
    char dir[] = "/tmp/matmul-shm-XXXXXX";
    EXPECT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/server.sock";
    options.listen_address = "127.0.0.1:0";
    options.metrics_address = "127.0.0.1:0";
    options.unix_socket = socket_;
    options.drain_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<MatmulServer>> server =
        MatmulServer::Start(options, std::move(provider));
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }
  ~SharedMemoryServer() {
    server_.reset();
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }

  MatmulServer& server() { return *server_; }
  const std::string& socket() const { return socket_; }
  std::unique_ptr<v1::MatmulService::Stub> UnixStub() const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    return v1::MatmulService::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("unix:", socket_),
                                  grpc::InsecureChannelCredentials(), args));
  }
  std::unique_ptr<v1::MatmulService::Stub> TcpStub() const {
    return v1::MatmulService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                            grpc::InsecureChannelCredentials()));
  }
  std::map<std::string, double> Scrape() const {
    return testing::ParseScrape(
        testing::HttpGet(server_->metrics_port(), "/metrics").body);
  }

 private:
  std::string dir_;
  std::string socket_;
  std::unique_ptr<MatmulServer> server_;
};

void Deadline(grpc::ClientContext& context, int seconds = 30) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(seconds));
}

// An open RegisterSharedMemory call: the first message, or the status the
// call ended with before it.
struct Registration {
  std::unique_ptr<grpc::ClientContext> context =
      std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::RegisterSharedMemoryResponse>> reader;
  v1::RegisterSharedMemoryResponse response;
  bool open = false;
  grpc::Status status;  // when !open, or after Finish

  const std::string& id() const { return response.region().id(); }
  // Waits for the call's end (after a cancel, an unregister, a drain).
  grpc::Status Finish() {
    if (open) {
      v1::RegisterSharedMemoryResponse extra;
      EXPECT_FALSE(reader->Read(&extra)) << "a second message";
      status = reader->Finish();
      open = false;
    }
    return status;
  }
  ~Registration() {
    if (open) {
      context->TryCancel();
      Finish();
    }
  }
};

std::unique_ptr<Registration> Register(v1::MatmulService::Stub& stub,
                                       const std::string& name, int64_t bytes,
                                       const std::string& client = "") {
  auto r = std::make_unique<Registration>();
  if (!client.empty()) r->context->AddMetadata("x-matmul-client", client);
  v1::RegisterSharedMemoryRequest request;
  request.set_name(name);
  request.set_bytes(bytes);
  r->reader = stub.RegisterSharedMemory(r->context.get(), request);
  r->open = r->reader->Read(&r->response);
  if (!r->open) r->status = r->reader->Finish();
  return r;
}

std::vector<v1::SharedMemoryRegion> List(v1::MatmulService::Stub& stub,
                                         const std::string& client = "",
                                         grpc::Status* status = nullptr) {
  grpc::ClientContext context;
  Deadline(context);
  if (!client.empty()) context.AddMetadata("x-matmul-client", client);
  v1::ListSharedMemoryResponse response;
  grpc::Status s =
      stub.ListSharedMemory(&context, v1::ListSharedMemoryRequest(), &response);
  if (status != nullptr) *status = s;
  EXPECT_TRUE(status != nullptr || s.ok()) << s.error_message();
  return {response.regions().begin(), response.regions().end()};
}

grpc::Status Unregister(v1::MatmulService::Stub& stub, const std::string& id,
                        const std::string& client = "") {
  grpc::ClientContext context;
  Deadline(context);
  if (!client.empty()) context.AddMetadata("x-matmul-client", client);
  v1::UnregisterSharedMemoryRequest request;
  request.set_region_id(id);
  v1::UnregisterSharedMemoryResponse response;
  return stub.UnregisterSharedMemory(&context, request, &response);
}

grpc::Status Multiply(v1::MatmulService::Stub& stub,
                      const v1::MultiplyRequest& request,
                      v1::MultiplyResponse* response,
                      const std::string& client = "") {
  grpc::ClientContext context;
  Deadline(context);
  if (!client.empty()) context.AddMetadata("x-matmul-client", client);
  return stub.Multiply(&context, request, response);
}

// Waits (bounded: at most 10 s) until the client's list is empty.
bool AwaitNoRegions(v1::MatmulService::Stub& stub) {
  for (int i = 0; i < 1000; ++i) {
    if (List(stub).empty()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// A float32 m x k by k x n problem laid out in a region: A at a_offset, B
// at b_offset, C at c_offset; random A and B written there.
struct Problem {
  int64_t m = 0, k = 0, n = 0;
  int64_t a_offset = 0, b_offset = 0, c_offset = 0;
  std::string a, b;  // the bytes

  int64_t a_bytes() const { return m * k * 4; }
  int64_t b_bytes() const { return k * n * 4; }
  int64_t c_bytes() const { return m * n * 4; }
};

Problem MakeProblem(int64_t m, int64_t k, int64_t n, absl::BitGen& gen) {
  Problem p;
  p.m = m;
  p.k = k;
  p.n = n;
  p.a = testing::RandomBytes(DType::kFloat32, m * k, gen);
  p.b = testing::RandomBytes(DType::kFloat32, k * n, gen);
  p.b_offset = (p.a_bytes() + 63) / 64 * 64;
  p.c_offset = (p.b_offset + p.b_bytes() + 63) / 64 * 64;
  return p;
}

void SetShape(v1::Tensor* t, int64_t rows, int64_t cols) {
  t->add_shape(rows);
  t->add_shape(cols);
  t->set_dtype(v1::DTYPE_FLOAT32);
}

void Shared(v1::Tensor* t, const std::string& id, int64_t offset) {
  t->mutable_shared()->set_region_id(id);
  t->mutable_shared()->set_offset(offset);
}

// C (float32 bytes) against the reference product of p.
void ExpectProduct(const Problem& p, const void* c) {
  const MatmulSpec spec = testing::MakeSpec(DType::kFloat32, 1, 1, p.m, p.n,
                                            p.k, false, false, false);
  const std::vector<double> ref = testing::ReferenceGemm(
      spec, testing::ToDoubles(DType::kFloat32, p.a.data(), p.m * p.k),
      testing::ToDoubles(DType::kFloat32, p.b.data(), p.k * p.n));
  EXPECT_LE(testing::RelativeError(
                testing::ToDoubles(DType::kFloat32, c, p.m * p.n), ref),
            testing::Tolerance(DType::kFloat32, ComputeMode::kStrict));
}

// A request with A, B and C all in region `id` as `p` lays them out.
v1::MultiplyRequest AllShared(const Problem& p, const std::string& id) {
  v1::MultiplyRequest request;
  SetShape(request.mutable_a(), p.m, p.k);
  Shared(request.mutable_a(), id, p.a_offset);
  SetShape(request.mutable_b(), p.k, p.n);
  Shared(request.mutable_b(), id, p.b_offset);
  request.mutable_c_shared()->set_region_id(id);
  request.mutable_c_shared()->set_offset(p.c_offset);
  return request;
}

void Fill(const ShmObject& shm, const Problem& p) {
  std::memcpy(shm.data() + p.a_offset, p.a.data(), p.a.size());
  std::memcpy(shm.data() + p.b_offset, p.b.data(), p.b.size());
  std::memset(shm.data() + p.c_offset, 0xff, p.c_bytes());
}

TEST(SharedMemoryTest, RegisterListMultiplyFromAndIntoTheRegion) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  absl::BitGen gen;
  const Problem p = MakeProblem(67, 45, 29, gen);
  ShmObject shm(p.c_offset + p.c_bytes() + 100);
  ASSERT_TRUE(shm.ok());
  Fill(shm, p);

  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  EXPECT_THAT(reg->id(), HasSubstr("shm-"));
  EXPECT_EQ(reg->response.region().name(), shm.name());
  EXPECT_EQ(reg->response.region().bytes(), shm.bytes());
  // Pinned on the CUDA engine; the host engine reads the mapping itself.
  EXPECT_EQ(reg->response.region().pinned(), EngineUnderTest() != "host");

  const std::vector<v1::SharedMemoryRegion> listed = List(*stub);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id(), reg->id());
  EXPECT_EQ(listed[0].bytes(), shm.bytes());
  EXPECT_EQ(listed[0].multiplies_in_flight(), 0);

  v1::MultiplyResponse response;
  ASSERT_TRUE(Multiply(*stub, AllShared(p, reg->id()), &response).ok());
  EXPECT_THAT(response.c().shape(), ::testing::ElementsAre(p.m, p.n));
  EXPECT_EQ(response.c().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_TRUE(response.c().data().empty());
  EXPECT_EQ(response.c().shared().region_id(), reg->id());
  EXPECT_EQ(response.c().shared().offset(), p.c_offset);
  ExpectProduct(p, shm.data() + p.c_offset);

  // Nothing was copied in user space: the engine read the operands from the
  // region and wrote the product into it.
  EXPECT_EQ(s.server().service().copied_operand_bytes(), 0);
  const std::map<std::string, double> metrics = s.Scrape();
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_regions"), 1);
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_bytes"), shm.bytes());
  EXPECT_EQ(testing::Sum(metrics, "matmul_payload_bytes_total",
                         {"path=\"shared_memory\"", "direction=\"in\""}),
            p.a_bytes() + p.b_bytes());
  EXPECT_EQ(testing::Sum(metrics, "matmul_payload_bytes_total",
                         {"path=\"shared_memory\"", "direction=\"out\""}),
            p.c_bytes());
  EXPECT_EQ(
      testing::Sum(metrics, "matmul_payload_bytes_total", {"path=\"inline\""}),
      0);

  ASSERT_TRUE(Unregister(*stub, reg->id()).ok());
  EXPECT_TRUE(reg->Finish().ok()) << reg->status.error_message();
  EXPECT_TRUE(List(*stub).empty());
  const std::map<std::string, double> after = s.Scrape();
  EXPECT_EQ(testing::Sum(after, "matmul_shared_memory_regions"), 0);
  EXPECT_EQ(testing::Sum(after, "matmul_shared_memory_bytes"), 0);
  // Gone: a multiply naming it is NOT_FOUND, as is a second unregister.
  EXPECT_EQ(Multiply(*stub, AllShared(p, reg->id()), &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Unregister(*stub, reg->id()).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(SharedMemoryTest, ListsOldestFirstAndCountsInlineBytes) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  ShmObject one(4096), two(8192);
  ASSERT_TRUE(one.ok() && two.ok());
  auto r1 = Register(*stub, one.name(), one.bytes());
  auto r2 = Register(*stub, two.name(), 5000);
  ASSERT_TRUE(r1->open && r2->open);
  const auto listed = List(*stub);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].id(), r1->id());
  EXPECT_EQ(listed[1].id(), r2->id());
  EXPECT_EQ(listed[1].bytes(), 5000);
  EXPECT_NE(r1->id(), r2->id());
  // Another client sees none of them.
  EXPECT_TRUE(List(*stub, "someone-else").empty());

  absl::BitGen gen;
  const Problem p = MakeProblem(8, 5, 3, gen);
  v1::MultiplyRequest inline_request;
  SetShape(inline_request.mutable_a(), p.m, p.k);
  inline_request.mutable_a()->set_data(p.a);
  SetShape(inline_request.mutable_b(), p.k, p.n);
  inline_request.mutable_b()->set_data(p.b);
  v1::MultiplyResponse response;
  ASSERT_TRUE(Multiply(*stub, inline_request, &response).ok());
  ExpectProduct(p, response.c().data().data());
  const std::map<std::string, double> metrics =
      testing::ScrapeUntil(s.server().metrics_port(), [&](const auto& m) {
        return testing::Sum(m, "matmul_payload_bytes_total",
                            {"path=\"inline\"", "direction=\"out\""}) > 0;
      });
  EXPECT_EQ(testing::Sum(metrics, "matmul_payload_bytes_total",
                         {"path=\"inline\"", "direction=\"in\""}),
            p.a_bytes() + p.b_bytes());
  EXPECT_EQ(testing::Sum(metrics, "matmul_payload_bytes_total",
                         {"path=\"inline\"", "direction=\"out\""}),
            p.c_bytes());
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_regions"), 2);
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_bytes"), 4096 + 5000);
}

TEST(SharedMemoryTest, MixedInlineSharedAndStoredOperands) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  absl::BitGen gen;
  const Problem p = MakeProblem(33, 17, 21, gen);
  ShmObject shm(p.c_offset + p.c_bytes());
  ASSERT_TRUE(shm.ok());
  Fill(shm, p);
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();

  // A inline, B in the region, C in the response.
  {
    v1::MultiplyRequest request;
    SetShape(request.mutable_a(), p.m, p.k);
    request.mutable_a()->set_data(p.a);
    SetShape(request.mutable_b(), p.k, p.n);
    Shared(request.mutable_b(), reg->id(), p.b_offset);
    v1::MultiplyResponse response;
    ASSERT_TRUE(Multiply(*stub, request, &response).ok());
    ASSERT_EQ(static_cast<int64_t>(response.c().data().size()), p.c_bytes());
    EXPECT_FALSE(response.c().has_shared());
    ExpectProduct(p, response.c().data().data());
  }
  // A in the region, B inline, C into the region.
  {
    v1::MultiplyRequest request;
    SetShape(request.mutable_a(), p.m, p.k);
    Shared(request.mutable_a(), reg->id(), p.a_offset);
    SetShape(request.mutable_b(), p.k, p.n);
    request.mutable_b()->set_data(p.b);
    request.mutable_c_shared()->set_region_id(reg->id());
    request.mutable_c_shared()->set_offset(p.c_offset);
    v1::MultiplyResponse response;
    ASSERT_TRUE(Multiply(*stub, request, &response).ok());
    EXPECT_TRUE(response.c().data().empty());
    ExpectProduct(p, shm.data() + p.c_offset);
  }
  // A in the region, B stored (Upload), C into the region.
  {
    std::memset(shm.data() + p.c_offset, 0xff, p.c_bytes());
    grpc::ClientContext context;
    Deadline(context);
    v1::UploadRequest upload;
    SetShape(upload.mutable_tensor(), p.k, p.n);
    upload.mutable_tensor()->set_data(p.b);
    v1::UploadResponse uploaded;
    ASSERT_TRUE(stub->Upload(&context, upload, &uploaded).ok());
    v1::MultiplyRequest request;
    SetShape(request.mutable_a(), p.m, p.k);
    Shared(request.mutable_a(), reg->id(), p.a_offset);
    request.set_b_handle(uploaded.handle().id());
    request.mutable_c_shared()->set_region_id(reg->id());
    request.mutable_c_shared()->set_offset(p.c_offset);
    v1::MultiplyResponse response;
    ASSERT_TRUE(Multiply(*stub, request, &response).ok());
    ExpectProduct(p, shm.data() + p.c_offset);
  }
  // Inline operands, C into the region.
  {
    std::memset(shm.data() + p.c_offset, 0xff, p.c_bytes());
    v1::MultiplyRequest request;
    SetShape(request.mutable_a(), p.m, p.k);
    request.mutable_a()->set_data(p.a);
    SetShape(request.mutable_b(), p.k, p.n);
    request.mutable_b()->set_data(p.b);
    request.mutable_c_shared()->set_region_id(reg->id());
    request.mutable_c_shared()->set_offset(p.c_offset);
    v1::MultiplyResponse response;
    ASSERT_TRUE(Multiply(*stub, request, &response).ok());
    EXPECT_EQ(response.c().shared().region_id(), reg->id());
    ExpectProduct(p, shm.data() + p.c_offset);
  }
}

// Batched and transposed operands in a region: [3, k, m] (transposed) times
// a broadcast [n, k] (transposed), the [3, m, n] product into the region.
TEST(SharedMemoryTest, BatchedTransposedOperandsInTheRegion) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  absl::BitGen gen;
  const int64_t batch = 3, m = 19, k = 11, n = 7;
  const std::string a =
      testing::RandomBytes(DType::kFloat64, batch * k * m, gen);
  const std::string b = testing::RandomBytes(DType::kFloat64, n * k, gen);
  const int64_t b_at = 8192, c_at = 16384, c_bytes = batch * m * n * 8;
  ShmObject shm(c_at + c_bytes);
  ASSERT_TRUE(shm.ok());
  std::memcpy(shm.data(), a.data(), a.size());
  std::memcpy(shm.data() + b_at, b.data(), b.size());
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  v1::MultiplyRequest request;
  for (int64_t d : {batch, k, m}) request.mutable_a()->add_shape(d);
  request.mutable_a()->set_dtype(v1::DTYPE_FLOAT64);
  Shared(request.mutable_a(), reg->id(), 0);
  for (int64_t d : {n, k}) request.mutable_b()->add_shape(d);
  request.mutable_b()->set_dtype(v1::DTYPE_FLOAT64);
  Shared(request.mutable_b(), reg->id(), b_at);
  request.set_transpose_a(true);
  request.set_transpose_b(true);
  request.mutable_c_shared()->set_region_id(reg->id());
  request.mutable_c_shared()->set_offset(c_at);
  v1::MultiplyResponse response;
  ASSERT_TRUE(Multiply(*stub, request, &response).ok());
  EXPECT_THAT(response.c().shape(), ::testing::ElementsAre(batch, m, n));
  EXPECT_EQ(response.c().dtype(), v1::DTYPE_FLOAT64);
  const MatmulSpec spec =
      testing::MakeSpec(DType::kFloat64, batch, 1, m, n, k, true, true, true);
  const std::vector<double> ref = testing::ReferenceGemm(
      spec, testing::ToDoubles(DType::kFloat64, a.data(), batch * k * m),
      testing::ToDoubles(DType::kFloat64, b.data(), n * k));
  EXPECT_LE(
      testing::RelativeError(
          testing::ToDoubles(DType::kFloat64, shm.data() + c_at, batch * m * n),
          ref),
      testing::Tolerance(DType::kFloat64, ComputeMode::kStrict));
}

// By default (EngineOptions::batch_c_shared), many clients' multiplies from and
// into one region, waiting together, go out as gathered batches (the batching
// engine, here with a fixed window so that they wait for one another): each
// product lands at its own offset, exact, and nothing is copied in user space.
TEST(SharedMemoryTest, MultipliesIntoARegionBatchAndEachProductIsExact) {
  MatmulServer::EngineProvider batching =
      []() -> absl::StatusOr<std::unique_ptr<Engine>> {
    absl::StatusOr<EngineKind> kind =
        ParseEngineKind(testing::EngineUnderTest());
    if (!kind.ok()) return kind.status();
    EngineOptions options;
    options.kind = *kind;
    options.streams_per_device = 2;
    options.pinned_pool_bytes = int64_t{256} << 20;
    options.batch_window = absl::Milliseconds(500);
    options.adaptive_batching = false;
    return CreateEngine(options);
  };
  SharedMemoryServer s(std::move(batching));
  auto stub = s.UnixStub();
  absl::BitGen gen;
  constexpr int kClients = 8;
  std::vector<Problem> problems;
  int64_t end = 0;
  for (int i = 0; i < kClients; ++i) {
    Problem p = MakeProblem(24, 20, 16, gen);
    p.a_offset += end;
    p.b_offset += end;
    p.c_offset += end;
    end = (p.c_offset + p.c_bytes() + 63) / 64 * 64;
    problems.push_back(std::move(p));
  }
  ShmObject shm(end);
  ASSERT_TRUE(shm.ok());
  for (const Problem& p : problems) Fill(shm, p);
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();

  std::vector<std::future<grpc::Status>> calls;
  for (const Problem& p : problems) {
    calls.push_back(std::async(std::launch::async, [&stub, &p, &reg] {
      v1::MultiplyResponse response;
      grpc::Status status = Multiply(*stub, AllShared(p, reg->id()), &response);
      EXPECT_EQ(response.c().shared().offset(), p.c_offset);
      EXPECT_TRUE(response.c().data().empty());
      return status;
    }));
  }
  for (auto& call : calls) {
    const grpc::Status status = call.get();
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  for (const Problem& p : problems) ExpectProduct(p, shm.data() + p.c_offset);
  EXPECT_EQ(s.server().service().copied_operand_bytes(), 0);
  // Fewer launches than requests: some went out together.
  const std::map<std::string, double> metrics = s.Scrape();
  EXPECT_EQ(testing::Sum(metrics, "matmul_batch_size_sum"), kClients);
  EXPECT_LT(testing::Sum(metrics, "matmul_batch_size_count"), kClients);
}

// Operands in regions are the client's memory, not server memory in
// flight: a multiply of them passes an in-flight budget that the same
// operands inline do not.
TEST(SharedMemoryTest, RegionBytesTakeNoneOfTheInflightBudget) {
  ServerOptions options;
  options.limits.max_inflight_bytes = 4096;
  SharedMemoryServer s(HostProvider(), options);
  auto stub = s.UnixStub();
  absl::BitGen gen;
  const Problem p = MakeProblem(40, 30, 20, gen);  // 4800 + 2400 + 3200 bytes
  ShmObject shm(p.c_offset + p.c_bytes());
  ASSERT_TRUE(shm.ok());
  Fill(shm, p);
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  v1::MultiplyResponse response;
  ASSERT_TRUE(Multiply(*stub, AllShared(p, reg->id()), &response).ok());
  ExpectProduct(p, shm.data() + p.c_offset);
  v1::MultiplyRequest inline_request;
  SetShape(inline_request.mutable_a(), p.m, p.k);
  inline_request.mutable_a()->set_data(p.a);
  SetShape(inline_request.mutable_b(), p.k, p.n);
  inline_request.mutable_b()->set_data(p.b);
  const grpc::Status refused = Multiply(*stub, inline_request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max-inflight-bytes"));
  // Mixed: B inline and C in the response hold 5600 bytes in the server.
  v1::MultiplyRequest mixed = inline_request;
  mixed.mutable_a()->clear_data();
  Shared(mixed.mutable_a(), reg->id(), p.a_offset);
  const grpc::Status mixed_refused = Multiply(*stub, mixed, &response);
  EXPECT_EQ(mixed_refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(mixed_refused.error_message(), HasSubstr("5600 bytes in flight"));
}

// A product written into a region is not bounded by the message size;
// one sent back inline still is.
TEST(SharedMemoryTest, AProductIntoARegionMayExceedTheMessageSize) {
  ServerOptions options;
  options.limits.max_message_bytes = 16384;
  SharedMemoryServer s(HostProvider(), options);
  auto stub = s.UnixStub();
  absl::BitGen gen;
  const Problem p = MakeProblem(96, 40, 80, gen);  // C: 30720 bytes
  ShmObject shm(p.c_offset + p.c_bytes());
  ASSERT_TRUE(shm.ok());
  Fill(shm, p);
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  v1::MultiplyResponse response;
  ASSERT_TRUE(Multiply(*stub, AllShared(p, reg->id()), &response).ok());
  ExpectProduct(p, shm.data() + p.c_offset);
  v1::MultiplyRequest inline_c = AllShared(p, reg->id());
  inline_c.clear_c_shared();
  const grpc::Status refused = Multiply(*stub, inline_c, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("c_shared"));
}

// An object truncated below its region after registering is refused before
// any byte of it is touched.
TEST(SharedMemoryTest, ATruncatedObjectIsFailedPrecondition) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  absl::BitGen gen;
  const Problem p = MakeProblem(16, 8, 4, gen);
  ShmObject shm(p.c_offset + p.c_bytes());
  ASSERT_TRUE(shm.ok());
  Fill(shm, p);
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  const int fd = shm_open(shm.name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  close(fd);
  v1::MultiplyResponse response;
  const grpc::Status status =
      Multiply(*stub, AllShared(p, reg->id()), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("truncated"));
}

TEST(SharedMemoryTest, BadMultipliesGetPreciseStatuses) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  absl::BitGen gen;
  const Problem p = MakeProblem(16, 8, 4, gen);
  ShmObject shm(p.c_offset + p.c_bytes());
  ASSERT_TRUE(shm.ok());
  Fill(shm, p);
  auto reg = Register(*stub, shm.name(), shm.bytes(), "alice");
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  ShmObject small(64);
  ASSERT_TRUE(small.ok());
  auto small_reg = Register(*stub, small.name(), small.bytes(), "alice");
  ASSERT_TRUE(small_reg->open);

  struct Case {
    const char* what;
    std::function<void(v1::MultiplyRequest&)> edit;
    grpc::StatusCode code;
    const char* message;
    std::string client = "alice";
  };
  const std::vector<Case> cases = {
      {"region too small for the shape",
       [&](v1::MultiplyRequest& r) {
         Shared(r.mutable_a(), small_reg->id(), 0);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "a.shared: 512 bytes at offset 0"},
      {"offset past the end",
       [&](v1::MultiplyRequest& r) {
         Shared(r.mutable_b(), reg->id(), shm.bytes() + 8);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "run past the end of region"},
      {"product past the end",
       [&](v1::MultiplyRequest& r) {
         r.mutable_c_shared()->set_offset(shm.bytes() - 4);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "c_shared: 256 bytes"},
      {"negative offset",
       [&](v1::MultiplyRequest& r) { Shared(r.mutable_b(), reg->id(), -4); },
       grpc::StatusCode::INVALID_ARGUMENT, "b.shared.offset"},
      {"unknown region",
       [&](v1::MultiplyRequest& r) {
         Shared(r.mutable_a(), "shm-0123456789abcdef", 0);
       },
       grpc::StatusCode::NOT_FOUND, "a.shared.region_id"},
      {"unknown product region",
       [&](v1::MultiplyRequest& r) {
         r.mutable_c_shared()->set_region_id("nope");
       },
       grpc::StatusCode::NOT_FOUND, "c_shared.region_id"},
      {"another client's region", [](v1::MultiplyRequest&) {},
       grpc::StatusCode::NOT_FOUND, "a.shared.region_id", "mallory"},
      {"data and shared both set",
       [&](v1::MultiplyRequest& r) { r.mutable_a()->set_data(p.a); },
       grpc::StatusCode::INVALID_ARGUMENT, "a: data and shared are both set"},
      {"handle and shared both set",
       [&](v1::MultiplyRequest& r) { r.set_b_handle("h-1"); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "b.shared and b_handle are both set"},
      {"keep_result with c_shared",
       [&](v1::MultiplyRequest& r) { r.set_keep_result(true); },
       grpc::StatusCode::INVALID_ARGUMENT, "keep_result and c_shared"},
      {"product over an operand",
       [&](v1::MultiplyRequest& r) {
         r.mutable_c_shared()->set_offset(p.b_offset + 4);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "overlap b.shared"},
      {"mismatched shapes",
       [&](v1::MultiplyRequest& r) { r.mutable_b()->set_shape(0, p.k + 1); },
       grpc::StatusCode::INVALID_ARGUMENT, "inner dimensions differ"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::MultiplyRequest request = AllShared(p, reg->id());
    c.edit(request);
    v1::MultiplyResponse response;
    const grpc::Status status = Multiply(*stub, request, &response, c.client);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  // None of them touched the product.
  for (int64_t i = 0; i < p.c_bytes(); ++i) {
    ASSERT_EQ(shm.data()[p.c_offset + i], std::byte{0xff});
  }
  // And the good request works for its owner.
  v1::MultiplyResponse response;
  ASSERT_TRUE(
      Multiply(*stub, AllShared(p, reg->id()), &response, "alice").ok());
  ExpectProduct(p, shm.data() + p.c_offset);
  // Another client cannot unregister it either.
  EXPECT_EQ(Unregister(*stub, reg->id(), "mallory").error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(List(*stub, "alice").size(), 2u);
}

TEST(SharedMemoryTest, BadRegistrationsGetPreciseStatuses) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  ShmObject shm(4096);
  ASSERT_TRUE(shm.ok());
  struct Case {
    std::string name;
    int64_t bytes;
    grpc::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no-slash", 64, grpc::StatusCode::INVALID_ARGUMENT, "name:"},
      {"/a/b", 64, grpc::StatusCode::INVALID_ARGUMENT, "name:"},
      {"/", 64, grpc::StatusCode::INVALID_ARGUMENT, "name:"},
      {"", 64, grpc::StatusCode::INVALID_ARGUMENT, "name:"},
      {"/" + std::string(300, 'x'), 64, grpc::StatusCode::INVALID_ARGUMENT,
       "name:"},
      {"/matmul-test-missing-object", 64, grpc::StatusCode::NOT_FOUND,
       "no such shared-memory object"},
      {shm.name(), 4097, grpc::StatusCode::INVALID_ARGUMENT,
       "is 4096 bytes, smaller than the 4097"},
      {shm.name(), 0, grpc::StatusCode::INVALID_ARGUMENT, "bytes:"},
      {shm.name(), -1, grpc::StatusCode::INVALID_ARGUMENT, "bytes:"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name.substr(0, 40));
    auto reg = Register(*stub, c.name, c.bytes);
    EXPECT_FALSE(reg->open);
    EXPECT_EQ(reg->status.error_code(), c.code) << reg->status.error_message();
    EXPECT_THAT(reg->status.error_message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(List(*stub).empty());
  EXPECT_EQ(testing::Sum(s.Scrape(), "matmul_shared_memory_regions"), 0);
}

TEST(SharedMemoryTest, TcpClientsArePermissionDenied) {
  SharedMemoryServer s(HostProvider());
  auto tcp = s.TcpStub();
  ShmObject shm(4096);
  ASSERT_TRUE(shm.ok());
  auto reg = Register(*tcp, shm.name(), shm.bytes());
  EXPECT_FALSE(reg->open);
  EXPECT_EQ(reg->status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(reg->status.error_message(), HasSubstr("Unix socket"));
  grpc::Status listed;
  List(*tcp, "", &listed);
  EXPECT_EQ(listed.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Unregister(*tcp, "shm-1").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Over the socket the same registration works.
  auto unix_stub = s.UnixStub();
  auto ok = Register(*unix_stub, shm.name(), shm.bytes());
  EXPECT_TRUE(ok->open) << ok->status.error_message();
}

// The uid and gid of "nobody", for the tests that run a client as another
// user; nullopt when the system has no such user.
std::optional<std::pair<uid_t, gid_t>> Nobody() {
  const passwd* entry = getpwnam("nobody");
  if (entry == nullptr) return std::nullopt;
  return std::make_pair(entry->pw_uid, entry->pw_gid);
}

// Gives the shared-memory object `name` to `uid`:`gid` (mode 0600).
void GiveObject(const std::string& name, uid_t uid, gid_t gid) {
  const std::string path = "/dev/shm" + name;
  ASSERT_EQ(chown(path.c_str(), uid, gid), 0) << std::strerror(errno);
  ASSERT_EQ(chmod(path.c_str(), 0600), 0) << std::strerror(errno);
}

// Lets any user reach the server's socket (its directory is 0700).
void OpenSocketToAll(const std::string& socket) {
  const std::string dir = socket.substr(0, socket.rfind('/'));
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0) << std::strerror(errno);
  ASSERT_EQ(chmod(socket.c_str(), 0666), 0) << std::strerror(errno);
}

// tests/shared_memory_child.cc run as `uid`:`gid` (no supplementary
// groups), registering `name`: "registered ..." once it holds the region,
// or "register: code N: ..." and its exit. The child is killed and reaped
// before this returns.
std::string RegisterAsUser(const std::string& socket, const std::string& name,
                           uid_t uid, gid_t gid) {
  std::string child_path = MATMUL_SHM_CHILD;
  std::string socket_path = socket;
  std::string object = name;
  std::string bytes = "4096";
  std::string client = "other-user";
  char* argv[] = {child_path.data(), socket_path.data(), object.data(),
                  bytes.data(),      client.data(),      nullptr};
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return "pipe failed";
  const pid_t child = fork();
  if (child == 0) {
    // Only async-signal-safe calls until exec.
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    if (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
        setresuid(uid, uid, uid) != 0) {
      _exit(126);
    }
    execv(child_path.c_str(), argv);
    _exit(127);
  }
  close(out[1]);
  std::string output;
  char buffer[512];
  // Until the child says what happened (a line), or closes its end.
  while (output.find('\n') == std::string::npos) {
    const ssize_t n = read(out[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  close(out[0]);
  if (child > 0) {
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) >= 126) {
      output +=
          absl::StrCat("could not become the user: exit ", WEXITSTATUS(status));
    }
  }
  return output;
}

// A client of another user than the server's, on the Unix socket, is
// refused by default; --shared-memory-peers admits it by user or by group.
TEST(SharedMemoryTest, AnotherUsersRegistrationIsPermissionDenied) {
  const auto nobody = Nobody();
  if (geteuid() != 0 || !nobody.has_value() || nobody->first == 0) {
    GTEST_SKIP() << "needs root and a user \"nobody\"";
  }
  ShmObject shm(4096);
  ASSERT_TRUE(shm.ok());
  // The object is the other user's own: only who the caller is is wrong.
  GiveObject(shm.name(), nobody->first, nobody->second);
  {
    FakeEngine* fake = nullptr;
    SharedMemoryServer s(FakeProvider(&fake));
    OpenSocketToAll(s.socket());
    const std::string said =
        RegisterAsUser(s.socket(), shm.name(), nobody->first, nobody->second);
    EXPECT_THAT(said,
                HasSubstr(absl::StrCat(
                    "register: code ",
                    static_cast<int>(grpc::StatusCode::PERMISSION_DENIED))));
    EXPECT_THAT(said, HasSubstr(absl::StrCat("the caller (uid ", nobody->first,
                                             ", gid ")));
    EXPECT_THAT(said, HasSubstr("is not allowed; only uid 0"));
    EXPECT_EQ(fake->registered(), 0);
  }
  for (const std::string& allowed :
       {std::string("nobody"), absl::StrCat("user:", nobody->first),
        absl::StrCat("group:", nobody->second)}) {
    SCOPED_TRACE(allowed);
    ServerOptions options;
    absl::StatusOr<PeerAllowList> peers = PeerAllowList::Parse(allowed);
    ASSERT_TRUE(peers.ok()) << peers.status();
    options.handle_limits.shared_memory_peers = *peers;
    FakeEngine* fake = nullptr;
    SharedMemoryServer s(FakeProvider(&fake), options);
    OpenSocketToAll(s.socket());
    EXPECT_THAT(
        RegisterAsUser(s.socket(), shm.name(), nobody->first, nobody->second),
        HasSubstr("registered shm-"));
  }
}

// The server may open objects the caller does not own (it runs as root
// here): an object of another uid, or a symbolic link, is refused all the
// same, checked on the descriptor the server opened.
TEST(SharedMemoryTest, AnObjectOfAnotherUidOrALinkIsPermissionDenied) {
  const auto nobody = Nobody();
  if (geteuid() != 0 || !nobody.has_value() || nobody->first == 0) {
    GTEST_SKIP() << "needs root and a user \"nobody\"";
  }
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  ShmObject theirs(4096);
  ASSERT_TRUE(theirs.ok());
  GiveObject(theirs.name(), nobody->first, nobody->second);
  auto reg = Register(*stub, theirs.name(), 4096);
  EXPECT_FALSE(reg->open);
  EXPECT_EQ(reg->status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(reg->status.error_message(),
              HasSubstr(absl::StrCat("is owned by uid ", nobody->first,
                                     ", not by the caller's uid 0")));

  ShmObject mine(4096);
  ASSERT_TRUE(mine.ok());
  const std::string link = mine.name() + "-link";
  ASSERT_EQ(
      symlink(("/dev/shm" + mine.name()).c_str(), ("/dev/shm" + link).c_str()),
      0)
      << std::strerror(errno);
  reg = Register(*stub, link, 4096);
  unlink(("/dev/shm" + link).c_str());
  EXPECT_FALSE(reg->open);
  EXPECT_EQ(reg->status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(reg->status.error_message(), HasSubstr("symbolic link"));

  // The caller's own object, by its own name, still registers.
  reg = Register(*stub, mine.name(), 4096);
  EXPECT_TRUE(reg->open) << reg->status.error_message();
  EXPECT_TRUE(List(*stub).size() == 1);
}

// The server accepts its Unix socket itself (server/unix_socket_listener.h):
// like gRPC's own listener it replaces a socket file a dead server left,
// never another file, and removes its own when it stops.
TEST(SharedMemoryTest, TheUnixSocketReplacesAStaleSocketNeverAFile) {
  char dir[] = "/tmp/matmul-sock-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/server.sock";
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address.clear();
  options.unix_socket = path;

  const int file = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(file, 0);
  close(file);
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(options, HostProvider());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(server.status().message(),
              HasSubstr("cannot listen on unix:" + path));
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));  // still the file
  ASSERT_EQ(unlink(path.c_str()), 0);

  // A socket bound and closed: what a killed server leaves.
  const int stale = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  ASSERT_EQ(bind(stale, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(stale);
  server = MatmulServer::Start(options, HostProvider());
  ASSERT_TRUE(server.ok()) << server.status();
  {
    auto stub = v1::MatmulService::NewStub(grpc::CreateChannel(
        "unix:" + path, grpc::InsecureChannelCredentials()));
    grpc::Status listed;
    EXPECT_TRUE(List(*stub, "", &listed).empty());
    EXPECT_TRUE(listed.ok()) << listed.error_message();
  }
  server->reset();
  EXPECT_NE(lstat(path.c_str(), &st), 0);  // removed
  rmdir(dir);
}

TEST(PeerAllowListTest, UsersAndGroupsByNameOrNumber) {
  absl::StatusOr<PeerAllowList> list =
      PeerAllowList::Parse("root, user:1234,group:root,group:77,99");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->uids, (std::vector<uid_t>{0, 1234, 99}));
  EXPECT_EQ(list->gids, (std::vector<gid_t>{0, 77}));
  PeerCredentials peer;
  peer.uid = 4321;
  peer.gid = 4321;
  EXPECT_EQ(list->Allows(peer), geteuid() == 4321);
  peer.groups = {5, 77};
  EXPECT_TRUE(list->Allows(peer));
  peer.groups.clear();
  peer.uid = 1234;
  EXPECT_TRUE(list->Allows(peer));
  peer.uid = geteuid();  // the server's own user, always
  EXPECT_TRUE(PeerAllowList().Allows(peer));
  EXPECT_TRUE(PeerAllowList::Parse("").ok());
  for (const char* bad :
       {"no-such-user-here", "group:no-such-group-here", "user:", "group:"}) {
    EXPECT_EQ(PeerAllowList::Parse(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(SharedMemoryTest, LimitsAreResourceExhausted) {
  ServerOptions options;
  options.handle_limits.max_bytes_per_client = 10000;
  options.handle_limits.max_bytes_total = 20000;
  options.handle_limits.max_shared_memory_regions_per_client = 2;
  SharedMemoryServer s(HostProvider(), options);
  auto stub = s.UnixStub();
  ShmObject big(16384), a(4096), b(4096), c(4096);
  ASSERT_TRUE(big.ok() && a.ok() && b.ok() && c.ok());
  auto over = Register(*stub, big.name(), big.bytes(), "x");
  EXPECT_EQ(over->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over->status.error_message(), HasSubstr("per client"));
  auto r1 = Register(*stub, a.name(), a.bytes(), "x");
  auto r2 = Register(*stub, b.name(), b.bytes(), "x");
  ASSERT_TRUE(r1->open && r2->open);
  auto r3 = Register(*stub, c.name(), c.bytes(), "x");
  EXPECT_EQ(r3->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(r3->status.error_message(), HasSubstr("shared-memory regions"));
  // The total: y gets 8192, then 4096 more is over 20000 in all.
  auto y1 = Register(*stub, big.name(), 8192, "y");
  ASSERT_TRUE(y1->open) << y1->status.error_message();
  auto y2 = Register(*stub, c.name(), c.bytes(), "y");
  EXPECT_EQ(y2->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(y2->status.error_message(), HasSubstr("--max-stored-bytes"));
  // Unregistering gives the quota back.
  ASSERT_TRUE(Unregister(*stub, r1->id(), "x").ok());
  EXPECT_TRUE(r1->Finish().ok());
  auto again = Register(*stub, c.name(), c.bytes(), "x");
  EXPECT_TRUE(again->open) << again->status.error_message();
}

// A region unregistered while a multiply uses it stays mapped until that
// multiply is done; the multiply succeeds and writes its product.
TEST(SharedMemoryTest, UnregisteredMidRequestTheMultiplyStillSucceeds) {
  FakeEngine* fake = nullptr;
  SharedMemoryServer s(FakeProvider(&fake));
  auto stub = s.UnixStub();
  absl::BitGen gen;
  const Problem p = MakeProblem(12, 7, 5, gen);
  ShmObject shm(p.c_offset + p.c_bytes());
  ASSERT_TRUE(shm.ok());
  Fill(shm, p);
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  EXPECT_EQ(fake->registered(), 1);

  auto stub2 = s.UnixStub();
  std::future<std::pair<grpc::Status, v1::MultiplyResponse>> multiply =
      std::async(std::launch::async, [&] {
        v1::MultiplyResponse response;
        grpc::Status status =
            Multiply(*stub2, AllShared(p, reg->id()), &response);
        return std::make_pair(status, response);
      });
  fake->WaitForHeld(1);
  const auto listed = List(*stub);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].multiplies_in_flight(), 1);

  ASSERT_TRUE(Unregister(*stub, reg->id()).ok());
  EXPECT_TRUE(reg->Finish().ok()) << reg->status.error_message();
  EXPECT_TRUE(List(*stub).empty());
  // Still mapped and registered with the engine: the multiply holds it.
  EXPECT_EQ(fake->registered(), 1);
  EXPECT_EQ(testing::Sum(s.Scrape(), "matmul_shared_memory_regions"), 1);

  fake->ReleaseOne();
  auto [status, response] = multiply.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.c().shared().region_id(), reg->id());
  ExpectProduct(p, shm.data() + p.c_offset);
  // Released before the answer was sent.
  EXPECT_EQ(fake->registered(), 0);
  const std::map<std::string, double> metrics = s.Scrape();
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_regions"), 0);
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_bytes"), 0);
}

TEST(SharedMemoryTest, CancellingTheRegisterCallUnregisters) {
  FakeEngine* fake = nullptr;
  SharedMemoryServer s(FakeProvider(&fake));
  auto stub = s.UnixStub();
  ShmObject shm(1 << 16);
  ASSERT_TRUE(shm.ok());
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  reg->context->TryCancel();
  EXPECT_EQ(reg->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(AwaitNoRegions(*stub));
  EXPECT_EQ(fake->registered(), 0);
  const std::map<std::string, double> metrics =
      testing::ScrapeUntil(s.server().metrics_port(), [](const auto& m) {
        return testing::Sum(m, "matmul_shared_memory_regions") == 0;
      });
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_regions"), 0);
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_bytes"), 0);
}

// A client whose channel goes away (its process died) loses its region.
TEST(SharedMemoryTest, ADisconnectedClientsRegionGoes) {
  FakeEngine* fake = nullptr;
  SharedMemoryServer s(FakeProvider(&fake));
  ShmObject shm(1 << 16);
  ASSERT_TRUE(shm.ok());
  {
    auto stub = s.UnixStub();  // its own channel, gone with it
    auto reg = Register(*stub, shm.name(), shm.bytes(), "gone");
    ASSERT_TRUE(reg->open) << reg->status.error_message();
    EXPECT_EQ(List(*stub, "gone").size(), 1u);
    // ~Registration cancels the call, then the channel is destroyed.
  }
  auto stub = s.UnixStub();
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {
    gone = List(*stub, "gone").empty();
    if (!gone) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone);
  EXPECT_EQ(fake->registered(), 0);
}

// A client process killed with its region registered: the server sees its
// connection close, ends the registration, and unpins and unmaps the
// region (the gauges return to 0).
TEST(SharedMemoryTest, AKilledClientsRegionGoes) {
  FakeEngine* fake = nullptr;
  SharedMemoryServer s(FakeProvider(&fake));
  ShmObject shm(4096);
  ASSERT_TRUE(shm.ok());
  // tests/shared_memory_child.cc, in a process of its own.
  std::string child_path = MATMUL_SHM_CHILD;
  std::string socket_path = s.socket();
  std::string name = shm.name();
  std::string bytes = "4096";
  std::string client = "killed-child";
  char* argv[] = {child_path.data(), socket_path.data(), name.data(),
                  bytes.data(),      client.data(),      nullptr};
  pid_t child = 0;
  ASSERT_EQ(
      posix_spawn(&child, child_path.c_str(), nullptr, nullptr, argv, environ),
      0);
  auto stub = s.UnixStub();
  bool registered = false;
  for (int i = 0; i < 2000 && !registered; ++i) {
    registered = List(*stub, "killed-child").size() == 1;
    if (!registered) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(registered);
  EXPECT_EQ(fake->registered(), 1);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  bool gone = false;
  for (int i = 0; i < 2000 && !gone; ++i) {
    gone = List(*stub, "killed-child").empty();
    if (!gone) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone);
  EXPECT_EQ(fake->registered(), 0);
  const std::map<std::string, double> metrics = s.Scrape();
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_regions"), 0);
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_bytes"), 0);
}

TEST(SharedMemoryTest, MultiplyStreamRefusesSharedOperands) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  grpc::ClientContext context;
  Deadline(context);
  auto stream = stub->MultiplyStream(&context);
  v1::MultiplyStreamRequest start;
  start.set_request_id(1);
  v1::MultiplyRequest* m = start.mutable_start()->mutable_request();
  SetShape(m->mutable_a(), 2, 2);
  Shared(m->mutable_a(), "shm-1", 0);
  SetShape(m->mutable_b(), 2, 2);
  ASSERT_TRUE(stream->Write(start));
  stream->WritesDone();
  v1::MultiplyStreamResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 1u);
  EXPECT_EQ(response.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(response.error().message(), HasSubstr("use Multiply"));
  while (stream->Read(&response)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

// An open registration does not hold a drain up: it ends UNAVAILABLE at the
// drain's start.
TEST(SharedMemoryTest, ShutdownEndsOpenRegistrations) {
  SharedMemoryServer s(HostProvider());
  auto stub = s.UnixStub();
  ShmObject shm(4096);
  ASSERT_TRUE(shm.ok());
  auto reg = Register(*stub, shm.name(), shm.bytes());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  s.server().Shutdown();
  EXPECT_EQ(reg->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.server().service().regions().registered(), 0);
}

// The flake that mapped_copy_test had (e0720f2) and this file could have:
// a test process that died left its object's name in /dev/shm, a later
// process given the same pid tried the same name first, and its test went
// on through MAP_FAILED. A name that exists is skipped and left as it was,
// and the object made is the one the server opens by name.
TEST(SharedMemoryTest, TheTestsObjectSkipsNamesThatExistAlready) {
  testing::StaleNames stale;
  ASSERT_TRUE(testing::LeaveNamesAhead(stale, ShmObject::Names(), 3));
  // The first name after those (past any other leftover) is the one made.
  const std::string expected =
      testing::FirstFreeNameAhead(ShmObject::Names(), 3);
  std::string made;
  {
    ShmObject shm(4096);
    ASSERT_TRUE(shm.ok());
    made = shm.name();
    EXPECT_EQ(made, expected);
    EXPECT_EQ(testing::ShmObjectSize(made), 4096);
    SharedMemoryServer s(HostProvider());
    auto stub = s.UnixStub();
    auto reg = Register(*stub, shm.name(), shm.bytes());
    ASSERT_TRUE(reg->open) << reg->status.error_message();
    EXPECT_EQ(reg->response.region().name(), made);
    EXPECT_EQ(reg->response.region().bytes(), 4096);
  }
  // Its own name unlinked; the others still there, untouched.
  EXPECT_EQ(testing::ShmObjectSize(made), -1) << made;
  testing::ExpectLeftAsTheyWere(stale);
}

// Where every name it may try exists, the object is not made: the test
// fails there (a test asserts ok()) instead of writing through MAP_FAILED,
// and none of those objects is touched.
TEST(SharedMemoryTest, TheTestsObjectFailsWhenNoNameIsFree) {
  testing::StaleNames stale;
  ASSERT_TRUE(testing::LeaveNamesAhead(stale, ShmObject::Names(),
                                       ShmObject::kAttempts));
  static bool made = true;
  EXPECT_NONFATAL_FAILURE(
      {
        ShmObject shm(4096);
        made = shm.ok();
      },
      "File exists");
  EXPECT_FALSE(made);
  testing::ExpectLeftAsTheyWere(stale);
}

}  // namespace
}  // namespace matmul
