// CUDA memory regions on a real GPU (issue 57): a MatmulServer on the CUDA
// engine listening on a Unix socket, and a separate client process
// (tests/gpu/cuda_memory_child.cc, started with posix_spawn: nothing forks
// after CUDA is initialized) that cudaMallocs operands, registers them
// (RegisterCudaMemory) and multiplies from and into its own GPU memory.
// GTEST_SKIP without a GPU.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gpu/cuda/device_registry.h"
#include "gpu/engine_factory.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/matmul_server.h"
#include "tests/metrics/scrape_client.h"

namespace matmul {
namespace {

class CudaServer {
 public:
  CudaServer() {
    char dir[] = "/tmp/matmul-cudagpu-XXXXXX";
    EXPECT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/server.sock";
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_address = "127.0.0.1:0";
    options.unix_socket = socket_;
    options.drain_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<MatmulServer>> server = MatmulServer::Start(
        options, []() -> absl::StatusOr<std::unique_ptr<Engine>> {
          EngineOptions engine;
          engine.kind = EngineKind::kCuda;
          engine.streams_per_device = 2;
          return CreateEngine(engine);
        });
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }
  ~CudaServer() {
    server_.reset();
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }
  const std::string& socket() const { return socket_; }
  std::map<std::string, double> Scrape() const {
    return testing::ParseScrape(
        testing::HttpGet(server_->metrics_port(), "/metrics").body);
  }
  std::unique_ptr<v1::MatmulService::Stub> UnixStub() const {
    return v1::MatmulService::NewStub(grpc::CreateChannel(
        absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials()));
  }

 private:
  std::string dir_;
  std::string socket_;
  std::unique_ptr<MatmulServer> server_;
};

// The child, started with its stdout on a pipe.
struct Child {
  pid_t pid = 0;
  FILE* out = nullptr;
  ~Child() {
    if (out != nullptr) std::fclose(out);
  }
};

std::unique_ptr<Child> Spawn(const std::string& socket,
                             const std::string& mode) {
  auto child = std::make_unique<Child>();
  int fds[2];
  if (pipe(fds) != 0) return child;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::string path = MATMUL_CUDA_MEMORY_CHILD;
  std::string socket_arg = socket, mode_arg = mode;
  char* argv[] = {path.data(), socket_arg.data(), mode_arg.data(), nullptr};
  if (posix_spawn(&child->pid, path.c_str(), &actions, nullptr, argv,
                  environ) != 0) {
    child->pid = 0;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  child->out = fdopen(fds[0], "r");
  return child;
}

std::string ReadAll(FILE* f) {
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  return text;
}

bool HaveGpu() { return VisibleCudaDevices() > 0; }

TEST(CudaMemoryGpuTest, ASecondProcessMultipliesItsGpuMemoryExactly) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  CudaServer s;
  auto child = Spawn(s.socket(), "exact");
  ASSERT_NE(child->pid, 0);
  const std::string output = ReadAll(child->out);
  int status = 0;
  waitpid(child->pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_THAT(output, ::testing::Not(::testing::HasSubstr("FAIL"))) << output;
  EXPECT_THAT(output, ::testing::HasSubstr("ok refusals"));
  // The child's regions are gone with its calls; its products came from
  // GPU memory, not the wire.
  std::map<std::string, double> metrics;
  for (int i = 0; i < 500; ++i) {
    metrics = s.Scrape();
    if (testing::Sum(metrics, "matmul_shared_memory_regions") == 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(testing::Sum(metrics, "matmul_shared_memory_regions"), 0);
  EXPECT_GT(testing::Sum(metrics, "matmul_payload_bytes_total",
                         {"path=\"cuda_memory\"", "direction=\"out\""}),
            0);
  EXPECT_EQ(
      testing::Sum(metrics, "matmul_payload_bytes_total", {"path=\"inline\""}),
      0);
}

TEST(CudaMemoryGpuTest, AClientKilledMidMultiplyLeavesTheServerServing) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  CudaServer s;
  auto child = Spawn(s.socket(), "loop");
  ASSERT_NE(child->pid, 0);
  char line[256] = {0};
  ASSERT_NE(std::fgets(line, sizeof line, child->out), nullptr);
  ASSERT_THAT(std::string(line), ::testing::HasSubstr("READY")) << line;
  absl::SleepFor(absl::Milliseconds(300));  // multiplies in flight
  EXPECT_EQ(testing::Sum(s.Scrape(), "matmul_shared_memory_regions"), 1);
  kill(child->pid, SIGKILL);
  int status = 0;
  waitpid(child->pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  double regions = 1;
  for (int i = 0; i < 1000 && regions != 0; ++i) {
    regions = testing::Sum(s.Scrape(), "matmul_shared_memory_regions");
    if (regions != 0) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(regions, 0);
  // Still serving: an inline multiply.
  auto stub = s.UnixStub();
  v1::MultiplyRequest request;
  for (v1::Tensor* t : {request.mutable_a(), request.mutable_b()}) {
    t->add_shape(2);
    t->add_shape(2);
    t->set_dtype(v1::DTYPE_FLOAT32);
    const float values[4] = {1, 2, 3, 4};
    t->set_data(std::string(reinterpret_cast<const char*>(values), 16));
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  v1::MultiplyResponse response;
  const grpc::Status ok = stub->Multiply(&context, request, &response);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  float c[4];
  ASSERT_EQ(response.c().data().size(), sizeof c);
  std::memcpy(c, response.c().data().data(), sizeof c);
  EXPECT_EQ(c[0], 7);
  EXPECT_EQ(c[3], 22);
}

}  // namespace
}  // namespace matmul
