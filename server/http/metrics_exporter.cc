#include "server/http/metrics_exporter.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/http/process_collector.h"
#include "server/http/state_collector.h"
#include "server/http/timeline.h"
#include "server/rpc/matmul_service.h"

namespace matmul {
namespace {

constexpr char kTextFormat[] = "text/plain; version=0.0.4; charset=utf-8";

constexpr char kIndex[] =
    "matmul-server metrics port\n"
    "  /metrics             Prometheus metrics (docs/METRICS.md)\n"
    "  /timeline?seconds=N  stream activity of the last N seconds "
    "(default 2, at most 60), Chrome trace JSON\n";

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const std::string& address, const MatmulServiceImpl* service,
    const std::string& version) {
  std::unique_ptr<MetricsExporter> self(new MetricsExporter(service));
  self->collectables_.push_back(service->metrics());
  self->collectables_.push_back(
      std::make_shared<StateCollector>(service, version, BuildCudaVersion()));
  self->collectables_.push_back(std::make_shared<ProcessCollector>());
  absl::StatusOr<std::unique_ptr<HttpServer>> http = HttpServer::Start(
      address, [exporter = self.get()](const HttpRequest& request) {
        return exporter->Handle(request);
      });
  if (!http.ok()) return http.status();
  self->http_ = std::move(*http);
  return self;
}

MetricsExporter::MetricsExporter(const MatmulServiceImpl* service)
    : service_(service) {}

MetricsExporter::~MetricsExporter() { http_.reset(); }

std::string MetricsExporter::Scrape() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : collectables_) {
    for (prometheus::MetricFamily& f : c->Collect()) {
      families.push_back(std::move(f));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

absl::StatusOr<std::string> MetricsExporter::Timeline(
    const std::string& seconds) const {
  absl::StatusOr<absl::Duration> window = ParseTimelineWindow(seconds);
  if (!window.ok()) return window.status();
  const Engine* engine = service_->engine();
  if (engine == nullptr) {
    return absl::UnavailableError("the engine is still starting");
  }
  return TimelineJson(engine->info(), engine->RecentSpans(*window), *window);
}

HttpResponse MetricsExporter::Handle(const HttpRequest& request) const {
  if (request.path == "/metrics") {
    return {200, kTextFormat, Scrape()};
  }
  if (request.path == "/timeline") {
    const std::optional<std::string> seconds =
        QueryParameter(request.query, "seconds");
    absl::StatusOr<std::string> body = Timeline(seconds.value_or(""));
    if (!body.ok()) {
      return {absl::IsInvalidArgument(body.status()) ? 400 : 503,
              "text/plain; charset=utf-8",
              absl::StrCat(body.status().message(), "\n")};
    }
    return {200, "application/json", *std::move(body)};
  }
  if (request.path == "/") return {200, "text/plain; charset=utf-8", kIndex};
  return {404, "text/plain; charset=utf-8", "not found; see /\n"};
}

}  // namespace matmul
