// The CUDA engine and host memory registered with it (RegisterHostMemory,
// the shared-memory path of issue 21): a mapping of a POSIX shared-memory
// object is pinned with cudaHostRegister, a multiply reads its operands
// from it and writes its product into it with no staging, and the result is
// exact against a float64 reference (small integer operands, so float32
// sums are exact). Skips where no GPU is visible, except for the two tests
// of the test's own shared-memory mapping, which need none.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/device_registry.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tests/reference_gemm.h"
#include "tests/shm_names.h"

namespace matmul {
namespace {

#define SKIP_WITHOUT_GPU()                                   \
  do {                                                       \
    if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU"; \
  } while (0)

// A mapped shared-memory object, its name unlinked as soon as it is open
// (the mapping keeps the object), so a test process that dies leaves
// nothing in /dev/shm. A name that exists all the same (from an older build
// that used one fixed name per pid, or held by another process) is skipped
// (O_EXCL, bounded), never reused or unlinked; pids come round again
// (pid_max is 32768 here). A create that fails is a test failure with ok()
// false, and a test asserts ok() before it uses the mapping.
class Mapping {
 public:
  static constexpr int kAttempts = testing::kFreshNameAttempts;

  explicit Mapping(int64_t bytes) : bytes_(bytes) {
    const int fd =
        testing::CreateUnderFreshName([] { return Names().Next(); }, &name_);
    if (fd < 0) return;
    EXPECT_EQ(shm_unlink(name_.c_str()), 0) << std::strerror(errno);
    if (ftruncate(fd, bytes) != 0) {
      ADD_FAILURE() << "ftruncate: " << std::strerror(errno);
      close(fd);
      return;
    }
    void* data = mmap(nullptr, static_cast<size_t>(bytes),
                      PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    close(fd);
    if (data == MAP_FAILED) {
      ADD_FAILURE() << "mmap: " << std::strerror(error);
      return;
    }
    data_ = static_cast<std::byte*>(data);
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, static_cast<size_t>(bytes_));
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // The names its constructions try, in order.
  static testing::NameSequence& Names() {
    static testing::NameSequence names(
        absl::StrCat("/matmul-gpu-test-", getpid(), "-"));
    return names;
  }

  bool ok() const { return data_ != nullptr; }
  // The name the object had while it was being created.
  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }

 private:
  int64_t bytes_;
  std::string name_;
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
  options.pinned_pool_bytes = int64_t{64} << 20;
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
  ASSERT_TRUE(region.ok());
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

// A and B in one registered region, flagged as one allocation
// (PrestagedOperands::one_allocation): back to back they go up in one copy
// (A's 256 KiB fill its aligned block on the device, so B follows it there
// too); apart in the region they go up in two. Either way C is exact.
TEST(CudaSharedMemoryTest, OperandsInOneRegionGoUpTogetherWhereTheyAdjoin) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  const int64_t m = 256, k = 256, n = 256;
  const int64_t a_bytes = m * k * 4, b_bytes = k * n * 4, c_bytes = m * n * 4;
  const int64_t c_at = 2 << 20, bytes = 4 << 20;
  Mapping region(bytes);
  ASSERT_TRUE(region.ok());
  absl::StatusOr<HostMemoryRegistration> registration =
      engine->RegisterHostMemory(region.data(), bytes);
  ASSERT_TRUE(registration.ok()) << registration.status();

  absl::BitGen gen;
  const std::vector<float> a = SmallIntegers(m * k, gen);
  const std::vector<float> b = SmallIntegers(k * n, gen);
  std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end());
  const MatmulSpec spec =
      testing::MakeSpec(DType::kFloat32, 1, 1, m, n, k, false, false, false);
  const std::vector<double> ref = testing::ReferenceGemm(spec, ad, bd);
  std::memcpy(region.data(), a.data(), a_bytes);
  for (const int64_t b_at : {a_bytes, int64_t{1} << 20}) {
    SCOPED_TRACE(b_at == a_bytes ? "B right after A" : "B apart from A");
    std::memcpy(region.data() + b_at, b.data(), b_bytes);
    std::memset(region.data() + c_at, 0xff, c_bytes);
    JobDescription job;
    job.spec = spec;
    MultiplyOp op;
    op.prestaged = PrestagedOperands{region.data(), region.data() + b_at,
                                     /*one_allocation=*/true};
    op.c_destination = region.data() + c_at;
    job.op = op;
    std::promise<absl::Status> promise;
    std::future<absl::Status> done = promise.get_future();
    engine->Submit(std::make_unique<RegionJob>(job, std::move(promise)));
    ASSERT_TRUE(done.get().ok());
    const float* c = reinterpret_cast<const float*>(region.data() + c_at);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_EQ(static_cast<double>(c[i]), ref[i]) << "at " << i;
    }
  }
  engine->Shutdown();
}

TEST(CudaSharedMemoryTest, RegistrationFailuresAreStatuses) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->RegisterHostMemory(nullptr, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  Mapping region(1 << 20);
  ASSERT_TRUE(region.ok());
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

// The mapping these tests use needs no GPU, and these two run without one.
// A name that exists already (a process that died, pids coming round) is
// skipped and left as it was, and no name remains once the mapping exists.
TEST(CudaSharedMemoryTest, TheTestsMappingSkipsNamesThatExistAlready) {
  testing::StaleNames stale;
  ASSERT_TRUE(testing::LeaveNamesAhead(stale, Mapping::Names(), 3));
  // The first name after those (past any other leftover) is the one made.
  const std::string expected = testing::FirstFreeNameAhead(Mapping::Names(), 3);
  Mapping region(1 << 16);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(region.name(), expected);
  std::memset(region.data(), 0x5a, 1 << 16);
  EXPECT_EQ(region.data()[(1 << 16) - 1], std::byte{0x5a});
  EXPECT_EQ(testing::ShmObjectSize(region.name()), -1)
      << region.name() << " remains";
  testing::ExpectLeftAsTheyWere(stale);
}

TEST(CudaSharedMemoryTest, TheTestsMappingFailsWhenNoNameIsFree) {
  testing::StaleNames stale;
  ASSERT_TRUE(
      testing::LeaveNamesAhead(stale, Mapping::Names(), Mapping::kAttempts));
  static bool made = true;
  EXPECT_NONFATAL_FAILURE(
      {
        Mapping region(4096);
        made = region.ok();
      },
      "File exists");
  EXPECT_FALSE(made);
  testing::ExpectLeftAsTheyWere(stale);
}

}  // namespace
}  // namespace matmul
