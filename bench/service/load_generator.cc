#include "bench/service/load_generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/service/load_clock.h"
#include "client/lib/multiply_encoding.h"
#include "client/lib/tensor_proto.h"

namespace matmul {
namespace {

using load_clock::Clock;
using load_clock::kDone;
using load_clock::kMeasure;
using load_clock::kWarmup;
using load_clock::Nanos;
using load_clock::Phase;
using load_clock::ToAbsl;
using load_clock::ToClock;

// Slots for the 17 gRPC status codes and WRONG_ANSWER.
constexpr int kGrpcCodes = 17;
constexpr int kWrongAnswerSlot = kGrpcCodes;
constexpr int kCodeSlots = kGrpcCodes + 1;

// A completion that runs inside the call that issued it (gRPC may do that
// for a call that fails at once) issues its successor inline at most this
// deep; beyond, the driver thread issues it, so errors cannot recurse
// without bound.
constexpr int kMaxInlineDepth = 8;

// How long the driver sleeps at most between looks at the clock and `stop`.
constexpr auto kTick = std::chrono::milliseconds(100);

// How long after the last deadline could have passed the stragglers are
// still waited for.
constexpr absl::Duration kDrainGrace = absl::Seconds(10);

void StoreMax(std::atomic<int64_t>& target, int64_t value) {
  int64_t seen = target.load(std::memory_order_relaxed);
  while (value > seen && !target.compare_exchange_weak(
                             seen, value, std::memory_order_relaxed)) {
  }
}

thread_local int inline_depth = 0;

// Everything one Run shares with its in-flight calls. Owned jointly by Run
// and every callback, so a late callback never touches freed memory.
struct RunState {
  MatmulClient* client = nullptr;
  const std::vector<const v1::MultiplyRequest*>* requests = nullptr;
  // The same, encoded; empty to serialize with protobuf on every call.
  const std::vector<grpc::ByteBuffer>* encoded = nullptr;
  const LoadGenerator::ResponseChecker* checker = nullptr;
  LoadPoint point;
  MultiplyOptions options;
  bool open_loop = false;
  bool count_mode = false;
  // LoadGenerator::set_exclusive_requests: indices of the requests that no
  // call is using now.
  bool exclusive = false;
  std::vector<int> free_requests ABSL_GUARDED_BY(mu);

  std::atomic<int> phase{kWarmup};
  std::atomic<bool> stop_issuing{false};
  std::atomic<uint64_t> next_request{0};
  std::atomic<int64_t> measured_started{0};
  std::atomic<int64_t> measured_completed{0};
  std::atomic<int64_t> ok_in_window{0};
  std::atomic<int64_t> ok{0};
  std::atomic<int64_t> errors{0};
  std::atomic<int64_t> verify_sequence{0};
  std::atomic<int64_t> verified{0};
  std::atomic<int64_t> mismatches{0};
  std::atomic<int64_t> code_counts[kCodeSlots] = {};
  // Deletes of kept products.
  std::atomic<int64_t> deletes{0};
  std::atomic<int64_t> deletes_ok{0};
  std::atomic<int64_t> delete_code_counts[kGrpcCodes] = {};
  // Serialized size of a successful response (0 until one is seen).
  std::atomic<int64_t> response_message_bytes{0};
  // Clock::time_point of the last measured completion, in nanoseconds.
  std::atomic<int64_t> last_completion_ns{0};
  LatencyHistogram latency_ns;

  absl::Mutex mu;
  absl::CondVar cv;  // signalled when the driver has something to do
  int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  // Deletes of kept products not answered yet.
  int64_t pending_deletes ABSL_GUARDED_BY(mu) = 0;
  // Closed loop: successors the driver must issue (see kMaxInlineDepth).
  int64_t deferred ABSL_GUARDED_BY(mu) = 0;
  bool driver_waits_for_slot ABSL_GUARDED_BY(mu) = false;
  // Blocking calls: caller threads waiting for a slot (held by a kept
  // product still being verified).
  int callers_wait_for_slot ABSL_GUARDED_BY(mu) = 0;
  std::map<std::string, std::string> messages ABSL_GUARDED_BY(mu);
  std::map<std::string, std::string> delete_messages ABSL_GUARDED_BY(mu);

  void RecordError(int slot, absl::string_view message) {
    errors.fetch_add(1, std::memory_order_relaxed);
    if (code_counts[slot].fetch_add(1, std::memory_order_relaxed) == 0) {
      const std::string name =
          slot == kWrongAnswerSlot
              ? std::string(kWrongAnswerCode)
              : absl::StatusCodeToString(static_cast<absl::StatusCode>(slot));
      absl::MutexLock lock(&mu);
      messages.emplace(name, std::string(message));
    }
  }

  int CodeSlot(const absl::Status& status) const {
    const int code = static_cast<int>(status.code());
    return code >= 0 && code < kGrpcCodes ? code : 2 /* UNKNOWN */;
  }
};

void OnDone(std::shared_ptr<RunState> s, int index, Clock::time_point start,
            bool measured, absl::StatusOr<v1::MultiplyResponse> response);

// Starts one request unless the point is over; `start` is when its latency
// starts (the scheduled time in an open loop, now in a closed one).
bool Issue(const std::shared_ptr<RunState>& s, Clock::time_point start) {
  if (s->stop_issuing.load(std::memory_order_relaxed)) return false;
  const bool measured = s->phase.load(std::memory_order_relaxed) == kMeasure;
  if (measured) {
    const int64_t n =
        s->measured_started.fetch_add(1, std::memory_order_relaxed);
    // Not stop_issuing: a request counted before this one may not have
    // started yet (on another thread) and must still start.
    if (s->count_mode && n >= s->point.requests) return false;
  }
  int index = -1;
  {
    // Checked again under the lock: once Run has seen nothing in flight
    // after stopping, nothing more may start (Run's caller may free the
    // client).
    absl::MutexLock lock(&s->mu);
    // A blocking caller's request may still hold its slot after its call
    // (a kept product being verified): the next waits for one.
    while (s->point.blocking_calls && s->in_flight >= s->point.concurrency &&
           !s->stop_issuing.load(std::memory_order_relaxed)) {
      ++s->callers_wait_for_slot;
      s->cv.Wait(&s->mu);
      --s->callers_wait_for_slot;
    }
    if (s->stop_issuing.load(std::memory_order_relaxed)) return false;
    ++s->in_flight;
    // Never empty: Run keeps concurrency <= requests, and a request is
    // freed before its slot.
    if (s->exclusive && !s->free_requests.empty()) {
      index = s->free_requests.back();
      s->free_requests.pop_back();
    }
  }
  if (index < 0) {
    index = static_cast<int>(
        s->next_request.fetch_add(1, std::memory_order_relaxed) %
        s->requests->size());
  }
  if (!s->open_loop) start = Clock::now();
  if (s->point.blocking_calls) {
    // gRPC's blocking call: this thread polls for its own reply.
    absl::StatusOr<v1::MultiplyResponse> response =
        !s->encoded->empty()
            ? s->client->MultiplyEncoded((*s->encoded)[index], s->options)
            : s->client->MultiplyRaw(*(*s->requests)[index], s->options);
    OnDone(s, index, start, measured, std::move(response));
    return true;
  }
  auto done = [s, index, start, measured](
                  absl::StatusOr<v1::MultiplyResponse> response) mutable {
    OnDone(std::move(s), index, start, measured, std::move(response));
  };
  if (!s->encoded->empty()) {
    s->client->MultiplyEncodedAsync((*s->encoded)[index], s->options,
                                    std::move(done));
  } else {
    s->client->MultiplyRawAsync(*(*s->requests)[index], s->options,
                                std::move(done));
  }
  return true;
}

// Deletes a kept product. Called while the request that made it still
// counts as in flight, so that Run cannot return before the delete is
// pending.
void DeleteKept(const std::shared_ptr<RunState>& s, const std::string& id) {
  {
    absl::MutexLock lock(&s->mu);
    ++s->pending_deletes;
  }
  s->deletes.fetch_add(1, std::memory_order_relaxed);
  s->client->DeleteAsync(id, s->point.timeout, [s](absl::Status status) {
    if (status.ok()) {
      s->deletes_ok.fetch_add(1, std::memory_order_relaxed);
    } else {
      const int slot = s->CodeSlot(status);
      if (s->delete_code_counts[slot].fetch_add(1, std::memory_order_relaxed) ==
          0) {
        absl::MutexLock lock(&s->mu);
        s->delete_messages.emplace(
            absl::StatusCodeToString(static_cast<absl::StatusCode>(slot)),
            std::string(status.message()));
      }
    }
    absl::MutexLock lock(&s->mu);
    --s->pending_deletes;
    if (s->stop_issuing.load()) s->cv.SignalAll();
  });
}

// Exclusive requests: `index` may be sent again.
void ReleaseRequest(RunState& s, int index) {
  if (!s.exclusive) return;
  absl::MutexLock lock(&s.mu);
  s.free_requests.push_back(index);
}

// The end of a request: counts, frees its slot and, in a closed loop,
// issues its successor. `phase` is the phase when its reply came.
void Complete(const std::shared_ptr<RunState>& s, bool ok, bool measured,
              int phase, Clock::time_point now) {
  if (measured && ok) s->ok.fetch_add(1, std::memory_order_relaxed);
  if (ok && (s->count_mode ? measured : phase == kMeasure)) {
    s->ok_in_window.fetch_add(1, std::memory_order_relaxed);
  }

  bool count_reached = false;
  if (measured) {
    StoreMax(s->last_completion_ns, Nanos(now.time_since_epoch()));
    count_reached =
        s->measured_completed.fetch_add(1, std::memory_order_relaxed) + 1 ==
        s->point.requests;
  }

  {
    absl::MutexLock lock(&s->mu);
    --s->in_flight;
    if (count_reached || s->driver_waits_for_slot ||
        s->callers_wait_for_slot > 0 ||
        (s->in_flight == 0 && s->stop_issuing.load())) {
      s->cv.SignalAll();
    }
  }
  // Blocking calls: the caller's thread issues the successor.
  if (s->open_loop || s->point.blocking_calls) return;
  // Closed loop: the successor.
  if (inline_depth < kMaxInlineDepth) {
    ++inline_depth;
    Issue(s, now);
    --inline_depth;
  } else {
    absl::MutexLock lock(&s->mu);
    ++s->deferred;
    s->cv.SignalAll();
  }
}

// Checks a kept product sampled for verification: downloads it, checks it,
// deletes it, then completes the request.
void VerifyKept(std::shared_ptr<RunState> s, int index, bool measured,
                int phase, Clock::time_point now, std::string id) {
  const std::string id_copy = id;
  s->client->DownloadAsync(
      id_copy, s->point.timeout,
      [s, index, measured, phase, now,
       id = std::move(id)](absl::StatusOr<HostTensor> c) mutable {
        bool ok = true;
        if (!c.ok()) {
          ok = false;
          s->RecordError(s->CodeSlot(c.status()),
                         absl::StrCat("downloading the kept product to verify "
                                      "it: ",
                                      c.status().message()));
        } else {
          v1::MultiplyResponse downloaded;
          absl::Status check = ToProto(*std::move(c), downloaded.mutable_c());
          if (check.ok()) check = (*s->checker)(index, downloaded);
          if (!check.ok()) {
            ok = false;
            s->mismatches.fetch_add(1, std::memory_order_relaxed);
            s->RecordError(kWrongAnswerSlot, check.message());
          }
        }
        DeleteKept(s, id);
        ReleaseRequest(*s, index);
        Complete(s, ok, measured, phase, now);
      });
}

void OnDone(std::shared_ptr<RunState> s, int index, Clock::time_point start,
            bool measured, absl::StatusOr<v1::MultiplyResponse> response) {
  const Clock::time_point now = Clock::now();
  const int phase = s->phase.load(std::memory_order_relaxed);
  bool ok = response.ok();
  bool check = false;
  if (ok && s->response_message_bytes.load(std::memory_order_relaxed) == 0) {
    s->response_message_bytes.store(
        static_cast<int64_t>(response->ByteSizeLong()),
        std::memory_order_relaxed);
  }
  if (measured) {
    if (ok) {
      s->latency_ns.Record(Nanos(now - start));
      const int every = s->point.verify_every;
      if (every > 0 &&
          s->verify_sequence.fetch_add(1, std::memory_order_relaxed) % every ==
              0) {
        s->verified.fetch_add(1, std::memory_order_relaxed);
        check = true;
      }
    } else {
      s->RecordError(s->CodeSlot(response.status()),
                     response.status().message());
    }
  }
  std::string kept;
  if (ok && response->has_c_handle()) kept = response->c_handle().id();
  if (check && !kept.empty()) {
    response = absl::StatusOr<v1::MultiplyResponse>();
    VerifyKept(std::move(s), index, measured, phase, now, std::move(kept));
    return;
  }
  if (check) {
    const absl::Status verdict = (*s->checker)(index, *response);
    if (!verdict.ok()) {
      ok = false;
      s->mismatches.fetch_add(1, std::memory_order_relaxed);
      s->RecordError(kWrongAnswerSlot, verdict.message());
    }
  }
  response = absl::StatusOr<v1::MultiplyResponse>();  // free the payload now
  if (!kept.empty()) DeleteKept(s, kept);
  ReleaseRequest(*s, index);
  Complete(s, ok, measured, phase, now);
}

}  // namespace

LoadGenerator::LoadGenerator(MatmulClient* client,
                             std::vector<const v1::MultiplyRequest*> requests,
                             ResponseChecker checker, Encoding encoding)
    : client_(client),
      requests_(std::move(requests)),
      checker_(std::move(checker)) {
  if (encoding == Encoding::kZeroCopy) {
    for (const v1::MultiplyRequest* request : requests_) {
      encoded_.push_back(EncodeMultiplyRequest(*request));
    }
  }
}

absl::Status CheckLoadPoint(const LoadPoint& point, bool has_checker,
                            size_t requests) {
  if (point.concurrency < 1) {
    return absl::InvalidArgumentError("concurrency must be at least 1");
  }
  if (!(point.rate >= 0) || std::isinf(point.rate)) {
    return absl::InvalidArgumentError("the rate must be finite and >= 0");
  }
  if (point.requests < 0 ||
      (point.requests == 0 && (point.duration <= absl::ZeroDuration() ||
                               point.duration == absl::InfiniteDuration()))) {
    return absl::InvalidArgumentError(
        "a point needs a finite positive duration or a request count");
  }
  if (point.warmup < absl::ZeroDuration() ||
      point.warmup == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("the warm-up must be finite and >= 0");
  }
  if (point.timeout <= absl::ZeroDuration() ||
      point.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("the timeout must be finite and > 0");
  }
  if (point.verify_every < 0 || (point.verify_every > 0 && !has_checker)) {
    return absl::InvalidArgumentError(
        "verification needs verify_every > 0 and a checker");
  }
  if (requests == 0) {
    return absl::InvalidArgumentError("no requests to send");
  }
  if (point.blocking_calls && point.rate > 0) {
    return absl::InvalidArgumentError(
        "blocking calls make a closed loop: not with a rate");
  }
  if (point.blocking_calls && point.concurrency > kMaxBlockingCallers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "blocking calls run a thread per request in flight: "
        "concurrency is at most ",
        kMaxBlockingCallers, " with them, got ", point.concurrency));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> LoadGenerator::Run(
    const LoadPoint& point, const std::atomic<bool>& stop,
    absl::FunctionRef<void(const LoadProgress&)> progress) {
  if (absl::Status checked =
          CheckLoadPoint(point, static_cast<bool>(checker_), requests_.size());
      !checked.ok()) {
    return checked;
  }
  if (exclusive_ &&
      point.concurrency > static_cast<int64_t>(requests_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("exclusive requests: concurrency ", point.concurrency,
                     " is more than the ", requests_.size(), " requests"));
  }

  auto s = std::make_shared<RunState>();
  s->client = client_;
  s->requests = &requests_;
  s->encoded = &encoded_;
  s->checker = &checker_;
  s->point = point;
  s->options.timeout = point.timeout;
  s->open_loop = point.rate > 0;
  s->count_mode = point.requests > 0;
  s->exclusive = exclusive_;
  if (exclusive_) {
    absl::MutexLock lock(&s->mu);
    for (int i = static_cast<int>(requests_.size()) - 1; i >= 0; --i) {
      s->free_requests.push_back(i);
    }
  }

  const Clock::time_point t_start = Clock::now();
  const Clock::time_point warmup_end = t_start + ToClock(point.warmup);
  const bool warmup = point.warmup > absl::ZeroDuration();
  s->phase.store(warmup ? kWarmup : kMeasure);
  Clock::time_point t0 = t_start;
  Clock::time_point t1 = t_start;
  bool window_closed = false;
  LoadResult result;

  // Open loop: the i-th request is due at t_start + i / rate.
  int64_t sent = 0;
  Clock::time_point next_send = t_start;
  bool send_delayed = false;
  auto due = [&](int64_t i) { return load_clock::Due(t_start, point.rate, i); };

  const bool report_progress = point.progress_interval > absl::ZeroDuration();
  Clock::time_point next_progress =
      t_start + (report_progress ? ToClock(point.progress_interval)
                                 : Clock::duration::zero());

  // Blocking calls: a thread per request in flight, each issuing its next
  // as soon as its call returns, until the point stops issuing.
  std::vector<std::thread> callers;
  if (s->point.blocking_calls) {
    callers.reserve(point.concurrency);
    for (int i = 0; i < point.concurrency; ++i) {
      callers.emplace_back([s] {
        while (Issue(s, Clock::now())) {
        }
      });
    }
  } else if (!s->open_loop) {
    for (int i = 0; i < point.concurrency; ++i) {
      if (!Issue(s, Clock::now())) break;
    }
  }

  while (true) {
    Clock::time_point now = Clock::now();
    if (stop.load(std::memory_order_relaxed)) {
      result.interrupted = true;
      break;
    }
    if (s->phase.load() == kWarmup && now >= warmup_end) {
      t0 = now;
      s->phase.store(kMeasure);
    }
    if (s->phase.load() == kMeasure) {
      if (!s->count_mode && now >= t0 + ToClock(point.duration)) {
        t1 = now;
        s->phase.store(kDone);
        window_closed = true;
        break;
      }
      if (s->count_mode && s->measured_completed.load() >= point.requests) {
        break;
      }
    }

    int64_t deferred = 0;
    {
      absl::MutexLock lock(&s->mu);
      std::swap(deferred, s->deferred);
    }
    for (int64_t i = 0; i < deferred; ++i) Issue(s, now);

    // Open loop: start every request that is due, while slots are free.
    bool slot_wait = false;
    while (s->open_loop && !s->stop_issuing.load() && now >= next_send) {
      {
        absl::MutexLock lock(&s->mu);
        if (s->in_flight >= point.concurrency) {
          slot_wait = true;
          if (!send_delayed) {
            send_delayed = true;
            ++result.delayed_starts;
          }
          break;
        }
      }
      if (!Issue(s, next_send)) break;
      send_delayed = false;
      next_send = due(++sent);
      now = Clock::now();
    }

    if (report_progress && now >= next_progress) {
      LoadProgress p;
      p.elapsed = ToAbsl(now - t_start);
      p.warming_up = s->phase.load() == kWarmup;
      p.ok = s->ok_in_window.load();
      const double measured_s =
          p.warming_up ? 0 : std::chrono::duration<double>(now - t0).count();
      p.ok_per_second = measured_s > 0 ? p.ok / measured_s : 0;
      p.errors = s->errors.load();
      {
        absl::MutexLock lock(&s->mu);
        p.in_flight = s->in_flight;
      }
      progress(p);
      while (next_progress <= now) {
        next_progress += ToClock(point.progress_interval);
      }
    }

    // Sleep until the next thing to do, a completion that needs the
    // driver, or a tick.
    Clock::time_point wake = now + kTick;
    if (s->phase.load() == kWarmup) wake = std::min(wake, warmup_end);
    if (s->phase.load() == kMeasure && !s->count_mode) {
      wake = std::min(wake, t0 + ToClock(point.duration));
    }
    if (s->open_loop && !slot_wait) wake = std::min(wake, next_send);
    if (report_progress) wake = std::min(wake, next_progress);
    absl::MutexLock lock(&s->mu);
    s->driver_waits_for_slot = slot_wait;
    const bool work_waiting =
        s->deferred > 0 ||
        (s->count_mode && s->measured_completed.load() >= point.requests) ||
        (slot_wait && s->in_flight < point.concurrency);
    const Clock::time_point before_wait = Clock::now();
    if (!work_waiting && wake > before_wait) {
      s->cv.WaitWithTimeout(&s->mu, ToAbsl(wake - before_wait));
    }
    s->driver_waits_for_slot = false;
  }

  // Stop issuing and wait for what is in flight.
  {
    absl::MutexLock lock(&s->mu);
    s->stop_issuing.store(true);
    s->cv.SignalAll();  // callers waiting for a slot
  }
  const Clock::time_point end = Clock::now();
  if (!window_closed) {
    t1 = end;
    if (s->phase.load() == kWarmup) t0 = end;  // interrupted while warming up
    s->phase.store(kDone);
  }
  result.ok_in_window = s->ok_in_window.load();
  {
    // A request may need a download and a delete after its reply: up to
    // three deadlines.
    const absl::Time give_up = absl::Now() + 3 * point.timeout + kDrainGrace;
    absl::MutexLock lock(&s->mu);
    s->deferred = 0;
    while ((s->in_flight > 0 || s->pending_deletes > 0) &&
           absl::Now() < give_up) {
      s->cv.WaitWithDeadline(&s->mu, give_up);
      s->deferred = 0;  // successors that will never be issued
    }
    result.abandoned = s->in_flight;
    result.abandoned_deletes = s->pending_deletes;
  }
  // Each caller returns within its call's deadline.
  for (std::thread& caller : callers) caller.join();

  if (s->count_mode && !result.interrupted) {
    const Clock::time_point last(
        std::chrono::nanoseconds(s->last_completion_ns.load()));
    result.elapsed = ToAbsl(std::max(last, t0) - t0);
  } else {
    result.elapsed = ToAbsl(t1 - t0);
  }
  if (s->count_mode) result.ok_in_window = s->ok_in_window.load();
  result.completed = s->measured_completed.load();
  result.ok = s->ok.load();
  result.errors = s->errors.load();
  result.verified = s->verified.load();
  result.mismatches = s->mismatches.load();
  for (int slot = 0; slot < kCodeSlots; ++slot) {
    const int64_t n = s->code_counts[slot].load();
    if (n == 0) continue;
    result.errors_by_code[slot == kWrongAnswerSlot
                              ? std::string(kWrongAnswerCode)
                              : absl::StatusCodeToString(
                                    static_cast<absl::StatusCode>(slot))] = n;
  }
  result.deletes = s->deletes.load();
  result.deletes_ok = s->deletes_ok.load();
  for (int slot = 0; slot < kGrpcCodes; ++slot) {
    const int64_t n = s->delete_code_counts[slot].load();
    if (n == 0) continue;
    result.delete_errors += n;
    result.delete_errors_by_code[absl::StatusCodeToString(
        static_cast<absl::StatusCode>(slot))] = n;
  }
  result.response_message_bytes = s->response_message_bytes.load();
  {
    absl::MutexLock lock(&s->mu);
    result.error_messages = s->messages;
    result.delete_error_messages = s->delete_messages;
  }
  result.latency_ns = s->latency_ns;
  return result;
}

}  // namespace matmul
