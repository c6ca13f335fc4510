// matmul-bench: measures a running matmul server over gRPC: requests/s,
// payload GB/s, TFLOP/s and latency percentiles for one shape and dtype,
// over a sweep of concurrency levels (closed loop) or at fixed request rates
// (open loop). Prints a table on stdout, optionally writes JSON (--json) for
// scripts/plot_bench.py. With --resident the operands (and products) stay on
// the server, named by handles, so that the GPU rather than the wire is
// measured. The flags are Abseil flags, each `--flag value` or
// `--flag=value` (dashes or underscores; --resident also stands alone),
// parsed by common/command_line.h.
//
// Exit status: 0 when every point ran (errors, if any, are in the report),
// and for --help and --version; 1 when the bench could not run (no server,
// a file it cannot write); 2 for a usage error (one line, `matmul-bench:
// PROBLEM; see --help`); 3 when --verify found a wrong answer; 130 when
// interrupted (the points measured so far are still reported).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/lib/matmul_client.h"
#include "client/lib/tensor_proto.h"
#include "client/tools/bench_report.h"
#include "client/tools/bench_shared_memory.h"
#include "client/tools/bench_stability.h"
#include "client/tools/bench_workload.h"
#include "client/tools/load_generator.h"
#include "client/tools/server_scrape.h"
#include "common/build_info.h"
#include "common/command_line.h"
#include "common/mutex_mode.h"

// The values are checked by MakeConfig; the help texts are kUsage's.
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
ABSL_FLAG(std::string, resident, "none", "");
ABSL_FLAG(bool, verify, false, "");
ABSL_FLAG(bool, progress, false, "");
ABSL_FLAG(bool, protobuf_requests, false, "");
ABSL_FLAG(bool, stable, false, "");
ABSL_FLAG(bool, shared_memory, false, "");
ABSL_FLAG(std::string, stable_windows, "", "");
ABSL_FLAG(std::string, shape_mix, "", "");
ABSL_FLAG(std::string, server_metrics, "", "");

namespace matmul {
namespace {

constexpr char kUsage[] = R"(usage:
  matmul-bench --target HOST:PORT [--shape N|MxKxN|BxMxKxN]
               [--dtype float32|float64|float16|bfloat16]
               [--compute strict|tf32]
               [--concurrency C1,C2,...] [--rate R1,R2,...]
               [--duration SECONDS | --requests N] [--warmup SECONDS]
               [--channels N] [--timeout SECONDS]
               [--verify] [--verify-every N] [--distinct N] [--seed N]
               [--protobuf-requests] [--shared-memory]
               [--resident[=operands|all|none]] [--client-id NAME]
               [--grpc-arg NAME=INT,...]
               [--json FILE] [--label TEXT] [--progress]
               [--stable] [--stable-windows N]
               [--shape-mix S1,S2,...] [--server-metrics HOST:PORT]

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
  --client-id     sent as x-matmul-client on every call: the name the
                  server charges stored tensors to (default
                  matmul-bench-HOST-PID)
  --grpc-arg      extra gRPC channel arguments, NAME=INT[,NAME=INT...]
                  (transport tuning; docs/PERFORMANCE.md)
  --protobuf-requests
                  serialize each request with protobuf on every call (a copy
                  of every operand byte), instead of sending prebuilt
                  encodings whose operands go out from memory as they are
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
                  the batching engine's launches, grouped ones included

Exit status: 0 all points ran; 1 could not run; 2 usage; 3 --verify found a
wrong answer; 130 interrupted (Ctrl-C; a second one exits at once).
--version prints the version, commit and CUDA versions of the build.
)";

constexpr int64_t kDistinctBytesBudget = int64_t{1} << 30;
// --stable: the last three windows' req/s within 10% of each other.
constexpr double kStableTolerance = 0.10;
constexpr int kDefaultMaxChannels = 16;

std::atomic<bool> stop_requested{false};

extern "C" void OnSignal(int) {
  if (stop_requested.exchange(true)) _exit(130);
  static constexpr char kMessage[] =
      "\nmatmul-bench: stopping after the requests in flight (again to quit "
      "now)\n";
  ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  (void)ignored;
}

void InstallSignalHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

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
  static const std::set<std::string> kValued = {
      "target",      "shape",         "dtype",    "compute",
      "concurrency", "rate",          "duration", "requests",
      "warmup",      "channels",      "timeout",  "distinct",
      "seed",        "verify-every",  "json",     "label",
      "client-id",   "grpc-arg",      "resident", "stable-windows",
      "shape-mix",   "server-metrics"};
  static const std::set<std::string> kSwitches = {
      "verify", "progress", "protobuf-requests", "stable", "shared-memory"};
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

std::string Rfc3339Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                          absl::UTCTimeZone());
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

int Usage(absl::string_view problem) {
  return UsageError("matmul-bench", problem);
}

int Fail(absl::string_view message) {
  absl::FPrintF(stderr, "matmul-bench: error: %s\n", message);
  return 1;
}

// Everything the command line says, checked.
struct Config {
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
  int channels = 0;  // 0: min(concurrency, 16)
  double timeout_s = 60;
  bool verify = false;
  bool protobuf_requests = false;
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
  std::string client_id;
  GrpcArgs grpc_args;
};

absl::StatusOr<Config> MakeConfig(const Flags& flags) {
  Config c;
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
  return c;
}

// Deletes stored tensors; returns how many deletes failed (a handle already
// gone counts: the server should not lose them).
int64_t DeleteAll(MatmulClient& client, const std::vector<std::string>& ids,
                  absl::Duration timeout) {
  int64_t failed = 0;
  for (const std::string& id : ids) {
    const absl::Status s = client.Delete(id, timeout);
    if (!s.ok()) {
      ++failed;
      absl::FPrintF(stderr, "matmul-bench: deleting stored operand %s: %s\n",
                    id, s.ToString());
    }
  }
  return failed;
}

// Uploads the workload's operands for one resident point: A and B of
// request i, on device devices[i % n] when the server has several devices
// (operands of one multiply must share a device), else where the server
// likes. Fills a_ids and b_ids (in request order); on failure deletes what
// it uploaded.
absl::Status UploadOperands(MatmulClient& client, const Workload& workload,
                            const v1::GetServerInfoResponse& server,
                            absl::Duration ttl, absl::Duration timeout,
                            std::vector<std::string>& a_ids,
                            std::vector<std::string>& b_ids) {
  std::vector<int> devices;
  for (const v1::Device& d : server.devices()) {
    if (d.index() >= 0) devices.push_back(d.index());
  }
  a_ids.clear();
  b_ids.clear();
  for (size_t i = 0; i < workload.requests.size(); ++i) {
    UploadOptions options;
    options.ttl = ttl;
    options.timeout = timeout;
    if (devices.size() > 1) options.device = devices[i % devices.size()];
    for (bool is_a : {true, false}) {
      const v1::MultiplyRequest& r = *workload.requests[i];
      absl::StatusOr<StoredTensor> stored = [&]() {
        absl::StatusOr<HostTensor> t = FromProto(is_a ? r.a() : r.b());
        if (!t.ok()) return absl::StatusOr<StoredTensor>(t.status());
        return client.Upload(*t, options);
      }();
      if (!stored.ok()) {
        std::vector<std::string> all = a_ids;
        all.insert(all.end(), b_ids.begin(), b_ids.end());
        DeleteAll(client, all, timeout);
        a_ids.clear();
        b_ids.clear();
        return absl::Status(
            stored.status().code(),
            absl::StrCat("uploading ", is_a ? "A" : "B", " of request ", i,
                         ": ", absl::StatusCodeToString(stored.status().code()),
                         ": ", stored.status().message()));
      }
      (is_a ? a_ids : b_ids).push_back(stored->id);
    }
  }
  return absl::OkStatus();
}

void PrintProgress(int concurrency, double rate, const LoadProgress& p) {
  const std::string point =
      rate > 0 ? absl::StrFormat("rate=%g c=%d", rate, concurrency)
               : absl::StrFormat("c=%d", concurrency);
  if (p.warming_up) {
    absl::FPrintF(stderr, "[%s] %6.1fs warming up, %d in flight\n", point,
                  absl::ToDoubleSeconds(p.elapsed), p.in_flight);
  } else {
    absl::FPrintF(stderr,
                  "[%s] %6.1fs %10.1f req/s, %d ok, %d errors, %d in flight\n",
                  point, absl::ToDoubleSeconds(p.elapsed), p.ok_per_second,
                  p.ok, p.errors, p.in_flight);
  }
}

int Main(int argc, char** argv) {
  SkipMutexDeadlockDetection();  // common/mutex_mode.h
  std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  switch (FindInfoRequest(args)) {
    case InfoRequest::kHelp:
      std::fputs(kUsage, stdout);
      return 0;
    case InfoRequest::kVersion:
      std::fputs(VersionText("matmul-bench").c_str(), stdout);
      return 0;
    case InfoRequest::kNone:
      break;
  }
  if (args.size() == 1 && args[0] == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  absl::StatusOr<Flags> flags = ParseFlags(args);
  if (!flags.ok()) return Usage(flags.status().message());
  absl::StatusOr<Config> config = MakeConfig(*flags);
  if (!config.ok()) return Usage(config.status().message());
  const Config& c = *config;
  InstallSignalHandlers();

  BenchRun run;
  run.label = c.label;
  run.target = c.target;
  run.host = HostName();
  run.timestamp = Rfc3339Now();
  run.command_line.assign(argv, argv + argc);
  run.shape = c.shape;
  run.shape_mix = c.shape_mix;
  run.dtype = c.dtype;
  run.compute = c.compute;
  run.seed = c.seed;
  run.verify = c.verify;
  run.resident = c.resident;
  run.client_id = c.client_id;

  // The server first: no point building operands for a server that is not
  // there.
  {
    ClientOptions info_options;
    info_options.client_id = c.client_id;
    absl::StatusOr<std::unique_ptr<MatmulClient>> info_client =
        MatmulClient::Create(c.target, info_options);
    if (!info_client.ok()) return Fail(info_client.status().message());
    absl::StatusOr<v1::GetServerInfoResponse> info =
        (*info_client)
            ->GetServerInfo(absl::Seconds(std::min(c.timeout_s, 30.0)));
    if (!info.ok()) {
      return Fail(absl::StrCat("GetServerInfo on ", c.target, ": ",
                               absl::StatusCodeToString(info.status().code()),
                               ": ", info.status().message()));
    }
    run.server = *std::move(info);
  }

  // A mix: one distinct request of each shape is one unit.
  int64_t operand_bytes = OperandBytes(c.shape, c.dtype);
  if (!c.shape_mix.empty()) {
    operand_bytes = 0;
    for (const BenchShape& s : c.shape_mix) {
      operand_bytes += OperandBytes(s, c.dtype);
    }
  }
  int distinct = c.distinct;
  if (distinct == 0) {
    distinct = static_cast<int>(std::clamp<int64_t>(
        kDistinctBytesBudget / std::max<int64_t>(operand_bytes, 1), 1, 4));
    // Resident operands pin multiplies to their device: one pair per
    // device at least, so that every GPU works, if memory allows.
    int devices = 0;
    for (const v1::Device& d : run.server.devices()) {
      if (d.index() >= 0) ++devices;
    }
    if (c.resident != Resident::kNone && devices > distinct &&
        operand_bytes * devices <= 4 * kDistinctBytesBudget) {
      distinct = std::min(devices, 1024);
    }
  }
  if (operand_bytes * distinct >= (int64_t{256} << 20)) {
    absl::FPrintF(stderr, "matmul-bench: building %d request(s) of %.1f MiB\n",
                  distinct, static_cast<double>(operand_bytes) / (1 << 20));
  }
  absl::StatusOr<Workload> workload =
      c.shape_mix.empty()
          ? BuildWorkload(c.shape, c.dtype, c.compute, distinct, c.seed)
          : BuildMixedWorkload(c.shape_mix, c.dtype, c.compute, distinct,
                               c.seed);
  if (!workload.ok()) return Fail(workload.status().message());
  // Payload: the tensors' data the messages carry.
  run.request_bytes = c.resident == Resident::kNone && !c.shared_memory
                          ? workload->request_bytes
                          : 0;
  run.response_bytes = c.resident == Resident::kAll || c.shared_memory
                           ? 0
                           : workload->response_bytes;
  run.shared_memory = c.shared_memory;
  run.flops_per_request = workload->flops_per_request;
  run.distinct_requests = static_cast<int>(workload->requests.size());

  std::unique_ptr<ResponseVerifier> verifier;
  LoadGenerator::ResponseChecker checker;
  if (c.verify) {
    if (workload->flops_per_request * distinct >= 1e10) {
      absl::FPrintF(stderr, "matmul-bench: computing %d float64 reference(s)\n",
                    distinct);
    }
    absl::StatusOr<std::unique_ptr<ResponseVerifier>> created =
        ResponseVerifier::Create(*workload);
    if (!created.ok()) return Fail(created.status().message());
    verifier = *std::move(created);
    checker = [v = verifier.get()](int index,
                                   const v1::MultiplyResponse& response) {
      return v->Check(index, response);
    };
  }
  const int64_t max_message = run.server.limits().max_message_bytes();
  if (max_message > 0 && std::max(workload->request_bytes,
                                  workload->response_bytes) > max_message) {
    absl::FPrintF(stderr,
                  "matmul-bench: warning: %d-byte requests exceed the "
                  "server's %d-byte message limit; expect "
                  "RESOURCE_EXHAUSTED\n",
                  workload->request_bytes, max_message);
  }
  std::vector<const v1::MultiplyRequest*> inline_requests;
  for (const auto& r : workload->requests) inline_requests.push_back(r.get());

  // Stored operands live for the point plus margins (they are deleted at
  // its end; the TTL only bounds what a crashed bench leaves behind), and
  // kept products a minute beyond their deadline (they are deleted at once).
  const int64_t max_ttl_s = run.server.limits().max_handle_ttl_seconds();
  auto capped_ttl = [&](double seconds) {
    if (max_ttl_s > 0)
      seconds = std::min(seconds, static_cast<double>(max_ttl_s));
    return absl::Seconds(std::ceil(seconds));
  };
  const absl::Duration operand_ttl = capped_ttl(
      c.warmup_s + (c.requests > 0 ? 3600 : c.duration_s) + c.timeout_s + 120);
  absl::StatusOr<int64_t> result_ttl_s =
      TtlSeconds(capped_ttl(c.timeout_s + 60), "result ttl");
  if (!result_ttl_s.ok()) return Fail(result_ttl_s.status().message());

  // Shared memory: the regions of every point, registered once (over a
  // client of their own, which holds the registration calls) so that the
  // server never sees one point's regions beside the next one's.
  std::unique_ptr<MatmulClient> shared_client;
  std::unique_ptr<SharedMemoryPoint> shared;
  double shared_setup_s = 0;
  // A point left calls behind: their callbacks may still read the regions.
  bool shared_abandoned = false;
  absl::Cleanup keep_shared = [&] {
    if (!shared_abandoned) return;
    (void)shared.release();
    (void)shared_client.release();
  };
  if (c.shared_memory) {
    ClientOptions options;
    options.client_id = c.client_id;
    options.channel_args = c.grpc_args;
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(c.target, options);
    if (!client.ok()) return Fail(client.status().message());
    shared_client = *std::move(client);
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<SharedMemoryPoint>> created =
        SharedMemoryPoint::Create(
            shared_client.get(), *workload,
            *std::max_element(c.concurrency.begin(), c.concurrency.end()));
    if (!created.ok()) return Fail(created.status().message());
    shared = *std::move(created);
    shared_setup_s = absl::ToDoubleSeconds(absl::Now() - start);
  }

  std::fputs(RunDescription(run).c_str(), stdout);
  std::fputs(TableHeader().c_str(), stdout);
  std::fflush(stdout);

  std::vector<BenchPoint> points;
  std::vector<double> rates = c.rates;
  if (rates.empty()) rates.push_back(0);
  bool interrupted = false;
  int64_t mismatches = 0;
  for (double rate : rates) {
    for (int concurrency : c.concurrency) {
      if (stop_requested.load()) {
        interrupted = true;
        break;
      }
      BenchPoint bp;
      bp.point.concurrency = concurrency;
      bp.point.rate = rate;
      bp.point.duration = absl::Seconds(c.duration_s);
      bp.point.requests = c.requests;
      bp.point.warmup = absl::Seconds(c.warmup_s);
      bp.point.timeout = absl::Seconds(c.timeout_s);
      bp.point.verify_every = c.verify ? c.verify_every : 0;
      if (c.progress) bp.point.progress_interval = absl::Seconds(1);
      bp.channels = c.channels > 0 ? c.channels
                                   : std::min(concurrency, kDefaultMaxChannels);
      ClientOptions options;
      options.channels = bp.channels;
      options.client_id = c.client_id;
      options.channel_args = c.grpc_args;
      absl::StatusOr<std::unique_ptr<MatmulClient>> client =
          MatmulClient::Create(c.target, options);
      if (!client.ok()) return Fail(client.status().message());

      // Resident: the point's operands, uploaded now, and the requests that
      // name them.
      std::vector<const v1::MultiplyRequest*> requests = inline_requests;
      std::vector<std::unique_ptr<v1::MultiplyRequest>> resident_requests;
      std::vector<std::string> a_ids;
      std::vector<std::string> b_ids;
      const absl::Duration rpc_timeout = absl::Seconds(c.timeout_s);
      if (c.resident != Resident::kNone) {
        const absl::Time upload_start = absl::Now();
        if (absl::Status s =
                UploadOperands(**client, *workload, run.server, operand_ttl,
                               rpc_timeout, a_ids, b_ids);
            !s.ok()) {
          return Fail(s.message());
        }
        bp.upload_s = absl::ToDoubleSeconds(absl::Now() - upload_start);
        bp.resident_operands = a_ids;
        bp.resident_operands.insert(bp.resident_operands.end(), b_ids.begin(),
                                    b_ids.end());
        absl::StatusOr<std::vector<std::unique_ptr<v1::MultiplyRequest>>>
            built =
                ResidentRequests(*workload, a_ids, b_ids,
                                 c.resident == Resident::kAll, *result_ttl_s);
        if (!built.ok()) {
          DeleteAll(**client, bp.resident_operands, rpc_timeout);
          return Fail(built.status().message());
        }
        resident_requests = *std::move(built);
        requests.clear();
        for (const auto& r : resident_requests) requests.push_back(r.get());
      }
      // Shared memory: the first `concurrency` regions, one per slot.
      LoadGenerator::ResponseChecker point_checker = checker;
      if (shared != nullptr) {
        bp.upload_s = std::exchange(shared_setup_s, 0.0);
        requests.assign(shared->requests().begin(),
                        shared->requests().begin() + concurrency);
        if (verifier != nullptr) {
          point_checker = shared->Checker(verifier.get());
        }
      }
      bp.request_message_bytes =
          static_cast<int64_t>(requests.front()->ByteSizeLong());

      auto generator = std::make_unique<LoadGenerator>(
          client->get(), requests, point_checker,
          c.protobuf_requests ? LoadGenerator::Encoding::kProtobuf
                              : LoadGenerator::Encoding::kZeroCopy);
      generator->set_exclusive_requests(c.shared_memory);
      bp.timestamp = Rfc3339Now();
      // --server-metrics: the server's counters around the point.
      std::optional<ServerCounters> before;
      if (c.server_metrics.has_value()) {
        absl::StatusOr<ServerCounters> scraped =
            Scrape(*c.server_metrics, absl::Seconds(10));
        if (!scraped.ok()) {
          DeleteAll(**client, bp.resident_operands, rpc_timeout);
          return Fail(scraped.status().message());
        }
        before = *scraped;
      }
      // One window, or (--stable) windows until the last three agree.
      std::vector<double> window_rates;
      Stability stability;
      LoadPoint window = bp.point;
      for (int w = 0; w < std::max(1, c.stable_windows); ++w) {
        absl::StatusOr<LoadResult> result =
            generator->Run(window, stop_requested, [&](const LoadProgress& p) {
              PrintProgress(concurrency, rate, p);
            });
        if (!result.ok()) {
          DeleteAll(**client, bp.resident_operands, rpc_timeout);
          return Fail(result.status().message());
        }
        bp.result = *std::move(result);
        window.warmup = absl::ZeroDuration();
        const double seconds = absl::ToDoubleSeconds(bp.result.elapsed);
        window_rates.push_back(
            seconds > 0 ? static_cast<double>(bp.result.ok_in_window) / seconds
                        : 0);
        if (c.stable_windows == 0 || bp.result.interrupted) break;
        stability = JudgeStability(window_rates, kStableTolerance);
        if (stability.stable) break;
        if (bp.result.abandoned > 0 || bp.result.abandoned_deletes > 0) break;
      }
      if (before.has_value()) {
        absl::StatusOr<ServerCounters> after =
            Scrape(*c.server_metrics, absl::Seconds(10));
        if (after.ok()) {
          bp.server_delta = Subtract(*before, *after);
        } else {
          absl::FPrintF(stderr, "matmul-bench: server metrics: %s\n",
                        after.status().message());
        }
      }
      if (!bp.resident_operands.empty()) {
        bp.operand_delete_errors =
            DeleteAll(**client, bp.resident_operands, rpc_timeout);
      }
      if (bp.result.abandoned > 0 || bp.result.abandoned_deletes > 0) {
        // Their callbacks may still come: keep what they use alive.
        (void)client->release();
        (void)generator.release();
        (void)verifier.release();
        for (auto& r : resident_requests) (void)r.release();
        shared_abandoned = true;
      }
      if (c.stable_windows > 0) {
        bp.window_rates = window_rates;
        bp.stable = stability.stable;
      }
      std::fputs(TableRow(run, bp).c_str(), stdout);
      if (c.stable_windows > 0) {
        std::fputs(
            absl::StrCat(
                "  ", StabilityLine(window_rates, stability, kStableTolerance),
                "\n")
                .c_str(),
            stdout);
      }
      std::fputs(ServerLine(bp).c_str(), stdout);
      std::fputs(ErrorLines(bp).c_str(), stdout);
      std::fflush(stdout);
      mismatches += bp.result.mismatches;
      interrupted = interrupted || bp.result.interrupted;
      points.push_back(std::move(bp));
      if (interrupted) break;
    }
    if (interrupted) break;
  }

  if (!c.json_path.empty()) {
    const std::string json = ReportJson(run, points);
    std::ofstream out(c.json_path, std::ios::binary | std::ios::trunc);
    out.write(json.data(), static_cast<std::streamsize>(json.size()));
    out.close();
    if (!out) return Fail(absl::StrCat("cannot write --json ", c.json_path));
  }
  if (interrupted) return 130;
  if (mismatches > 0) {
    absl::FPrintF(stderr,
                  "matmul-bench: %d response(s) failed verification "
                  "(WRONG_ANSWER)\n",
                  mismatches);
    return 3;
  }
  return 0;
}

}  // namespace
}  // namespace matmul

int main(int argc, char** argv) { return matmul::Main(argc, argv); }
