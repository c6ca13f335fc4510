// OperandIntake and FailedRequests (server/stream/) driven directly: chunks
// of a streamed multiply's operands in any order, bad chunks refused with
// what is wrong, failed ids remembered within their bound. No server and
// no gRPC.
#include "server/stream/operand_intake.h"

#include <cstdint>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.pb.h"
#include "server/stream/failed_requests.h"
#include "server/stream/stream_bounds.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

constexpr int kA = v1::OPERAND_A;
constexpr int kB = v1::OPERAND_B;

// A float32 multiply whose A (`a` bytes) and B (`b` bytes; 0: by handle)
// come in chunks, laid out as PlanStreamStart does.
StreamStartPlan Plan(int64_t a, int64_t b) {
  StreamStartPlan plan;
  plan.spec.dtype = DType::kFloat32;
  plan.staged[0] = a > 0;
  plan.staged[1] = b > 0;
  plan.need[0] = a;
  plan.need[1] = b;
  plan.at[1] = b > 0 ? StreamBounds::kOperandAlignment : 0;
  return plan;
}

TEST(OperandIntakeTest, ChunksInAnyOrderArePlacedAndCounted) {
  OperandIntake intake(Plan(24, 48));
  EXPECT_FALSE(intake.complete());
  EXPECT_EQ(intake.missing(), 0);
  // B's last chunk first, then A back to front, then the rest of B.
  absl::StatusOr<int64_t> at = intake.Take(kB, 40, 8);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, StreamBounds::kOperandAlignment + 40);
  at = intake.Take(kA, 12, 12);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 12);
  at = intake.Take(kA, 0, 12);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 0);
  EXPECT_EQ(intake.received(0), 24);
  EXPECT_EQ(intake.missing(), 1);
  EXPECT_FALSE(intake.complete());
  at = intake.Take(kB, 0, 40);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_TRUE(intake.complete());
  EXPECT_EQ(intake.received(1), 48);
  EXPECT_EQ(intake.need_total(), 72);
  EXPECT_EQ(intake.OperandAt(0), 0);
  EXPECT_EQ(intake.OperandAt(StreamBounds::kOperandAlignment + 4), 1);
}

TEST(OperandIntakeTest, OverlapIsRefusedAndNotCounted) {
  OperandIntake intake(Plan(24, 48));
  ASSERT_TRUE(intake.Take(kA, 4, 8).ok());
  absl::StatusOr<int64_t> at = intake.Take(kA, 8, 8);
  EXPECT_EQ(at.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(at.status().message(),
              HasSubstr("the chunk of bytes [8, 16) overlaps bytes [4, 12)"));
  EXPECT_EQ(intake.received(0), 8);
  // The same bytes again.
  EXPECT_EQ(intake.Take(kA, 4, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Beside them is fine.
  EXPECT_TRUE(intake.Take(kA, 12, 12).ok());
  EXPECT_TRUE(intake.Take(kA, 0, 4).ok());
  EXPECT_EQ(intake.received(0), 24);
}

TEST(OperandIntakeTest, BadChunksSayWhatIsWrong) {
  OperandIntake intake(Plan(24, 48));
  struct Case {
    int operand;
    int64_t offset;
    int64_t bytes;
    const char* says;
  } cases[] = {
      {0, 0, 4, "expected OPERAND_A or OPERAND_B, got 0"},
      {7, 0, 4, "expected OPERAND_A or OPERAND_B, got 7"},
      {kA, 0, 0, "positive whole number of 4-byte elements, got 0 bytes"},
      {kA, 0, 6, "positive whole number of 4-byte elements, got 6 bytes"},
      {kA, 2, 4, "chunk.offset: expected a whole number of 4-byte elements"},
      {kA, -4, 4, "chunk.offset"},
      {kA, 20, 8, "the chunk of 8 bytes at offset 20 runs past its end at 24"},
      {kB, 48, 4, "runs past its end at 48 bytes"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<int64_t> at = intake.Take(c.operand, c.offset, c.bytes);
    EXPECT_EQ(at.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_THAT(at.status().message(), HasSubstr(c.says));
  }
  EXPECT_EQ(intake.received(0), 0);
  EXPECT_EQ(intake.received(1), 0);
}

TEST(OperandIntakeTest, OperandByHandleTakesNoChunks) {
  OperandIntake intake(Plan(24, 0));
  absl::StatusOr<int64_t> at = intake.Take(kB, 0, 4);
  EXPECT_EQ(at.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(at.status().message(),
              HasSubstr("operand b, which is given by b_handle"));
  ASSERT_TRUE(intake.Take(kA, 0, 24).ok());
  EXPECT_TRUE(intake.complete());
}

TEST(FailedRequestsTest, RemembersTheMostRecentWithinItsCapacity) {
  FailedRequests failed(3);
  failed.Remember(1);
  failed.Remember(2);
  failed.Remember(3);
  EXPECT_TRUE(failed.Contains(1));
  failed.Remember(4);  // 1 goes
  EXPECT_FALSE(failed.Contains(1));
  EXPECT_TRUE(failed.Contains(2));
  EXPECT_TRUE(failed.Contains(4));
  EXPECT_EQ(failed.size(), 3u);
}

TEST(FailedRequestsTest, AFailureAgainCountsFromItsLatest) {
  FailedRequests failed(3);
  failed.Remember(1);
  failed.Remember(2);
  failed.Remember(1);  // again: now the most recent
  failed.Remember(3);
  failed.Remember(4);  // 2 goes, and 1's first entry with it, not 1
  EXPECT_TRUE(failed.Contains(1));
  EXPECT_FALSE(failed.Contains(2));
  EXPECT_TRUE(failed.Contains(3));
  EXPECT_TRUE(failed.Contains(4));
}

TEST(FailedRequestsTest, StartedAgainIsForgotten) {
  FailedRequests failed(StreamBounds::kMaxRememberedFailures);
  failed.Remember(9);
  failed.Forget(9);
  EXPECT_FALSE(failed.Contains(9));
  failed.Forget(10);  // never failed: nothing happens
  EXPECT_EQ(failed.size(), 0u);
}

}  // namespace
}  // namespace matmul
