// staging_copy_bench: how long StagingCopier takes to copy one request's
// operands (gRPC-sized pieces) into a staging buffer, by helper count, at
// a given pace: with --gap-us 400 (about one n=256 request at concurrency
// 1) the helpers are asleep when each copy starts, as in the service.
//
// Each copy takes the next of --buffers messages and staging buffers in
// turn, so that neither is in the cache as a request's would not be.
//
//   staging_copy_bench [--bytes 524288] [--piece-bytes 16384]
//                      [--helpers 0,1,2,3] [--copies 2000] [--gap-us 400]
//                      [--buffers 128] [--streaming]
// With --streaming the copies use streaming stores (StagingCopyOptions::
// streaming_stores).
//
// Prints, per helper count: copy time p50, p90 and mean in µs, GB/s at the
// mean, and the share of bytes the helpers copied.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/staging_copier.h"

namespace {

// "0,1,2,3" as numbers; false if one is not a number.
bool ParseList(const char* s, std::vector<int>& out) {
  out.clear();
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v)) return false;
    out.push_back(v);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t bytes = 524288;
  int64_t piece_bytes = 16384;
  std::vector<int> helper_counts = {0, 1, 2, 3};
  int copies = 2000;
  int gap_us = 400;
  int buffers = 128;
  bool streaming = false;
  // --streaming takes no value; the others come in pairs.
  std::vector<char*> args(argv, argv + argc);
  if (auto it =
          std::find(args.begin() + 1, args.end(), std::string("--streaming"));
      it != args.end()) {
    streaming = true;
    args.erase(it);
  }
  argc = static_cast<int>(args.size());
  argv = args.data();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--bytes") {
      bytes = std::atoll(argv[i + 1]);
    } else if (arg == "--piece-bytes") {
      piece_bytes = std::atoll(argv[i + 1]);
    } else if (arg == "--helpers") {
      if (!ParseList(argv[i + 1], helper_counts)) {
        std::fprintf(stderr, "--helpers takes numbers, e.g. 0,1,2,3\n");
        return 2;
      }
    } else if (arg == "--copies") {
      copies = std::atoi(argv[i + 1]);
    } else if (arg == "--buffers") {
      buffers = std::atoi(argv[i + 1]);
    } else if (arg == "--gap-us") {
      gap_us = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (bytes <= 0 || piece_bytes <= 0 || copies <= 0 || copies > 1000000 ||
      gap_us < 0 || buffers < 1 || buffers > 4096) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  // The received messages: pieces of piece_bytes, apart in memory as
  // gRPC's slices are.
  std::vector<std::vector<uint8_t>> storage;
  std::vector<std::vector<matmul::StagingCopier::Piece>> messages(
      static_cast<size_t>(buffers));
  for (auto& pieces : messages) {
    for (int64_t at = 0; at < bytes; at += piece_bytes) {
      storage.emplace_back(
          static_cast<size_t>(std::min(piece_bytes, bytes - at)),
          static_cast<uint8_t>(at / piece_bytes));
      pieces.emplace_back(storage.back().data(), storage.back().size());
    }
  }
  std::vector<std::vector<std::byte>> staging(
      static_cast<size_t>(buffers),
      std::vector<std::byte>(static_cast<size_t>(bytes), std::byte{1}));
  std::printf(
      "%lld bytes in %zu pieces, %d copies, %d us apart, %d buffers, "
      "%s stores\n",
      static_cast<long long>(bytes), messages[0].size(), copies, gap_us,
      buffers, streaming ? "streaming" : "plain");
  std::printf("%8s %10s %10s %10s %8s %8s\n", "helpers", "p50 us", "p90 us",
              "mean us", "GB/s", "helped");
  for (int helpers : helper_counts) {
    matmul::StagingCopyOptions options{helpers, 1, 65536};
    options.streaming_stores = streaming;
    matmul::StagingCopier copier(options);
    std::vector<double> us;
    us.reserve(static_cast<size_t>(copies));
    for (int i = 0; i < copies; ++i) {
      const size_t b = static_cast<size_t>(i % buffers);
      const auto t0 = std::chrono::steady_clock::now();
      copier.Copy(messages[b], staging[b].data());
      const auto t1 = std::chrono::steady_clock::now();
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      if (gap_us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
      }
    }
    for (size_t b = 0; b < messages.size() && b < static_cast<size_t>(copies);
         ++b) {
      const std::byte* at = staging[b].data();
      for (const auto& piece : messages[b]) {
        if (std::memcmp(at, piece.data(), piece.size()) != 0) {
          std::fprintf(stderr, "copy %zu differs\n", b);
          return 1;
        }
        at += piece.size();
      }
    }
    double sum = 0;
    for (double u : us) sum += u;
    std::sort(us.begin(), us.end());
    const double mean = sum / static_cast<double>(us.size());
    std::printf("%8d %10.1f %10.1f %10.1f %8.2f %7.0f%%\n", helpers,
                us[us.size() / 2], us[us.size() * 9 / 10], mean,
                static_cast<double>(bytes) / (mean * 1e3),
                100.0 * static_cast<double>(copier.helper_bytes()) /
                    (static_cast<double>(bytes) * copies));
  }
  return 0;
}
