#include "bench/service/bench_stream.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/service/load_clock.h"
#include "client/lib/tensor_proto.h"

namespace matmul {
namespace {

using load_clock::Clock;
using load_clock::Due;
using load_clock::kDone;
using load_clock::kMeasure;
using load_clock::kWarmup;
using load_clock::Nanos;
using load_clock::Phase;
using load_clock::ToAbsl;
using load_clock::ToClock;

// How long the driver sleeps at most between looks at the clock and `stop`.
constexpr auto kTick = std::chrono::milliseconds(100);

std::vector<int64_t> Shape(const v1::Tensor& t) {
  return std::vector<int64_t>(t.shape().begin(), t.shape().end());
}

// What one Run's workers share with its driver (Run's thread). Lives on
// Run's stack: the workers are joined before Run returns.
struct RunState {
  LoadPoint point;
  bool count_mode = false;
  // Open loop (point.rate > 0): the schedule's start.
  bool open_loop = false;
  Clock::time_point schedule_start;
  std::atomic<int> phase{kWarmup};
  std::atomic<uint64_t> next_request{0};
  // Measured responses in the order they came, for verify_every.
  std::atomic<int64_t> verify_sequence{0};
  LatencyHistogram latency_ns;

  absl::Mutex mu;
  absl::CondVar cv;  // signalled when the driver has something to look at
  bool stop_issuing ABSL_GUARDED_BY(mu) = false;
  // Open loop: the first start on the schedule that no worker has taken.
  int64_t next_start ABSL_GUARDED_BY(mu) = 0;
  int64_t delayed_starts ABSL_GUARDED_BY(mu) = 0;
  int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  int64_t measured_started ABSL_GUARDED_BY(mu) = 0;
  int64_t measured_completed ABSL_GUARDED_BY(mu) = 0;
  int64_t ok_in_window ABSL_GUARDED_BY(mu) = 0;
  int64_t ok ABSL_GUARDED_BY(mu) = 0;
  int64_t errors ABSL_GUARDED_BY(mu) = 0;
  int64_t verified ABSL_GUARDED_BY(mu) = 0;
  int64_t mismatches ABSL_GUARDED_BY(mu) = 0;
  int64_t response_bytes ABSL_GUARDED_BY(mu) = 0;
  Clock::time_point last_completion ABSL_GUARDED_BY(mu);
  std::map<std::string, int64_t> errors_by_code ABSL_GUARDED_BY(mu);
  std::map<std::string, std::string> messages ABSL_GUARDED_BY(mu);

  void RecordError(const std::string& code, absl::string_view message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++errors;
    if (errors_by_code[code]++ == 0) messages[code] = std::string(message);
  }
};

}  // namespace

StreamLoadGenerator::StreamLoadGenerator(MatmulClient* client,
                                         const Workload& workload,
                                         const StreamOptions& stream,
                                         LoadGenerator::ResponseChecker checker)
    : client_(client), stream_(stream), checker_(std::move(checker)) {
  for (const auto& r : workload.requests) {
    Request request;
    for (auto [operand, tensor] : {std::make_pair(&request.a, &r->a()),
                                   std::make_pair(&request.b, &r->b())}) {
      operand->shape = Shape(*tensor);
      operand->dtype = workload.dtype;
      operand->data = tensor->data();
    }
    request.options.transpose_a = r->transpose_a();
    request.options.transpose_b = r->transpose_b();
    request.options.compute = r->compute_mode() == v1::COMPUTE_MODE_TF32
                                  ? ComputeMode::kTf32
                                  : ComputeMode::kStrict;
    requests_.push_back(std::move(request));
  }
}

absl::StatusOr<LoadResult> StreamLoadGenerator::Run(
    const LoadPoint& point, const std::atomic<bool>& stop,
    absl::FunctionRef<void(const LoadProgress&)> progress) {
  if (absl::Status checked =
          CheckLoadPoint(point, static_cast<bool>(checker_), requests_.size());
      !checked.ok()) {
    return checked;
  }

  RunState s;
  s.point = point;
  s.count_mode = point.requests > 0;
  s.open_loop = point.rate > 0;
  const Clock::time_point t_start = Clock::now();
  s.schedule_start = t_start;
  const Clock::time_point warmup_end = t_start + ToClock(point.warmup);
  s.phase.store(point.warmup > absl::ZeroDuration() ? kWarmup : kMeasure);

  // A worker: one streamed multiply after the other until told to stop;
  // in an open loop, each at the next start due on the schedule.
  auto work = [this, &s] {
    // Open loop: this worker has made a call, so it was busy (and not
    // waiting for a start) until it takes its next one.
    bool was_busy = false;
    while (true) {
      bool measured = false;
      Clock::time_point start;
      {
        absl::MutexLock lock(&s.mu);
        bool late = false;
        if (s.open_loop) {
          if (s.stop_issuing) return;
          start = Due(s.schedule_start, s.point.rate, s.next_start++);
          // A free worker takes the first start nobody has taken at once,
          // so a start already due found every worker busy (a fresh
          // worker's first start is late only by its thread's start-up).
          late = was_busy && Clock::now() > start;
          for (Clock::time_point now = Clock::now();
               !s.stop_issuing && now < start; now = Clock::now()) {
            s.mu.AwaitWithTimeout(absl::Condition(&s.stop_issuing),
                                  ToAbsl(start - now));
          }
        }
        if (s.stop_issuing) return;
        measured = s.phase.load() == kMeasure;
        if (measured && s.count_mode) {
          if (s.measured_started >= s.point.requests) {
            s.stop_issuing = true;
            s.cv.SignalAll();
            return;
          }
          ++s.measured_started;
        }
        if (late) ++s.delayed_starts;
        ++s.in_flight;
      }
      was_busy = true;
      const int index =
          static_cast<int>(s.next_request.fetch_add(1) % requests_.size());
      const Request& r = requests_[index];
      MultiplyOptions options = r.options;
      options.timeout = s.point.timeout;
      // Closed loop: latency from the call's start; open loop: from the
      // scheduled start.
      if (!s.open_loop) start = Clock::now();
      absl::StatusOr<HostTensor> c =
          client_->MultiplyStreamedView(r.a, r.b, options, stream_);
      const Clock::time_point now = Clock::now();
      const int phase = s.phase.load();
      bool ok = c.ok();
      const int64_t product_bytes =
          ok ? static_cast<int64_t>(c->data.size()) : 0;
      // Checked outside the lock (a product may be large).
      absl::Status verdict;
      bool checked = false;
      if (measured && ok) {
        s.latency_ns.Record(Nanos(now - start));
        const int every = s.point.verify_every;
        if (every > 0 && s.verify_sequence.fetch_add(1) % every == 0) {
          checked = true;
          v1::MultiplyResponse response;
          verdict = ToProto(*std::move(c), response.mutable_c());
          if (verdict.ok()) verdict = checker_(index, response);
        }
      }
      absl::MutexLock lock(&s.mu);
      if (ok && s.response_bytes == 0) s.response_bytes = product_bytes;
      if (measured) {
        if (!ok) {
          s.RecordError(absl::StatusCodeToString(c.status().code()),
                        c.status().message());
        } else if (checked) {
          ++s.verified;
          if (!verdict.ok()) {
            ok = false;
            ++s.mismatches;
            s.RecordError(kWrongAnswerCode, verdict.message());
          }
        }
        if (ok) ++s.ok;
        ++s.measured_completed;
        s.last_completion = std::max(s.last_completion, now);
      }
      if (ok && (s.count_mode ? measured : phase == kMeasure)) {
        ++s.ok_in_window;
      }
      --s.in_flight;
      if (s.count_mode && s.measured_completed >= s.point.requests) {
        s.cv.SignalAll();
      }
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(point.concurrency);
  for (int i = 0; i < point.concurrency; ++i) workers.emplace_back(work);

  LoadResult result;
  Clock::time_point t0 = t_start;
  Clock::time_point t1 = t_start;
  bool window_closed = false;
  const bool report_progress = point.progress_interval > absl::ZeroDuration();
  Clock::time_point next_progress =
      t_start + (report_progress ? ToClock(point.progress_interval)
                                 : Clock::duration::zero());
  while (true) {
    const Clock::time_point now = Clock::now();
    if (stop.load(std::memory_order_relaxed)) {
      result.interrupted = true;
      break;
    }
    if (s.phase.load() == kWarmup && now >= warmup_end) {
      t0 = now;
      s.phase.store(kMeasure);
    }
    if (s.phase.load() == kMeasure && !s.count_mode &&
        now >= t0 + ToClock(point.duration)) {
      t1 = now;
      s.phase.store(kDone);
      window_closed = true;
      break;
    }
    absl::MutexLock lock(&s.mu);
    if (s.count_mode && s.measured_completed >= point.requests) break;
    if (report_progress && now >= next_progress) {
      LoadProgress p;
      p.elapsed = ToAbsl(now - t_start);
      p.warming_up = s.phase.load() == kWarmup;
      p.ok = s.ok_in_window;
      const double measured_s =
          p.warming_up ? 0 : std::chrono::duration<double>(now - t0).count();
      p.ok_per_second = measured_s > 0 ? p.ok / measured_s : 0;
      p.errors = s.errors;
      p.in_flight = s.in_flight;
      progress(p);
      while (next_progress <= now) {
        next_progress += ToClock(point.progress_interval);
      }
    }
    Clock::time_point wake = now + kTick;
    if (s.phase.load() == kWarmup) wake = std::min(wake, warmup_end);
    if (s.phase.load() == kMeasure && !s.count_mode) {
      wake = std::min(wake, t0 + ToClock(point.duration));
    }
    if (report_progress) wake = std::min(wake, next_progress);
    const Clock::time_point before_wait = Clock::now();
    if (wake > before_wait) {
      s.cv.WaitWithTimeout(&s.mu, ToAbsl(wake - before_wait));
    }
  }

  // Stop issuing; the calls in flight end by their deadlines at the latest.
  {
    absl::MutexLock lock(&s.mu);
    s.stop_issuing = true;
  }
  const Clock::time_point end = Clock::now();
  if (!window_closed) {
    t1 = end;
    if (s.phase.load() == kWarmup) t0 = end;  // interrupted while warming up
    s.phase.store(kDone);
  }
  for (std::thread& w : workers) w.join();

  absl::MutexLock lock(&s.mu);
  if (s.count_mode && !result.interrupted) {
    result.elapsed = ToAbsl(std::max(s.last_completion, t0) - t0);
  } else {
    result.elapsed = ToAbsl(t1 - t0);
  }
  result.ok_in_window = s.ok_in_window;
  result.completed = s.measured_completed;
  result.ok = s.ok;
  result.errors = s.errors;
  result.errors_by_code = s.errors_by_code;
  result.error_messages = s.messages;
  result.verified = s.verified;
  result.mismatches = s.mismatches;
  result.latency_ns = s.latency_ns;
  result.delayed_starts = s.delayed_starts;
  result.response_message_bytes = s.response_bytes;
  return result;
}

}  // namespace matmul
