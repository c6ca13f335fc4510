// Extra gRPC channel arguments given on a command line, for transport
// tuning: "NAME=INTEGER,NAME=INTEGER" (e.g.
// "grpc.http2.lookahead_bytes=67108864"). The server (--grpc-arg) and the
// clients (ClientOptions::channel_args, --grpc-arg) set them on every
// channel. Pure function; thread-safe.
#ifndef MATMUL_COMMON_GRPC_ARGS_H_
#define MATMUL_COMMON_GRPC_ARGS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace matmul {

using GrpcArgs = std::vector<std::pair<std::string, int>>;

// INVALID_ARGUMENT, naming the bad item, for anything but NAME=INTEGER
// items (NAME non-empty, INTEGER within int).
inline absl::StatusOr<GrpcArgs> ParseGrpcArgs(absl::string_view text) {
  GrpcArgs args;
  if (text.empty()) return args;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    int value = 0;
    if (kv.first.empty() || item.find('=') == absl::string_view::npos ||
        !absl::SimpleAtoi(kv.second, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("gRPC argument \"", item, "\": expected NAME=INTEGER"));
    }
    args.emplace_back(std::string(kv.first), value);
  }
  return args;
}

}  // namespace matmul

#endif  // MATMUL_COMMON_GRPC_ARGS_H_
