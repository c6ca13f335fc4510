// ServiceState: what every RPC adapter in server/rpc/ shares, owned by
// MatmulServiceImpl and handed to each adapter by reference: the request
// limits, the metrics, the stored tensors, the shared-memory regions and the
// admission core every RPC's work passes. Adapters reach nothing else of the
// service.
#ifndef MATMUL_SERVER_RPC_SERVICE_STATE_H_
#define MATMUL_SERVER_RPC_SERVICE_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "server/admission/admission.h"
#include "server/handle_registry.h"
#include "server/request_limits.h"
#include "server/rpc/call_registry.h"
#include "server/rpc/stripe_registry.h"
#include "server/server_metrics.h"
#include "server/shared_memory/region_registry.h"
#include "server/staging_copier.h"

namespace matmul {

// Thread-safe (each part is).
struct ServiceState {
  ServiceState(const RequestLimits& request_limits,
               const HandleLimits& handle_limits, std::string server_version,
               const StagingCopyOptions& staging_copy = {})
      : limits(request_limits),
        version(std::move(server_version)),
        handles(handle_limits),
        regions(&handles,
                SharedMemoryLimits{
                    handle_limits.max_shared_memory_regions_per_client,
                    handle_limits.shared_memory_peers},
                metrics->shared_memory_gauges()),
        admission(request_limits.max_inflight_bytes, &handles, metrics.get()),
        stripes(absl::Milliseconds(request_limits.stripe_join_timeout_ms)),
        staging_copier(staging_copy) {}

  ServiceState(const ServiceState&) = delete;
  ServiceState& operator=(const ServiceState&) = delete;

  const RequestLimits limits;
  const std::string version;
  // Per-request metrics, recorded whether or not they are exported.
  const std::shared_ptr<ServerMetrics> metrics =
      std::make_shared<ServerMetrics>();
  HandleRegistry handles;
  // Registered shared-memory regions (charged to handles' quotas).
  SharedMemoryRegistry regions;
  // After handles and metrics, which it uses.
  Admission admission;
  // The calls a drain ends itself.
  CallRegistry calls;
  // Open striped MultiplyStream multiplies, for their joins.
  StripeRegistry stripes;
  // Copies inline operands (gRPC's receive buffers) into engine staging.
  StagingCopier staging_copier;
  // Bytes copied in user space (see MatmulServiceImpl::copied_operand_bytes).
  std::atomic<int64_t> copied_operand_bytes{0};
  std::atomic<int64_t> copied_result_bytes{0};
};

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_SERVICE_STATE_H_
