#include "server/http/timeline.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace matmul {
namespace {

// JSON string literal, quotes included.
std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

// Trace pid of a device: its index; the host engine's device (-1) is 0.
int Pid(int device) { return std::max(device, 0); }

absl::string_view SpanName(StreamSpan::Kind kind) {
  switch (kind) {
    case StreamSpan::Kind::kH2D:
      return "h2d";
    case StreamSpan::Kind::kCompute:
      return "gemm";
    case StreamSpan::Kind::kD2H:
      return "d2h";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<absl::Duration> ParseTimelineWindow(absl::string_view seconds) {
  if (seconds.empty()) return kDefaultTimelineWindow;
  double value = 0;
  if (!absl::SimpleAtod(seconds, &value) || !std::isfinite(value) ||
      value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seconds must be a positive number, got \"", seconds, "\""));
  }
  return std::min(absl::Seconds(value), kMaxTimelineWindow);
}

std::string TimelineJson(const EngineInfo& info,
                         const std::vector<StreamSpan>& spans,
                         absl::Duration window) {
  absl::Time origin = absl::InfiniteFuture();
  for (const StreamSpan& s : spans) origin = std::min(origin, s.start);
  if (spans.empty()) origin = absl::Now();

  std::string out = "{\"traceEvents\":[";
  bool first = true;
  auto event = [&out, &first](const std::string& json) {
    if (!first) out += ",";
    first = false;
    out += "\n";
    out += json;
  };

  // Lanes: every stream of every device, named, so idle ones show too.
  for (const DeviceInfo& d : info.devices) {
    const int pid = Pid(d.index);
    const std::string name = d.index < 0
                                 ? absl::StrCat("host: ", d.name)
                                 : absl::StrCat("GPU ", d.index, ": ", d.name);
    event(absl::StrCat("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", pid,
                       ",\"args\":{\"name\":", JsonString(name), "}}"));
    event(absl::StrCat("{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":",
                       pid, ",\"args\":{\"sort_index\":", pid, "}}"));
    for (int s = 0; s < info.streams_per_device; ++s) {
      event(absl::StrCat(
          "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", pid,
          ",\"tid\":", s, ",\"args\":{\"name\":",
          JsonString(absl::StrCat(d.index < 0 ? "lane " : "stream ", s)),
          "}}"));
      event(absl::StrCat(
          "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":", pid,
          ",\"tid\":", s, ",\"args\":{\"sort_index\":", s, "}}"));
    }
  }

  for (const StreamSpan& s : spans) {
    const double ts = absl::ToDoubleMicroseconds(s.start - origin);
    const double dur =
        std::max(0.0, absl::ToDoubleMicroseconds(s.end - s.start));
    event(absl::StrFormat(
        "{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,"
        "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"job\":%d}}",
        SpanName(s.kind),
        s.kind == StreamSpan::Kind::kCompute ? "compute" : "copy",
        Pid(s.device), s.stream, ts, dur, s.job));
  }

  absl::StrAppendFormat(
      &out,
      "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"engine\":%s,"
      "\"window_seconds\":%.6g,\"start_unix_us\":%d,\"spans\":%d}}\n",
      JsonString(info.name), absl::ToDoubleSeconds(window),
      absl::ToUnixMicros(origin), spans.size());
  return out;
}

}  // namespace matmul
