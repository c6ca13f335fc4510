// MatmulServiceImpl: the matmul.v1.MatmulService registered with gRPC, on
// the callback API. It owns the state the RPC adapters share
// (server/rpc/service_state.h) and hands each call to its adapter:
//   Multiply                  server/rpc/multiply.h
//   MultiplyStream            server/rpc/multiply_stream.h
//   Upload, Download, Delete  server/rpc/transfers.h
//   UploadStream,
//   DownloadStream            server/rpc/stored_tensor_streams.h
//   GetServerInfo             server/rpc/server_info.h
//   RegisterSharedMemory,
//   RegisterCudaMemory,
//   UnregisterSharedMemory,
//   ListSharedMemory          server/rpc/shared_memory.h
// No handler thread ever waits for compute: an adapter validates its
// request, admits it (server/admission/admission.h: the one gate for every
// RPC's work) and hands it to the Engine as a job, and the engine's
// completion thread finishes the RPC.
#ifndef MATMUL_SERVER_RPC_MATMUL_SERVICE_H_
#define MATMUL_SERVER_RPC_MATMUL_SERVICE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "gpu/engine.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/admission/admission.h"
#include "server/handle_registry.h"
#include "server/request_limits.h"
#include "server/rpc/multiply.h"
#include "server/rpc/multiply_stream.h"
#include "server/rpc/server_info.h"
#include "server/rpc/service_state.h"
#include "server/rpc/shared_memory.h"
#include "server/rpc/stored_tensor_streams.h"
#include "server/rpc/transfers.h"
#include "server/server_metrics.h"

namespace matmul {

// The chunked stored-tensor methods, innermost of
// MatmulServiceBase (UploadStream, DownloadStream).
using StoredTensorStreamsBase =
    v1::MatmulService::WithRawCallbackMethod_UploadStream<
        v1::MatmulService::WithRawCallbackMethod_DownloadStream<
            v1::MatmulService::Service>>;

// Thread-safe. Must outlive the grpc::Server it is registered with.
// Every method is raw. Multiply and MultiplyStream decode their bytes by
// hand; the others parse them into their request message
// (server/rpc/raw_messages.h), so that bytes which are not one get
// INVALID_ARGUMENT saying so rather than gRPC's bare UNIMPLEMENTED.
using CudaMemoryBase =
    v1::MatmulService::WithRawCallbackMethod_RegisterCudaMemory<
        StoredTensorStreamsBase>;
using MatmulServiceBase = v1::MatmulService::WithRawCallbackMethod_Multiply<
    v1::MatmulService::WithRawCallbackMethod_GetServerInfo<
        v1::MatmulService::WithRawCallbackMethod_Upload<
            v1::MatmulService::WithRawCallbackMethod_Download<
                v1::MatmulService::WithRawCallbackMethod_Delete<
                    v1::MatmulService::WithRawCallbackMethod_MultiplyStream<
                        v1::MatmulService::
                            WithRawCallbackMethod_RegisterSharedMemory<
                                v1::MatmulService::
                                    WithRawCallbackMethod_UnregisterSharedMemory<
                                        v1::MatmulService::
                                            WithRawCallbackMethod_ListSharedMemory<
                                                CudaMemoryBase>>>>>>>>>;

class MatmulServiceImpl final : public MatmulServiceBase {
 public:
  MatmulServiceImpl(const RequestLimits& limits,
                    const HandleLimits& handle_limits, std::string version,
                    const StagingCopyOptions& staging_copy = {})
      : state_(limits, handle_limits, std::move(version), staging_copy) {}

  // Installs the engine once it is ready; until then Multiply answers
  // UNAVAILABLE. The engine must outlive every RPC and every stored tensor
  // (stop the gRPC server and clear handles() before destroying it).
  void SetEngine(Engine* engine) { state_.admission.SetEngine(engine); }

  // From now on new work is refused UNAVAILABLE: the server is going away.
  // Streams with nothing open end at once; the others after their answers.
  void StartDraining() {
    state_.admission.StartDraining();
    state_.calls.Draining();
  }

  // Unary calls and streams that have not ended yet (GetServerInfo and
  // Delete, answered at once, are not counted).
  size_t calls_in_progress() const { return state_.calls.size(); }
  // Such calls started since the server did, ended or not.
  uint64_t calls_started() const { return state_.calls.started(); }

  // Waits until every call has ended, or `deadline`; true if they have.
  bool AwaitCallsEnded(absl::Time deadline) const {
    return state_.calls.AwaitEmpty(deadline);
  }

  // The drain's deadline: every call still running is answered
  // UNAVAILABLE (retryable) and its work dropped.
  void CutCallsForDrain() { state_.calls.CutForDrain(); }

  bool draining() const { return state_.admission.draining(); }

  // The striped MultiplyStream multiplies: open now, their joins matched,
  // and joins waiting for their start.
  const StripeRegistry& stripes() const { return state_.stripes; }

  // Work admitted and not yet finished (multiplies, streamed multiplies,
  // transfers).
  int64_t inflight_requests() const {
    return state_.admission.inflight_requests();
  }
  const InflightBytes& inflight_bytes() const {
    return state_.admission.inflight_bytes();
  }
  // How long the oldest request still in progress (a Multiply, Upload or
  // Download call, queued or running; not an open MultiplyStream or region
  // registration) has been so; zero when there is none.
  absl::Duration oldest_request_age() const {
    return state_.calls.OldestRequestAge(std::chrono::steady_clock::now());
  }

  // The installed engine, or null while it is starting.
  Engine* engine() const { return state_.admission.engine(); }

  // The admission core every RPC's work passes.
  Admission& admission() { return state_.admission; }

  // Per-request metrics, recorded whether or not they are exported.
  const std::shared_ptr<ServerMetrics>& metrics() const {
    return state_.metrics;
  }

  // Stored tensors.
  HandleRegistry& handles() { return state_.handles; }
  const HandleRegistry& handles() const { return state_.handles; }

  // Registered shared-memory regions.
  SharedMemoryRegistry& regions() { return state_.regions; }
  const SharedMemoryRegistry& regions() const { return state_.regions; }

  // Bytes the server copied in user space: operand bytes copied from
  // gRPC's buffers into staging (Multiply, MultiplyStream), and result bytes
  // copied out of staging into a response (only Download does). A
  // multiply's operands are copied exactly once and its product not at all
  // (see docs/WIRE.md).
  int64_t copied_operand_bytes() const {
    return state_.copied_operand_bytes.load(std::memory_order_relaxed);
  }
  int64_t copied_result_bytes() const {
    return state_.copied_result_bytes.load(std::memory_order_relaxed);
  }
  // What copied those operand bytes: the dispatching threads alone, or
  // with the staging-copy helpers.
  const StagingCopier& staging_copier() const { return state_.staging_copier; }

  grpc::ServerUnaryReactor* Multiply(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    return StartMultiply(state_, context, request, response);
  }
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MultiplyStream(
      grpc::CallbackServerContext* context) override {
    return StartMultiplyStream(state_, context);
  }
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override {
    return matmul::GetServerInfo(state_, context, request, response);
  }
  grpc::ServerUnaryReactor* Upload(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override {
    return StartUpload(state_, context, request, response);
  }
  grpc::ServerUnaryReactor* Download(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    return StartDownload(state_, context, request, response);
  }
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadStream(
      grpc::CallbackServerContext* context,
      grpc::ByteBuffer* response) override {
    return StartUploadStream(state_, context, response);
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* DownloadStream(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override {
    return StartDownloadStream(state_, context, request);
  }
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override {
    return DeleteHandle(state_, context, request, response);
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* RegisterSharedMemory(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override {
    return StartRegisterSharedMemory(state_, context, request);
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* RegisterCudaMemory(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override {
    return StartRegisterCudaMemory(state_, context, request);
  }
  grpc::ServerUnaryReactor* UnregisterSharedMemory(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
      grpc::ByteBuffer* response) override {
    return matmul::UnregisterSharedMemory(state_, context, request, response);
  }
  grpc::ServerUnaryReactor* ListSharedMemory(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
      grpc::ByteBuffer* response) override {
    return matmul::ListSharedMemory(state_, context, request, response);
  }

 private:
  ServiceState state_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_MATMUL_SERVICE_H_
