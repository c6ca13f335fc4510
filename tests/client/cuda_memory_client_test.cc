// CudaMemorySession without a GPU: its client-side checks, and a host-engine
// MatmulServer in this process (on a Unix socket in a fresh folder)
// refusing the registration with FAILED_PRECONDITION, then serving on.
// (With a GPU, tests/gpu/cuda_memory_gpu_test.cc and matmul-bench
// --cuda-memory exercise the registration for real.)
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/lib/cuda_memory_session.h"
#include "client/lib/matmul_client.h"
#include "gmock/gmock.h"
#include "gpu/engine_factory.h"
#include "gtest/gtest.h"
#include "server/matmul_server.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

class CudaMemoryClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char folder[] = "/tmp/matmul-cuda-client-XXXXXX";
    ASSERT_NE(mkdtemp(folder), nullptr);
    folder_ = folder;
    socket_ = absl::StrCat(folder_, "/matmul.sock");
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.unix_socket = socket_;
    options.drain_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<MatmulServer>> server = MatmulServer::Start(
        options, []() -> absl::StatusOr<std::unique_ptr<Engine>> {
          EngineOptions engine;
          engine.kind = EngineKind::kHost;
          engine.streams_per_device = 1;
          return CreateEngine(engine);
        });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(absl::StrCat("unix:", socket_));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  void TearDown() override {
    client_.reset();
    if (server_ != nullptr) server_->Shutdown();
    if (!socket_.empty()) unlink(socket_.c_str());
    if (!folder_.empty()) rmdir(folder_.c_str());
  }

  std::string folder_, socket_;
  std::unique_ptr<MatmulServer> server_;
  std::unique_ptr<MatmulClient> client_;
};

TEST_F(CudaMemoryClientTest, MalformedRangesAreRefusedBeforeSending) {
  CudaMemoryRange range{std::string(63, '\0'), 4096, std::string(16, '\0')};
  auto session = CudaMemorySession::Create(client_.get(), range);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(session.status().message(), HasSubstr("64 bytes"));
  range = {std::string(64, '\0'), 4096, std::string(15, '\0')};
  session = CudaMemorySession::Create(client_.get(), range);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
  range = {std::string(64, '\0'), 0, std::string(16, '\0')};
  session = CudaMemorySession::Create(client_.get(), range);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaMemoryClientTest, AHostEngineServerRefusesGpuMemory) {
  const CudaMemoryRange range{std::string(64, '\x01'), 4096,
                              std::string(16, '\x02')};
  auto session = CudaMemorySession::Create(client_.get(), range);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(session.status().message(),
              HasSubstr("the host engine has no GPU memory"));
  // Still serving.
  HostTensor a{{1, 2}, DType::kFloat32, std::string(8, '\0')};
  HostTensor b{{2, 1}, DType::kFloat32, std::string(8, '\0')};
  auto c = client_->Multiply(a, b);
  EXPECT_TRUE(c.ok()) << c.status();
}

}  // namespace
}  // namespace matmul
