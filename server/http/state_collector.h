// StateCollector: the metrics that are read, not recorded: at each scrape it
// takes one Engine::stats() snapshot and the service's in-flight gauges, so
// the request path does nothing for them.
//
//   matmul_inflight_requests, matmul_inflight_bytes
//   matmul_oldest_request_seconds
//   matmul_queued_requests{device}, matmul_streams{device}
//   matmul_stream_busy_seconds_total{device,stream}
//   matmul_stream_jobs_total{device,stream}
//   matmul_device_busy_seconds_total{device}             (union of streams)
//   matmul_device_compute_busy_seconds_total{device}
//   matmul_device_copy_busy_seconds_total{device}
//   matmul_device_copy_compute_overlap_seconds_total{device}
//   matmul_transfer_bytes_total{device,direction}
//   matmul_flops_total{device,dtype}
//   matmul_pinned_bytes{device,state}
//   matmul_device_memory_used_bytes{device}
//   matmul_build_info{version,cuda}
//   matmul_staging_copy_helpers, matmul_staging_copies_shared_total,
//   matmul_staging_copy_helper_bytes_total
//
// docs/METRICS.md describes every metric.
#ifndef MATMUL_SERVER_HTTP_STATE_COLLECTOR_H_
#define MATMUL_SERVER_HTTP_STATE_COLLECTOR_H_

#include <string>
#include <vector>

#include "gpu/engine.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace matmul {

class MatmulServiceImpl;

// Families for one engine snapshot (no engine-independent ones). Exposed for
// tests.
std::vector<prometheus::MetricFamily> EngineFamilies(const EngineStats& stats);

// Thread-safe (Collect may run on several scrape threads at once). The
// service must outlive it, and so must the service's engine once installed.
class StateCollector final : public prometheus::Collectable {
 public:
  // `cuda`: the CUDA toolkit version the server was built with, or "none".
  StateCollector(const MatmulServiceImpl* service, std::string version,
                 std::string cuda);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const MatmulServiceImpl* const service_;
  const std::string version_;
  const std::string cuda_;
};

// The CUDA toolkit version this binary was built with ("13.0.88"), or "none".
std::string BuildCudaVersion();

}  // namespace matmul

#endif  // MATMUL_SERVER_HTTP_STATE_COLLECTOR_H_
