// Tests of common/command_line: the tools' flags spelled with dashes or
// underscores, --flag value and --flag=value, bools, one-line usage errors,
// and --help's groups.
#include "common/command_line.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int64_t, test_max_bytes, 100, "Largest thing, bytes");
ABSL_FLAG(std::string, test_name, "", "A name");
ABSL_FLAG(bool, test_switch, false, "A switch");
ABSL_FLAG(absl::Duration, test_wait, absl::Seconds(3), "How long to wait");

namespace matmul {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class CommandLineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_test_max_bytes, 100);
    absl::SetFlag(&FLAGS_test_name, "");
    absl::SetFlag(&FLAGS_test_switch, false);
    absl::SetFlag(&FLAGS_test_wait, absl::Seconds(3));
    options_.allowed = {"test_max_bytes", "test_name", "test_switch",
                        "test_wait"};
  }

  FlagParseOptions options_;
};

TEST_F(CommandLineTest, TakesDashesUnderscoresAndBothValueForms) {
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(
      {"--test-max-bytes", "7", "--test_name=x y", "--test-wait=1m"}, options_);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_max_bytes), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "x y");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_wait), absl::Minutes(1));
  EXPECT_TRUE(parsed->Given("test_max_bytes"));
  EXPECT_TRUE(parsed->Given("test_name"));
  EXPECT_FALSE(parsed->Given("test_switch"));
}

TEST_F(CommandLineTest, ValueMayStartWithADash) {
  ASSERT_TRUE(ParseFlags({"--test-max-bytes", "-1"}, options_).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_max_bytes), -1);
}

TEST_F(CommandLineTest, Bools) {
  ASSERT_TRUE(ParseFlags({"--test-switch"}, options_).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_switch));
  ASSERT_TRUE(ParseFlags({"--test-switch=false"}, options_).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_switch));
  ASSERT_TRUE(ParseFlags({"--test_switch=true"}, options_).ok());
  ASSERT_TRUE(ParseFlags({"--notest-switch"}, options_).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_switch));
  absl::StatusOr<ParsedFlags> bad =
      ParseFlags({"--test-switch=maybe"}, options_);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--test-switch takes no value, or true/false; got \"maybe\"");
}

TEST_F(CommandLineTest, UsageErrorsAreOneLineWithDashedNames) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--bogus"}, "unknown flag --bogus"},
      {{"--bogus-flag=1"}, "unknown flag --bogus-flag"},
      {{"--test-name"}, "--test-name needs a value"},
      {{"--test_max_bytes=lots"},
       "--test-max-bytes: \"lots\" is not an integer"},
      {{"--test-name", "a", "--test-name", "b"},
       "--test-name is given more than once"},
      {{"stray"}, "unexpected argument \"stray\""},
      {{"--", "after"}, "unexpected argument \"after\""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ParsedFlags> parsed = ParseFlags(c.args, options_);
    ASSERT_FALSE(parsed.ok()) << c.message;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(parsed.status().message()), Not(HasSubstr("\n")));
  }
}

TEST_F(CommandLineTest, OnlyAllowedFlagsAreKnown) {
  options_.allowed.erase("test_name");
  absl::StatusOr<ParsedFlags> parsed = ParseFlags({"--test-name=x"}, options_);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), "unknown flag --test-name");
}

TEST_F(CommandLineTest, RepeatsAndPositionalsWhenAllowed) {
  options_.allow_repeats = true;
  options_.allow_positional = true;
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(
      {"--test-name=a", "x", "--test-name=b", "--", "--test-name=c"}, options_);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "b");
  EXPECT_EQ(parsed->positional,
            (std::vector<std::string>{"x", "--test-name=c"}));
}

TEST(FindInfoRequestTest, HelpAndVersion) {
  EXPECT_EQ(FindInfoRequest({"--port", "1", "--help"}), InfoRequest::kHelp);
  EXPECT_EQ(FindInfoRequest({"-h"}), InfoRequest::kHelp);
  EXPECT_EQ(FindInfoRequest({"--version"}), InfoRequest::kVersion);
  EXPECT_EQ(FindInfoRequest({"--", "--help"}), InfoRequest::kNone);
  EXPECT_EQ(FindInfoRequest({"--helpful"}), InfoRequest::kNone);
}

TEST(FlagsHelpTest, GroupsDashedNamesPlaceholdersAndDefaults) {
  const std::string help = FlagsHelp({
      {"Sizes", {"test_max_bytes", "test_wait"}},
      {"Other", {"test_name=NAME", "test_switch"}},
  });
  EXPECT_THAT(help, HasSubstr("Sizes:\n  --test-max-bytes=INT"));
  EXPECT_THAT(help, HasSubstr("Largest thing, bytes (default: 100)"));
  EXPECT_THAT(help, HasSubstr("--test-wait=DURATION"));
  EXPECT_THAT(help, HasSubstr("(default: 3s)"));
  EXPECT_THAT(help, HasSubstr("\nOther:\n  --test-name=NAME"));
  EXPECT_THAT(help, HasSubstr("  --test-switch "));
  EXPECT_THAT(help, Not(HasSubstr("test_")));
  EXPECT_EQ(FlagsOf({{"x", {"test_name=NAME", "test_switch"}}}),
            (std::set<std::string>{"test_name", "test_switch"}));
}

TEST(BuildInfoTest, VersionText) {
  const std::string text = VersionText("matmul-tool");
  EXPECT_THAT(text, HasSubstr(absl::StrCat("matmul-tool ", ProjectVersion(),
                                           "\ncommit ", GitCommit(), "\n")));
  EXPECT_THAT(text, HasSubstr("CUDA "));
  EXPECT_FALSE(ProjectVersion().empty());
  EXPECT_FALSE(GitCommit().empty());
}

}  // namespace
}  // namespace matmul
