// The pipeline timeline: recent stream activity (Engine::RecentSpans) as
// Chrome trace / Perfetto JSON, served by MetricsExporter at
// GET /timeline?seconds=N and drawn by bench/tools/render_timeline.py.
//
// Format (the "JSON Object Format" of the Trace Event Format):
//   {"traceEvents": [
//      {"ph":"M","name":"process_name","pid":0,"args":{"name":"GPU 0: ..."}},
//      {"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"stream
//      1"}},
//      {"ph":"X","name":"h2d"|"gemm"|"d2h","cat":"copy"|"compute",
//       "pid":0,"tid":1,"ts":12.345,"dur":6.789,"args":{"job":42}}, ...],
//    "displayTimeUnit":"ms",
//    "otherData":{"engine":"cuda","window_seconds":2,"start_unix_us":...}}
// pid is the device index (the host engine's one device is pid 0), tid the
// stream; ts and dur are microseconds, ts relative to start_unix_us (the
// earliest span start), so that they keep sub-microsecond precision.
// Written by nlohmann-json, compact (one line), keys in the order above;
// bytes of a name that are not UTF-8 become U+FFFD.
#ifndef MATMUL_SERVER_HTTP_TIMELINE_H_
#define MATMUL_SERVER_HTTP_TIMELINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gpu/engine.h"

namespace matmul {

inline constexpr absl::Duration kDefaultTimelineWindow = absl::Seconds(2);
inline constexpr absl::Duration kMaxTimelineWindow = absl::Seconds(60);

// The window asked for by a `seconds` query value: empty means the default;
// larger than the maximum is clamped to it; INVALID_ARGUMENT unless a
// positive number.
absl::StatusOr<absl::Duration> ParseTimelineWindow(absl::string_view seconds);

// The trace JSON for `spans` (any order) of an engine described by `info`.
std::string TimelineJson(const EngineInfo& info,
                         const std::vector<StreamSpan>& spans,
                         absl::Duration window);

}  // namespace matmul

#endif  // MATMUL_SERVER_HTTP_TIMELINE_H_
