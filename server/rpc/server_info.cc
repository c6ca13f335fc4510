#include "server/rpc/server_info.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/dtype_mapping.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_messages.h"

namespace matmul {

namespace {

// The response, from the engine's description and the server's limits.
void Describe(const ServiceState& state, const EngineInfo& info,
              v1::GetServerInfoResponse* response) {
  response->set_engine(info.name);
  response->set_version(state.version);
  response->set_streams_per_device(info.streams_per_device);
  for (const DeviceInfo& d : info.devices) {
    v1::Device* out = response->add_devices();
    out->set_index(d.index);
    out->set_name(d.name);
    out->set_uuid(d.uuid);
    out->set_memory_bytes(d.memory_bytes);
    out->set_multiprocessors(d.multiprocessors);
    out->set_copy_engines(d.copy_engines);
    out->set_compute_capability(d.compute_capability);
    out->set_staging_bytes(d.staging_bytes);
  }
  for (DType t : info.dtypes) response->add_dtypes(DTypeToProto(t));
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(state.limits.max_message_bytes);
  limits->set_max_elements_per_operand(state.limits.max_elements_per_operand);
  limits->set_max_inflight_bytes(state.limits.max_inflight_bytes);
  limits->set_max_dimension(state.limits.max_dimension);
  const HandleLimits handle_limits = state.handles.limits();
  limits->set_max_stored_bytes(handle_limits.max_bytes_total);
  limits->set_max_stored_bytes_per_client(handle_limits.max_bytes_per_client);
  limits->set_max_handles_per_client(handle_limits.max_handles_per_client);
  limits->set_default_handle_ttl_seconds(
      absl::ToInt64Seconds(handle_limits.default_ttl));
  limits->set_max_handle_ttl_seconds(
      absl::ToInt64Seconds(handle_limits.max_ttl));
}

}  // namespace

grpc::ServerUnaryReactor* GetServerInfo(ServiceState& state,
                                        grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) {
  const auto started = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto finish = [&](const grpc::Status& status) {
    state.metrics->RecordRequest(RpcMethod::kGetServerInfo, status.error_code(),
                                 SecondsSince(started));
    reactor->Finish(status);
  };
  v1::GetServerInfoRequest parsed;
  if (absl::Status s = ParseRequest(*context, request, parsed); !s.ok()) {
    state.admission.RecordRejection(RequestRejection(s));
    finish(ToGrpcStatus(s));
    return reactor;
  }
  Engine* engine = state.admission.engine();
  if (engine == nullptr) {
    finish(
        ToGrpcStatus(absl::UnavailableError("the engine is still starting")));
    return reactor;
  }
  v1::GetServerInfoResponse info;
  Describe(state, engine->info(), &info);
  finish(ToGrpcStatus(SerializeResponse(info, response)));
  return reactor;
}

}  // namespace matmul
