// StreamAnswer (server/stream/stream_answer.h) driven directly: answers a
// MultiplyStream call writes, as bytes that parse as the API's
// MultiplyStreamResponse, a result chunk's data held in its job result's
// staging until the last copy goes. No server and no gRPC.
#include "server/stream/stream_answer.h"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {
namespace {

TEST(StreamAnswerTest, ResultChunkParsesWithItsDataAndHoldsItsStaging) {
  const std::vector<std::byte> staging = {std::byte{1}, std::byte{2},
                                          std::byte{3}, std::byte{4}};
  int released = 0;
  StreamAnswer answer = StreamAnswer::ResultChunk(
      42, 16,
      JobResult(absl::MakeConstSpan(staging), Placement{0, 0}, StageTimings{},
                [&released]() mutable { ++released; }));
  ASSERT_NE(answer.product, nullptr);
  EXPECT_EQ(answer.bytes(), static_cast<int64_t>(answer.head.size()) + 4);
  std::string wire = answer.head;
  wire.append(reinterpret_cast<const char*>(answer.product->c().data()),
              answer.product->c().size());
  v1::MultiplyStreamResponse response;
  ASSERT_TRUE(response.ParseFromString(wire));
  EXPECT_EQ(response.request_id(), 42u);
  ASSERT_TRUE(response.has_chunk());
  EXPECT_EQ(response.chunk().offset(), 16);
  EXPECT_EQ(response.chunk().data(), std::string("\1\2\3\4", 4));
  {
    StreamAnswer copy = answer;  // as when posted to a joining call
    answer = StreamAnswer{};
    EXPECT_EQ(released, 0);
  }
  EXPECT_EQ(released, 1);  // the staging goes back with the last copy
}

TEST(StreamAnswerTest, ErrorAndMessageAreWholeMessages) {
  StreamAnswer error = StreamAnswer::Error(7, 3, "bad chunk");
  EXPECT_EQ(error.product, nullptr);
  v1::MultiplyStreamResponse response;
  ASSERT_TRUE(response.ParseFromString(error.head));
  EXPECT_EQ(response.request_id(), 7u);
  EXPECT_EQ(response.error().code(), 3);
  EXPECT_EQ(response.error().message(), "bad chunk");

  v1::MultiplyStreamResponse header;
  header.set_request_id(9);
  header.mutable_result()->set_bytes(64);
  StreamAnswer message = StreamAnswer::Message(header);
  EXPECT_EQ(message.bytes(), static_cast<int64_t>(header.ByteSizeLong()));
  ASSERT_TRUE(response.ParseFromString(message.head));
  EXPECT_EQ(response.result().bytes(), 64);
}

}  // namespace
}  // namespace matmul
