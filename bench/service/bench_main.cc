// matmul-bench: measures a running matmul server over gRPC: requests/s,
// payload GB/s, TFLOP/s and latency percentiles for one shape and dtype,
// over a sweep of concurrency levels (closed loop) or at fixed request rates
// (open loop). Prints a table on stdout, optionally writes JSON (--json) for
// bench/plot/plot_bench.py. With --resident the operands (and products) stay on
// the server, named by handles, so that the GPU rather than the wire is
// measured; with --stream each multiply travels over MultiplyStream in
// chunks (bench_stream.h). The command line is bench_options.h's.
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
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/service/bench_cuda_memory.h"
#include "bench/service/bench_options.h"
#include "bench/service/bench_report.h"
#include "bench/service/bench_shared_memory.h"
#include "bench/service/bench_stability.h"
#include "bench/service/bench_stream.h"
#include "bench/service/bench_workload.h"
#include "bench/service/load_generator.h"
#include "bench/service/server_scrape.h"
#include "client/lib/matmul_client.h"
#include "client/lib/tensor_proto.h"
#include "common/build_info.h"
#include "common/command_line.h"
#include "common/mutex_mode.h"

namespace matmul {
namespace {

constexpr int64_t kDistinctBytesBudget = int64_t{1} << 30;
// --stable: the last three windows' req/s within 10% of each other.
constexpr double kStableTolerance = 0.10;

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

std::string Rfc3339Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                          absl::UTCTimeZone());
}

int Usage(absl::string_view problem) {
  return UsageError("matmul-bench", problem);
}

int Fail(absl::string_view message) {
  absl::FPrintF(stderr, "matmul-bench: error: %s\n", message);
  return 1;
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
      std::fputs(kBenchUsage, stdout);
      return 0;
    case InfoRequest::kVersion:
      std::fputs(VersionText("matmul-bench").c_str(), stdout);
      return 0;
    case InfoRequest::kNone:
      break;
  }
  if (args.size() == 1 && args[0] == "help") {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  absl::StatusOr<BenchConfig> config = ParseBenchCommandLine(args);
  if (!config.ok()) return Usage(config.status().message());
  const BenchConfig& c = *config;
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
  run.lb_policy = c.lb_policy;
  if (c.stream) run.stream = StreamOptions{c.stream_chunk_bytes, c.stripes};
  run.blocking_calls = c.blocking_calls;

  // The server first: no point building operands for a server that is not
  // there.
  {
    ClientOptions info_options;
    info_options.client_id = c.client_id;
    info_options.load_balancing_policy = c.lb_policy;
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
  const bool in_regions = c.shared_memory || c.cuda_memory;
  run.request_bytes = c.resident == Resident::kNone && !in_regions
                          ? workload->request_bytes
                          : 0;
  run.response_bytes =
      c.resident == Resident::kAll || in_regions ? 0 : workload->response_bytes;
  run.shared_memory = c.shared_memory;
  run.cuda_memory = c.cuda_memory;
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
  // The messages the multiplies send and get back (stored operands and
  // products travel apart from them: Upload and Download take any size).
  const int64_t max_message = run.server.limits().max_message_bytes();
  if (max_message > 0 && !c.stream &&
      std::max(run.request_bytes, run.response_bytes) > max_message) {
    absl::FPrintF(stderr,
                  "matmul-bench: warning: %d-byte messages exceed the "
                  "server's %d-byte message limit; expect "
                  "RESOURCE_EXHAUSTED\n",
                  std::max(run.request_bytes, run.response_bytes), max_message);
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
  std::unique_ptr<CudaMemoryPoint> cuda;  // --cuda-memory
  double shared_setup_s = 0;
  // A point left calls behind: their callbacks may still read the regions.
  bool shared_abandoned = false;
  absl::Cleanup keep_shared = [&] {
    if (!shared_abandoned) return;
    (void)shared.release();
    (void)cuda.release();
    (void)shared_client.release();
  };
  if (c.cuda_memory && !BenchHasCuda()) {
    return Fail(
        CudaMemoryPoint::Create(nullptr, *workload, 1).status().message());
  }
  if (in_regions) {
    ClientOptions options;
    options.client_id = c.client_id;
    options.load_balancing_policy = c.lb_policy;
    options.channel_args = c.grpc_args;
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(c.target, options);
    if (!client.ok()) return Fail(client.status().message());
    shared_client = *std::move(client);
    const absl::Time start = absl::Now();
    const int slots =
        *std::max_element(c.concurrency.begin(), c.concurrency.end());
    if (c.cuda_memory) {
      absl::StatusOr<std::unique_ptr<CudaMemoryPoint>> created =
          CudaMemoryPoint::Create(shared_client.get(), *workload, slots);
      if (!created.ok()) return Fail(created.status().message());
      cuda = *std::move(created);
    } else {
      absl::StatusOr<std::unique_ptr<SharedMemoryPoint>> created =
          SharedMemoryPoint::Create(shared_client.get(), *workload, slots);
      if (!created.ok()) return Fail(created.status().message());
      shared = *std::move(created);
    }
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
      bp.point.blocking_calls = c.blocking_calls;
      if (c.progress) bp.point.progress_interval = absl::Seconds(1);
      bp.channels = PointChannels(c, concurrency);
      ClientOptions options;
      options.channels = bp.channels;
      options.client_id = c.client_id;
      options.load_balancing_policy = c.lb_policy;
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
      if (cuda != nullptr) {
        bp.upload_s = std::exchange(shared_setup_s, 0.0);
        requests.assign(cuda->requests().begin(),
                        cuda->requests().begin() + concurrency);
        if (verifier != nullptr) point_checker = cuda->Checker(verifier.get());
      }
      bp.request_message_bytes =
          static_cast<int64_t>(requests.front()->ByteSizeLong());

      std::unique_ptr<LoadGenerator> generator;
      std::unique_ptr<StreamLoadGenerator> streamer;  // --stream
      if (run.stream.has_value()) {
        streamer = std::make_unique<StreamLoadGenerator>(
            client->get(), *workload, *run.stream, point_checker);
        bp.request_message_bytes = workload->request_bytes;
      } else {
        generator = std::make_unique<LoadGenerator>(
            client->get(), requests, point_checker,
            c.protobuf_requests ? LoadGenerator::Encoding::kProtobuf
                                : LoadGenerator::Encoding::kZeroCopy);
        generator->set_exclusive_requests(in_regions);
      }
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
        auto progress = [&](const LoadProgress& p) {
          PrintProgress(concurrency, rate, p);
        };
        absl::StatusOr<LoadResult> result =
            streamer != nullptr
                ? streamer->Run(window, stop_requested, progress)
                : generator->Run(window, stop_requested, progress);
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
        absl::StatusOr<ServerCounters> after = ScrapeAfter(
            *c.server_metrics, *before, static_cast<double>(bp.result.ok),
            c.stream, absl::Seconds(10), absl::Seconds(2));
        if (after.ok()) {
          bp.server_delta = Subtract(*before, *after, c.stream);
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
