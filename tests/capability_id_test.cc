// Capability ids (stored-tensor handles, shared-memory region ids) come from
// getrandom(2). This binary defines getrandom itself: the definition in the
// executable takes the place of libc's for every call linked into it, so a
// test can see, and choose, the bits the kernel would have given. While no
// test has chosen them it asks the kernel.
#include "common/capability_id.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/handle_registry.h"
#include "server/server_metrics.h"
#include "server/shared_memory/region_registry.h"
#include "tests/fake_engine.h"

namespace {

// Set by a test: every getrandom call fills its buffer with this byte, or
// fails with this errno.
std::atomic<int> g_fill{-1};
std::atomic<int> g_fail_errno{0};
std::atomic<int> g_calls{0};

}  // namespace

extern "C" ssize_t getrandom(void* buffer, size_t length, unsigned int flags) {
  g_calls.fetch_add(1);
  if (const int error = g_fail_errno.load(); error != 0) {
    errno = error;
    return -1;
  }
  if (const int fill = g_fill.load(); fill >= 0) {
    std::memset(buffer, fill, length);
    return static_cast<ssize_t>(length);
  }
  return syscall(SYS_getrandom, buffer, length, flags);
}

namespace matmul {
namespace {

// Every getrandom call in the scope fills with `fill` (or fails with
// `error`, when not 0).
class ChosenRandom {
 public:
  explicit ChosenRandom(int fill, int error = 0) {
    g_fill = fill;
    g_fail_errno = error;
  }
  ~ChosenRandom() {
    g_fill = -1;
    g_fail_errno = 0;
  }
};

TEST(CapabilityIdTest, PrefixAnd128BitsOfHex) {
  const int calls = g_calls.load();
  absl::StatusOr<std::string> id = NewCapabilityId("x-");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 2u + kCapabilityIdBits / 4);
  EXPECT_EQ(id->substr(0, 2), "x-");
  EXPECT_EQ(id->find_first_not_of("0123456789abcdef", 2), std::string::npos);
  EXPECT_GT(g_calls.load(), calls);
  EXPECT_NE(*NewCapabilityId("x-"), *id);
}

TEST(CapabilityIdTest, TheBitsAreGetrandoms) {
  ChosenRandom chosen(0xa5);
  std::string hex;
  for (int i = 0; i < 16; ++i) hex += "a5";
  EXPECT_EQ(*NewCapabilityId("x-"), "x-" + hex);
}

TEST(CapabilityIdTest, AKernelRefusalIsUnavailableNeverAWeakerId) {
  ChosenRandom chosen(-1, ENOSYS);
  EXPECT_EQ(NewCapabilityId("x-").status().code(),
            absl::StatusCode::kUnavailable);
}

class FakeTensor final : public ResidentTensor {
 public:
  FakeTensor() : ResidentTensor(0, DType::kFloat32, 1, 1, 1, nullptr) {}
};

TEST(CapabilityIdTest, StoredTensorHandlesComeFromGetrandom) {
  HandleRegistry registry{HandleLimits{}};
  std::string id;
  {
    ChosenRandom chosen(0x3c);
    absl::StatusOr<HandleRegistry::Reservation> r =
        registry.Reserve("alice", 4);
    ASSERT_TRUE(r.ok()) << r.status();
    id = registry
             .Add(std::move(*r), std::make_shared<FakeTensor>(), {1, 1},
                  absl::Seconds(60))
             .id;
  }
  std::string hex;
  for (int i = 0; i < 16; ++i) hex += "3c";
  EXPECT_EQ(id, "h-" + hex);
  EXPECT_TRUE(registry.Get(id).ok());
  {
    ChosenRandom chosen(-1, EIO);
    EXPECT_EQ(registry.Reserve("alice", 4).status().code(),
              absl::StatusCode::kUnavailable);
  }
  EXPECT_TRUE(registry.Reserve("alice", 4).ok());  // nothing left charged
}

TEST(CapabilityIdTest, SharedMemoryRegionIdsComeFromGetrandom) {
  const std::string name = "/matmul-capability-id-" + std::to_string(getpid());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  testing::FakeEngine engine;
  HandleRegistry handles{HandleLimits{}};
  SharedMemoryRegistry regions(&handles, SharedMemoryLimits{},
                               std::make_shared<SharedMemoryGauges>());
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> region;
  {
    ChosenRandom chosen(0xc3);
    PeerCredentials peer;
    peer.uid = geteuid();
    region = regions.Register("alice", peer, name, 4096, engine, nullptr);
  }
  shm_unlink(name.c_str());
  ASSERT_TRUE(region.ok()) << region.status();
  std::string hex;
  for (int i = 0; i < 16; ++i) hex += "c3";
  EXPECT_EQ((*region)->id(), "shm-" + hex);
  region->reset();
  regions.Clear();
}

}  // namespace
}  // namespace matmul
