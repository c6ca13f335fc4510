// matmul-bench: measures a running matmul server over gRPC: requests/s,
// payload GB/s, TFLOP/s and latency percentiles for one shape and dtype,
// over a sweep of concurrency levels (closed loop) or at fixed request rates
// (open loop). Prints a table on stdout, optionally writes JSON (--json) for
// scripts/plot_bench.py. Flags are parsed by hand, as in matmul-cli: each is
// `--flag value` or `--flag=value`.
//
// Exit status: 0 when every point ran (errors, if any, are in the report);
// 1 when the bench could not run (no server, a file it cannot write); 2 for
// a usage error; 3 when --verify found a wrong answer; 130 when interrupted
// (the points measured so far are still reported).
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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/bench_report.h"
#include "client/bench_workload.h"
#include "client/load_generator.h"
#include "client/matmul_client.h"

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
               [--json FILE] [--label TEXT] [--progress]

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
  --json          write every point to FILE (schema matmul-bench/1)
  --label         free text stored with every point in the JSON
  --progress      a line on stderr every second: elapsed, req/s, errors

Exit status: 0 all points ran; 1 could not run; 2 usage; 3 --verify found a
wrong answer; 130 interrupted (Ctrl-C; a second one exits at once).
)";

constexpr int64_t kDistinctBytesBudget = int64_t{1} << 30;
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

struct Flags {
  std::map<std::string, std::string> values;
  std::set<std::string> switches;

  bool Has(const std::string& name) const { return values.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
};

absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args) {
  static const std::set<std::string> kValued = {
      "target",      "shape",        "dtype",    "compute",
      "concurrency", "rate",         "duration", "requests",
      "warmup",      "channels",     "timeout",  "distinct",
      "seed",        "verify-every", "json",     "label"};
  static const std::set<std::string> kSwitches = {"verify", "progress"};
  Flags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", arg, "\""));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (flags.values.count(name) > 0 || flags.switches.count(name) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is given more than once"));
    }
    if (kSwitches.count(name) > 0) {
      if (value.has_value() && *value != "true" && *value != "1") {
        if (*value == "false" || *value == "0") continue;
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes no value, or true/false; got \"",
                         *value, "\""));
      }
      flags.switches.insert(name);
    } else if (kValued.count(name) > 0) {
      if (!value.has_value()) {
        if (i + 1 == args.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " needs a value"));
        }
        value = args[++i];
      }
      flags.values[name] = *value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
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
  absl::FPrintF(stderr, "matmul-bench: %s\n\n%s", problem, kUsage);
  return 2;
}

int Fail(absl::string_view message) {
  absl::FPrintF(stderr, "matmul-bench: error: %s\n", message);
  return 1;
}

// Everything the command line says, checked.
struct Config {
  std::string target;
  BenchShape shape;
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
  int verify_every = 64;
  int distinct = 0;  // 0: automatic
  uint64_t seed = 1;
  std::string json_path;
  std::string label;
  bool progress = false;
};

absl::StatusOr<Config> MakeConfig(const Flags& flags) {
  Config c;
  c.target = flags.values.at("target");
  if (c.target.empty()) return absl::InvalidArgumentError("--target is empty");
  absl::StatusOr<BenchShape> shape = ParseShape(flags.Get("shape", "1024"));
  if (!shape.ok()) return shape.status();
  c.shape = *shape;
  absl::StatusOr<DType> dtype = ParseDType(flags.Get("dtype", "float32"));
  if (!dtype.ok()) return dtype.status();
  c.dtype = *dtype;
  absl::StatusOr<ComputeMode> compute =
      ParseComputeMode(flags.Get("compute", "strict"));
  if (!compute.ok()) return compute.status();
  c.compute = *compute;
  if (flags.Has("rate")) {
    absl::StatusOr<std::vector<double>> rates =
        ParseRateList(flags.values.at("rate"));
    if (!rates.ok()) return rates.status();
    c.rates = *rates;
  }
  absl::StatusOr<std::vector<int>> concurrency = ParseIntList(
      "concurrency",
      flags.Get("concurrency", c.rates.empty() ? "1,4,16,64" : "64"));
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
  c.json_path = flags.Get("json", "");
  c.label = flags.Get("label", "");
  c.progress = flags.switches.count("progress") > 0;
  return c;
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
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h" || arg == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
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
  run.dtype = c.dtype;
  run.compute = c.compute;
  run.seed = c.seed;
  run.verify = c.verify;

  // The server first: no point building operands for a server that is not
  // there.
  {
    absl::StatusOr<std::unique_ptr<MatmulClient>> info_client =
        MatmulClient::Create(c.target);
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

  const int64_t operand_bytes = OperandBytes(c.shape, c.dtype);
  int distinct = c.distinct;
  if (distinct == 0) {
    distinct = static_cast<int>(std::clamp<int64_t>(
        kDistinctBytesBudget / std::max<int64_t>(operand_bytes, 1), 1, 4));
  }
  if (operand_bytes * distinct >= (int64_t{256} << 20)) {
    absl::FPrintF(stderr, "matmul-bench: building %d request(s) of %.1f MiB\n",
                  distinct, static_cast<double>(operand_bytes) / (1 << 20));
  }
  absl::StatusOr<Workload> workload =
      BuildWorkload(c.shape, c.dtype, c.compute, distinct, c.seed);
  if (!workload.ok()) return Fail(workload.status().message());
  run.request_bytes = workload->request_bytes;
  run.response_bytes = workload->response_bytes;
  run.flops_per_request = workload->flops_per_request;
  run.distinct_requests = distinct;

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
  std::vector<const v1::MultiplyRequest*> requests;
  for (const auto& r : workload->requests) requests.push_back(r.get());

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
      absl::StatusOr<std::unique_ptr<MatmulClient>> client =
          MatmulClient::Create(c.target, options);
      if (!client.ok()) return Fail(client.status().message());
      auto generator =
          std::make_unique<LoadGenerator>(client->get(), requests, checker);
      bp.timestamp = Rfc3339Now();
      absl::StatusOr<LoadResult> result = generator->Run(
          bp.point, stop_requested,
          [&](const LoadProgress& p) { PrintProgress(concurrency, rate, p); });
      if (!result.ok()) return Fail(result.status().message());
      bp.result = *std::move(result);
      if (bp.result.abandoned > 0) {
        // Their callbacks may still come: keep what they use alive.
        (void)client->release();
        (void)generator.release();
        (void)verifier.release();
      }
      std::fputs(TableRow(run, bp).c_str(), stdout);
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
