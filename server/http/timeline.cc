#include "server/http/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace matmul {
namespace {

// Keys in the order written (the trace viewers don't care; a reader does).
using Json = nlohmann::ordered_json;

// Microseconds with nanosecond resolution: at most three decimals, as the
// Trace Event Format's ts and dur have them.
double Micros(absl::Duration d) {
  return static_cast<double>(absl::ToInt64Nanoseconds(d)) / 1000;
}

// Trace pid of a device: its index; the host engine's device (-1) is 0.
int Pid(int device) { return std::max(device, 0); }

const char* SpanName(StreamSpan::Kind kind) {
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

  Json events = Json::array();
  // Lanes: every stream of every device, named, so idle ones show too.
  for (const DeviceInfo& d : info.devices) {
    const int pid = Pid(d.index);
    const std::string name = d.index < 0
                                 ? absl::StrCat("host: ", d.name)
                                 : absl::StrCat("GPU ", d.index, ": ", d.name);
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", pid},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", pid},
                      {"args", {{"sort_index", pid}}}});
    for (int s = 0; s < info.streams_per_device; ++s) {
      events.push_back(
          {{"ph", "M"},
           {"name", "thread_name"},
           {"pid", pid},
           {"tid", s},
           {"args",
            {{"name", absl::StrCat(d.index < 0 ? "lane " : "stream ", s)}}}});
      events.push_back({{"ph", "M"},
                        {"name", "thread_sort_index"},
                        {"pid", pid},
                        {"tid", s},
                        {"args", {{"sort_index", s}}}});
    }
  }

  for (const StreamSpan& s : spans) {
    events.push_back(
        {{"ph", "X"},
         {"name", SpanName(s.kind)},
         {"cat", s.kind == StreamSpan::Kind::kCompute ? "compute" : "copy"},
         {"pid", Pid(s.device)},
         {"tid", s.stream},
         {"ts", Micros(s.start - origin)},
         {"dur", Micros(std::max(absl::ZeroDuration(), s.end - s.start))},
         {"args", {{"job", s.job}}}});
  }

  Json trace = {{"traceEvents", std::move(events)},
                {"displayTimeUnit", "ms"},
                {"otherData",
                 {{"engine", info.name},
                  {"window_seconds", absl::ToDoubleSeconds(window)},
                  {"start_unix_us", absl::ToUnixMicros(origin)},
                  {"spans", spans.size()}}}};
  // Names come from drivers and flags: bytes that are not UTF-8 become
  // U+FFFD rather than an exception.
  return trace.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace matmul
