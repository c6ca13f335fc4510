// The CUDA engine and host memory registered with it (RegisterHostMemory,
// the shared-memory path of issue 21): a mapping of a POSIX shared-memory
// object is pinned with cudaHostRegister, a multiply reads its operands
// from it and writes its product into it with no staging, and the result is
// exact against a float64 reference (small integer operands, so float32
// sums are exact). Skips where no GPU is visible.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/device_registry.h"
#include "gtest/gtest.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

#define SKIP_WITHOUT_GPU()                                   \
  do {                                                       \
    if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU"; \
  } while (0)

// A mapped shared-memory object, unlinked at once (the mapping keeps it).
class Mapping {
 public:
  explicit Mapping(int64_t bytes) : bytes_(bytes) {
    const std::string name = absl::StrCat("/matmul-gpu-test-", getpid());
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    shm_unlink(name.c_str());
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    void* data = mmap(nullptr, static_cast<size_t>(bytes),
                      PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(data, MAP_FAILED);
    data_ = static_cast<std::byte*>(data);
  }
  ~Mapping() { munmap(data_, static_cast<size_t>(bytes_)); }
  std::byte* data() const { return data_; }

 private:
  int64_t bytes_;
  std::byte* data_ = nullptr;
};

class RegionJob final : public MatmulJob {
 public:
  RegionJob(JobDescription description, std::promise<absl::Status> done)
      : MatmulJob(std::move(description)), done_(std::move(done)) {}
  void Done(absl::StatusOr<JobResult> result) override {
    absl::Status status = result.status();
    if (result.ok() && !result->c().empty()) {
      status = absl::InternalError("C came back in staging, not in place");
    }
    { absl::StatusOr<JobResult> release = std::move(result); }
    done_.set_value(status);
  }

 private:
  std::promise<absl::Status> done_;
};

std::unique_ptr<CudaEngine> NewEngine() {
  CudaEngineOptions options;
  options.streams_per_device = 2;
  options.pinned_bytes_per_device = int64_t{64} << 20;
  options.poison_outputs = true;
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine =
      CudaEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Small integers as float32: every product and sum below is exact.
std::vector<float> SmallIntegers(int64_t count, absl::BitGen& gen) {
  std::vector<float> out(static_cast<size_t>(count));
  for (float& v : out) v = static_cast<float>(absl::Uniform(gen, -4, 5));
  return out;
}

TEST(CudaSharedMemoryTest, MultiplyFromAndIntoRegisteredMemoryIsExact) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  const int64_t m = 300, k = 257, n = 129;
  const int64_t a_bytes = m * k * 4, b_bytes = k * n * 4, c_bytes = m * n * 4;
  const int64_t b_at = 1 << 20, c_at = 2 << 20, bytes = 4 << 20;
  Mapping region(bytes);
  absl::StatusOr<HostMemoryRegistration> registration =
      engine->RegisterHostMemory(region.data(), bytes);
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_TRUE(registration->pinned());

  absl::BitGen gen;
  const std::vector<float> a = SmallIntegers(m * k, gen);
  const std::vector<float> b = SmallIntegers(k * n, gen);
  std::memcpy(region.data(), a.data(), a_bytes);
  std::memcpy(region.data() + b_at, b.data(), b_bytes);
  std::memset(region.data() + c_at, 0xff, c_bytes);

  for (bool inline_dispatch : {true, false}) {
    SCOPED_TRACE(inline_dispatch ? "small" : "forced through a lane");
    JobDescription job;
    job.spec =
        testing::MakeSpec(DType::kFloat32, 1, 1, m, n, k, false, false, false);
    MultiplyOp op;
    op.prestaged = PrestagedOperands{region.data(), region.data() + b_at};
    op.c_destination = region.data() + c_at;
    job.op = op;
    std::promise<absl::Status> promise;
    std::future<absl::Status> done = promise.get_future();
    engine->Submit(std::make_unique<RegionJob>(job, std::move(promise)));
    ASSERT_TRUE(done.get().ok());
    std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end());
    const std::vector<double> ref = testing::ReferenceGemm(job.spec, ad, bd);
    const float* c = reinterpret_cast<const float*>(region.data() + c_at);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_EQ(static_cast<double>(c[i]), ref[i]) << "at " << i;
    }
    std::memset(region.data() + c_at, 0xff, c_bytes);
  }
  const EngineStats stats = engine->stats();
  ASSERT_FALSE(stats.devices.empty());
  engine->Shutdown();
}

TEST(CudaSharedMemoryTest, RegistrationFailuresAreStatuses) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->RegisterHostMemory(nullptr, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  Mapping region(1 << 20);
  absl::StatusOr<HostMemoryRegistration> first =
      engine->RegisterHostMemory(region.data(), 1 << 20);
  ASSERT_TRUE(first.ok()) << first.status();
  // The same pages twice: CUDA refuses, the engine says so.
  absl::StatusOr<HostMemoryRegistration> twice =
      engine->RegisterHostMemory(region.data(), 1 << 20);
  EXPECT_FALSE(twice.ok());
  // Unregistered on destruction: registering again then works.
  *first = HostMemoryRegistration();
  absl::StatusOr<HostMemoryRegistration> again =
      engine->RegisterHostMemory(region.data(), 1 << 20);
  EXPECT_TRUE(again.ok()) << again.status();
  engine->Shutdown();
}

}  // namespace
}  // namespace matmul
