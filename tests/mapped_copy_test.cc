// CopyMappedMemory (common/mapped_copy.h) and the host engine over memory a
// client truncates under it: a shared-memory object mapped MAP_SHARED whose
// object shrinks to one page while the mapping still covers four. Reading
// or writing past the new end raises SIGBUS; these copies turn it into
// FAILED_PRECONDITION for the one copy (or job), and the process goes on.
#include "common/mapped_copy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/host/host_engine.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/shm_names.h"

namespace matmul {
namespace {

// The sanitizers take SIGBUS themselves; the fault tests run in the plain
// build.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_SANITIZERS() \
  GTEST_SKIP() << "a sanitizer handles SIGBUS in this build"
#else
#define SKIP_UNDER_SANITIZERS() (void)0
#endif

// A POSIX shared-memory object of `pages` pages, mapped read-write; Shrink
// truncates the object to one page, leaving the mapping as it was. A test
// asserts ok() before it uses one.
//
// The name is unlinked as soon as the object is open (the fd and the mapping
// keep the object): a process that dies inside a test, as the death test's
// child does by SIGBUS, runs no destructor and would otherwise leave the
// name in /dev/shm. Such a leftover named "-<pid>-0" made the first mapping
// of a later process that got the same pid (pids wrap at pid_max, 32768
// here) fail its O_EXCL shm_open, and the memset on MAP_FAILED then ended
// that test with SIGSEGV. A name that exists all the same (left by an older
// build, or held by another process) is skipped, never reused.
class TruncatedMapping {
 public:
  explicit TruncatedMapping(size_t pages)
      : bytes_(pages * static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    fd_ = testing::CreateUnderFreshName([] { return Names().Next(); }, &name_);
    if (fd_ < 0) return;
    EXPECT_EQ(shm_unlink(name_.c_str()), 0) << std::strerror(errno);
    if (ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      ADD_FAILURE() << "ftruncate: " << std::strerror(errno);
      return;
    }
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) {
      ADD_FAILURE() << "mmap: " << std::strerror(errno);
      return;
    }
    data_ = static_cast<std::byte*>(p);
    std::memset(data_, 0x3c, bytes_);
  }
  ~TruncatedMapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
    if (fd_ >= 0) close(fd_);
  }
  TruncatedMapping(const TruncatedMapping&) = delete;
  TruncatedMapping& operator=(const TruncatedMapping&) = delete;

  // The names its constructions try, in order.
  static testing::NameSequence& Names() {
    static testing::NameSequence names(
        absl::StrCat("/matmul-mapped-copy-test-", getpid(), "-"));
    return names;
  }

  bool ok() const { return data_ != nullptr; }
  // The name the object had while it was being created.
  const std::string& name() const { return name_; }
  void Shrink() { ASSERT_EQ(ftruncate(fd_, sysconf(_SC_PAGESIZE)), 0); }
  std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  const size_t bytes_;
  std::string name_;
  int fd_ = -1;
  std::byte* data_ = nullptr;
};

TEST(MappedCopyTest, CopiesLikeMemcpy) {
  TruncatedMapping m(4);
  ASSERT_TRUE(m.ok());
  std::vector<std::byte> out(m.bytes());
  ASSERT_TRUE(CopyMappedMemory(out.data(), m.data(), m.bytes(), "x").ok());
  EXPECT_EQ(std::memcmp(out.data(), m.data(), m.bytes()), 0);
}

// The flake this file had (a SIGSEGV in CopiesLikeMemcpy under ctest): the
// death test's child left its object's name behind, a later test process
// with the same pid could not create its own, and the test crashed. Names
// that exist already are skipped, and left as they were.
TEST(MappedCopyTest, TheTestsMappingSkipsNamesThatExistAlready) {
  testing::StaleNames stale;
  ASSERT_TRUE(testing::LeaveNamesAhead(stale, TruncatedMapping::Names(), 3));
  TruncatedMapping m(4);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m.name(), TruncatedMapping::Names().Ahead(-1));  // the fourth name
  std::vector<std::byte> out(m.bytes());
  ASSERT_TRUE(CopyMappedMemory(out.data(), m.data(), m.bytes(), "x").ok());
  EXPECT_EQ(std::memcmp(out.data(), m.data(), m.bytes()), 0);
  testing::ExpectLeftAsTheyWere(stale);
}

// A test process that dies (the death test's child, a crash) leaves nothing
// in /dev/shm: the name is gone once the mapping exists.
TEST(MappedCopyTest, TheTestsMappingLeavesNoNameBehind) {
  TruncatedMapping m(4);
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(testing::ShmExists(m.name())) << m.name() << " still exists";
}

TEST(MappedCopyTest, AReadPastATruncatedObjectFailsTheCopyNotTheProcess) {
  SKIP_UNDER_SANITIZERS();
  TruncatedMapping m(4);
  ASSERT_TRUE(m.ok());
  m.Shrink();
  std::vector<std::byte> out(m.bytes());
  for (int i = 0; i < 3; ++i) {  // the handler stays armed for each
    absl::Status s = CopyMappedMemory(out.data(), m.data(), m.bytes(), "a");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("a: the memory faulted"), std::string::npos)
        << s;
  }
  // The page still inside the object copies.
  EXPECT_TRUE(CopyMappedMemory(out.data(), m.data(),
                               static_cast<size_t>(sysconf(_SC_PAGESIZE)), "a")
                  .ok());
}

TEST(MappedCopyTest, AWritePastATruncatedObjectFailsTheCopy) {
  SKIP_UNDER_SANITIZERS();
  TruncatedMapping m(4);
  ASSERT_TRUE(m.ok());
  m.Shrink();
  std::vector<std::byte> in(m.bytes(), std::byte{1});
  absl::Status s = CopyMappedMemory(m.data(), in.data(), m.bytes(), "c");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(MappedCopyTest, ThreadsFaultIndependently) {
  SKIP_UNDER_SANITIZERS();
  TruncatedMapping bad(4);
  ASSERT_TRUE(bad.ok());
  bad.Shrink();
  TruncatedMapping good(4);
  ASSERT_TRUE(good.ok());
  std::vector<std::thread> threads;
  std::vector<absl::StatusCode> codes(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> out(bad.bytes());
      const TruncatedMapping& m = t % 2 == 0 ? bad : good;
      for (int i = 0; i < 50; ++i) {
        codes[t] =
            CopyMappedMemory(out.data(), m.data(), m.bytes(), "x").code();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(codes[t], t % 2 == 0 ? absl::StatusCode::kFailedPrecondition
                                   : absl::StatusCode::kOk)
        << t;
  }
}

TEST(MappedCopyTest, AFaultOutsideAGuardedCopyStillEndsTheProcess) {
  SKIP_UNDER_SANITIZERS();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        TruncatedMapping m(4);
        if (!m.ok()) std::exit(1);
        std::vector<std::byte> out(m.bytes());
        // Installs the handler, then faults outside it.
        (void)CopyMappedMemory(out.data(), m.data(), 16, "x");
        m.Shrink();
        volatile std::byte* p = m.data() + m.bytes() - 1;
        *p = std::byte{7};
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

MatmulSpec Spec64() {
  MatmulSpec spec;
  spec.dtype = DType::kFloat32;
  spec.m = spec.n = spec.k = 64;
  return spec;
}

std::unique_ptr<HostEngine> NewEngine() {
  HostEngineOptions options;
  options.lanes = 2;
  absl::StatusOr<std::unique_ptr<HostEngine>> engine =
      HostEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

// Operands prestaged in a mapping whose object shrank (the server's path
// for A and B both in shared memory): the job fails, the engine goes on.
TEST(MappedCopyTest, HostEngineFailsAJobWhoseOperandsWereTruncated) {
  SKIP_UNDER_SANITIZERS();
  const MatmulSpec spec = Spec64();
  TruncatedMapping m(16);  // 64 KiB: A and B, 16 KiB each, then C
  ASSERT_TRUE(m.ok());
  std::unique_ptr<HostEngine> engine = NewEngine();
  auto run = [&](bool into_region) {
    MultiplyOp op;
    op.prestaged = PrestagedOperands{m.data(), m.data() + spec.a_bytes()};
    if (into_region) {
      op.c_destination = m.data() + spec.a_bytes() + spec.b_bytes();
    }
    testing::EngineJob::Options options;
    options.op = op;
    return testing::Run(*engine, spec, options);
  };
  testing::JobOutcome ok = run(true);
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  // Every entry is 0x3c3c3c3c as a float (about 0.0115): C = 64 * that^2.
  float a0, c0;
  std::memcpy(&a0, m.data(), sizeof a0);
  std::memcpy(&c0, m.data() + spec.a_bytes() + spec.b_bytes(), sizeof c0);
  EXPECT_FLOAT_EQ(c0, 64 * a0 * a0);

  m.Shrink();  // A's first page stays; the rest of A, B and C are gone
  testing::JobOutcome faulted = run(false);
  EXPECT_EQ(faulted.status.code(), absl::StatusCode::kFailedPrecondition)
      << faulted.status;
  faulted = run(true);
  EXPECT_EQ(faulted.status.code(), absl::StatusCode::kFailedPrecondition)
      << faulted.status;

  // The engine still works.
  TruncatedMapping fresh(16);
  ASSERT_TRUE(fresh.ok());
  MultiplyOp op;
  op.prestaged = PrestagedOperands{fresh.data(), fresh.data() + spec.a_bytes()};
  testing::EngineJob::Options options;
  options.op = op;
  testing::JobOutcome after = testing::Run(*engine, spec, options);
  EXPECT_TRUE(after.status.ok()) << after.status;
  EXPECT_EQ(after.c.size(), static_cast<size_t>(spec.c_bytes()));
  engine->Shutdown();
}

}  // namespace
}  // namespace matmul
