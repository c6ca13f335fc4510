// MatmulServiceImpl: the matmul.v1.MatmulService RPC handlers, on the gRPC
// callback API. A Multiply is validated, admitted against the in-flight byte
// budget, and handed to the Engine as a job; the engine's completion thread
// finishes the RPC. No handler thread ever waits for compute.
#ifndef MATMUL_SERVER_MATMUL_SERVICE_H_
#define MATMUL_SERVER_MATMUL_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "gpu/engine.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/inflight_bytes.h"
#include "server/request_limits.h"
#include "server/server_metrics.h"

namespace matmul {

// Thread-safe. Must outlive the grpc::Server it is registered with.
class MatmulServiceImpl final : public v1::MatmulService::CallbackService {
 public:
  MatmulServiceImpl(const RequestLimits& limits, std::string version);

  // Installs the engine once it is ready; until then Multiply answers
  // UNAVAILABLE. The engine must outlive every RPC (stop the gRPC server
  // before destroying it).
  void SetEngine(Engine* engine);

  // From now on Multiply answers UNAVAILABLE: the server is going away.
  void StartDraining();

  bool draining() const { return draining_.load(std::memory_order_relaxed); }

  // Multiplies admitted and not yet finished.
  int64_t inflight_requests() const {
    return inflight_requests_.load(std::memory_order_relaxed);
  }
  const InflightBytes& inflight_bytes() const { return inflight_bytes_; }

  // The installed engine, or null while it is starting.
  Engine* engine() const { return engine_.load(std::memory_order_acquire); }

  // Per-request metrics, recorded whether or not they are exported.
  const std::shared_ptr<ServerMetrics>& metrics() const { return metrics_; }

  grpc::ServerUnaryReactor* Multiply(grpc::CallbackServerContext* context,
                                     const v1::MultiplyRequest* request,
                                     v1::MultiplyResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* context,
      const v1::GetServerInfoRequest* request,
      v1::GetServerInfoResponse* response) override;

 private:
  friend class MultiplyReactor;

  const RequestLimits limits_;
  const std::string version_;
  InflightBytes inflight_bytes_;
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> inflight_requests_{0};
  const std::shared_ptr<ServerMetrics> metrics_ =
      std::make_shared<ServerMetrics>();
};

}  // namespace matmul

#endif  // MATMUL_SERVER_MATMUL_SERVICE_H_
