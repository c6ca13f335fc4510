// StripeSet (server/stream/stripe_set.h) driven directly: a striped
// multiply's streams as its owner keeps them, joining late or never,
// closing their sides, and sharing out the product chunks. No server and no
// gRPC.
#include "server/stream/stripe_set.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace matmul {
namespace {

struct Peer {
  std::string name;
};

TEST(StripeSetTest, TheOwnersStripeHasJoinedFromTheStart) {
  StripeSet<Peer> set(3, 11);
  EXPECT_EQ(set.size(), 3);
  EXPECT_TRUE(set[0].joined);
  EXPECT_EQ(set[0].request_id, 11u);
  EXPECT_FALSE(set[1].joined);
  EXPECT_EQ(set.joins(), 0);
  EXPECT_FALSE(set.all_joined());
}

TEST(StripeSetTest, JoinsInAnyOrderAndLateOnesAreWaitedFor) {
  StripeSet<Peer> set(3, 11);
  set.Join(2, 40, {"second"});
  EXPECT_FALSE(set.all_joined());  // the result header waits
  EXPECT_EQ(set[2].name, "second");
  EXPECT_EQ(set[2].request_id, 40u);
  set.Join(1, 30, {"first"});
  EXPECT_TRUE(set.all_joined());
  EXPECT_EQ(set.joins(), 2);
}

TEST(StripeSetTest, StarvedOnlyOnceEveryStreamJoinedAndClosedItsSide) {
  StripeSet<Peer> set(3, 11);
  set.SideClosed(0);
  set.Join(1, 30, {"first"});
  set.SideClosed(1);
  // Stripe 2 never joined: it may still bring the missing bytes.
  EXPECT_FALSE(set.Starved(false));
  set.Join(2, 40, {"second"});
  EXPECT_FALSE(set.Starved(false));  // its side is open
  set.SideClosed(2);
  EXPECT_TRUE(set.Starved(false));
  // Nothing missing: not starved, whatever the sides.
  EXPECT_FALSE(set.Starved(true));
}

TEST(StripeSetTest, ChunksGoToTheStreamWithTheFewestUnwritten) {
  StripeSet<Peer> set(3, 11);
  set.Join(1, 30, {"first"});
  set.Join(2, 40, {"second"});
  std::vector<int> to;
  for (int i = 0; i < 6; ++i) to.push_back(set.GiveChunk());
  EXPECT_EQ(to, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(set[1].chunks_out, 2);
  // Stripe 2 writes both of its chunks: the next two go there.
  set.ChunkWritten(2);
  set.ChunkWritten(2);
  EXPECT_EQ(set.GiveChunk(), 2);
  EXPECT_EQ(set.GiveChunk(), 2);
  // All level on unwritten: the fewest given goes first.
  set.ChunkWritten(0);
  set.ChunkWritten(1);
  set.ChunkWritten(2);
  EXPECT_EQ(set[2].chunks_sent, 4);
  EXPECT_EQ(set.GiveChunk(), 0);
  EXPECT_EQ(set.GiveChunk(), 1);
  EXPECT_EQ(set[0].chunks_out, 2);
}

}  // namespace
}  // namespace matmul
