#include "common/command_line.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace matmul {
namespace {

constexpr size_t kHelpColumn = 32;
constexpr size_t kWidth = 80;

std::string Underscored(absl::string_view name) {
  std::string out(name);
  for (char& c : out) {
    if (c == '-') c = '_';
  }
  return out;
}

// What a flag's value is, for --help and for parse errors; "" for a bool.
std::string ValueKind(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "";
  if (flag.IsOfType<int32_t>() || flag.IsOfType<int64_t>() ||
      flag.IsOfType<uint64_t>()) {
    return "INT";
  }
  if (flag.IsOfType<double>()) return "NUMBER";
  if (flag.IsOfType<absl::Duration>()) return "DURATION";
  return "TEXT";
}

std::string KindDescription(const std::string& kind) {
  if (kind == "INT") return "an integer";
  if (kind == "NUMBER") return "a number";
  if (kind == "DURATION") return "a duration (30s, 5m, 1h30m)";
  return "a value";
}

// `text` wrapped to kWidth, every line indented by `indent`, the first line
// going on from column `column`.
std::string Wrap(absl::string_view text, size_t indent, size_t column) {
  std::string out;
  size_t at = column;
  bool line_empty = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line_empty && at + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      at = indent;
      line_empty = true;
    }
    if (!line_empty) {
      out.push_back(' ');
      ++at;
    }
    absl::StrAppend(&out, word);
    at += word.size();
    line_empty = false;
  }
  return out;
}

}  // namespace

std::string DashedFlag(absl::string_view name) {
  std::string out = absl::StrCat("--", name);
  for (char& c : out) {
    if (c == '_') c = '-';
  }
  return out;
}

std::set<std::string> FlagsOf(const std::vector<FlagGroup>& groups) {
  std::set<std::string> out;
  for (const FlagGroup& group : groups) {
    for (const std::string& entry : group.flags) {
      out.insert(entry.substr(0, entry.find('=')));
    }
  }
  return out;
}

InfoRequest FindInfoRequest(const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      return InfoRequest::kHelp;
    }
    if (arg == "--version" || arg == "-version") return InfoRequest::kVersion;
  }
  return InfoRequest::kNone;
}

absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const FlagParseOptions& options) {
  ParsedFlags parsed;
  bool flags_ended = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (flags_ended || arg.size() < 2 || arg[0] != '-') {
      if (!options.allow_positional) {
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected argument \"", arg, "\""));
      }
      parsed.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    // --name, -name, --name=value.
    absl::string_view written = arg;
    written.remove_prefix(written[1] == '-' ? 2 : 1);
    absl::string_view value_text;
    bool has_value = false;
    if (const size_t eq = written.find('='); eq != absl::string_view::npos) {
      value_text = written.substr(eq + 1);
      written = written.substr(0, eq);
      has_value = true;
    }
    std::string name = Underscored(written);
    absl::CommandLineFlag* flag = nullptr;
    if (options.allowed.count(name) > 0) flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && name.rfind("no", 0) == 0 && !has_value &&
        options.allowed.count(name.substr(2)) > 0) {
      absl::CommandLineFlag* positive =
          absl::FindCommandLineFlag(name.substr(2));
      if (positive != nullptr && positive->IsOfType<bool>()) {
        flag = positive;
        name = name.substr(2);
        negated = true;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", written));
    }
    const std::string dashed = DashedFlag(name);
    if (!parsed.given.insert(name).second && !options.allow_repeats) {
      return absl::InvalidArgumentError(
          absl::StrCat(dashed, " is given more than once"));
    }
    std::string value;
    if (flag->IsOfType<bool>()) {
      value = negated ? "false" : has_value ? std::string(value_text) : "true";
    } else if (has_value) {
      value = std::string(value_text);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(dashed, " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      if (flag->IsOfType<bool>()) {
        return absl::InvalidArgumentError(absl::StrCat(
            dashed, " takes no value, or true/false; got \"", value, "\""));
      }
      // Abseil's message names the flag with underscores; keep its reason.
      const size_t reason = error.find("; ");
      return absl::InvalidArgumentError(absl::StrCat(
          dashed, ": \"", value, "\" is not ",
          KindDescription(ValueKind(*flag)),
          reason == std::string::npos ? "" : error.substr(reason)));
    }
  }
  return parsed;
}

std::string FlagsHelp(const std::vector<FlagGroup>& groups) {
  std::string out;
  for (const FlagGroup& group : groups) {
    absl::StrAppend(&out, out.empty() ? "" : "\n", group.title, ":\n");
    for (const std::string& entry : group.flags) {
      const size_t eq = entry.find('=');
      const std::string name = entry.substr(0, eq);
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      std::string left = absl::StrCat("  ", DashedFlag(name));
      if (flag == nullptr) {
        absl::StrAppend(&out, left, "  (not a defined flag)\n");
        continue;
      }
      const std::string kind =
          eq == std::string::npos ? ValueKind(*flag) : entry.substr(eq + 1);
      if (!kind.empty()) absl::StrAppend(&left, "=", kind);
      std::string help = flag->Help();
      const std::string fallback = flag->DefaultValue();
      if (!fallback.empty() && fallback != "false") {
        absl::StrAppend(&help, " (default: ", fallback, ")");
      }
      if (left.size() + 2 > kHelpColumn) {
        absl::StrAppend(&out, left, "\n", std::string(kHelpColumn, ' '));
      } else {
        absl::StrAppend(&out, left,
                        std::string(kHelpColumn - left.size(), ' '));
      }
      absl::StrAppend(&out, Wrap(help, kHelpColumn, kHelpColumn), "\n");
    }
  }
  return out;
}

int UsageError(absl::string_view program, absl::string_view problem) {
  std::string line = absl::StrCat(program, ": ", problem, "; see --help\n");
  std::fputs(line.c_str(), stderr);
  return 2;
}

}  // namespace matmul
