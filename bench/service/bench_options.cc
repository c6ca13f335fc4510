#include "bench/service/bench_options.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/service/bench_stability.h"
#include "bench/service/load_generator.h"
#include "client/lib/matmul_client.h"
#include "common/command_line.h"
#include "common/dtype.h"

// The values are checked by MakeConfig; the help texts are kBenchUsage's.
ABSL_FLAG(std::string, target, "", "");
ABSL_FLAG(std::string, shape, "1024", "");
ABSL_FLAG(std::string, dtype, "float32", "");
ABSL_FLAG(std::string, compute, "strict", "");
ABSL_FLAG(std::string, concurrency, "", "");
ABSL_FLAG(std::string, rate, "", "");
ABSL_FLAG(std::string, duration, "", "");
ABSL_FLAG(std::string, requests, "", "");
ABSL_FLAG(std::string, warmup, "", "");
ABSL_FLAG(std::string, channels, "", "");
ABSL_FLAG(std::string, timeout, "", "");
ABSL_FLAG(std::string, distinct, "", "");
ABSL_FLAG(std::string, seed, "", "");
ABSL_FLAG(std::string, verify_every, "", "");
ABSL_FLAG(std::string, json, "", "");
ABSL_FLAG(std::string, label, "", "");
ABSL_FLAG(std::string, client_id, "", "");
ABSL_FLAG(std::string, grpc_arg, "", "");
ABSL_FLAG(std::string, lb_policy, "round_robin", "");
ABSL_FLAG(std::string, resident, "none", "");
ABSL_FLAG(bool, verify, false, "");
ABSL_FLAG(bool, progress, false, "");
ABSL_FLAG(bool, protobuf_requests, false, "");
ABSL_FLAG(bool, blocking_calls, false, "");
ABSL_FLAG(bool, stable, false, "");
ABSL_FLAG(bool, shared_memory, false, "");
ABSL_FLAG(bool, cuda_memory, false, "");
ABSL_FLAG(std::string, stable_windows, "", "");
ABSL_FLAG(std::string, shape_mix, "", "");
ABSL_FLAG(std::string, server_metrics, "", "");
ABSL_FLAG(bool, stream, false, "");
ABSL_FLAG(std::string, stream_chunk_bytes, "", "");
ABSL_FLAG(std::string, stripes, "", "");

namespace matmul {

const char kBenchUsage[] = R"(usage:
  matmul-bench --target HOST:PORT [--shape N|MxKxN|BxMxKxN]
               [--dtype float32|float64|float16|bfloat16]
               [--compute strict|tf32]
               [--concurrency C1,C2,...] [--rate R1,R2,...]
               [--duration SECONDS | --requests N] [--warmup SECONDS]
               [--channels N] [--timeout SECONDS]
               [--verify] [--verify-every N] [--distinct N] [--seed N]
               [--protobuf-requests] [--shared-memory] [--cuda-memory]
               [--blocking-calls]
               [--resident[=operands|all|none]] [--client-id NAME]
               [--grpc-arg NAME=INT,...] [--lb-policy round_robin|pick_first]
               [--json FILE] [--label TEXT] [--progress]
               [--stable] [--stable-windows N]
               [--shape-mix S1,S2,...] [--server-metrics HOST:PORT]
               [--stream [--stream-chunk-bytes N] [--stripes K]]

Drives a running matmul server and reports, for each point, successful
requests/s, payload GB/s on the wire (request = A and B data, response = C
data, 1 GB = 1e9 bytes), TFLOP/s (2*batch*m*k*n per request), latency
p50/p90/p99/p99.9 of the successful requests, and errors by gRPC status code.

  --target        any gRPC target: 127.0.0.1:50051, unix:/run/matmul.sock,
                  dns:///matmul.example:50051 (required)
  --shape         N (N x N x N), MxKxN, or BxMxKxN for batched operands
                  A[B,M,K] . B[B,K,N]; default 1024
  --dtype         default float32; --compute default strict
  --concurrency   comma-separated sweep, one point each; closed loop: the
                  requests kept in flight (default 1,4,16,64); with --rate:
                  the cap on requests in flight (default 64)
  --rate          requests started per second (open loop), comma-separated
                  for several points (each rate x each concurrency); a late
                  request's latency counts from its scheduled start
  --duration      seconds measured per point (default 5); or
  --requests      measure exactly N requests per point
  --warmup        seconds of the same load before each point, not recorded
                  (default 1)
  --channels      HTTP/2 connections per point (default min(concurrency,
                  16)); each point opens its own
  --timeout       per-request deadline, seconds (default 60)
  --verify        check the first response of each point and every 64th
                  (--verify-every N) against a float64 product computed
                  here; a mismatch is an error with code WRONG_ANSWER
  --distinct      distinct prebuilt requests sent in rotation (default 4,
                  fewer when they would pass 1 GiB); --seed for their data
  --resident      keep the operands on the server: before each point the
                  distinct A and B are uploaded once (Upload), every request
                  names them by handle, and their handles are deleted at the
                  end of the point. --resident (or =all) also keeps each
                  product on the server (keep_result) and deletes it with an
                  asynchronous Delete after its reply, outside latency and
                  req/s; --verify then downloads the sampled products to
                  check them. --resident=operands returns products inline.
                  Payload GB/s is then (nearly) 0: TFLOP/s is the figure;
                  the JSON has the actual message sizes (wire_gb_per_s)
  --shared-memory operands and products in shared memory (a unix: target on
                  the server's host): before the first point, one region
                  per slot of the largest --concurrency is registered, with
                  its own A, B and C, and requests name places in them; no
                  payload crosses the socket (payload GB/s is 0; TFLOP/s is
                  the figure; upload_s of the first point is the time the
                  registrations took). Not with --resident
  --cuda-memory   as --shared-memory, but each region is GPU memory the
                  bench allocates (cudaMalloc on its device 0) and
                  registers (RegisterCudaMemory): the server's GPU reads A
                  and B and writes C in place, with no host copy. Needs a
                  bench built with CUDA and a server on the CUDA engine
                  driving that GPU. Not with --resident or --shared-memory
  --client-id     sent as x-matmul-client on every call: the name the
                  server charges stored tensors to (default
                  matmul-bench-HOST-PID)
  --grpc-arg      extra gRPC channel arguments, NAME=INT[,NAME=INT...]
                  (transport tuning; docs/PERFORMANCE.md)
  --lb-policy     round_robin (default: calls spread over every address the
                  target resolves to) or pick_first (all on one)
  --protobuf-requests
                  serialize each request with protobuf on every call (a copy
                  of every operand byte), instead of sending prebuilt
                  encodings whose operands go out from memory as they are
  --blocking-calls
                  a thread per request in flight, each making gRPC's blocking
                  call (MatmulClient::MultiplyEncoded: the thread polls for
                  its own reply) and then the next, as the transport
                  ceiling's rawclient does, instead of callbacks on gRPC's
                  threads. A closed loop only (not with --rate); concurrency
                  at most 256; not with --stream, whose calls block already
  --json          write every point to FILE (schema matmul-bench/1)
  --label         free text stored with every point in the JSON
  --progress      a line on stderr every second: elapsed, req/s, errors
  --stable        measure each point in windows of --duration (the warm-up
                  before the first only) until the last three windows' req/s
                  agree within 10%, at most --stable-windows (default 10);
                  the point's figures are its last window's, and a line
                  says whether and when it settled
  --shape-mix     requests of several shapes, taken in turn: shapes as
                  --shape takes them, comma-separated (e.g. 64,128,256,512);
                  --distinct requests of each; replaces --shape. Payload
                  and TFLOP/s use the mix's mean bytes and flops per request
  --server-metrics
                  the server's Prometheus endpoint (HOST:PORT of its
                  --metrics-port, or http://HOST:PORT/PATH): scraped before
                  and after each point to report the device's GEMM time per
                  request (matmul_device_compute_busy_seconds_total over
                  the server's OK multiplies), engine jobs per request and
                  the batching engine's launches
  --stream        each multiply over a MultiplyStream call instead of a
                  unary Multiply: the operands go out in chunks of
                  --stream-chunk-bytes from memory and the
                  product comes back in chunks (MatmulClient's
                  MultiplyStreamedView), blocking calls on a thread per
                  request in flight: a closed loop, or with --rate an open
                  one (a start due while every thread is busy starts late,
                  its latency from its scheduled start). --stripes K (1 to
                  16) stripes each multiply over K calls on as many
                  connections. Both default to what the client library
                  picks for the shape (one call and 4 MiB chunks up to
                  96 MiB on the wire, up to 8 calls and 16 MiB chunks
                  above). Payload as inline; the message sizes
                  in the JSON are the payloads (chunk framing aside).
                  Concurrency at most 256; not with --resident,
                  --shared-memory or --protobuf-requests

Exit status: 0 all points ran; 1 could not run; 2 usage; 3 --verify found a
wrong answer; 130 interrupted (Ctrl-C; a second one exits at once).
--version prints the version, commit and CUDA versions of the build.
)";

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

namespace {

constexpr int kDefaultMaxChannels = 16;
// --stream: requests in flight at most (a thread each, and two more per
// stripe inside MatmulClient).
constexpr int kMaxStreamConcurrency = 256;

// The flags a command line gave (with dashes): the values of those that
// take one, and the switches that are on.
struct Flags {
  std::map<std::string, std::string> values;
  std::set<std::string> switches;

  bool Has(const std::string& name) const { return values.count(name) > 0; }
  // The flag's value, or its default when it was not given.
  std::string Get(const std::string& name) const {
    auto it = values.find(name);
    if (it != values.end()) return it->second;
    std::string flag = name;
    for (char& c : flag) {
      if (c == '-') c = '_';
    }
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(flag);
    return f == nullptr ? "" : f->DefaultValue();
  }
};

absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args) {
  static const std::set<std::string> kValued = {"target",
                                                "shape",
                                                "dtype",
                                                "compute",
                                                "concurrency",
                                                "rate",
                                                "duration",
                                                "requests",
                                                "warmup",
                                                "channels",
                                                "timeout",
                                                "distinct",
                                                "seed",
                                                "verify-every",
                                                "json",
                                                "label",
                                                "client-id",
                                                "grpc-arg",
                                                "resident",
                                                "stable-windows",
                                                "shape-mix",
                                                "server-metrics",
                                                "stream-chunk-bytes",
                                                "stripes",
                                                "lb-policy"};
  static const std::set<std::string> kSwitches = {
      "verify",        "progress", "protobuf-requests", "stable",
      "shared-memory", "stream",   "blocking-calls",    "cuda-memory"};
  // A switch that may take a value: --resident, --resident=operands, or
  // --resident operands; given alone it is --resident=all.
  static const std::set<std::string> kResidentValues = {"none", "operands",
                                                        "all"};
  std::vector<std::string> normalized;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      normalized.insert(normalized.end(), args.begin() + i, args.end());
      break;
    }
    if (args[i] != "--resident") {
      normalized.push_back(args[i]);
    } else if (i + 1 < args.size() && kResidentValues.count(args[i + 1]) > 0) {
      normalized.push_back("--resident=" + args[++i]);
    } else {
      normalized.push_back("--resident=all");
    }
  }
  auto underscored = [](std::string name) {
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    return name;
  };
  FlagParseOptions options;
  for (const auto* names : {&kValued, &kSwitches}) {
    for (const std::string& name : *names) {
      options.allowed.insert(underscored(name));
    }
  }
  absl::StatusOr<ParsedFlags> parsed = matmul::ParseFlags(normalized, options);
  if (!parsed.ok()) return parsed.status();
  Flags flags;
  for (const std::string& name : kValued) {
    const std::string flag = underscored(name);
    if (!parsed->Given(flag)) continue;
    flags.values[name] = absl::FindCommandLineFlag(flag)->CurrentValue();
  }
  for (const std::string& name : kSwitches) {
    if (absl::FindCommandLineFlag(underscored(name))->CurrentValue() ==
        "true") {
      flags.switches.insert(name);
    }
  }
  if (!flags.Has("target")) {
    return absl::InvalidArgumentError("--target is required");
  }
  return flags;
}

absl::StatusOr<double> ParseSeconds(const Flags& flags, const std::string& name,
                                    double fallback, bool allow_zero) {
  if (!flags.Has(name)) return fallback;
  const std::string text = flags.values.at(name);
  double v = 0;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v) || v < 0 ||
      (v == 0 && !allow_zero)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " takes a ", allow_zero ? "" : "positive ",
                     "number of seconds, got \"", text, "\""));
  }
  return v;
}

absl::StatusOr<int64_t> ParsePositive(const Flags& flags,
                                      const std::string& name,
                                      int64_t fallback) {
  if (!flags.Has(name)) return fallback;
  const std::string text = flags.values.at(name);
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " takes a positive integer, got \"", text, "\""));
  }
  return v;
}

absl::StatusOr<std::vector<int>> ParseIntList(const std::string& name,
                                              const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1 || v > 100000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, " takes positive integers separated by commas, got \"",
          text, "\""));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<double>> ParseRateList(const std::string& text) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v) || !std::isfinite(v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rate takes positive numbers (requests/s) separated by commas, "
          "got \"",
          text, "\""));
    }
    out.push_back(v);
  }
  return out;
}

// --stream and its options: --stream-chunk-bytes and --stripes only with
// it, and none of the options that name something a streamed multiply has
// no place for.
absl::Status StreamOptionsFrom(const Flags& flags, BenchConfig& c) {
  c.stream = flags.switches.count("stream") > 0;
  if (!c.stream) {
    for (const char* name : {"stream-chunk-bytes", "stripes"}) {
      if (flags.Has(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " applies only with --stream"));
      }
    }
    return absl::OkStatus();
  }
  struct Excluded {
    bool given;
    const char* flag;
    const char* why;
  };
  for (const Excluded& e : {
           Excluded{c.resident != Resident::kNone, "--resident",
                    "sends the operands' data in chunks"},
           Excluded{c.shared_memory, "--shared-memory",
                    "sends the operands' data in chunks"},
           Excluded{c.cuda_memory, "--cuda-memory",
                    "sends the operands' data in chunks"},
           Excluded{c.protobuf_requests, "--protobuf-requests",
                    "frames its chunks from memory, with no request to "
                    "serialize"},
           Excluded{c.blocking_calls, "--blocking-calls",
                    "makes blocking calls already"},
       }) {
    if (e.given) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stream ", e.why, ": not with ", e.flag));
    }
  }
  const int most =
      *std::max_element(c.concurrency.begin(), c.concurrency.end());
  if (most > kMaxStreamConcurrency) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream runs a thread per request in flight: --concurrency is at "
        "most ",
        kMaxStreamConcurrency, " with it, got ", most));
  }
  // What the client library chooses for this size where a flag is not
  // given (StreamOptionsFor), resolved here so that the report names it.
  const int64_t elem = static_cast<int64_t>(DTypeSize(c.dtype));
  int64_t wire_bytes = 0;
  for (const BenchShape& s :
       c.shape_mix.empty() ? std::vector<BenchShape>{c.shape} : c.shape_mix) {
    wire_bytes = std::max(
        wire_bytes, s.matrices() * elem * (s.m * s.k + s.k * s.n + s.m * s.n));
  }
  const StreamOptions plan = StreamOptionsFor(wire_bytes);
  absl::StatusOr<int64_t> chunk =
      ParsePositive(flags, "stream-chunk-bytes", plan.chunk_bytes);
  if (!chunk.ok()) return chunk.status();
  if (*chunk > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        "--stream-chunk-bytes is at most 1073741824 (1 GiB)");
  }
  c.stream_chunk_bytes = *chunk;
  absl::StatusOr<int64_t> stripes =
      ParsePositive(flags, "stripes", plan.stripes);
  if (!stripes.ok()) return stripes.status();
  if (*stripes > kMaxStreamStripes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stripes takes 1 to ", kMaxStreamStripes, ", got ", *stripes));
  }
  c.stripes = static_cast<int>(*stripes);
  return absl::OkStatus();
}

absl::StatusOr<BenchConfig> MakeConfig(const Flags& flags) {
  BenchConfig c;
  c.target = flags.values.at("target");
  if (c.target.empty()) return absl::InvalidArgumentError("--target is empty");
  absl::StatusOr<BenchShape> shape = ParseShape(flags.Get("shape"));
  if (!shape.ok()) return shape.status();
  c.shape = *shape;
  if (flags.Has("shape-mix")) {
    if (flags.Has("shape")) {
      return absl::InvalidArgumentError(
          "--shape and --shape-mix exclude each other");
    }
    absl::StatusOr<std::vector<BenchShape>> mix =
        ParseShapeMix(flags.values.at("shape-mix"));
    if (!mix.ok()) return mix.status();
    c.shape_mix = *std::move(mix);
    c.shape = c.shape_mix.front();
  }
  if (flags.Has("server-metrics")) {
    absl::StatusOr<ScrapeTarget> target =
        ParseScrapeTarget(flags.values.at("server-metrics"));
    if (!target.ok()) return target.status();
    c.server_metrics = *std::move(target);
  }
  absl::StatusOr<DType> dtype = ParseDType(flags.Get("dtype"));
  if (!dtype.ok()) return dtype.status();
  c.dtype = *dtype;
  absl::StatusOr<ComputeMode> compute = ParseComputeMode(flags.Get("compute"));
  if (!compute.ok()) return compute.status();
  c.compute = *compute;
  if (flags.Has("rate")) {
    absl::StatusOr<std::vector<double>> rates =
        ParseRateList(flags.values.at("rate"));
    if (!rates.ok()) return rates.status();
    c.rates = *rates;
  }
  absl::StatusOr<std::vector<int>> concurrency = ParseIntList(
      "concurrency", flags.Has("concurrency") ? flags.values.at("concurrency")
                     : c.rates.empty()        ? "1,4,16,64"
                                              : "64");
  if (!concurrency.ok()) return concurrency.status();
  c.concurrency = *concurrency;
  if (flags.Has("duration") && flags.Has("requests")) {
    return absl::InvalidArgumentError(
        "--duration and --requests exclude each other");
  }
  absl::StatusOr<double> duration = ParseSeconds(flags, "duration", 5, false);
  if (!duration.ok()) return duration.status();
  c.duration_s = *duration;
  absl::StatusOr<int64_t> requests = ParsePositive(flags, "requests", 0);
  if (!requests.ok()) return requests.status();
  c.requests = *requests;
  absl::StatusOr<double> warmup = ParseSeconds(flags, "warmup", 1, true);
  if (!warmup.ok()) return warmup.status();
  c.warmup_s = *warmup;
  absl::StatusOr<double> timeout = ParseSeconds(flags, "timeout", 60, false);
  if (!timeout.ok()) return timeout.status();
  c.timeout_s = *timeout;
  absl::StatusOr<int64_t> channels = ParsePositive(flags, "channels", 0);
  if (!channels.ok()) return channels.status();
  if (*channels > 1024) {
    return absl::InvalidArgumentError("--channels is at most 1024");
  }
  c.channels = static_cast<int>(*channels);
  c.verify = flags.switches.count("verify") > 0 || flags.Has("verify-every");
  c.protobuf_requests = flags.switches.count("protobuf-requests") > 0;
  c.blocking_calls = flags.switches.count("blocking-calls") > 0;
  if (c.blocking_calls) {
    if (!c.rates.empty()) {
      return absl::InvalidArgumentError(
          "--blocking-calls makes a closed loop: not with --rate");
    }
    const int most =
        *std::max_element(c.concurrency.begin(), c.concurrency.end());
    if (most > kMaxBlockingCallers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--blocking-calls runs a thread per request in flight: "
                       "--concurrency is at most ",
                       kMaxBlockingCallers, " with it, got ", most));
    }
  }
  absl::StatusOr<int64_t> every = ParsePositive(flags, "verify-every", 64);
  if (!every.ok()) return every.status();
  c.verify_every = static_cast<int>(std::min<int64_t>(*every, 1 << 30));
  absl::StatusOr<int64_t> distinct = ParsePositive(flags, "distinct", 0);
  if (!distinct.ok()) return distinct.status();
  if (*distinct > 1024) {
    return absl::InvalidArgumentError("--distinct is at most 1024");
  }
  c.distinct = static_cast<int>(*distinct);
  if (flags.Has("seed")) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(flags.values.at("seed"), &seed)) {
      return absl::InvalidArgumentError("--seed takes a non-negative integer");
    }
    c.seed = seed;
  }
  c.json_path = flags.Get("json");
  c.label = flags.Get("label");
  c.progress = flags.switches.count("progress") > 0;
  if (flags.switches.count("stable") > 0 || flags.Has("stable-windows")) {
    if (flags.Has("requests")) {
      return absl::InvalidArgumentError(
          "--stable measures windows of --duration; not with --requests");
    }
    absl::StatusOr<int64_t> windows =
        ParsePositive(flags, "stable-windows", 10);
    if (!windows.ok()) return windows.status();
    if (*windows < Stability::kWindows || *windows > 100) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stable-windows: expected ", Stability::kWindows,
                       " to 100, got ", *windows));
    }
    c.stable_windows = static_cast<int>(*windows);
  }
  absl::StatusOr<Resident> resident = ParseResident(flags.Get("resident"));
  if (!resident.ok()) return resident.status();
  c.resident = *resident;
  c.shared_memory = flags.switches.count("shared-memory") > 0;
  if (c.shared_memory && c.resident != Resident::kNone) {
    return absl::InvalidArgumentError(
        "--shared-memory and --resident exclude each other");
  }
  c.cuda_memory = flags.switches.count("cuda-memory") > 0;
  if (c.cuda_memory && (c.resident != Resident::kNone || c.shared_memory)) {
    return absl::InvalidArgumentError(
        "--cuda-memory excludes --resident and --shared-memory");
  }
  c.client_id = flags.Has("client-id")
                    ? flags.values.at("client-id")
                    : absl::StrCat("matmul-bench-", HostName(), "-", getpid());
  if (absl::Status s = CheckClientId(c.client_id); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--client-id: ", s.message()));
  }
  absl::StatusOr<GrpcArgs> grpc_args = ParseGrpcArgs(flags.Get("grpc-arg"));
  if (!grpc_args.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-arg: ", grpc_args.status().message()));
  }
  c.grpc_args = *std::move(grpc_args);
  c.lb_policy = flags.Get("lb-policy");
  if (c.lb_policy != "round_robin" && c.lb_policy != "pick_first") {
    return absl::InvalidArgumentError(
        absl::StrCat("--lb-policy takes round_robin or pick_first, got \"",
                     c.lb_policy, "\""));
  }
  if (absl::Status s = StreamOptionsFrom(flags, c); !s.ok()) return s;
  return c;
}

}  // namespace

absl::StatusOr<BenchConfig> ParseBenchCommandLine(
    const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags = ParseFlags(args);
  if (!flags.ok()) return flags.status();
  return MakeConfig(*flags);
}

int PointChannels(const BenchConfig& config, int concurrency) {
  if (!config.stream) {
    return config.channels > 0 ? config.channels
                               : std::min(concurrency, kDefaultMaxChannels);
  }
  if (config.channels > 0) return std::max(config.channels, config.stripes);
  const int64_t wanted = int64_t{concurrency} * config.stripes;
  return static_cast<int>(std::max<int64_t>(
      std::min<int64_t>(wanted, kDefaultMaxChannels), config.stripes));
}

}  // namespace matmul
