// MatmulServiceImpl: the matmul.v1.MatmulService RPC handlers, on the gRPC
// callback API. No handler thread ever waits for compute: a request is
// validated, admitted (server/admission/admission.h: the one gate for every
// RPC's work) and handed to the Engine as a job, and the engine's completion
// thread finishes the RPC.
//
// Multiply is a raw method: its request is decoded straight from gRPC's
// receive buffers (server/multiply_wire.h), so operand bytes are copied once,
// into the engine's pinned staging, and the product is sent from staging as
// a slice of the response without a copy. Operands may also be stored
// tensors (Upload, or products kept with keep_result) named by handle.
#ifndef MATMUL_SERVER_MATMUL_SERVICE_H_
#define MATMUL_SERVER_MATMUL_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/engine.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/admission/admission.h"
#include "server/handle_registry.h"
#include "server/request_limits.h"
#include "server/request_validation.h"
#include "server/server_metrics.h"

namespace matmul {

// Thread-safe. Must outlive the grpc::Server it is registered with.
// Multiply and MultiplyStream are raw methods (their bytes are decoded by
// hand); the generated CallbackService cannot be the base, since its typed
// MultiplyStream clashes with the raw one.
using MatmulServiceBase = v1::MatmulService::WithRawCallbackMethod_Multiply<
    v1::MatmulService::WithCallbackMethod_GetServerInfo<
        v1::MatmulService::WithCallbackMethod_Upload<
            v1::MatmulService::WithCallbackMethod_Download<
                v1::MatmulService::WithCallbackMethod_Delete<
                    v1::MatmulService::WithRawCallbackMethod_MultiplyStream<
                        v1::MatmulService::Service>>>>>>;

class MatmulServiceImpl final : public MatmulServiceBase {
 public:
  MatmulServiceImpl(const RequestLimits& limits,
                    const HandleLimits& handle_limits, std::string version);

  // Installs the engine once it is ready; until then Multiply answers
  // UNAVAILABLE. The engine must outlive every RPC and every stored tensor
  // (stop the gRPC server and clear handles() before destroying it).
  void SetEngine(Engine* engine) { admission_.SetEngine(engine); }

  // From now on Multiply answers UNAVAILABLE: the server is going away.
  void StartDraining() { admission_.StartDraining(); }

  bool draining() const { return admission_.draining(); }

  // Work admitted and not yet finished (multiplies, streamed multiplies,
  // transfers).
  int64_t inflight_requests() const { return admission_.inflight_requests(); }
  const InflightBytes& inflight_bytes() const {
    return admission_.inflight_bytes();
  }

  // The installed engine, or null while it is starting.
  Engine* engine() const { return admission_.engine(); }

  // The admission core every RPC's work passes.
  Admission& admission() { return admission_; }

  // Per-request metrics, recorded whether or not they are exported.
  const std::shared_ptr<ServerMetrics>& metrics() const { return metrics_; }

  // Stored tensors.
  HandleRegistry& handles() { return handles_; }
  const HandleRegistry& handles() const { return handles_; }

  // Bytes the server copied in user space on the Multiply path: operand
  // bytes copied from gRPC's buffers into staging, and result bytes copied
  // out of staging into a response. Each request's operands are copied
  // exactly once and its result not at all (see docs/WIRE.md).
  int64_t copied_operand_bytes() const {
    return copied_operand_bytes_.load(std::memory_order_relaxed);
  }
  int64_t copied_result_bytes() const {
    return copied_result_bytes_.load(std::memory_order_relaxed);
  }

  grpc::ServerUnaryReactor* Multiply(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // A MultiplyStream call (server/multiply_stream_reactor.h).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MultiplyStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* context,
      const v1::GetServerInfoRequest* request,
      v1::GetServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* Upload(grpc::CallbackServerContext* context,
                                   const v1::UploadRequest* request,
                                   v1::UploadResponse* response) override;
  grpc::ServerUnaryReactor* Download(grpc::CallbackServerContext* context,
                                     const v1::DownloadRequest* request,
                                     v1::DownloadResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const v1::DeleteRequest* request,
                                   v1::DeleteResponse* response) override;

  // The client a stored tensor is charged to: the "x-matmul-client"
  // metadata if the call has it, else the peer's address without its port.
  static std::string ClientKey(const grpc::CallbackServerContext& context);

  // Replaces `operand`'s header with the stored tensor `handle` names (for
  // the operand called `name` in messages); `shape` keeps its shape.
  static absl::Status ResolveHandle(const HandleRegistry& handles,
                                    const std::string& handle, const char* name,
                                    OperandHeader& operand,
                                    std::shared_ptr<ResidentTensor>& tensor,
                                    std::vector<int64_t>& shape);
  static void FillHandle(const HandleRegistry::Entry& entry,
                         v1::TensorHandle* out);

 private:
  friend class JobReactor;
  friend class MultiplyReactor;
  friend class TransferReactor;
  friend class MultiplyStreamReactor;

  const RequestLimits limits_;
  const std::string version_;
  const std::shared_ptr<ServerMetrics> metrics_ =
      std::make_shared<ServerMetrics>();
  HandleRegistry handles_;
  // After handles_ and metrics_, which it uses.
  Admission admission_;
  std::atomic<int64_t> copied_operand_bytes_{0};
  std::atomic<int64_t> copied_result_bytes_{0};
};

}  // namespace matmul

#endif  // MATMUL_SERVER_MATMUL_SERVICE_H_
