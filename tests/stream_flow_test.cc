// StreamFlow (server/stream/stream_flow.h) driven directly: when a
// MultiplyStream call reads, writes and ends, through reads, writes, the
// client closing its side, cancel and the server's drain. No server and no
// gRPC.
#include "server/stream/stream_flow.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/stream/stream_bounds.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;
using Moves = StreamFlow::Moves;

TEST(StreamFlowTest, ReadsOneMessageAtATime) {
  StreamFlow flow;
  Moves moves;
  EXPECT_FALSE(flow.Settle(false, false, moves));
  EXPECT_TRUE(moves.read);
  EXPECT_FALSE(moves.finish);
  Moves again;
  flow.Settle(false, false, again);
  EXPECT_FALSE(again.read);  // one read at a time
  flow.ReadDone(true);
  Moves next;
  flow.Settle(true, false, next);
  EXPECT_TRUE(next.read);
}

TEST(StreamFlowTest, HeldChunkBytesStopReadingUntilLetGo) {
  StreamFlow flow;
  Moves first;
  flow.Settle(false, false, first);
  flow.Hold(StreamBounds::kMaxHeldChunkBytes);
  flow.ReadDone(true);
  Moves held;
  flow.Settle(true, false, held);
  EXPECT_FALSE(held.read);
  flow.Release(1);
  Moves freed;
  flow.Settle(true, false, freed);
  EXPECT_TRUE(freed.read);
  EXPECT_EQ(flow.held_chunk_bytes(), StreamBounds::kMaxHeldChunkBytes - 1);
}

TEST(StreamFlowTest, UnsentRepliesStopReadingUntilSent) {
  StreamFlow flow;
  Moves first;
  flow.Settle(false, false, first);
  flow.ReadDone(true);
  for (int i = 0; i < StreamBounds::kMaxUnsentReplies; ++i) flow.ReplyQueued();
  Moves full;
  EXPECT_TRUE(flow.Settle(false, true, full));
  EXPECT_FALSE(full.read);
  EXPECT_TRUE(full.write);
  flow.ReplySent();
  flow.WriteDone(full);
  Moves sent;
  flow.Settle(false, true, sent);
  EXPECT_TRUE(sent.read);
  EXPECT_TRUE(sent.write);
}

TEST(StreamFlowTest, OneWriteAtATime) {
  StreamFlow flow;
  Moves moves;
  EXPECT_TRUE(flow.Settle(false, true, moves));
  EXPECT_TRUE(moves.write);
  EXPECT_TRUE(flow.writing());
  Moves busy;
  EXPECT_FALSE(flow.Settle(false, true, busy));
  EXPECT_FALSE(busy.write);
  Moves done;
  flow.WriteDone(done);
  EXPECT_FALSE(done.finish);
  EXPECT_TRUE(flow.Settle(false, true, done));
}

TEST(StreamFlowTest, EndsOkOnceClosedNothingOpenAndEverythingWritten) {
  StreamFlow flow;
  Moves moves;
  flow.Settle(true, false, moves);
  flow.ReadDone(false);  // the client closed its side
  Moves open;
  flow.Settle(true, false, open);
  EXPECT_FALSE(open.finish);  // a multiply is still open
  EXPECT_FALSE(open.read);
  Moves answer;
  EXPECT_TRUE(flow.Settle(false, true, answer));  // its last answer
  EXPECT_FALSE(answer.finish);
  Moves written;
  flow.WriteDone(written);
  flow.Settle(false, false, written);
  EXPECT_TRUE(written.finish);
  EXPECT_TRUE(written.finish_status.ok());
  EXPECT_TRUE(flow.finished());
  Moves after;
  flow.Settle(false, true, after);
  EXPECT_FALSE(after.read || after.write || after.finish);
}

TEST(StreamFlowTest, DrainEndsUnavailableOnceNothingIsOpen) {
  StreamFlow flow;
  Moves moves;
  flow.Settle(true, false, moves);
  flow.Draining();
  Moves open;
  flow.Settle(true, false, open);
  EXPECT_FALSE(open.finish);  // its multiplies finish first
  Moves done;
  flow.Settle(false, false, done);
  EXPECT_TRUE(done.finish);
  EXPECT_EQ(done.finish_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(done.finish_status.message(), HasSubstr("open a new stream"));
}

TEST(StreamFlowTest, AnEndDecidedDuringAWriteWaitsForIt) {
  StreamFlow flow;
  Moves moves;
  ASSERT_TRUE(flow.Settle(true, true, moves));
  Moves cut;
  flow.Cancelled();
  flow.End(absl::CancelledError("the stream was cancelled"), cut);
  EXPECT_FALSE(cut.finish);  // a write is in progress
  EXPECT_TRUE(flow.finished());
  Moves done;
  flow.WriteDone(done);
  EXPECT_TRUE(done.finish);
  EXPECT_EQ(done.finish_status.code(), absl::StatusCode::kCancelled);
  // Only once.
  Moves again;
  flow.WriteDone(again);
  EXPECT_FALSE(again.finish);
}

TEST(StreamFlowTest, CancelStopsReadingAndEndsAtOnceWhenNotWriting) {
  StreamFlow flow;
  Moves moves;
  flow.Settle(true, false, moves);
  flow.ReadDone(true);
  flow.Cancelled();
  Moves cancelled;
  flow.Settle(true, false, cancelled);
  EXPECT_FALSE(cancelled.read);
  flow.End(absl::CancelledError("the stream was cancelled"), cancelled);
  EXPECT_TRUE(cancelled.finish);
  EXPECT_EQ(cancelled.finish_status.code(), absl::StatusCode::kCancelled);
}

TEST(StreamFlowTest, AWaitingJoinHoldsReadingAndTheEnd) {
  StreamFlow flow;
  Moves moves;
  flow.Settle(false, false, moves);
  flow.ReadDone(true);
  flow.JoinWaiting(true);
  Moves waiting;
  flow.Settle(false, false, waiting);
  EXPECT_FALSE(waiting.read);
  flow.Draining();
  flow.Settle(false, false, waiting);
  EXPECT_FALSE(waiting.finish);  // the join may still match
  flow.JoinWaiting(false);
  Moves decided;
  flow.Settle(false, false, decided);
  EXPECT_TRUE(decided.read);
  EXPECT_TRUE(decided.finish);
  EXPECT_EQ(decided.finish_status.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace matmul
