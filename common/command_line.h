// The command lines of matmul-server, matmul-cli and matmul-bench: their
// flags are Abseil flags (ABSL_FLAG, spelled with underscores), parsed here
// so that every tool takes them the way the docs write them:
//
//   --max-message-bytes=N or --max-message-bytes N (dashes or underscores)
//   --stream, --stream=true|false, --nostream for a bool
//
// A usage error is one line, "PROGRAM: PROBLEM; see --help", and exit status
// 2; --help lists the tool's own flags in groups, with dashes; --version
// prints VersionText (common/build_info.h).
//
// Not thread-safe: parse before starting threads.
#ifndef MATMUL_COMMON_COMMAND_LINE_H_
#define MATMUL_COMMON_COMMAND_LINE_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace matmul {

// A heading of --help and the flags under it: names as defined, with
// underscores, each optionally followed by "=PLACEHOLDER" for what its
// value is in --help ("timeout=SECONDS"; by default INT, NUMBER, DURATION or
// TEXT, from the flag's type).
struct FlagGroup {
  std::string title;
  std::vector<std::string> flags;
};

struct FlagParseOptions {
  // The flags this command takes (as defined); any other is unknown.
  std::set<std::string> allowed;
  // A flag given twice: the last wins (true), or a usage error.
  bool allow_repeats = false;
  // Arguments that are not flags (and all after "--"): kept in
  // `positional` (true), or a usage error.
  bool allow_positional = false;
};

struct ParsedFlags {
  std::vector<std::string> positional;
  // The flags the command line set (as defined, with underscores).
  std::set<std::string> given;

  bool Given(absl::string_view name) const {
    return given.count(std::string(name)) > 0;
  }
};

// What the arguments ask for before any flag is parsed: --help (or -h), or
// --version. The first one before a "--" counts.
enum class InfoRequest { kNone, kHelp, kVersion };
InfoRequest FindInfoRequest(const std::vector<std::string>& args);

// Sets the Abseil flags `args` name (argv without the program name).
// INVALID_ARGUMENT with a one-line message ("unknown flag --bogus", "--out
// needs a value", "--port: \"x\" is not a valid integer") on a usage error;
// flags parsed before the error keep their new values.
absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const FlagParseOptions& options);

// The flags of every group (without placeholders).
std::set<std::string> FlagsOf(const std::vector<FlagGroup>& groups);

// "max_message_bytes" -> "--max-message-bytes".
std::string DashedFlag(absl::string_view name);

// --help's list of `groups`: each title, then each flag with dashes, the
// kind of value it takes, its help text and its default, wrapped to 80
// columns. A name that is not a defined flag is listed as such (a bug).
std::string FlagsHelp(const std::vector<FlagGroup>& groups);

// Prints "PROGRAM: PROBLEM; see --help" on stderr; returns 2, the usage
// error's exit status.
int UsageError(absl::string_view program, absl::string_view problem);

}  // namespace matmul

#endif  // MATMUL_COMMON_COMMAND_LINE_H_
