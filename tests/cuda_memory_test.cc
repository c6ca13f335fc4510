// Integration tests of CUDA memory regions (RegisterCudaMemory, issue 57)
// that need no GPU: a real MatmulServer on a Unix socket in a temporary
// directory, over
//   - the host engine, which refuses every registration
//     (FAILED_PRECONDITION: it has no GPU memory), and
//   - ImportingEngine, the host engine with an ImportDeviceMemory that
//     "opens" handles the test made up onto host buffers it owns: the whole
//     server path (registry, quota, lifetimes, PlanMultiply's views and
//     c_target, the engine's in-place product) runs as it does on the CUDA
//     engine, where tests/gpu/cuda_memory_gpu_test.cc runs it for real.
#include <grpcpp/create_channel.h>
#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gpu/engine_factory.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/matmul_server.h"
#include "tests/metrics/scrape_client.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

constexpr unsigned char kUuid[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc,
                                     0xde, 0xf0, 0x01, 0x23, 0x45, 0x67,
                                     0x89, 0xab, 0xcd, 0xef};
constexpr char kUuidText[] = "GPU-12345678-9abc-def0-0123-456789abcdef";

std::string Uuid() {
  return std::string(reinterpret_cast<const char*>(kUuid), 16);
}

// A made-up IPC handle: 64 bytes, the first eight `tag`.
std::string Handle(uint64_t tag) {
  std::string handle(64, '\0');
  std::memcpy(handle.data(), &tag, sizeof tag);
  return handle;
}

// The host engine with "GPU memory": buffers of the test's, named by
// made-up handles, opened as raw engine memory. Counts opens not yet
// closed. Thread-safe.
class ImportingEngine final : public Engine {
 public:
  explicit ImportingEngine(std::unique_ptr<Engine> inner)
      : inner_(std::move(inner)) {}
  ~ImportingEngine() override { Shutdown(); }

  // `memory` (the test's, outliving the server) is what `Handle(tag)` opens.
  void Add(uint64_t tag, std::vector<std::byte>* memory) {
    absl::MutexLock lock(&mu_);
    memory_[Handle(tag)] = memory;
  }
  int64_t open() const { return open_->load(); }

  const EngineInfo& info() const override { return inner_->info(); }
  absl::Status CheckFits(const MatmulSpec& spec) const override {
    return inner_->CheckFits(spec);
  }
  void Submit(std::unique_ptr<MatmulJob> job) override {
    inner_->Submit(std::move(job));
  }
  EngineStats stats() const override { return inner_->stats(); }
  std::vector<StreamSpan> RecentSpans(absl::Duration window) const override {
    return inner_->RecentSpans(window);
  }
  absl::StatusOr<HostBuffer> AllocateHostBuffer(int64_t bytes) override {
    return inner_->AllocateHostBuffer(bytes);
  }
  absl::StatusOr<HostMemoryRegistration> RegisterHostMemory(
      void* data, int64_t bytes) override {
    return inner_->RegisterHostMemory(data, bytes);
  }
  void Shutdown() override { inner_->Shutdown(); }

  absl::StatusOr<std::shared_ptr<ResidentTensor>> ImportDeviceMemory(
      absl::Span<const std::byte> ipc_handle, int64_t bytes,
      absl::Span<const std::byte> device_uuid) override {
    if (device_uuid.size() != 16 ||
        std::memcmp(device_uuid.data(), kUuid, 16) != 0) {
      return absl::FailedPreconditionError(
          "device_uuid: the memory is on a GPU this server does not use");
    }
    std::vector<std::byte>* memory = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = memory_.find(std::string(
          reinterpret_cast<const char*>(ipc_handle.data()), ipc_handle.size()));
      if (it != memory_.end()) memory = it->second;
    }
    if (memory == nullptr) {
      return absl::FailedPreconditionError(
          "ipc_handle: cudaIpcOpenMemHandle failed: cudaErrorInvalidValue");
    }
    if (bytes > static_cast<int64_t>(memory->size())) {
      return absl::InvalidArgumentError("bytes: past the allocation");
    }
    return std::shared_ptr<ResidentTensor>(
        std::make_shared<Opened>(open_, memory->data(), bytes));
  }

 private:
  class Opened final : public ResidentTensor {
   public:
    Opened(std::shared_ptr<std::atomic<int64_t>> open, std::byte* data,
           int64_t bytes)
        : ResidentTensor(-1, bytes, data), open_(std::move(open)) {
      open_->fetch_add(1);
    }
    ~Opened() override { open_->fetch_sub(1); }

   private:
    std::shared_ptr<std::atomic<int64_t>> open_;
  };

  std::unique_ptr<Engine> inner_;
  std::shared_ptr<std::atomic<int64_t>> open_ =
      std::make_shared<std::atomic<int64_t>>(0);
  absl::Mutex mu_;
  std::map<std::string, std::vector<std::byte>*> memory_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<Engine> HostEngine() {
  EngineOptions options;
  options.kind = EngineKind::kHost;
  options.streams_per_device = 2;
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateEngine(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

// A server on 127.0.0.1:0 and a Unix socket, metrics on 127.0.0.1:0; over
// the host engine, or an ImportingEngine around it (`importing`).
class Server {
 public:
  explicit Server(bool importing, ServerOptions options = {}) {
    char dir[] = "/tmp/matmul-cuda-XXXXXX";
    EXPECT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/server.sock";
    options.listen_address = "127.0.0.1:0";
    options.metrics_address = "127.0.0.1:0";
    options.unix_socket = socket_;
    options.drain_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<MatmulServer>> server = MatmulServer::Start(
        options,
        [this, importing]() -> absl::StatusOr<std::unique_ptr<Engine>> {
          if (!importing) return HostEngine();
          auto engine = std::make_unique<ImportingEngine>(HostEngine());
          engine_ = engine.get();
          return std::unique_ptr<Engine>(std::move(engine));
        });
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }
  ~Server() {
    server_.reset();
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }

  MatmulServer& server() { return *server_; }
  ImportingEngine& engine() { return *engine_; }
  std::unique_ptr<v1::MatmulService::Stub> UnixStub() const {
    return v1::MatmulService::NewStub(grpc::CreateChannel(
        absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials()));
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
  ImportingEngine* engine_ = nullptr;
  std::unique_ptr<MatmulServer> server_;
};

void Deadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
}

// An open RegisterCudaMemory call: the first message, or the status the
// call ended with before it.
struct Registration {
  std::unique_ptr<grpc::ClientContext> context =
      std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::RegisterCudaMemoryResponse>> reader;
  v1::RegisterCudaMemoryResponse response;
  bool open = false;
  grpc::Status status;

  const std::string& id() const { return response.region().id(); }
  grpc::Status Finish() {
    if (open) {
      v1::RegisterCudaMemoryResponse extra;
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
                                       const std::string& handle, int64_t bytes,
                                       const std::string& uuid = Uuid(),
                                       const std::string& client = "") {
  auto r = std::make_unique<Registration>();
  if (!client.empty()) r->context->AddMetadata("x-matmul-client", client);
  v1::RegisterCudaMemoryRequest request;
  request.set_ipc_handle(handle);
  request.set_bytes(bytes);
  request.set_device_uuid(uuid);
  r->reader = stub.RegisterCudaMemory(r->context.get(), request);
  r->open = r->reader->Read(&r->response);
  if (!r->open) r->status = r->reader->Finish();
  return r;
}

std::vector<v1::SharedMemoryRegion> List(v1::MatmulService::Stub& stub) {
  grpc::ClientContext context;
  Deadline(context);
  v1::ListSharedMemoryResponse response;
  grpc::Status s =
      stub.ListSharedMemory(&context, v1::ListSharedMemoryRequest(), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return {response.regions().begin(), response.regions().end()};
}

grpc::Status Multiply(v1::MatmulService::Stub& stub,
                      const v1::MultiplyRequest& request,
                      v1::MultiplyResponse* response) {
  grpc::ClientContext context;
  Deadline(context);
  return stub.Multiply(&context, request, response);
}

// A float32 m x k by k x n problem: random A and B.
struct Problem {
  int64_t m, k, n;
  std::string a, b;
  int64_t a_bytes() const { return m * k * 4; }
  int64_t b_bytes() const { return k * n * 4; }
  int64_t c_bytes() const { return m * n * 4; }
};

Problem MakeProblem(int64_t m, int64_t k, int64_t n) {
  absl::BitGen gen;
  return Problem{m, k, n, testing::RandomBytes(DType::kFloat32, m * k, gen),
                 testing::RandomBytes(DType::kFloat32, k * n, gen)};
}

void SetShape(v1::Tensor* t, int64_t rows, int64_t cols) {
  t->add_shape(rows);
  t->add_shape(cols);
  t->set_dtype(v1::DTYPE_FLOAT32);
}

void Shared(v1::SharedMemoryRef* ref, const std::string& id, int64_t offset) {
  ref->set_region_id(id);
  ref->set_offset(offset);
}

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

// The server still multiplies an inline request.
void ExpectServing(v1::MatmulService::Stub& stub) {
  const Problem p = MakeProblem(3, 4, 5);
  v1::MultiplyRequest request;
  SetShape(request.mutable_a(), p.m, p.k);
  request.mutable_a()->set_data(p.a);
  SetShape(request.mutable_b(), p.k, p.n);
  request.mutable_b()->set_data(p.b);
  v1::MultiplyResponse response;
  const grpc::Status s = Multiply(stub, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectProduct(p, response.c().data().data());
}

TEST(CudaMemoryTest, TheHostEngineRefusesGpuMemoryAndKeepsServing) {
  Server s(/*importing=*/false);
  auto stub = s.UnixStub();
  auto reg = Register(*stub, Handle(1), 4096);
  ASSERT_FALSE(reg->open);
  EXPECT_EQ(reg->status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(reg->status.error_message(),
              HasSubstr("the host engine has no GPU memory"));
  EXPECT_TRUE(List(*stub).empty());
  const std::map<std::string, double> metrics = s.Scrape();
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_regions"), 0);
  EXPECT_EQ(testing::Sum(metrics, "matmul_requests_total",
                         {"method=\"RegisterCudaMemory\"",
                          "code=\"FAILED_PRECONDITION\""}),
            1);
  ExpectServing(*stub);
}

TEST(CudaMemoryTest, OnlyOverTheUnixSocket) {
  Server s(/*importing=*/true);
  auto tcp = s.TcpStub();
  auto reg = Register(*tcp, Handle(1), 4096);
  EXPECT_EQ(reg->status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(reg->status.error_message(), HasSubstr("Unix socket"));
}

TEST(CudaMemoryTest, MultipliesFromAndIntoGpuMemoryInPlace) {
  Server s(/*importing=*/true);
  auto stub = s.UnixStub();
  const Problem p = MakeProblem(67, 45, 29);
  const int64_t b_offset = 12288, c_offset = 17664;
  std::vector<std::byte> gpu(32768, std::byte{0xff});
  std::memcpy(gpu.data(), p.a.data(), p.a.size());
  std::memcpy(gpu.data() + b_offset, p.b.data(), p.b.size());
  s.engine().Add(7, &gpu);

  auto reg = Register(*stub, Handle(7), 30000);
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  EXPECT_THAT(reg->id(), HasSubstr("cuda-"));
  EXPECT_EQ(reg->response.region().kind(), v1::REGION_KIND_CUDA);
  EXPECT_EQ(reg->response.region().device_uuid(), kUuidText);
  EXPECT_EQ(reg->response.region().bytes(), 30000);
  EXPECT_EQ(s.engine().open(), 1);
  const auto listed = List(*stub);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].kind(), v1::REGION_KIND_CUDA);

  v1::MultiplyRequest request;
  SetShape(request.mutable_a(), p.m, p.k);
  Shared(request.mutable_a()->mutable_shared(), reg->id(), 0);
  SetShape(request.mutable_b(), p.k, p.n);
  Shared(request.mutable_b()->mutable_shared(), reg->id(), b_offset);
  Shared(request.mutable_c_shared(), reg->id(), c_offset);
  v1::MultiplyResponse response;
  const grpc::Status status = Multiply(*stub, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.c().data().empty());
  EXPECT_EQ(response.c().shared().region_id(), reg->id());
  EXPECT_EQ(response.c().shared().offset(), c_offset);
  ExpectProduct(p, gpu.data() + c_offset);

  // Nothing went through host staging or the wire.
  EXPECT_EQ(s.server().service().copied_operand_bytes(), 0);
  const std::map<std::string, double> metrics = s.Scrape();
  EXPECT_EQ(testing::Sum(metrics, "matmul_payload_bytes_total",
                         {"path=\"cuda_memory\"", "direction=\"in\""}),
            p.a_bytes() + p.b_bytes());
  EXPECT_EQ(testing::Sum(metrics, "matmul_payload_bytes_total",
                         {"path=\"cuda_memory\"", "direction=\"out\""}),
            p.c_bytes());
  EXPECT_EQ(
      testing::Sum(metrics, "matmul_payload_bytes_total", {"path=\"inline\""}),
      0);
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_regions"), 1);

  // Unregistered: gone from the list, its memory closed, the metrics 0.
  grpc::ClientContext context;
  Deadline(context);
  v1::UnregisterSharedMemoryRequest unregister;
  unregister.set_region_id(reg->id());
  v1::UnregisterSharedMemoryResponse unregistered;
  ASSERT_TRUE(
      stub->UnregisterSharedMemory(&context, unregister, &unregistered).ok());
  EXPECT_TRUE(reg->Finish().ok());
  EXPECT_TRUE(List(*stub).empty());
  EXPECT_EQ(s.engine().open(), 0);
  EXPECT_EQ(testing::Sum(s.Scrape(), "matmul_shared_memory_regions"), 0);
  EXPECT_EQ(Multiply(*stub, request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(CudaMemoryTest, MixesWithInlineOperandsAndStoredTensors) {
  Server s(/*importing=*/true);
  auto stub = s.UnixStub();
  const Problem p = MakeProblem(16, 24, 8);
  std::vector<std::byte> gpu(8192, std::byte{0});
  std::memcpy(gpu.data(), p.a.data(), p.a.size());
  s.engine().Add(9, &gpu);
  auto reg = Register(*stub, Handle(9), gpu.size());
  ASSERT_TRUE(reg->open) << reg->status.error_message();

  // A in GPU memory, B inline, C answered inline.
  v1::MultiplyRequest request;
  SetShape(request.mutable_a(), p.m, p.k);
  Shared(request.mutable_a()->mutable_shared(), reg->id(), 0);
  SetShape(request.mutable_b(), p.k, p.n);
  request.mutable_b()->set_data(p.b);
  v1::MultiplyResponse response;
  grpc::Status status = Multiply(*stub, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectProduct(p, response.c().data().data());

  // B stored, A in GPU memory, C into GPU memory.
  v1::UploadRequest upload;
  SetShape(upload.mutable_tensor(), p.k, p.n);
  upload.mutable_tensor()->set_data(p.b);
  v1::UploadResponse uploaded;
  {
    grpc::ClientContext context;
    Deadline(context);
    ASSERT_TRUE(stub->Upload(&context, upload, &uploaded).ok());
  }
  v1::MultiplyRequest stored;
  SetShape(stored.mutable_a(), p.m, p.k);
  Shared(stored.mutable_a()->mutable_shared(), reg->id(), 0);
  stored.set_b_handle(uploaded.handle().id());
  Shared(stored.mutable_c_shared(), reg->id(), 4096);
  status = Multiply(*stub, stored, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectProduct(p, gpu.data() + 4096);
}

TEST(CudaMemoryTest, RefusalsArePreciseAndTheServerKeepsServing) {
  ServerOptions options;
  options.handle_limits.max_bytes_per_client = 10000;
  Server s(/*importing=*/true, options);
  auto stub = s.UnixStub();
  std::vector<std::byte> gpu(16384), other(4096);
  s.engine().Add(1, &gpu);
  s.engine().Add(2, &other);

  // A handle that does not open.
  auto bad = Register(*stub, Handle(99), 4096);
  EXPECT_EQ(bad->status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(bad->status.error_message(), HasSubstr("cudaIpcOpenMemHandle"));
  ExpectServing(*stub);
  // A GPU the server does not use.
  auto elsewhere = Register(*stub, Handle(1), 4096, std::string(16, 'x'));
  EXPECT_EQ(elsewhere->status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(elsewhere->status.error_message(), HasSubstr("device_uuid"));
  ExpectServing(*stub);
  // No bytes.
  auto empty = Register(*stub, Handle(1), 0);
  EXPECT_EQ(empty->status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Over the client's stored-bytes quota: nothing is opened.
  auto over = Register(*stub, Handle(1), 16384);
  EXPECT_EQ(over->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.engine().open(), 0);
  ExpectServing(*stub);

  // A product that does not fit its region, an operand at an offset that is
  // not element-aligned.
  auto reg = Register(*stub, Handle(2), other.size());
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  const Problem p = MakeProblem(16, 16, 16);  // 1024 bytes each
  v1::MultiplyRequest request;
  SetShape(request.mutable_a(), p.m, p.k);
  request.mutable_a()->set_data(p.a);
  SetShape(request.mutable_b(), p.k, p.n);
  request.mutable_b()->set_data(p.b);
  Shared(request.mutable_c_shared(), reg->id(), 3584);
  v1::MultiplyResponse response;
  grpc::Status status = Multiply(*stub, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("run past the end of region"));
  Shared(request.mutable_c_shared(), reg->id(), 2);
  status = Multiply(*stub, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("not a multiple"));
  Shared(request.mutable_c_shared(), reg->id(), 3072);
  status = Multiply(*stub, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectProduct(p, other.data() + 3072);
}

TEST(CudaMemoryTest, CancellingTheRegistrationClosesTheMemory) {
  Server s(/*importing=*/true);
  auto stub = s.UnixStub();
  std::vector<std::byte> gpu(4096);
  s.engine().Add(3, &gpu);
  auto reg = Register(*stub, Handle(3), 4096);
  ASSERT_TRUE(reg->open) << reg->status.error_message();
  EXPECT_EQ(s.engine().open(), 1);
  reg->context->TryCancel();
  EXPECT_EQ(reg->Finish().error_code(), grpc::StatusCode::CANCELLED);
  for (int i = 0; i < 500 && (s.engine().open() != 0 || !List(*stub).empty());
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(List(*stub).empty());
  EXPECT_EQ(s.engine().open(), 0);
  EXPECT_EQ(testing::Sum(s.Scrape(), "matmul_shared_memory_regions"), 0);
  ExpectServing(*stub);
}

}  // namespace
}  // namespace matmul
