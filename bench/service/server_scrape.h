// matmul-bench --server-metrics: the server's own counters, scraped from its
// Prometheus endpoint (docs/METRICS.md) before and after a point, so that a
// point can report what the device did for it: GEMM time per request (the
// union of compute spans, summed over devices), engine jobs per request
// (1 when every request is its own launch), and the batching engine's
// launches. Counts taken from the server's side of
// the same interval (its OK Multiply count is the denominator; with
// --stream its OK MultiplyStream multiplies), so the warm-up, which the
// scrape brackets too, cancels out of the ratios.
//
// Plain values and pure functions, except Scrape (a blocking HTTP/1.1 GET).
#ifndef MATMUL_CLIENT_TOOLS_SERVER_SCRAPE_H_
#define MATMUL_CLIENT_TOOLS_SERVER_SCRAPE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace matmul {

// Counter values at one scrape, each summed over its label sets.
struct ServerCounters {
  double compute_busy_s = 0;  // matmul_device_compute_busy_seconds_total
  double device_busy_s = 0;   // matmul_device_busy_seconds_total
  double multiplies_ok =
      0;  // matmul_requests_total{method="Multiply",code="OK"}
  // matmul_requests_total{method="MultiplyStream",code="OK"}: streamed
  // multiplies (one each, however many calls it was striped over).
  double stream_multiplies_ok = 0;
  double engine_jobs = 0;        // matmul_stream_jobs_total
  double launches = 0;           // matmul_batch_size_count
  double launched_requests = 0;  // matmul_batch_size_sum
};

// What happened between two scrapes, per OK multiply where it says so.
struct ServerDelta {
  double multiplies_ok = 0;
  double compute_busy_s = 0;
  double device_busy_s = 0;
  double compute_us_per_request = 0;  // 0 when no multiply finished
  double device_busy_us_per_request = 0;
  double jobs_per_request = 0;
  double launches = 0;
  double launched_requests = 0;
};

// Reads the counters above from Prometheus text format; absent ones are 0.
ServerCounters ParseServerCounters(absl::string_view text);

// `streamed`: the multiplies are the streamed ones (matmul-bench --stream)
// rather than unary Multiply's.
ServerDelta Subtract(const ServerCounters& before, const ServerCounters& after,
                     bool streamed = false);

// "HOST:PORT" or "http://HOST:PORT[/metrics]" into host, port and path
// (default /metrics). INVALID_ARGUMENT for anything else.
struct ScrapeTarget {
  std::string host;
  int port = 0;
  std::string path = "/metrics";
};
absl::StatusOr<ScrapeTarget> ParseScrapeTarget(absl::string_view text);

// GETs the target's page over plain HTTP/1.1 (IPv4 or IPv6 literal, or a
// name getaddrinfo resolves) and parses it. UNAVAILABLE when it cannot
// connect or the answer is not 200.
absl::StatusOr<ServerCounters> Scrape(const ScrapeTarget& target,
                                      absl::Duration timeout);

// The scrape after a point: the server counts a multiply when its RPC is
// done (OnDone), which may come a little after the client has its answer,
// so this scrapes again (every 20 ms, for up to `settle`) until the server
// has counted at least `client_ok` OK multiplies since `before` (`streamed`:
// streamed ones). Returns the last scrape either way.
absl::StatusOr<ServerCounters> ScrapeAfter(const ScrapeTarget& target,
                                           const ServerCounters& before,
                                           double client_ok, bool streamed,
                                           absl::Duration timeout,
                                           absl::Duration settle);

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_SERVER_SCRAPE_H_
