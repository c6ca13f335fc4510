// matmul-bench's command line: its flags (Abseil flags, each `--flag value`
// or `--flag=value`, dashes or underscores; --resident also stands alone,
// parsed by common/command_line.h), their help text, and the BenchConfig
// they make once checked. bench_main.cc runs what the config says.
//
// Not thread-safe: parsing sets the process's Abseil flags.
#ifndef MATMUL_CLIENT_TOOLS_BENCH_OPTIONS_H_
#define MATMUL_CLIENT_TOOLS_BENCH_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/service/bench_workload.h"
#include "bench/service/server_scrape.h"
#include "common/dtype.h"
#include "common/grpc_args.h"

namespace matmul {

// matmul-bench --help.
extern const char kBenchUsage[];

// Everything the command line says, checked.
struct BenchConfig {
  std::string target;
  BenchShape shape;
  std::vector<BenchShape> shape_mix;  // --shape-mix (replaces shape)
  std::optional<ScrapeTarget> server_metrics;
  DType dtype = DType::kFloat32;
  ComputeMode compute = ComputeMode::kStrict;
  std::vector<int> concurrency;
  std::vector<double> rates;  // empty: closed loop
  double duration_s = 5;
  int64_t requests = 0;
  double warmup_s = 1;
  int channels = 0;  // 0: PointChannels's default
  double timeout_s = 60;
  bool verify = false;
  bool protobuf_requests = false;
  // --blocking-calls: LoadPoint::blocking_calls.
  bool blocking_calls = false;
  int verify_every = 64;
  int distinct = 0;  // 0: automatic
  uint64_t seed = 1;
  std::string json_path;
  std::string label;
  bool progress = false;
  // --stable: windows per point at most (0: one window, no judgement).
  int stable_windows = 0;
  Resident resident = Resident::kNone;
  bool shared_memory = false;
  // --cuda-memory (bench_cuda_memory.h).
  bool cuda_memory = false;
  std::string client_id;
  GrpcArgs grpc_args;
  // --lb-policy: ClientOptions::load_balancing_policy.
  std::string lb_policy = "round_robin";
  // --stream: each multiply over MultiplyStream (MatmulClient's
  // MultiplyStreamedView) in chunks of stream_chunk_bytes, striped over
  // `stripes` calls (by default StreamOptionsFor the largest shape).
  bool stream = false;
  int64_t stream_chunk_bytes = int64_t{4} << 20;
  int stripes = 1;
};

// The config of a command line (the arguments after the program's name).
// INVALID_ARGUMENT, with a one-line message naming the flag, for anything
// wrong: an unknown flag, a bad value, flags that exclude each other.
absl::StatusOr<BenchConfig> ParseBenchCommandLine(
    const std::vector<std::string>& args);

// HTTP/2 connections a point of `concurrency` opens: --channels, or
// min(concurrency, 16). With --stream never fewer than the stripes (each
// striped call takes that many connections of its own; MatmulClient opens
// the missing ones), and by default min(concurrency * stripes, 16).
int PointChannels(const BenchConfig& config, int concurrency);

// This machine's host name ("" if unknown).
std::string HostName();

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_BENCH_OPTIONS_H_
