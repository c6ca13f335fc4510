#include "common/bounded_text.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace matmul {
namespace {

TEST(BoundedTextTest, LongTextIsCutAndSaysHowMuchWasLeftOut) {
  EXPECT_EQ(BoundedForMessage("short"), "short");
  const std::string id(100'000, 'x');
  EXPECT_EQ(BoundedForMessage(id),
            std::string(kMaxEchoedBytes, 'x') + "... (99872 more bytes)");
  EXPECT_EQ(BoundedForMessage(id, 4), "xxxx... (99996 more bytes)");
}

TEST(BoundedTextTest, LongShapesShowTheirFirstDimensions) {
  EXPECT_EQ(BoundedShape({}), "[]");
  EXPECT_EQ(BoundedShape({2, 3, 4}), "[2, 3, 4]");
  const std::vector<int64_t> many(3000, 1);
  EXPECT_EQ(BoundedShape(many), "[1, 1, 1, 1, 1, 1, 1, 1, ... (2992 more)]");
}

}  // namespace
}  // namespace matmul
