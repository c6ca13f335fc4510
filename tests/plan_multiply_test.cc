// PlanMultiply (server/rpc/plan_multiply.h) driven directly: decoded
// requests in, a plan or a refusal out, against a real HandleRegistry and
// SharedMemoryRegistry (regions over shared-memory objects the test makes).
// No server.
#include "server/rpc/plan_multiply.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/dtype_mapping.h"
#include "tests/fake_engine.h"
#include "tests/shm_names.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kRegionBytes = 4096;

class FakeTensor final : public ResidentTensor {
 public:
  FakeTensor(int64_t rows, int64_t cols)
      : ResidentTensor(0, DType::kFloat32, 1, rows, cols, nullptr) {}
};

HandleLimits TestHandleLimits() {
  HandleLimits limits;
  limits.default_ttl = absl::Seconds(60);
  limits.max_ttl = absl::Seconds(600);
  return limits;
}

// A float32 operand of `shape` whose data is the first `data_bytes` of
// `bytes` (none when 0).
WireTensor Inline(std::vector<int64_t> shape, const std::vector<uint8_t>& bytes,
                  int64_t data_bytes) {
  WireTensor t;
  t.present = true;
  t.shape = std::move(shape);
  t.dtype = DTypeToProto(DType::kFloat32);
  if (data_bytes > 0) {
    t.data = {ByteChunk(bytes.data(), static_cast<size_t>(data_bytes))};
  }
  t.data_bytes = data_bytes;
  return t;
}

// A float32 operand of `shape` whose bytes are at `offset` in `region`.
WireTensor InRegion(std::vector<int64_t> shape, const std::string& region,
                    int64_t offset) {
  WireTensor t;
  t.present = true;
  t.shape = std::move(shape);
  t.dtype = DTypeToProto(DType::kFloat32);
  t.shared = WireSharedRef{true, region, offset};
  return t;
}

const MultiplyOp& OpOf(const MultiplyPlan& plan) {
  return std::get<MultiplyOp>(plan.job.op);
}

class PlanMultiplyTest : public ::testing::Test {
 protected:
  ~PlanMultiplyTest() override {
    regions_.Clear();
    for (int fd : fds_) close(fd);
  }

  PlanContext Context(const std::string& client = "alice") const {
    return PlanContext{limits_, handles_, regions_, client};
  }

  // [2, 3] x [3, 4], both inline: A 24 bytes, B 48, C 32.
  WireMultiplyRequest InlineRequest() const {
    WireMultiplyRequest wire;
    wire.a = Inline({2, 3}, bytes_, 24);
    wire.b = Inline({3, 4}, bytes_, 48);
    return wire;
  }

  // Stores a [rows, cols] float32 tensor charged to `owner`; its handle.
  std::string Store(int64_t rows, int64_t cols, const std::string& owner,
                    std::shared_ptr<ResidentTensor>* tensor) {
    absl::StatusOr<HandleRegistry::Reservation> reservation =
        handles_.Reserve(owner, rows * cols * 4);
    EXPECT_TRUE(reservation.ok()) << reservation.status();
    *tensor = std::make_shared<FakeTensor>(rows, cols);
    return handles_
        .Add(std::move(*reservation), *tensor, {rows, cols}, absl::Seconds(60))
        .id;
  }

  // Registers a kRegionBytes region for `owner`; the region (its object's
  // name is unlinked at once; the descriptor stays open, in fds_).
  std::shared_ptr<SharedMemoryRegion> Region(const std::string& owner,
                                             int* fd_out = nullptr) {
    std::string name;
    const int fd =
        testing::CreateUnderFreshName([this] { return names_.Next(); }, &name);
    if (fd < 0) return nullptr;
    fds_.push_back(fd);
    EXPECT_EQ(ftruncate(fd, kRegionBytes), 0);
    PeerCredentials peer;
    peer.uid = geteuid();
    absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> region =
        regions_.Register(owner, peer, name, kRegionBytes, engine_, nullptr);
    shm_unlink(name.c_str());
    EXPECT_TRUE(region.ok()) << region.status();
    if (fd_out != nullptr) *fd_out = fd;
    return region.ok() ? *region : nullptr;
  }

  RequestLimits limits_;
  const std::vector<uint8_t> bytes_ = std::vector<uint8_t>(1 << 16);
  testing::FakeEngine engine_;  // outlives the regions registered with it
  HandleRegistry handles_{TestHandleLimits()};
  SharedMemoryRegistry regions_{&handles_, SharedMemoryLimits{},
                                std::make_shared<SharedMemoryGauges>()};
  testing::NameSequence names_{"/matmul-plan-multiply-test-" +
                               std::to_string(getpid()) + "-"};
  std::vector<int> fds_;
};

TEST_F(PlanMultiplyTest, InlineOperands) {
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(InlineRequest(), Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->job.spec.m, 2);
  EXPECT_EQ(plan->job.spec.k, 3);
  EXPECT_EQ(plan->job.spec.n, 4);
  EXPECT_EQ(plan->job.spec.dtype, DType::kFloat32);
  EXPECT_EQ(plan->job.device, -1);
  const MultiplyOp& op = OpOf(*plan);
  EXPECT_EQ(op.resident_a, nullptr);
  EXPECT_EQ(op.resident_b, nullptr);
  EXPECT_FALSE(op.prestaged.has_value());
  EXPECT_EQ(op.c_destination, nullptr);
  EXPECT_FALSE(op.keep_result);
  EXPECT_EQ(plan->held_bytes, 24 + 48 + 32);
  EXPECT_FALSE(plan->stored_bytes.has_value());
  EXPECT_EQ(plan->client, "");
  EXPECT_FALSE(plan->keep_ttl.has_value());
  EXPECT_EQ(plan->in_region[0], nullptr);
  EXPECT_EQ(plan->in_region[1], nullptr);
  EXPECT_EQ(plan->c_in_region, nullptr);
  EXPECT_EQ(plan->staged_bytes[0], 24);
  EXPECT_EQ(plan->staged_bytes[1], 48);
  for (const SharedMemoryRegion::Use& use : plan->regions) {
    EXPECT_FALSE(use);
  }

  const Operation admission = plan->Admission();
  EXPECT_EQ(admission.kind, OperationKind::kMultiply);
  EXPECT_EQ(admission.spec, &plan->job.spec);
  EXPECT_EQ(admission.held_bytes, 24 + 48 + 32);
  EXPECT_FALSE(admission.stored_bytes.has_value());
  EXPECT_EQ(admission.deadline, absl::InfiniteFuture());
}

TEST_F(PlanMultiplyTest, ByteCountThatDoesNotMatchTheShape) {
  WireMultiplyRequest wire = InlineRequest();
  wire.a = Inline({2, 3}, bytes_, 20);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "a.data: expected 24 bytes (shape [2, 3] of DTYPE_FLOAT32, 4 "
            "bytes each), got 20");
}

TEST_F(PlanMultiplyTest, InnerDimensionsThatDiffer) {
  WireMultiplyRequest wire = InlineRequest();
  wire.b = Inline({4, 4}, bytes_, 64);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              StartsWith("inner dimensions differ: op(a) is [2, 3] and op(b) "
                         "is [4, 4]"));
}

TEST_F(PlanMultiplyTest, MissingOperand) {
  WireMultiplyRequest wire = InlineRequest();
  wire.b = WireTensor{};
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(), "b: required");
}

TEST_F(PlanMultiplyTest, ResultOverTheMessageSizeInline) {
  limits_.max_message_bytes = 1024;
  WireMultiplyRequest wire;
  wire.a = Inline({16, 4}, bytes_, 256);
  wire.b = Inline({4, 16}, bytes_, 256);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("over the server's max message size of 1024 bytes"));
}

TEST_F(PlanMultiplyTest, KeptResultIsNotBoundByTheMessageSize) {
  limits_.max_message_bytes = 1024;
  WireMultiplyRequest wire;
  wire.a = Inline({16, 4}, bytes_, 256);
  wire.b = Inline({4, 16}, bytes_, 256);
  wire.keep_result = true;
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->job.spec.c_bytes(), 1024);
}

TEST_F(PlanMultiplyTest, HandleOperandFound) {
  std::shared_ptr<ResidentTensor> stored;
  WireMultiplyRequest wire = InlineRequest();
  wire.a = WireTensor{};
  wire.a_handle = Store(2, 3, "alice", &stored);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->job.spec.m, 2);
  EXPECT_EQ(plan->job.spec.k, 3);
  EXPECT_EQ(plan->job.spec.n, 4);
  EXPECT_EQ(OpOf(*plan).resident_a, stored);
  EXPECT_EQ(OpOf(*plan).resident_b, nullptr);
  EXPECT_FALSE(OpOf(*plan).prestaged.has_value());
  // A stored operand holds no server memory in flight, and is not staged.
  EXPECT_EQ(plan->held_bytes, 48 + 32);
  EXPECT_EQ(plan->staged_bytes[0], 0);
  EXPECT_EQ(plan->staged_bytes[1], 48);
}

TEST_F(PlanMultiplyTest, HandleNotFound) {
  WireMultiplyRequest wire = InlineRequest();
  wire.b = WireTensor{};
  wire.b_handle = "h-00000000000000000000000000000000";
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(plan.status().message(),
            "b_handle: no stored tensor "
            "\"h-00000000000000000000000000000000\" (never existed, deleted "
            "or expired)");
}

// Handles are capabilities (server/handle_registry.h): whoever holds the id
// may use it, and a product kept from it is charged to the caller.
TEST_F(PlanMultiplyTest, HandleOfAnotherClientIsUsable) {
  std::shared_ptr<ResidentTensor> stored;
  WireMultiplyRequest wire = InlineRequest();
  wire.b = WireTensor{};
  wire.b_handle = Store(3, 4, "alice", &stored);
  wire.keep_result = true;
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context("bob"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(OpOf(*plan).resident_b, stored);
  EXPECT_EQ(plan->client, "bob");
  EXPECT_EQ(plan->Admission().client, "bob");
}

TEST_F(PlanMultiplyTest, HandleAndDataBothSet) {
  std::shared_ptr<ResidentTensor> stored;
  WireMultiplyRequest wire = InlineRequest();
  wire.a_handle = Store(2, 3, "alice", &stored);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "a and a_handle are both set; set exactly one");
}

TEST_F(PlanMultiplyTest, StoredShapeThatDoesNotFit) {
  std::shared_ptr<ResidentTensor> stored;
  WireMultiplyRequest wire = InlineRequest();
  wire.b = WireTensor{};
  wire.b_handle = Store(5, 4, "alice", &stored);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              StartsWith("inner dimensions differ"));
}

TEST_F(PlanMultiplyTest, BothOperandsInOneRegion) {
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire;
  wire.a = InRegion({2, 3}, region->id(), 0);
  wire.b = InRegion({3, 4}, region->id(), 64);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const MultiplyOp& op = OpOf(*plan);
  ASSERT_TRUE(op.prestaged.has_value());
  EXPECT_EQ(op.prestaged->a, region->data());
  EXPECT_EQ(op.prestaged->b, region->data() + 64);
  EXPECT_TRUE(op.prestaged->one_allocation);
  EXPECT_EQ(op.c_destination, nullptr);
  EXPECT_EQ(plan->in_region[0], region->data());
  EXPECT_EQ(plan->in_region[1], region->data() + 64);
  EXPECT_EQ(plan->staged_bytes[0], 24);
  EXPECT_EQ(plan->staged_bytes[1], 48);
  // Only the product is server memory.
  EXPECT_EQ(plan->held_bytes, 32);
  // One hold for the one region.
  EXPECT_EQ(plan->regions[0].get(), region.get());
  EXPECT_FALSE(plan->regions[1]);
  EXPECT_FALSE(plan->regions[2]);
  EXPECT_EQ(region->multiplies_in_flight(), 1);
  plan = absl::CancelledError("dropped");
  EXPECT_EQ(region->multiplies_in_flight(), 0);
}

TEST_F(PlanMultiplyTest, RegionOperandBesideAnInlineOne) {
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire = InlineRequest();
  wire.b = InRegion({3, 4}, region->id(), 100);
  wire.c_shared = WireSharedRef{true, region->id(), 200};
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Staged with the inline one, not prestaged.
  EXPECT_FALSE(OpOf(*plan).prestaged.has_value());
  EXPECT_EQ(plan->in_region[0], nullptr);
  EXPECT_EQ(plan->in_region[1], region->data() + 100);
  EXPECT_EQ(plan->staged_bytes[0], 24);
  EXPECT_EQ(plan->staged_bytes[1], 48);
  EXPECT_EQ(plan->c_in_region, region->data() + 200);
  EXPECT_EQ(OpOf(*plan).c_destination, region->data() + 200);
  EXPECT_EQ(plan->held_bytes, 24);
  EXPECT_EQ(region->multiplies_in_flight(), 1);
}

TEST_F(PlanMultiplyTest, RegionOperandsInTwoRegions) {
  std::shared_ptr<SharedMemoryRegion> one = Region("alice");
  std::shared_ptr<SharedMemoryRegion> two = Region("alice");
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  WireMultiplyRequest wire;
  wire.a = InRegion({2, 3}, one->id(), 0);
  wire.b = InRegion({3, 4}, two->id(), 0);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(OpOf(*plan).prestaged.has_value());
  EXPECT_FALSE(OpOf(*plan).prestaged->one_allocation);
  EXPECT_EQ(plan->regions[0].get(), one.get());
  EXPECT_EQ(plan->regions[1].get(), two.get());
}

TEST_F(PlanMultiplyTest, RegionRangePastItsEnd) {
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire = InlineRequest();
  wire.a = InRegion({2, 3}, region->id(), kRegionBytes - 20);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "a.shared: 24 bytes at offset 4076 run past the end of region " +
                region->id() + " (4096 bytes)");
  EXPECT_EQ(region->multiplies_in_flight(), 0);
}

TEST_F(PlanMultiplyTest, RegionOffsetBelowZero) {
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire = InlineRequest();
  wire.b = InRegion({3, 4}, region->id(), -8);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "b.shared.offset: expected 0 or more, got -8");
}

TEST_F(PlanMultiplyTest, RegionOfAnotherClientIsNotFound) {
  std::shared_ptr<SharedMemoryRegion> mine = Region("alice");
  std::shared_ptr<SharedMemoryRegion> theirs = Region("bob");
  ASSERT_NE(mine, nullptr);
  ASSERT_NE(theirs, nullptr);
  WireMultiplyRequest wire;
  wire.a = InRegion({2, 3}, mine->id(), 0);
  wire.b = InRegion({3, 4}, theirs->id(), 0);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context("alice"));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(plan.status().message(),
            "b.shared.region_id: no shared-memory region \"" + theirs->id() +
                "\" registered by this client (never registered, "
                "unregistered, or its register call ended)");
  // The hold A's region got is given back with the refusal.
  EXPECT_EQ(mine->multiplies_in_flight(), 0);
  EXPECT_EQ(theirs->multiplies_in_flight(), 0);
}

TEST_F(PlanMultiplyTest, RegionTruncatedSinceItWasRegistered) {
  int fd = -1;
  std::shared_ptr<SharedMemoryRegion> region = Region("alice", &fd);
  ASSERT_NE(region, nullptr);
  ASSERT_EQ(ftruncate(fd, 1024), 0);
  WireMultiplyRequest wire = InlineRequest();
  wire.a = InRegion({2, 3}, region->id(), 0);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plan.status().message()),
              StartsWith("a.shared: region "));
}

TEST_F(PlanMultiplyTest, RegionOperandWithDataOrHandleToo) {
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire = InlineRequest();
  wire.a.shared = WireSharedRef{true, region->id(), 0};
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "a: data and shared are both set; set exactly one");

  wire = InlineRequest();
  wire.b = InRegion({3, 4}, region->id(), 0);
  wire.b_handle = "h-00000000000000000000000000000000";
  plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "b.shared and b_handle are both set; set exactly one");
}

TEST_F(PlanMultiplyTest, ProductOverlappingAnOperand) {
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire = InlineRequest();
  wire.a = InRegion({2, 3}, region->id(), 0);
  wire.c_shared = WireSharedRef{true, region->id(), 16};
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "c_shared: the product's 32 bytes at offset 16 overlap "
            "a.shared's 24 bytes at offset 0");
}

TEST_F(PlanMultiplyTest, KeepResultAndProductInARegion) {
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire = InlineRequest();
  wire.keep_result = true;
  wire.c_shared = WireSharedRef{true, region->id(), 0};
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "keep_result and c_shared are both set; set at most one");
}

// With a region named, what travels is checked after the regions are known:
// a product that would come back in the message, and inline bytes.
TEST_F(PlanMultiplyTest, RegionRequestOverTheMessageSize) {
  limits_.max_message_bytes = 1024;
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire;
  wire.a = InRegion({16, 4}, region->id(), 0);
  wire.b = InRegion({4, 16}, region->id(), 256);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(plan.status().message(),
            "the result would be 1024 bytes, over the server's max message "
            "size of 1024 bytes; have it written into a region (c_shared)");

  // Into the region instead: admissible.
  wire.c_shared = WireSharedRef{true, region->id(), 1024};
  plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->held_bytes, 0);
  EXPECT_EQ(plan->c_in_region, region->data() + 1024);
}

TEST_F(PlanMultiplyTest, RegionRequestOverTheInflightLimit) {
  limits_.max_inflight_bytes = 50;
  std::shared_ptr<SharedMemoryRegion> region = Region("alice");
  ASSERT_NE(region, nullptr);
  WireMultiplyRequest wire = InlineRequest();
  wire.b = InRegion({3, 4}, region->id(), 0);
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(plan.status().message(),
            "the request needs 56 bytes in flight (inline operands and "
            "result), over the server's limit of 50 bytes "
            "(--max-inflight-bytes)");
}

TEST_F(PlanMultiplyTest, KeepResultWithTheDefaultTtl) {
  WireMultiplyRequest wire = InlineRequest();
  wire.keep_result = true;
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(OpOf(*plan).keep_result);
  EXPECT_EQ(plan->keep_ttl, absl::Seconds(60));
  EXPECT_EQ(plan->stored_bytes, 32);
  EXPECT_EQ(plan->client, "alice");
  // The product stays on the device: it holds no server memory.
  EXPECT_EQ(plan->held_bytes, 24 + 48);
  const Operation admission = plan->Admission();
  EXPECT_EQ(admission.stored_bytes, 32);
  EXPECT_EQ(admission.client, "alice");
  EXPECT_EQ(admission.held_bytes, 24 + 48);
}

TEST_F(PlanMultiplyTest, KeepResultWithATtl) {
  WireMultiplyRequest wire = InlineRequest();
  wire.keep_result = true;
  wire.result_ttl_seconds = 600;
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->keep_ttl, absl::Seconds(600));
}

TEST_F(PlanMultiplyTest, KeepResultWithATtlOverTheMaximum) {
  WireMultiplyRequest wire = InlineRequest();
  wire.keep_result = true;
  wire.result_ttl_seconds = 601;
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "ttl: 601 s is over the server's maximum of 600 s");
}

TEST_F(PlanMultiplyTest, KeepResultWithANegativeTtl) {
  WireMultiplyRequest wire = InlineRequest();
  wire.keep_result = true;
  wire.result_ttl_seconds = -1;
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "ttl: expected 0 (the default) or a positive number of seconds, "
            "got -1");
}

// A TTL is only read when the product is kept.
TEST_F(PlanMultiplyTest, TtlWithoutKeepResultIsIgnored) {
  WireMultiplyRequest wire = InlineRequest();
  wire.result_ttl_seconds = -1;
  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(wire, Context());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->keep_ttl.has_value());
  EXPECT_FALSE(OpOf(*plan).keep_result);
}

}  // namespace
}  // namespace matmul
