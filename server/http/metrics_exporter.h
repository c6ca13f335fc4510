// MetricsExporter: the server's HTTP side port (--metrics-port):
//   GET /metrics            Prometheus text format 0.0.4: ServerMetrics
//                           (recorded per request) and StateCollector
//                           (engine stats, read at scrape time) and
//                           ProcessCollector (process_*, from /proc)
//   GET /timeline?seconds=N the last N seconds (default 2, at most 60) of
//                           stream activity as Chrome trace JSON (timeline.h)
// The metric families are prometheus-cpp Collectables, serialized with its
// TextSerializer; the HTTP side is HttpServer (see there why not the
// prometheus-cpp Exposer).
#ifndef MATMUL_SERVER_HTTP_METRICS_EXPORTER_H_
#define MATMUL_SERVER_HTTP_METRICS_EXPORTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "server/http/http_server.h"

namespace matmul {

class MatmulServiceImpl;

// Thread-safe. The service (and its engine, once installed) must outlive it.
class MetricsExporter {
 public:
  // Listens on `address` ("127.0.0.1:0", "0.0.0.0:9464", "[::]:9464").
  // UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(
      const std::string& address, const MatmulServiceImpl* service,
      const std::string& version);

  // Stops serving; blocks until running requests have been answered.
  ~MetricsExporter();

  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The bound port.
  int port() const { return http_->port(); }

  // The /metrics body.
  std::string Scrape() const;

  // The /timeline body for a `seconds` query value (empty: the default), or
  // INVALID_ARGUMENT, or UNAVAILABLE while the engine starts.
  absl::StatusOr<std::string> Timeline(const std::string& seconds) const;

 private:
  explicit MetricsExporter(const MatmulServiceImpl* service);

  HttpResponse Handle(const HttpRequest& request) const;

  const MatmulServiceImpl* const service_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<HttpServer> http_;  // last: stops before the rest goes
};

}  // namespace matmul

#endif  // MATMUL_SERVER_HTTP_METRICS_EXPORTER_H_
