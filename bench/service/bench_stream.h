// `matmul-bench --stream`: the load of one measurement point when every
// multiply travels over a MultiplyStream call (MatmulClient's
// MultiplyStreamedView, client/lib/matmul_client.h) instead of a unary
// Multiply: the operands go out in chunks of StreamOptions::chunk_bytes
// from the workload's own memory (not copied), the product comes back in
// chunks, and with StreamOptions::stripes > 1 each multiply is striped over
// that many calls on as many connections.
//
// MultiplyStreamedView blocks, so the load is a pool of worker threads,
// one per request in flight at most (LoadPoint::concurrency), sending the
// workload's requests in rotation. The two disciplines are LoadGenerator's
// (load_generator.h):
//  - closed loop (rate 0): each worker starts its next multiply as soon as
//    the last one returned; latency from the call's start to its return.
//  - open loop (rate > 0): requests are due on a fixed schedule, `rate` per
//    second from the point's start (load_clock::Due). A worker that is free
//    takes the next due start off the shared schedule and waits for it; a
//    start that was already due when a worker came free for it found every
//    worker busy: it starts at once, late, and counts in
//    LoadResult::delayed_starts. Latency runs from the scheduled start, so
//    a server that falls behind shows in the latencies (no coordinated
//    omission).
// Everything else is as LoadGenerator's: a warm-up, then a window of
// LoadPoint::duration (requests started in it are measured; the successful
// completions in it count for throughput) or exactly LoadPoint::requests
// requests; successful calls only in the latencies; the first successful
// measured product and every verify_every-th checked (holding its worker
// meanwhile), a wrong one an error WRONG_ANSWER; errors by gRPC code.
// `stop` ends the point after the calls in flight (each has the point's
// timeout as its deadline; workers waiting for a scheduled start give it
// up), so nothing is ever abandoned. LoadResult::response_message_bytes is
// the product's payload (the chunks' framing aside).
//
// Thread safety: one point at a time (Run is not reentrant); the client,
// the workload and the checker must outlive the generator. The checker is
// called from the worker threads, concurrently.
#ifndef MATMUL_CLIENT_TOOLS_BENCH_STREAM_H_
#define MATMUL_CLIENT_TOOLS_BENCH_STREAM_H_

#include <atomic>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "bench/service/bench_workload.h"
#include "bench/service/load_generator.h"
#include "client/lib/matmul_client.h"

namespace matmul {

class StreamLoadGenerator {
 public:
  // Sends `workload`'s requests (their operands as data; transposes and
  // compute mode as the requests say) in rotation.
  StreamLoadGenerator(MatmulClient* client, const Workload& workload,
                      const StreamOptions& stream,
                      LoadGenerator::ResponseChecker checker);

  StreamLoadGenerator(const StreamLoadGenerator&) = delete;
  StreamLoadGenerator& operator=(const StreamLoadGenerator&) = delete;

  // Runs one point. INVALID_ARGUMENT as LoadGenerator::Run (CheckLoadPoint).
  absl::StatusOr<LoadResult> Run(
      const LoadPoint& point, const std::atomic<bool>& stop,
      absl::FunctionRef<void(const LoadProgress&)> progress);

 private:
  // One of the workload's requests, as MultiplyStreamedView takes it.
  struct Request {
    StreamedOperand a;
    StreamedOperand b;
    MultiplyOptions options;
  };

  MatmulClient* client_;
  StreamOptions stream_;
  std::vector<Request> requests_;
  LoadGenerator::ResponseChecker checker_;
};

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_BENCH_STREAM_H_
