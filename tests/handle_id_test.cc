// Handle ids that name their server (common/handle_id.h): composed by the
// server, parsed by the clients.
#include "common/handle_id.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace matmul {
namespace {

const char kHex[] = "0123456789abcdef0123456789abcdef";

TEST(HandleIdTest, ComposeThenParseGivesTheHomeBack) {
  for (const char* address :
       {"127.0.0.1:41234", "10.1.2.3:50051", "[::1]:50051", "[fd00:1::7]:443",
        "matmul-0.matmul.ns.svc.cluster.local:50051", "localhost:1"}) {
    for (int device : {-1, 0, 7, 12}) {
      const std::string id = ComposeHandleId(address, device, kHex);
      std::optional<HandleHome> home = HandleHomeOf(id);
      ASSERT_TRUE(home.has_value()) << id;
      EXPECT_EQ(home->address, address) << id;
      EXPECT_EQ(home->device, device) << id;
    }
  }
  EXPECT_EQ(ComposeHandleId("10.0.0.5:50051", 3, kHex),
            std::string("h1.10.0.0.5:50051.3.") + kHex);
}

TEST(HandleIdTest, IdsWithoutAHomeOrMalformedOnesHaveNone) {
  const std::string hex = kHex;
  for (const std::string& id : {
           std::string("h-") + hex,                 // before homes
           std::string(""),                         //
           std::string("h1."),                      //
           "h1.10.0.0.5:50051.0." + hex.substr(1),  // short random
           "h1.10.0.0.5:50051.0." + hex + "0",      // long random
           std::string("h1.10.0.0.5:50051.0.0123456789ABCDEF0123456789abcdef"),
           "h1.10.0.0.5:50051." + hex,      // no device
           "h1.10.0.0.5:50051.x." + hex,    // device not a number
           "h1.10.0.0.5:50051.-2." + hex,   // below -1
           "h1.10.0.0.5:50051.01." + hex,   // not canonical
           "h1.10.0.0.5.0." + hex,          // no port
           "h1.10.0.0.5:0.0." + hex,        // port 0
           "h1.10.0.0.5:65536.0." + hex,    // port too large
           "h1.10.0.0.5/x:50051.0." + hex,  // '/' in the host
           "h1.::1:50051.0." + hex,         // IPv6 unbracketed
           "h1.[zz::1]:50051.0." + hex,     // not IPv6
           "h2.10.0.0.5:50051.0." + hex,    // future version
           "h1.:50051.0." + hex,            // no host
       }) {
    EXPECT_FALSE(HandleHomeOf(id).has_value()) << id;
  }
}

TEST(HandleIdTest, AdvertiseAddressesMustBeHostPort) {
  EXPECT_TRUE(CheckAdvertiseAddress("10.0.0.5:50051").ok());
  EXPECT_TRUE(CheckAdvertiseAddress("[fd00::5]:50051").ok());
  EXPECT_TRUE(CheckAdvertiseAddress("matmul-0.matmul:50051").ok());
  for (const char* bad : {"", "10.0.0.5", "10.0.0.5:", "10.0.0.5:x", ":50051",
                          "a b:1", "dns:///matmul:50051", "10.0.0.5:50051\n",
                          "-x:1", "[::1:50051", "10.0.0.5:123456"}) {
    EXPECT_EQ(CheckAdvertiseAddress(bad).code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_FALSE(CheckAdvertiseAddress(std::string(250, 'a') + ":50051").ok());
}

TEST(HandleIdTest, AHostAloneGetsTheBoundPort) {
  EXPECT_EQ(*ResolveAdvertiseAddress("10.0.0.5:7000", 50051), "10.0.0.5:7000");
  EXPECT_EQ(*ResolveAdvertiseAddress("10.0.0.5", 50051), "10.0.0.5:50051");
  EXPECT_EQ(*ResolveAdvertiseAddress("fd00::5", 50051), "[fd00::5]:50051");
  EXPECT_EQ(*ResolveAdvertiseAddress("[fd00::5]", 50051), "[fd00::5]:50051");
  EXPECT_EQ(*ResolveAdvertiseAddress("[fd00::5]:7000", 50051),
            "[fd00::5]:7000");
  EXPECT_EQ(*ResolveAdvertiseAddress("matmul-0.matmul", 50051),
            "matmul-0.matmul:50051");
  EXPECT_EQ(ResolveAdvertiseAddress("a b", 50051).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveAdvertiseAddress("", 50051).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HandleIdTest, TheDefaultAddressIsAConcreteListeningIp) {
  EXPECT_EQ(DefaultAdvertiseAddress("127.0.0.1:0", 41234), "127.0.0.1:41234");
  EXPECT_EQ(DefaultAdvertiseAddress("10.0.0.5:50051", 50051), "10.0.0.5:50051");
  EXPECT_EQ(DefaultAdvertiseAddress("[::1]:0", 5000), "[::1]:5000");
  EXPECT_EQ(DefaultAdvertiseAddress("0.0.0.0:50051", 50051), std::nullopt);
  EXPECT_EQ(DefaultAdvertiseAddress("[::]:50051", 50051), std::nullopt);
  EXPECT_EQ(DefaultAdvertiseAddress("[0::0]:50051", 50051), std::nullopt);
  EXPECT_EQ(DefaultAdvertiseAddress("localhost:50051", 50051), std::nullopt);
  EXPECT_EQ(DefaultAdvertiseAddress("127.0.0.1:0", 0), std::nullopt);
}

}  // namespace
}  // namespace matmul
