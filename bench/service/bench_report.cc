#include "bench/service/bench_report.h"

#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/lib/tensor_proto.h"
#include "nlohmann/json.hpp"

namespace matmul {
namespace {

// Keys in the order written: the documented order of bench_report.h.
using Json = nlohmann::ordered_json;

// A double as the report writes it: null if not finite (JSON has no NaN),
// as nlohmann's dump does too; said here so that it does not depend on it.
Json Number(double value) {
  return std::isfinite(value) ? Json(value) : Json(nullptr);
}

std::string DTypeText(int proto_dtype) {
  std::optional<DType> d = DTypeFromProto(static_cast<v1::Dtype>(proto_dtype));
  return d.has_value() ? std::string(DTypeName(*d))
                       : absl::StrCat("dtype(", proto_dtype, ")");
}

Json ServerJson(const v1::GetServerInfoResponse& info) {
  Json device_names = Json::array();
  Json devices = Json::array();
  for (const v1::Device& d : info.devices()) {
    device_names.push_back(d.name());
    devices.push_back({{"index", d.index()},
                       {"name", d.name()},
                       {"uuid", d.uuid()},
                       {"memory_bytes", d.memory_bytes()},
                       {"multiprocessors", d.multiprocessors()},
                       {"copy_engines", d.copy_engines()},
                       {"compute_capability", d.compute_capability()},
                       {"staging_bytes", d.staging_bytes()}});
  }
  Json dtypes = Json::array();
  for (int d : info.dtypes()) dtypes.push_back(DTypeText(d));
  const v1::Limits& l = info.limits();
  return {{"engine", info.engine()},
          {"version", info.version()},
          {"streams_per_device", info.streams_per_device()},
          {"device_names", std::move(device_names)},
          {"devices", std::move(devices)},
          {"dtypes", std::move(dtypes)},
          {"limits",
           {{"max_message_bytes", l.max_message_bytes()},
            {"max_elements_per_operand", l.max_elements_per_operand()},
            {"max_inflight_bytes", l.max_inflight_bytes()},
            {"max_dimension", l.max_dimension()},
            {"max_stored_bytes_per_client", l.max_stored_bytes_per_client()},
            {"max_handles_per_client", l.max_handles_per_client()},
            {"default_handle_ttl_seconds", l.default_handle_ttl_seconds()},
            {"max_handle_ttl_seconds", l.max_handle_ttl_seconds()}}}};
}

void AddShapeFields(const BenchRun& run, Json& j) {
  j["shape"] = run.shape.ToString();
  j["batch"] = run.shape.batch;
  j["m"] = run.shape.m;
  j["k"] = run.shape.k;
  j["n"] = run.shape.n;
  j["dtype"] = std::string(DTypeName(run.dtype));
  j["compute"] = std::string(ComputeModeName(run.compute));
  if (!run.shape_mix.empty()) {
    Json mix = Json::array();
    for (const BenchShape& s : run.shape_mix) mix.push_back(s.ToString());
    j["shape_mix"] = std::move(mix);
  }
}

// {code: value} of a map keyed by gRPC code names.
template <typename Map>
Json ByCode(const Map& map) {
  Json j = Json::object();
  for (const auto& [code, value] : map) j[code] = value;
  return j;
}

// --stream's settings; null for unary multiplies.
Json StreamJson(const BenchRun& run) {
  if (!run.stream.has_value()) return nullptr;
  return {{"stripes", run.stream->stripes},
          {"chunk_bytes", run.stream->chunk_bytes}};
}

Json PointJson(const BenchRun& run, const BenchPoint& bp) {
  const LoadPoint& p = bp.point;
  const LoadResult& r = bp.result;
  const PointMetrics m = ComputeMetrics(run, bp);
  Json j = Json::object();
  j["label"] = run.label;
  j["timestamp"] = bp.timestamp;
  j["host"] = run.host;
  j["target"] = run.target;
  AddShapeFields(run, j);
  j["mode"] = p.rate > 0 ? "open" : "closed";
  j["concurrency"] = p.concurrency;
  j["channels"] = bp.channels;
  j["rate"] = p.rate > 0 ? Number(p.rate) : Json(nullptr);
  if (p.requests > 0) {
    j["duration_s"] = nullptr;
    j["requests_target"] = p.requests;
  } else {
    j["duration_s"] = Number(absl::ToDoubleSeconds(p.duration));
    j["requests_target"] = nullptr;
  }
  j["warmup_s"] = Number(absl::ToDoubleSeconds(p.warmup));
  j["timeout_s"] = Number(absl::ToDoubleSeconds(p.timeout));
  j["elapsed_s"] = Number(absl::ToDoubleSeconds(r.elapsed));
  j["requests"] = r.completed;
  j["ok"] = r.ok;
  j["ok_in_window"] = r.ok_in_window;
  j["errors"] = r.errors;
  j["errors_by_code"] = ByCode(r.errors_by_code);
  j["error_messages"] = ByCode(r.error_messages);
  j["requests_per_s"] = Number(m.requests_per_s);
  j["request_bytes"] = run.request_bytes;
  j["response_bytes"] = run.response_bytes;
  j["request_gb_per_s"] = Number(m.request_gb_per_s);
  j["response_gb_per_s"] = Number(m.response_gb_per_s);
  j["total_gb_per_s"] = Number(m.total_gb_per_s);
  j["flops_per_request"] = Number(run.flops_per_request);
  j["tflop_per_s"] = Number(m.tflop_per_s);
  j["latency_ms"] = {
      {"count", r.latency_ns.count()}, {"p50", Number(m.p50_ms)},
      {"p90", Number(m.p90_ms)},       {"p99", Number(m.p99_ms)},
      {"p99_9", Number(m.p999_ms)},    {"min", Number(m.min_ms)},
      {"max", Number(m.max_ms)},       {"mean", Number(m.mean_ms)}};
  j["verify"] = {{"enabled", p.verify_every > 0},
                 {"every", p.verify_every},
                 {"checked", r.verified},
                 {"mismatches", r.mismatches}};
  j["delayed_starts"] = r.delayed_starts;
  j["interrupted"] = r.interrupted;
  j["abandoned"] = r.abandoned;
  j["resident"] = std::string(ResidentName(run.resident));
  j["shared_memory"] = run.shared_memory;
  j["cuda_memory"] = run.cuda_memory;
  j["streamed"] = run.stream.has_value();
  j["blocking_calls"] = p.blocking_calls;
  j["stream"] = StreamJson(run);
  j["request_message_bytes"] = bp.request_message_bytes;
  j["response_message_bytes"] = r.response_message_bytes;
  j["wire_gb_per_s"] = Number(m.wire_gb_per_s);
  j["resident_operands"] = bp.resident_operands;
  j["upload_s"] = Number(bp.upload_s);
  j["operand_delete_errors"] = bp.operand_delete_errors;
  j["deletes"] = {{"issued", r.deletes},
                  {"ok", r.deletes_ok},
                  {"errors", r.delete_errors},
                  {"errors_by_code", ByCode(r.delete_errors_by_code)},
                  {"error_messages", ByCode(r.delete_error_messages)},
                  {"abandoned", r.abandoned_deletes}};
  if (!bp.window_rates.empty()) {
    Json rates = Json::array();
    for (double rate : bp.window_rates) rates.push_back(Number(rate));
    j["stability"] = {{"stable", bp.stable}, {"window_requests_per_s", rates}};
  }
  if (bp.server_delta.has_value()) {
    const ServerDelta& d = *bp.server_delta;
    j["server_metrics"] = {
        {"multiplies_ok", Number(d.multiplies_ok)},
        {"compute_busy_s", Number(d.compute_busy_s)},
        {"device_busy_s", Number(d.device_busy_s)},
        {"compute_us_per_request", Number(d.compute_us_per_request)},
        {"device_busy_us_per_request", Number(d.device_busy_us_per_request)},
        {"jobs_per_request", Number(d.jobs_per_request)},
        {"launches", Number(d.launches)},
        {"launched_requests", Number(d.launched_requests)}};
  }
  j["server"] = ServerJson(run.server);
  return j;
}

std::string Ms(double ms) {
  if (ms >= 100) return absl::StrFormat("%.1f", ms);
  if (ms >= 10) return absl::StrFormat("%.2f", ms);
  return absl::StrFormat("%.3f", ms);
}

std::string HumanBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

}  // namespace

PointMetrics ComputeMetrics(const BenchRun& run, const BenchPoint& point) {
  PointMetrics m;
  const LoadResult& r = point.result;
  const double seconds = absl::ToDoubleSeconds(r.elapsed);
  if (seconds > 0) {
    m.requests_per_s = static_cast<double>(r.ok_in_window) / seconds;
  }
  m.request_gb_per_s =
      m.requests_per_s * static_cast<double>(run.request_bytes) / 1e9;
  m.response_gb_per_s =
      m.requests_per_s * static_cast<double>(run.response_bytes) / 1e9;
  m.total_gb_per_s = m.request_gb_per_s + m.response_gb_per_s;
  m.wire_gb_per_s = m.requests_per_s *
                    static_cast<double>(point.request_message_bytes +
                                        r.response_message_bytes) /
                    1e9;
  m.tflop_per_s = m.requests_per_s * run.flops_per_request / 1e12;
  const LatencyHistogram& h = r.latency_ns;
  m.p50_ms = h.Percentile(0.5) / 1e6;
  m.p90_ms = h.Percentile(0.9) / 1e6;
  m.p99_ms = h.Percentile(0.99) / 1e6;
  m.p999_ms = h.Percentile(0.999) / 1e6;
  m.min_ms = static_cast<double>(h.min()) / 1e6;
  m.max_ms = static_cast<double>(h.max()) / 1e6;
  m.mean_ms = h.mean() / 1e6;
  return m;
}

std::string RunDescription(const BenchRun& run) {
  std::vector<std::string> devices;
  for (const v1::Device& d : run.server.devices()) devices.push_back(d.name());
  std::string text = absl::StrCat(
      "matmul-bench ", run.target, ": engine ", run.server.engine(), " ",
      run.server.version(), ", ", run.server.devices_size(), " device(s) [",
      absl::StrJoin(devices, ", "), "], ", run.server.streams_per_device(),
      " streams per device\n");
  absl::StrAppend(
      &text,
      run.shape_mix.empty()
          ? absl::StrCat("shape ", run.shape.ToString())
          : absl::StrCat("shape mix ", ShapeMixName(run.shape_mix),
                         " (in turn; sizes are means)"),
      " ", DTypeName(run.dtype), " ", ComputeModeName(run.compute),
      ": request ", HumanBytes(run.request_bytes), ", response ",
      HumanBytes(run.response_bytes),
      absl::StrFormat(", %.4g GFLOP", run.flops_per_request / 1e9),
      " per request; ", run.distinct_requests, " distinct request(s)",
      run.verify ? ", verifying" : "",
      run.resident == Resident::kAll
          ? "; resident: operands stored, products kept and deleted"
      : run.resident == Resident::kOperands
          ? "; resident: operands stored, products returned"
          : "",
      run.shared_memory ? "; through shared memory (a region per slot)" : "",
      run.cuda_memory ? "; through the bench's GPU memory (a region per slot)"
                      : "",
      run.blocking_calls ? "; blocking calls (a thread per request in flight)"
                         : "",
      run.stream.has_value()
          ? absl::StrCat("; streamed (MultiplyStream) over ",
                         run.stream->stripes, " stripe(s), ",
                         HumanBytes(run.stream->chunk_bytes), " chunks")
          : "",
      run.label.empty() ? "" : absl::StrCat("; label \"", run.label, "\""),
      "\n");
  return text;
}

std::string TableHeader() {
  return absl::StrFormat(
      "%5s %4s %7s %10s %8s %8s %8s %8s %8s %8s %8s %8s %7s\n", "conc", "chan",
      "rate", "req/s", "in GB/s", "out GB/s", "tot GB/s", "TFLOP/s", "p50 ms",
      "p90 ms", "p99 ms", "p99.9 ms", "errors");
}

std::string TableRow(const BenchRun& run, const BenchPoint& point) {
  const PointMetrics m = ComputeMetrics(run, point);
  const std::string rate =
      point.point.rate > 0 ? absl::StrFormat("%.4g", point.point.rate) : "-";
  return absl::StrFormat(
      "%5d %4d %7s %10.1f %8.3f %8.3f %8.3f %8.3f %8s %8s %8s %8s %7d%s\n",
      point.point.concurrency, point.channels, rate, m.requests_per_s,
      m.request_gb_per_s, m.response_gb_per_s, m.total_gb_per_s, m.tflop_per_s,
      Ms(m.p50_ms), Ms(m.p90_ms), Ms(m.p99_ms), Ms(m.p999_ms),
      point.result.errors, point.result.interrupted ? "  (interrupted)" : "");
}

std::string ServerLine(const BenchPoint& point) {
  if (!point.server_delta.has_value()) return "";
  const ServerDelta& d = *point.server_delta;
  return absl::StrFormat(
      "  c=%d server: %.0f multiplies, device compute %.2f us/request (busy "
      "%.2f us/request), %.3f engine jobs/request; %.0f launches (%.0f "
      "requests)\n",
      point.point.concurrency, d.multiplies_ok, d.compute_us_per_request,
      d.device_busy_us_per_request, d.jobs_per_request, d.launches,
      d.launched_requests);
}

std::string ErrorLines(const BenchPoint& point) {
  std::string text;
  for (const auto& [code, n] : point.result.errors_by_code) {
    auto it = point.result.error_messages.find(code);
    absl::StrAppend(&text, "  c=", point.point.concurrency, ": ", code, " x", n,
                    it == point.result.error_messages.end()
                        ? ""
                        : absl::StrCat(" (first: ", it->second, ")"),
                    "\n");
  }
  for (const auto& [code, n] : point.result.delete_errors_by_code) {
    auto it = point.result.delete_error_messages.find(code);
    absl::StrAppend(&text, "  c=", point.point.concurrency,
                    ": Delete of a kept product: ", code, " x", n,
                    it == point.result.delete_error_messages.end()
                        ? ""
                        : absl::StrCat(" (first: ", it->second, ")"),
                    "\n");
  }
  if (point.result.abandoned_deletes > 0) {
    absl::StrAppend(&text, "  c=", point.point.concurrency, ": ",
                    point.result.abandoned_deletes,
                    " delete(s) of kept products never completed\n");
  }
  if (point.operand_delete_errors > 0) {
    absl::StrAppend(&text, "  c=", point.point.concurrency, ": ",
                    point.operand_delete_errors,
                    " stored operand(s) could not be deleted\n");
  }
  if (point.result.abandoned > 0) {
    absl::StrAppend(&text, "  c=", point.point.concurrency, ": ",
                    point.result.abandoned,
                    " request(s) never completed (abandoned)\n");
  }
  return text;
}

std::string ReportJson(const BenchRun& run,
                       const std::vector<BenchPoint>& points) {
  Json doc = Json::object();
  doc["schema"] = "matmul-bench/1";
  doc["tool"] = "matmul-bench";
  doc["label"] = run.label;
  doc["timestamp"] = run.timestamp;
  doc["host"] = run.host;
  doc["target"] = run.target;
  doc["command_line"] = run.command_line;
  Json config = Json::object();
  AddShapeFields(run, config);
  config["request_bytes"] = run.request_bytes;
  config["response_bytes"] = run.response_bytes;
  config["flops_per_request"] = Number(run.flops_per_request);
  config["distinct_requests"] = run.distinct_requests;
  config["seed"] = static_cast<int64_t>(run.seed);
  config["verify"] = run.verify;
  config["resident"] = std::string(ResidentName(run.resident));
  config["shared_memory"] = run.shared_memory;
  config["cuda_memory"] = run.cuda_memory;
  config["streamed"] = run.stream.has_value();
  config["blocking_calls"] = run.blocking_calls;
  config["stream"] = StreamJson(run);
  config["client_id"] = run.client_id;
  config["lb_policy"] = run.lb_policy;
  doc["config"] = std::move(config);
  doc["server"] = ServerJson(run.server);
  Json points_json = Json::array();
  for (const BenchPoint& p : points) points_json.push_back(PointJson(run, p));
  doc["points"] = std::move(points_json);
  // Labels, error messages and command lines are the user's and the
  // server's bytes: what is not UTF-8 becomes U+FFFD, not an exception.
  return doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace matmul
