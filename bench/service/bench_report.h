// matmul-bench's report: the figures derived from a LoadResult (requests/s,
// payload GB/s, TFLOP/s, latency percentiles), the table printed on stdout
// and the JSON document written with --json.
//
// JSON document (schema "matmul-bench/1"):
//   { "schema", "tool", "label", "timestamp", "host", "target",
//     "command_line": [...], "config": {...}, "server": {...},
//     "points": [ {point}, ... ] }
// Each point object is self-contained (it repeats the run's label, target,
// shape, dtype, host and server), so points from several files can be
// pooled:
//   label, timestamp (point start), host, target,
//   shape ("MxKxN" | "BxMxKxN"), batch (0: 2-D), m, k, n, dtype, compute,
//   mode ("closed" | "open"), concurrency, channels, rate (null if closed),
//   duration_s | requests_target (the other null), warmup_s, timeout_s,
//   elapsed_s (the window throughput is divided by),
//   requests (measured completions), ok, ok_in_window, errors,
//   errors_by_code {CODE: n} (gRPC code names and WRONG_ANSWER),
//   error_messages {CODE: first message},
//   requests_per_s (successful), request_bytes, response_bytes (payload per
//   request), request_gb_per_s, response_gb_per_s, total_gb_per_s,
//   flops_per_request, tflop_per_s,
//   latency_ms {count, p50, p90, p99, p99_9, min, max, mean} (successful
//   requests only),
//   verify {enabled, every, checked, mismatches},
//   delayed_starts (open loop: starts that waited for a free slot),
//   interrupted, abandoned,
//   resident ("none" | "operands" | "all"), shared_memory (--shared-memory:
//   operands and products in regions registered per slot; upload_s is then
//   the time the registrations and copies took),
//   streamed (--stream: each multiply over MultiplyStream calls),
//   stream {stripes, chunk_bytes} (null unless streamed; the message sizes
//   below are then the payloads, the chunks' framing aside),
//   request_message_bytes, response_message_bytes (serialized Multiply
//   messages as sent and received: with resident operands the request is a
//   few dozen bytes of handles, with kept products so is the response),
//   wire_gb_per_s (requests_per_s x the two message sizes),
//   resident_operands [handle ids uploaded for the point, deleted at its
//   end], upload_s (time the uploads took), operand_delete_errors,
//   deletes {issued, ok, errors, errors_by_code, error_messages, abandoned}
//   (asynchronous deletes of kept products, warm-up included; they count in
//   neither latency nor throughput),
//   stability {stable, window_requests_per_s [..]} (only with --stable: each
//   window's req/s; the point's figures are the last window's),
//   shape_mix ["MxKxN", ..] (only with --shape-mix: the shapes requests
//   take in turn; shape, m, k, n are then the first's, request_bytes,
//   response_bytes and flops_per_request the mix's means),
//   server_metrics {multiplies_ok, compute_busy_s, device_busy_s,
//   compute_us_per_request, device_busy_us_per_request, jobs_per_request,
//   launches, launched_requests} (only with --server-metrics: the server's
//   counters over the point, warm-up included,
//   bench/service/server_scrape.h),
//   server {engine, version, streams_per_device, device_names [..],
//           devices [{index, name, uuid, memory_bytes, multiprocessors,
//                     copy_engines, compute_capability, staging_bytes}],
//           dtypes [..], limits {max_message_bytes, ...}}
// Written by nlohmann-json: two-space indent, keys in the order above,
// figures that are not finite as null, bytes that are not UTF-8 (in a label
// or an error message) as U+FFFD.
// 1 GB = 1e9 bytes; payload counts the tensors' data bytes only: with
// --resident, request_bytes is 0 (operands are handles) and so is
// response_bytes with --resident=all (the product stays on the server), so
// the payload GB/s are 0 and TFLOP/s is the figure that matters.
//
// Pure functions over plain values; thread-safe.
#ifndef MATMUL_CLIENT_TOOLS_BENCH_REPORT_H_
#define MATMUL_CLIENT_TOOLS_BENCH_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/service/bench_workload.h"
#include "bench/service/load_generator.h"
#include "bench/service/server_scrape.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

// What holds for every point of one matmul-bench run.
struct BenchRun {
  std::string label;
  std::string target;
  std::string host;       // this machine's host name
  std::string timestamp;  // start of the run, UTC, RFC 3339
  std::vector<std::string> command_line;
  BenchShape shape;
  // --shape-mix: the shapes requests take in turn (empty: `shape` only);
  // the bytes and flops per request are then the mix's means.
  std::vector<BenchShape> shape_mix;
  DType dtype = DType::kFloat32;
  ComputeMode compute = ComputeMode::kStrict;
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
  double flops_per_request = 0;
  int distinct_requests = 0;
  uint64_t seed = 0;
  bool verify = false;
  Resident resident = Resident::kNone;
  // --shared-memory: operands and products in registered regions.
  bool shared_memory = false;
  // --cuda-memory: operands and products in the bench's GPU memory.
  bool cuda_memory = false;
  // --stream: each multiply over MultiplyStream, in chunks of about
  // chunk_bytes, striped over `stripes` calls (unset: unary Multiply).
  std::optional<StreamOptions> stream;
  // --blocking-calls: LoadPoint::blocking_calls on every point.
  bool blocking_calls = false;
  // Sent as x-matmul-client on every call.
  std::string client_id;
  // --lb-policy: the clients' load-balancing policy.
  std::string lb_policy;
  v1::GetServerInfoResponse server;
};

// One measured point.
struct BenchPoint {
  LoadPoint point;
  int channels = 1;
  std::string timestamp;  // start of the point, UTC, RFC 3339
  LoadResult result;
  // Serialized size of the (first) request sent.
  int64_t request_message_bytes = 0;
  // Resident points: the handles uploaded for the point, how long the
  // uploads took, and how many of the handles' deletes at the end failed.
  std::vector<std::string> resident_operands;
  double upload_s = 0;
  int64_t operand_delete_errors = 0;
  // --stable: each window's successful requests per second (the point's
  // figures are the last window's), and whether the last three agreed.
  std::vector<double> window_rates;
  bool stable = false;
  // --server-metrics: the server's counters over the point (warm-up
  // included; its ratios are per OK multiply the server counted).
  std::optional<ServerDelta> server_delta;
};

struct PointMetrics {
  double requests_per_s = 0;     // successful requests per second
  double request_gb_per_s = 0;   // A + B payload, client to server
  double response_gb_per_s = 0;  // C payload, server to client
  double total_gb_per_s = 0;
  // Whole messages, both ways (what actually crossed the wire, framing
  // aside).
  double wire_gb_per_s = 0;
  double tflop_per_s = 0;
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double p999_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  double mean_ms = 0;
};

PointMetrics ComputeMetrics(const BenchRun& run, const BenchPoint& point);

// A few lines describing the run (server, shape, payload sizes).
std::string RunDescription(const BenchRun& run);
// The table's header line and one row per point (each ends in '\n').
std::string TableHeader();
std::string TableRow(const BenchRun& run, const BenchPoint& point);
// Lines detailing a point's errors by code (empty when there are none).
std::string ErrorLines(const BenchPoint& point);
// --server-metrics: a line with the device's time per request over the
// point and the launches it made (empty without server metrics).
std::string ServerLine(const BenchPoint& point);

// The whole JSON document, pretty-printed, ending in '\n'.
std::string ReportJson(const BenchRun& run,
                       const std::vector<BenchPoint>& points);

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_BENCH_REPORT_H_
