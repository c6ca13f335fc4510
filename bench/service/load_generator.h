// LoadGenerator: drives one measurement point of matmul-bench against a
// server, through MatmulClient's asynchronous callback API on prebuilt
// requests (sent as they are: the generator copies no payload).
//
// Two disciplines:
//  - closed loop (rate 0): `concurrency` requests are kept in flight; each
//    completion issues the next one at once, from the gRPC thread that ran
//    it. Latency runs from the moment a request is handed to gRPC. With
//    LoadPoint::blocking_calls, `concurrency` threads each make a blocking
//    call and then the next, as the transport ceiling's client does.
//  - open loop (rate > 0): requests are started on a fixed schedule,
//    `rate` per second, with `concurrency` as the cap on requests in flight.
//    A request whose slot is not free yet waits for one; its latency still
//    runs from its scheduled start, so a server that falls behind shows in
//    the latencies (no coordinated omission).
//
// A point is a warm-up (same load, nothing recorded), then the measurement:
//  - by duration: requests started during [t0, t0 + duration] are measured
//    (latency, errors, verification; the ones still in flight at the end are
//    waited for); throughput counts the successful completions that fall in
//    the window, divided by the window.
//  - by count: the first `requests` requests started after the warm-up are
//    measured; throughput is their successes over the time from t0 to the
//    last of their completions.
// Latency percentiles cover successful RPCs only (an error that comes back
// at once would otherwise look like a fast request). A response that fails
// verification is an error with code "WRONG_ANSWER".
//
// Kept products: a successful response that carries a c_handle (the request
// set keep_result) is followed by an asynchronous Delete of that handle,
// which counts in neither latency nor throughput; deletes and their errors
// are reported apart (LoadResult::deletes...). A kept product sampled for
// verification is downloaded first and checked, then deleted; its request
// holds its slot until then.
//
// Every point ends by itself: after its duration or count, or when `stop`
// becomes true (then marked interrupted). Each request carries a deadline
// (LoadPoint::timeout), so waiting for the stragglers is bounded too.
//
// Thread safety: a LoadGenerator runs one point at a time (Run is not
// reentrant); the client, the requests and the checker must outlive it. The
// checker is called from gRPC threads, concurrently.
#ifndef MATMUL_CLIENT_TOOLS_LOAD_GENERATOR_H_
#define MATMUL_CLIENT_TOOLS_LOAD_GENERATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bench/service/latency_histogram.h"
#include "client/lib/matmul_client.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

// The error code recorded for a response that fails verification.
inline constexpr char kWrongAnswerCode[] = "WRONG_ANSWER";

struct LoadPoint {
  // Closed loop: requests kept in flight. Open loop: the most in flight.
  int concurrency = 1;
  // Requests started per second (open loop); 0 for a closed loop.
  double rate = 0;
  // How long to measure; used when `requests` is 0.
  absl::Duration duration = absl::Seconds(5);
  // When positive: measure exactly this many requests instead.
  int64_t requests = 0;
  // Load applied before measuring; nothing of it is recorded.
  absl::Duration warmup = absl::Seconds(1);
  // Each request's deadline. Must be finite and positive.
  absl::Duration timeout = absl::Seconds(60);
  // 0: no verification; n > 0: check the first successful measured
  // response and every n-th after it.
  int verify_every = 0;
  // How often `progress` is called (zero: never).
  absl::Duration progress_interval = absl::ZeroDuration();
  // Closed loop only: a thread per request in flight, each making gRPC's
  // blocking call (the thread polls for its own reply, as the transport
  // ceiling's rawclient does) and then the next, instead of callbacks on
  // gRPC's threads. At most kMaxBlockingCallers.
  bool blocking_calls = false;
};

// LoadPoint::blocking_calls: the most requests in flight (threads).
inline constexpr int kMaxBlockingCallers = 256;

// What a progress callback sees.
struct LoadProgress {
  absl::Duration elapsed;  // since the point started, warm-up included
  bool warming_up = false;
  int64_t ok = 0;            // successful completions in the window so far
  double ok_per_second = 0;  // ok / time measured so far
  int64_t errors = 0;        // measured errors so far
  int64_t in_flight = 0;
};

struct LoadResult {
  // Measurement window that throughput is divided by.
  absl::Duration elapsed;
  // Successful completions counted for throughput (see the file comment).
  int64_t ok_in_window = 0;
  // Measured requests that completed: successes and errors.
  int64_t completed = 0;
  int64_t ok = 0;
  int64_t errors = 0;
  // Errors by gRPC status code name ("RESOURCE_EXHAUSTED", ...) and
  // "WRONG_ANSWER"; with the first message seen for each.
  std::map<std::string, int64_t> errors_by_code;
  std::map<std::string, std::string> error_messages;
  // Responses checked, and how many of them were wrong.
  int64_t verified = 0;
  int64_t mismatches = 0;
  // Latency of the measured successful requests, in nanoseconds.
  LatencyHistogram latency_ns;
  // Open loop: starts that found every slot busy and had to wait.
  int64_t delayed_starts = 0;
  // `stop` ended the point early.
  bool interrupted = false;
  // Requests that did not complete within timeout + grace after the end
  // (should not happen: every request has a deadline).
  int64_t abandoned = 0;
  // Deletes of kept products (warm-up included): issued, succeeded, failed
  // (by gRPC code name, with the first message for each), and still
  // unanswered at the end.
  int64_t deletes = 0;
  int64_t deletes_ok = 0;
  int64_t delete_errors = 0;
  std::map<std::string, int64_t> delete_errors_by_code;
  std::map<std::string, std::string> delete_error_messages;
  int64_t abandoned_deletes = 0;
  // Serialized size of a successful MultiplyResponse (0 if none).
  int64_t response_message_bytes = 0;
};

// The checks every point passes before it runs, whichever generator sends
// it: INVALID_ARGUMENT naming the first one that fails.
// `has_checker`: a response checker is set; `requests`: how many distinct
// requests there are to send.
absl::Status CheckLoadPoint(const LoadPoint& point, bool has_checker,
                            size_t requests);

class LoadGenerator {
 public:
  // Checks a successful response to requests[index]: OK, or an error whose
  // message describes the mismatch. Called concurrently from gRPC threads.
  using ResponseChecker = std::function<absl::Status(
      int index, const v1::MultiplyResponse& response)>;

  // How requests are put on the wire: encoded once up front, their
  // operands sent from memory (EncodeMultiplyRequest, as MatmulClient's
  // Multiply does), or serialized by protobuf on every call, which copies
  // each operand byte (MultiplyRawAsync).
  enum class Encoding { kZeroCopy, kProtobuf };

  // `requests` are sent in rotation (several distinct ones defeat any
  // caching); none may be null. `checker` may be empty when no point
  // verifies. kZeroCopy keeps an encoded copy of each request.
  LoadGenerator(MatmulClient* client,
                std::vector<const v1::MultiplyRequest*> requests,
                ResponseChecker checker,
                Encoding encoding = Encoding::kZeroCopy);

  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  // Each request on at most one call at a time (its product goes to one
  // place: a shared-memory region's C); Run then refuses a point whose
  // concurrency is more than the requests (INVALID_ARGUMENT). Off by
  // default: requests rotate whatever is in flight.
  void set_exclusive_requests(bool exclusive) { exclusive_ = exclusive; }

  // Runs one point and returns its figures. INVALID_ARGUMENT for a point
  // that makes no sense (no concurrency, a negative rate, no end, an
  // infinite timeout, verification without a checker).
  absl::StatusOr<LoadResult> Run(
      const LoadPoint& point, const std::atomic<bool>& stop,
      absl::FunctionRef<void(const LoadProgress&)> progress);

 private:
  MatmulClient* client_;
  std::vector<const v1::MultiplyRequest*> requests_;
  std::vector<grpc::ByteBuffer> encoded_;  // kZeroCopy: requests_, encoded
  ResponseChecker checker_;
  bool exclusive_ = false;
};

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_LOAD_GENERATOR_H_
