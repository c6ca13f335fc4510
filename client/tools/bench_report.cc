#include "client/tools/bench_report.h"

#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/lib/tensor_proto.h"

namespace matmul {
namespace {

// A small streaming JSON writer: pretty-printed, two-space indent. Doubles
// that are not finite become null.
class JsonWriter {
 public:
  JsonWriter& BeginObject() { return Open('{'); }
  JsonWriter& EndObject() { return Close('}'); }
  JsonWriter& BeginArray() { return Open('['); }
  JsonWriter& EndArray() { return Close(']'); }

  JsonWriter& Key(absl::string_view key) {
    Separate();
    AppendString(key);
    out_ += ": ";
    after_key_ = true;
    return *this;
  }
  JsonWriter& String(absl::string_view value) {
    Separate();
    AppendString(value);
    return *this;
  }
  JsonWriter& Int(int64_t value) {
    Separate();
    absl::StrAppend(&out_, value);
    return *this;
  }
  JsonWriter& Double(double value) {
    Separate();
    if (std::isfinite(value)) {
      absl::StrAppend(&out_, absl::StrFormat("%.10g", value));
    } else {
      out_ += "null";
    }
    return *this;
  }
  JsonWriter& Bool(bool value) {
    Separate();
    out_ += value ? "true" : "false";
    return *this;
  }
  JsonWriter& Null() {
    Separate();
    out_ += "null";
    return *this;
  }

  std::string Finish() { return std::move(out_) + "\n"; }

 private:
  JsonWriter& Open(char c) {
    Separate();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& Close(char c) {
    const bool empty = first_.back();
    first_.pop_back();
    if (!empty) Newline();
    out_ += c;
    return *this;
  }
  // Before a value or key: the comma and the line break, unless the value
  // follows its key.
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) out_ += ',';
    first_.back() = false;
    Newline();
  }
  void Newline() {
    out_ += '\n';
    out_.append(2 * first_.size(), ' ');
  }
  void AppendString(absl::string_view s) {
    out_ += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"':
          out_ += "\\\"";
          break;
        case '\\':
          out_ += "\\\\";
          break;
        case '\n':
          out_ += "\\n";
          break;
        case '\r':
          out_ += "\\r";
          break;
        case '\t':
          out_ += "\\t";
          break;
        default:
          if (c < 0x20) {
            absl::StrAppend(&out_, absl::StrFormat("\\u%04x", c));
          } else {
            out_ += static_cast<char>(c);
          }
      }
    }
    out_ += '"';
  }

  std::string out_;
  std::vector<bool> first_;  // per open container: nothing written yet
  bool after_key_ = false;
};

std::string DTypeText(int proto_dtype) {
  std::optional<DType> d = DTypeFromProto(static_cast<v1::Dtype>(proto_dtype));
  return d.has_value() ? std::string(DTypeName(*d))
                       : absl::StrCat("dtype(", proto_dtype, ")");
}

void WriteServer(const v1::GetServerInfoResponse& info, JsonWriter& w) {
  w.BeginObject();
  w.Key("engine").String(info.engine());
  w.Key("version").String(info.version());
  w.Key("streams_per_device").Int(info.streams_per_device());
  w.Key("device_names").BeginArray();
  for (const v1::Device& d : info.devices()) w.String(d.name());
  w.EndArray();
  w.Key("devices").BeginArray();
  for (const v1::Device& d : info.devices()) {
    w.BeginObject();
    w.Key("index").Int(d.index());
    w.Key("name").String(d.name());
    w.Key("uuid").String(d.uuid());
    w.Key("memory_bytes").Int(d.memory_bytes());
    w.Key("multiprocessors").Int(d.multiprocessors());
    w.Key("copy_engines").Int(d.copy_engines());
    w.Key("compute_capability").String(d.compute_capability());
    w.Key("staging_bytes").Int(d.staging_bytes());
    w.EndObject();
  }
  w.EndArray();
  w.Key("dtypes").BeginArray();
  for (int d : info.dtypes()) w.String(DTypeText(d));
  w.EndArray();
  w.Key("limits").BeginObject();
  w.Key("max_message_bytes").Int(info.limits().max_message_bytes());
  w.Key("max_elements_per_operand")
      .Int(info.limits().max_elements_per_operand());
  w.Key("max_inflight_bytes").Int(info.limits().max_inflight_bytes());
  w.Key("max_dimension").Int(info.limits().max_dimension());
  w.Key("max_stored_bytes_per_client")
      .Int(info.limits().max_stored_bytes_per_client());
  w.Key("max_handles_per_client").Int(info.limits().max_handles_per_client());
  w.Key("default_handle_ttl_seconds")
      .Int(info.limits().default_handle_ttl_seconds());
  w.Key("max_handle_ttl_seconds").Int(info.limits().max_handle_ttl_seconds());
  w.EndObject();
  w.EndObject();
}

void WriteShapeFields(const BenchRun& run, JsonWriter& w) {
  w.Key("shape").String(run.shape.ToString());
  w.Key("batch").Int(run.shape.batch);
  w.Key("m").Int(run.shape.m);
  w.Key("k").Int(run.shape.k);
  w.Key("n").Int(run.shape.n);
  w.Key("dtype").String(DTypeName(run.dtype));
  w.Key("compute").String(ComputeModeName(run.compute));
}

void WritePoint(const BenchRun& run, const BenchPoint& bp, JsonWriter& w) {
  const LoadPoint& p = bp.point;
  const LoadResult& r = bp.result;
  const PointMetrics m = ComputeMetrics(run, bp);
  w.BeginObject();
  w.Key("label").String(run.label);
  w.Key("timestamp").String(bp.timestamp);
  w.Key("host").String(run.host);
  w.Key("target").String(run.target);
  WriteShapeFields(run, w);
  w.Key("mode").String(p.rate > 0 ? "open" : "closed");
  w.Key("concurrency").Int(p.concurrency);
  w.Key("channels").Int(bp.channels);
  if (p.rate > 0) {
    w.Key("rate").Double(p.rate);
  } else {
    w.Key("rate").Null();
  }
  if (p.requests > 0) {
    w.Key("duration_s").Null();
    w.Key("requests_target").Int(p.requests);
  } else {
    w.Key("duration_s").Double(absl::ToDoubleSeconds(p.duration));
    w.Key("requests_target").Null();
  }
  w.Key("warmup_s").Double(absl::ToDoubleSeconds(p.warmup));
  w.Key("timeout_s").Double(absl::ToDoubleSeconds(p.timeout));
  w.Key("elapsed_s").Double(absl::ToDoubleSeconds(r.elapsed));
  w.Key("requests").Int(r.completed);
  w.Key("ok").Int(r.ok);
  w.Key("ok_in_window").Int(r.ok_in_window);
  w.Key("errors").Int(r.errors);
  w.Key("errors_by_code").BeginObject();
  for (const auto& [code, n] : r.errors_by_code) w.Key(code).Int(n);
  w.EndObject();
  w.Key("error_messages").BeginObject();
  for (const auto& [code, message] : r.error_messages) {
    w.Key(code).String(message);
  }
  w.EndObject();
  w.Key("requests_per_s").Double(m.requests_per_s);
  w.Key("request_bytes").Int(run.request_bytes);
  w.Key("response_bytes").Int(run.response_bytes);
  w.Key("request_gb_per_s").Double(m.request_gb_per_s);
  w.Key("response_gb_per_s").Double(m.response_gb_per_s);
  w.Key("total_gb_per_s").Double(m.total_gb_per_s);
  w.Key("flops_per_request").Double(run.flops_per_request);
  w.Key("tflop_per_s").Double(m.tflop_per_s);
  w.Key("latency_ms").BeginObject();
  w.Key("count").Int(r.latency_ns.count());
  w.Key("p50").Double(m.p50_ms);
  w.Key("p90").Double(m.p90_ms);
  w.Key("p99").Double(m.p99_ms);
  w.Key("p99_9").Double(m.p999_ms);
  w.Key("min").Double(m.min_ms);
  w.Key("max").Double(m.max_ms);
  w.Key("mean").Double(m.mean_ms);
  w.EndObject();
  w.Key("verify").BeginObject();
  w.Key("enabled").Bool(p.verify_every > 0);
  w.Key("every").Int(p.verify_every);
  w.Key("checked").Int(r.verified);
  w.Key("mismatches").Int(r.mismatches);
  w.EndObject();
  w.Key("delayed_starts").Int(r.delayed_starts);
  w.Key("interrupted").Bool(r.interrupted);
  w.Key("abandoned").Int(r.abandoned);
  w.Key("resident").String(ResidentName(run.resident));
  w.Key("request_message_bytes").Int(bp.request_message_bytes);
  w.Key("response_message_bytes").Int(r.response_message_bytes);
  w.Key("wire_gb_per_s").Double(m.wire_gb_per_s);
  w.Key("resident_operands").BeginArray();
  for (const std::string& id : bp.resident_operands) w.String(id);
  w.EndArray();
  w.Key("upload_s").Double(bp.upload_s);
  w.Key("operand_delete_errors").Int(bp.operand_delete_errors);
  w.Key("deletes").BeginObject();
  w.Key("issued").Int(r.deletes);
  w.Key("ok").Int(r.deletes_ok);
  w.Key("errors").Int(r.delete_errors);
  w.Key("errors_by_code").BeginObject();
  for (const auto& [code, n] : r.delete_errors_by_code) w.Key(code).Int(n);
  w.EndObject();
  w.Key("error_messages").BeginObject();
  for (const auto& [code, message] : r.delete_error_messages) {
    w.Key(code).String(message);
  }
  w.EndObject();
  w.Key("abandoned").Int(r.abandoned_deletes);
  w.EndObject();
  w.Key("server");
  WriteServer(run.server, w);
  w.EndObject();
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
      &text, "shape ", run.shape.ToString(), " ", DTypeName(run.dtype), " ",
      ComputeModeName(run.compute), ": request ", HumanBytes(run.request_bytes),
      ", response ", HumanBytes(run.response_bytes),
      absl::StrFormat(", %.4g GFLOP", run.flops_per_request / 1e9),
      " per request; ", run.distinct_requests, " distinct request(s)",
      run.verify ? ", verifying" : "",
      run.resident == Resident::kAll
          ? "; resident: operands stored, products kept and deleted"
      : run.resident == Resident::kOperands
          ? "; resident: operands stored, products returned"
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
  JsonWriter w;
  w.BeginObject();
  w.Key("schema").String("matmul-bench/1");
  w.Key("tool").String("matmul-bench");
  w.Key("label").String(run.label);
  w.Key("timestamp").String(run.timestamp);
  w.Key("host").String(run.host);
  w.Key("target").String(run.target);
  w.Key("command_line").BeginArray();
  for (const std::string& arg : run.command_line) w.String(arg);
  w.EndArray();
  w.Key("config").BeginObject();
  WriteShapeFields(run, w);
  w.Key("request_bytes").Int(run.request_bytes);
  w.Key("response_bytes").Int(run.response_bytes);
  w.Key("flops_per_request").Double(run.flops_per_request);
  w.Key("distinct_requests").Int(run.distinct_requests);
  w.Key("seed").Int(static_cast<int64_t>(run.seed));
  w.Key("verify").Bool(run.verify);
  w.Key("resident").String(ResidentName(run.resident));
  w.Key("client_id").String(run.client_id);
  w.EndObject();
  w.Key("server");
  WriteServer(run.server, w);
  w.Key("points").BeginArray();
  for (const BenchPoint& p : points) WritePoint(run, p, w);
  w.EndArray();
  w.EndObject();
  return w.Finish();
}

}  // namespace matmul
