// Unit tests of the client's shared-memory pieces that need no server:
// SharedMemoryObject (a real POSIX object: created, mapped, seen in
// /dev/shm with its mode and size, unlinked), ProductShape, the request
// SharedMemorySession::Multiply sends (MakeSharedMultiplyRequest) and the
// reading of its response (SharedProductFromResponse). The session against
// a real server is in shared_memory_client_test.cc.
#include "client/lib/shared_memory_object.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/lib/shared_memory_session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The object's status as another process would find it, by name.
bool Stat(const std::string& name, struct stat* st) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  const bool ok = fstat(fd, st) == 0;
  close(fd);
  return ok;
}

bool Exists(const std::string& name) {
  struct stat st;
  return Stat(name, &st);
}

TEST(SharedMemoryObjectTest, CreatesAZeroFilledObjectOfItsSizeAndMode) {
  absl::StatusOr<SharedMemoryObject> region = SharedMemoryObject::Create(5000);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_THAT(region->name(),
              StartsWith(absl::StrCat("/matmul-", getpid(), "-")));
  EXPECT_EQ(region->name().find('/', 1), std::string::npos);
  EXPECT_EQ(region->size(), 5000);
  EXPECT_TRUE(region->linked());
  struct stat st;
  ASSERT_TRUE(Stat(region->name(), &st));
  EXPECT_EQ(st.st_size, 5000);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, getuid());
  for (char c : region->bytes()) ASSERT_EQ(c, 0);
}

TEST(SharedMemoryObjectTest, AnotherMappingSeesTheWrites) {
  absl::StatusOr<SharedMemoryObject> region = SharedMemoryObject::Create(4096);
  ASSERT_TRUE(region.ok()) << region.status();
  std::memcpy(region->data() + 100, "matmul", 6);
  // What the server does: open by name, map, read and write.
  const int fd = shm_open(region->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  void* other = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(std::string(static_cast<char*>(other) + 100, 6), "matmul");
  std::memcpy(static_cast<char*>(other) + 200, "product", 7);
  EXPECT_EQ(std::string(region->data() + 200, 7), "product");
  munmap(other, 4096);
}

TEST(SharedMemoryObjectTest, ModeAndPrefixAreTheOptions) {
  SharedMemoryObjectOptions options;
  options.mode = 0640;
  options.name_prefix = "/matmul-test-prefix";
  absl::StatusOr<SharedMemoryObject> region =
      SharedMemoryObject::Create(64, options);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_THAT(region->name(), StartsWith("/matmul-test-prefix-"));
  struct stat st;
  ASSERT_TRUE(Stat(region->name(), &st));
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST(SharedMemoryObjectTest, NamesAreUnique) {
  std::vector<SharedMemoryObject> regions;
  std::set<std::string> names;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<SharedMemoryObject> region = SharedMemoryObject::Create(64);
    ASSERT_TRUE(region.ok()) << region.status();
    names.insert(region->name());
    regions.push_back(*std::move(region));
  }
  EXPECT_EQ(names.size(), 8u);
}

TEST(SharedMemoryObjectTest, SkipsANameThatExistsAlready) {
  absl::StatusOr<SharedMemoryObject> first = SharedMemoryObject::Create(64);
  ASSERT_TRUE(first.ok()) << first.status();
  // The next name this process would take, created by "someone else".
  const std::string prefix = absl::StrCat("/matmul-", getpid(), "-");
  const int n = std::stoi(first->name().substr(prefix.size()));
  const std::string taken = absl::StrCat(prefix, n + 1);
  const int fd = shm_open(taken.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  absl::StatusOr<SharedMemoryObject> second = SharedMemoryObject::Create(64);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->name(), taken);
  struct stat st;
  ASSERT_TRUE(Stat(taken, &st));
  EXPECT_EQ(st.st_size, 0);  // untouched
  shm_unlink(taken.c_str());
}

TEST(SharedMemoryObjectTest, DestructorUnlinks) {
  std::string name;
  {
    absl::StatusOr<SharedMemoryObject> region = SharedMemoryObject::Create(64);
    ASSERT_TRUE(region.ok()) << region.status();
    name = region->name();
    ASSERT_TRUE(Exists(name));
  }
  EXPECT_FALSE(Exists(name));
}

TEST(SharedMemoryObjectTest, UnlinkRemovesTheNameButKeepsTheMapping) {
  absl::StatusOr<SharedMemoryObject> region = SharedMemoryObject::Create(64);
  ASSERT_TRUE(region.ok()) << region.status();
  region->data()[3] = 42;
  ASSERT_TRUE(region->Unlink().ok());
  EXPECT_FALSE(region->linked());
  EXPECT_FALSE(Exists(region->name()));
  EXPECT_EQ(region->data()[3], 42);
  EXPECT_TRUE(region->Unlink().ok());  // idempotent
}

TEST(SharedMemoryObjectTest, MovedFromOwnsNothing) {
  absl::StatusOr<SharedMemoryObject> region = SharedMemoryObject::Create(64);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::string name = region->name();
  SharedMemoryObject moved = *std::move(region);
  EXPECT_EQ(moved.name(), name);
  EXPECT_EQ(moved.size(), 64);
  EXPECT_TRUE(Exists(name));
  {
    absl::StatusOr<SharedMemoryObject> other = SharedMemoryObject::Create(32);
    ASSERT_TRUE(other.ok());
    const std::string other_name = other->name();
    *other = std::move(moved);  // frees other's own object
    EXPECT_FALSE(Exists(other_name));
    EXPECT_EQ(other->name(), name);
    EXPECT_TRUE(Exists(name));
  }
  EXPECT_FALSE(Exists(name));
}

TEST(SharedMemoryObjectTest, RejectsBadArguments) {
  EXPECT_EQ(SharedMemoryObject::Create(0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedMemoryObject::Create(-5).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* prefix : {"", "/", "matmul", "/a/b"}) {
    SharedMemoryObjectOptions options;
    options.name_prefix = prefix;
    EXPECT_EQ(SharedMemoryObject::Create(64, options).status().code(),
              absl::StatusCode::kInvalidArgument)
        << prefix;
  }
}

TEST(ProductShapeTest, MatrixBatchesAndTransposes) {
  EXPECT_THAT(*ProductShape({2, 3}, {3, 4}), ElementsAre(2, 4));
  EXPECT_THAT(*ProductShape({3, 2}, {4, 3}, true, true), ElementsAre(2, 4));
  EXPECT_THAT(*ProductShape({5, 2, 3}, {3, 4}), ElementsAre(5, 2, 4));
  EXPECT_THAT(*ProductShape({1, 2, 3}, {5, 3, 4}), ElementsAre(5, 2, 4));
  EXPECT_EQ(ProductShape({2, 3}, {4, 5}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProductShape({2, 2, 3}, {5, 3, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProductShape({3}, {3, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

SharedTensor Placed(std::vector<int64_t> shape, int64_t offset,
                    DType dtype = DType::kFloat32) {
  return SharedTensor{std::move(shape), dtype, offset};
}

TEST(MakeSharedMultiplyRequestTest, SendsOnlyReferences) {
  MultiplyOptions options;
  options.transpose_b = true;
  options.compute = ComputeMode::kTf32;
  absl::StatusOr<v1::MultiplyRequest> request = MakeSharedMultiplyRequest(
      "r1", Placed({2, 3}, 0), Placed({4, 3}, 256), 512, options);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_THAT(request->a().shape(), ElementsAre(2, 3));
  EXPECT_EQ(request->a().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_TRUE(request->a().data().empty());
  EXPECT_EQ(request->a().shared().region_id(), "r1");
  EXPECT_EQ(request->a().shared().offset(), 0);
  EXPECT_THAT(request->b().shape(), ElementsAre(4, 3));
  EXPECT_TRUE(request->b().data().empty());
  EXPECT_EQ(request->b().shared().offset(), 256);
  EXPECT_EQ(request->c_shared().region_id(), "r1");
  EXPECT_EQ(request->c_shared().offset(), 512);
  EXPECT_FALSE(request->transpose_a());
  EXPECT_TRUE(request->transpose_b());
  EXPECT_EQ(request->compute_mode(), v1::COMPUTE_MODE_TF32);
  EXPECT_TRUE(request->a_handle().empty());
  EXPECT_FALSE(request->keep_result());
  // Nothing but references: the whole message is a few dozen bytes.
  EXPECT_LT(request->ByteSizeLong(), 100u);
}

TEST(MakeSharedMultiplyRequestTest, RejectsWhatCouldNeverBeSent) {
  const SharedTensor a = Placed({2, 3}, 0), b = Placed({3, 4}, 64);
  EXPECT_EQ(MakeSharedMultiplyRequest("", a, b, 128).status().code(),
            absl::StatusCode::kInvalidArgument);
  MultiplyOptions keep;
  keep.keep_result = true;
  EXPECT_EQ(MakeSharedMultiplyRequest("r", a, b, 128, keep).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSharedMultiplyRequest("r", a, b, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSharedMultiplyRequest("r", Placed({2, 3}, -8), b, 128)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MakeSharedMultiplyRequest("r", Placed({6}, 0), b, 128).status().code(),
      absl::StatusCode::kInvalidArgument);
  absl::Status mixed = MakeSharedMultiplyRequest(
                           "r", a, Placed({3, 4}, 64, DType::kFloat64), 128)
                           .status();
  EXPECT_EQ(mixed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mixed.message(), HasSubstr("same dtype"));
}

v1::MultiplyResponse Answer(std::vector<int64_t> shape, std::string region,
                            int64_t offset) {
  v1::MultiplyResponse response;
  v1::Tensor* c = response.mutable_c();
  c->mutable_shape()->Assign(shape.begin(), shape.end());
  c->set_dtype(v1::DTYPE_FLOAT32);
  c->mutable_shared()->set_region_id(std::move(region));
  c->mutable_shared()->set_offset(offset);
  return response;
}

TEST(SharedProductFromResponseTest, ReadsCsPlace) {
  absl::StatusOr<SharedTensor> c =
      SharedProductFromResponse(Answer({2, 4}, "r1", 512), "r1", 512, 1024);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->shape, ElementsAre(2, 4));
  EXPECT_EQ(c->dtype, DType::kFloat32);
  EXPECT_EQ(c->offset, 512);
}

TEST(SharedProductFromResponseTest, RejectsAnAnswerThatIsNotWhatWasAsked) {
  auto code = [](const v1::MultiplyResponse& r) {
    return SharedProductFromResponse(r, "r1", 512, 1024).status().code();
  };
  EXPECT_EQ(code(v1::MultiplyResponse()), absl::StatusCode::kInternal);
  EXPECT_EQ(code(Answer({2, 4}, "r2", 512)), absl::StatusCode::kInternal);
  EXPECT_EQ(code(Answer({2, 4}, "r1", 0)), absl::StatusCode::kInternal);
  // 2 x 100 floats are 800 bytes: past the end of 1024 from 512.
  EXPECT_EQ(code(Answer({2, 100}, "r1", 512)), absl::StatusCode::kInternal);
  v1::MultiplyResponse with_data = Answer({2, 4}, "r1", 512);
  with_data.mutable_c()->set_data(std::string(32, '\0'));
  EXPECT_EQ(code(with_data), absl::StatusCode::kInternal);
  v1::MultiplyResponse no_dtype = Answer({2, 4}, "r1", 512);
  no_dtype.mutable_c()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(code(no_dtype), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace matmul
