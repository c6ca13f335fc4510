// PlanStreamStart (server/stream/plan_stream_start.h) driven directly: a
// decoded MultiplyStreamStart in, its plan or the refusal out, against a
// real HandleRegistry. No server and no gRPC.
#include "server/stream/plan_stream_start.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/dtype_mapping.h"
#include "server/stream/stream_bounds.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

class FakeTensor final : public ResidentTensor {
 public:
  FakeTensor(int device, int64_t rows, int64_t cols)
      : ResidentTensor(device, DType::kFloat32, 1, rows, cols, nullptr) {}
};

HandleLimits TestHandleLimits() {
  HandleLimits limits;
  limits.default_ttl = absl::Seconds(60);
  limits.max_ttl = absl::Seconds(600);
  return limits;
}

// A float32 operand of `shape` whose data comes in chunks.
WireTensor Declared(std::vector<int64_t> shape) {
  WireTensor t;
  t.present = true;
  t.shape = std::move(shape);
  t.dtype = DTypeToProto(DType::kFloat32);
  return t;
}

// The start of a [m, k] x [k, n] float32 multiply.
WireStreamRequest Start(int64_t m, int64_t k, int64_t n) {
  WireStreamRequest request;
  request.kind = WireStreamRequest::Kind::kStart;
  request.request_id = 7;
  request.start.a = Declared({m, k});
  request.start.b = Declared({k, n});
  return request;
}

class PlanStreamStartTest : public ::testing::Test {
 protected:
  absl::StatusOr<StreamStartPlan> Plan(const WireStreamRequest& request) {
    return PlanStreamStart(request, limits_, handles_);
  }

  // Stores a [rows, cols] float32 tensor on device 3; its handle.
  std::string Store(int64_t rows, int64_t cols) {
    absl::StatusOr<HandleRegistry::Reservation> reservation =
        handles_.Reserve("alice", rows * cols * 4);
    EXPECT_TRUE(reservation.ok()) << reservation.status();
    return handles_
        .Add(std::move(*reservation),
             std::make_shared<FakeTensor>(3, rows, cols), {rows, cols},
             absl::Seconds(60))
        .id;
  }

  RequestLimits limits_;
  HandleRegistry handles_{TestHandleLimits()};
};

TEST_F(PlanStreamStartTest, BothOperandsChunkedShareOneAlignedTensor) {
  absl::StatusOr<StreamStartPlan> plan = Plan(Start(2, 3, 4));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->need[0], 24);
  EXPECT_EQ(plan->need[1], 48);
  EXPECT_TRUE(plan->staged[0]);
  EXPECT_TRUE(plan->staged[1]);
  EXPECT_EQ(plan->at[0], 0);
  EXPECT_EQ(plan->at[1], StreamBounds::kOperandAlignment);
  EXPECT_EQ(plan->buffer_bytes, StreamBounds::kOperandAlignment + 48);
  EXPECT_EQ(plan->c_shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(plan->device, -1);
  EXPECT_FALSE(plan->paneled);  // A is small
  EXPECT_FALSE(plan->keep);
  EXPECT_EQ(plan->stripes, 1);
  EXPECT_EQ(plan->result_chunk_bytes, StreamBounds::kDefaultResultChunkBytes);
  // Operands and the whole (small) product.
  EXPECT_EQ(plan->held_bytes, 24 + 48 + 32);
  EXPECT_FALSE(plan->stored_bytes.has_value());
}

TEST_F(PlanStreamStartTest, ResultChunkIsWholeElementsUnderTheMessageLimit) {
  WireStreamRequest request = Start(2, 3, 4);
  request.result_chunk_bytes = 10;
  absl::StatusOr<StreamStartPlan> plan = Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->result_chunk_bytes, 8);
  request.result_chunk_bytes = 1;
  plan = Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->result_chunk_bytes, 4);  // one element at least
  limits_.max_message_bytes = 1064;
  request.result_chunk_bytes = 1 << 20;
  plan = Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->result_chunk_bytes, 1000);
  request.result_chunk_bytes = -1;
  plan = Plan(request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("result_chunk_bytes"));
}

TEST_F(PlanStreamStartTest, OperandsAreNotBoundedByTheMessageSize) {
  limits_.max_message_bytes = 4096;
  limits_.max_inflight_bytes = 4096;
  absl::StatusOr<StreamStartPlan> plan = Plan(Start(1024, 1024, 4));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->need[0], 4 << 20);
}

TEST_F(PlanStreamStartTest, LargeAIsPaneledUnlessKeptOrTransposed) {
  // A: 1024 x 512 float32 = 2 MiB.
  absl::StatusOr<StreamStartPlan> plan = Plan(Start(1024, 512, 8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->paneled);
  EXPECT_EQ(plan->panel_rows, 1024 / StreamBounds::kPanels);

  WireStreamRequest kept = Start(1024, 512, 8);
  kept.start.keep_result = true;
  plan = Plan(kept);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->paneled);
  EXPECT_TRUE(plan->keep);
  EXPECT_EQ(plan->keep_ttl, absl::Seconds(60));
  ASSERT_TRUE(plan->stored_bytes.has_value());
  EXPECT_EQ(*plan->stored_bytes, 1024 * 8 * 4);
  // A kept product holds no result window.
  EXPECT_EQ(plan->held_bytes, (1024 * 512 + 512 * 8) * 4);

  // A stored [512, 1024], multiplied as its transpose [1024, 512].
  WireStreamRequest transposed = Start(512, 1024, 8);
  transposed.start.b = Declared({512, 8});
  transposed.start.transpose_a = true;
  plan = Plan(transposed);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->paneled);
}

TEST_F(PlanStreamStartTest, StoredOperandTakesNoChunksAndPicksTheDevice) {
  WireStreamRequest request = Start(2, 3, 4);
  request.start.b = WireTensor{};
  request.start.b_handle = Store(3, 4);
  absl::StatusOr<StreamStartPlan> plan = Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->staged[0]);
  EXPECT_FALSE(plan->staged[1]);
  EXPECT_EQ(plan->need[1], 0);
  EXPECT_NE(plan->stored[1], nullptr);
  EXPECT_EQ(plan->handle_shape[1], (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(plan->buffer_bytes, 24);
  EXPECT_EQ(plan->device, 3);
}

TEST_F(PlanStreamStartTest, UnknownHandleIsNotFound) {
  WireStreamRequest request = Start(2, 3, 4);
  request.start.a = WireTensor{};
  request.start.a_handle = "no-such-handle";
  EXPECT_EQ(Plan(request).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PlanStreamStartTest, SharedMemoryIsRefused) {
  WireStreamRequest request = Start(2, 3, 4);
  request.start.c_shared = WireSharedRef{true, "region", 0};
  absl::StatusOr<StreamStartPlan> plan = Plan(request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("use Multiply"));
}

TEST_F(PlanStreamStartTest, BadShapeIsInvalid) {
  WireStreamRequest request = Start(2, 3, 4);
  request.start.b = Declared({5, 4});
  EXPECT_EQ(Plan(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PlanStreamStartTest, Stripes) {
  WireStreamRequest request = Start(2, 3, 4);
  request.stripes = 2;
  absl::StatusOr<StreamStartPlan> plan = Plan(request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("without a stripe_key"));

  request.stripe_key = "short";
  plan = Plan(request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("16 to 64 bytes"));

  request.stripe_key = std::string(16, 'k');
  request.stripes = 17;
  plan = Plan(request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("2 to 16"));

  request.stripes = 4;
  plan = Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stripes, 4);
  EXPECT_EQ(plan->stripe_key, std::string(16, 'k'));
  // Both windows per stream: here the operands and product are smaller.
  EXPECT_EQ(plan->held_bytes, 24 + 48 + 32);
}

TEST_F(PlanStreamStartTest, StripedHeldBytesAreOneWindowPerStream) {
  // A and B: 4096 x 8192 float32 each, 128 MiB; the product 64 MiB.
  WireStreamRequest request = Start(4096, 8192, 4096);
  absl::StatusOr<StreamStartPlan> plan = Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t window = StreamBounds::kMaxHeldChunkBytes;
  const int64_t results = StreamBounds::kMaxResultChunksInFlight *
                          StreamBounds::kDefaultResultChunkBytes;
  EXPECT_EQ(plan->held_bytes, window + results);
  request.stripe_key = std::string(20, 'k');
  request.stripes = 2;
  plan = Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->held_bytes, (int64_t{256} << 20) + 2 * results);
}

}  // namespace
}  // namespace matmul
