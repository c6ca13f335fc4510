#include "server/rpc/shared_memory.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/bounded_text.h"
#include "common/status_macros.h"
#include "matmul/v1/matmul.pb.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/call_registry.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_messages.h"
#include "server/rpc/stored_tensors.h"
#include "server/shared_memory/region_registry.h"
#include "server/unix_socket_listener.h"

namespace matmul {
namespace {

void FillRegion(const SharedMemoryRegion& region, v1::SharedMemoryRegion* out) {
  out->set_id(region.id());
  out->set_name(region.name());
  out->set_bytes(region.bytes());
  out->set_pinned(region.pinned());
  out->set_multiplies_in_flight(region.multiplies_in_flight());
  const bool cuda = region.kind() == SharedMemoryRegion::Kind::kCuda;
  out->set_kind(cuda ? v1::REGION_KIND_CUDA : v1::REGION_KIND_SYSTEM);
  out->set_device_uuid(region.device_uuid());
}

// One RegisterSharedMemory call. It holds the region's registration for as
// long as it is open; the registry holds a reference to it (taken before
// registering, given back by the region's on_removed) so that an
// UnregisterSharedMemory can end it whichever thread runs first.
//
// The call ends exactly once, with the first of: a failed registration, the
// client's cancel (or a failed write: the client is gone), Unregister (OK),
// or the drain's start (UNAVAILABLE). Ending removes the region from the
// registry; it stays mapped while multiplies use it. A Finish asked for
// while the one response is being written waits for OnWriteDone.
class RegisterReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                              public DrainableCall {
 public:
  // `cuda`: a RegisterCudaMemory call; RegisterSharedMemory otherwise.
  RegisterReactor(ServiceState& state, grpc::CallbackServerContext* context,
                  bool cuda)
      : state_(state), context_(context), cuda_(cuda) {
    state_.calls.AddOpen(this);
  }

  void Start(const grpc::ByteBuffer* request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override {
    End(grpc::Status(grpc::StatusCode::CANCELLED,
                     "the registration was cancelled; the region is "
                     "unregistered"));
  }
  void OnDone() override {
    state_.calls.Remove(this);
    state_.metrics->RecordRequest(cuda_ ? RpcMethod::kRegisterCudaMemory
                                        : RpcMethod::kRegisterSharedMemory,
                                  code_.load(std::memory_order_acquire),
                                  setup_seconds_.load());
    Unref();
  }

  // DrainableCall. An open registration holds nothing a drain waits for:
  // it ends at the drain's start, and clients register again elsewhere.
  void Ref() override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() override {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  void Draining() override {
    End(ToGrpcStatus(absl::UnavailableError(
        "the server is shutting down; the region is unregistered")));
  }
  void CutForDrain() override { Draining(); }

 private:
  ~RegisterReactor() override = default;

  // Parses the request and registers its region.
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> Register(
      const grpc::ByteBuffer* request, const PeerCredentials& peer);
  // The one response, describing `region`.
  absl::Status Describe(const SharedMemoryRegion& region);
  // The region left the registry (Unregister: `unregistered`).
  void OnRemoved(bool unregistered);
  // Removes the region, if any, and finishes the call, once.
  void End(const grpc::Status& status);
  void FinishRpc(const grpc::Status& status);

  ServiceState& state_;
  grpc::CallbackServerContext* const context_;
  const bool cuda_;
  const std::chrono::steady_clock::time_point started_ =
      std::chrono::steady_clock::now();
  std::atomic<double> setup_seconds_{0};
  std::atomic<grpc::StatusCode> code_{grpc::StatusCode::UNKNOWN};
  std::atomic<int> refs_{1};  // gRPC's, until OnDone
  grpc::ByteBuffer response_;

  absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // A Finish asked for during the write.
  std::optional<grpc::Status> finish_after_write_ ABSL_GUARDED_BY(mu_);
  // The registered region, while it is in the registry.
  std::string region_id_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> RegisterReactor::Register(
    const grpc::ByteBuffer* request, const PeerCredentials& peer) {
  auto on_removed = [this](bool unregistered) { OnRemoved(unregistered); };
  if (cuda_) {
    v1::RegisterCudaMemoryRequest parsed;
    RETURN_IF_ERROR(ParseRequest(*context_, request, parsed));
    return state_.regions.RegisterCuda(
        ClientKey(*context_), peer, parsed.ipc_handle(), parsed.bytes(),
        parsed.device_uuid(), *state_.admission.engine(), on_removed);
  }
  v1::RegisterSharedMemoryRequest parsed;
  RETURN_IF_ERROR(ParseRequest(*context_, request, parsed));
  return state_.regions.Register(ClientKey(*context_), peer, parsed.name(),
                                 parsed.bytes(), *state_.admission.engine(),
                                 on_removed);
}

absl::Status RegisterReactor::Describe(const SharedMemoryRegion& region) {
  if (cuda_) {
    v1::RegisterCudaMemoryResponse response;
    FillRegion(region, response.mutable_region());
    return SerializeResponse(response, &response_);
  }
  v1::RegisterSharedMemoryResponse response;
  FillRegion(region, response.mutable_region());
  return SerializeResponse(response, &response_);
}

void RegisterReactor::Start(const grpc::ByteBuffer* request) {
  absl::StatusOr<PeerCredentials> peer =
      SharedMemoryPeer(*context_, state_.regions);
  absl::Status status = peer.status();
  // Draining, or the engine still starting: the admission core's check.
  if (status.ok()) status = state_.admission.CheckOpen();
  if (!status.ok()) {
    if (status.code() != absl::StatusCode::kUnavailable) {
      state_.admission.RecordRejection(RequestRejection(status));
    }
    End(ToGrpcStatus(status));
    return;
  }
  // The region's bytes are charged to the client's stored-bytes quota by
  // the registry (the same HandleRegistry limits Admit enforces for
  // stored tensors); they are the client's memory, not server memory in
  // flight, so they take nothing of the in-flight budget.
  Ref();  // the registry's, given back by on_removed
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> region =
      Register(request, *peer);
  setup_seconds_.store(SecondsSince(started_));
  if (!region.ok()) {
    Unref();  // on_removed is never called
    state_.admission.RecordRejection(
        region.status().code() == absl::StatusCode::kResourceExhausted
            ? RejectReason::kQuota
            : RejectReason::kInvalid);
    End(ToGrpcStatus(region.status()));
    return;
  }
  if (absl::Status s = Describe(**region); !s.ok()) {
    state_.regions.Remove((*region)->id());
    End(ToGrpcStatus(s));
    return;
  }
  bool open = false;
  {
    absl::MutexLock lock(&mu_);
    if (!ended_) {
      region_id_ = (*region)->id();
      writing_ = open = true;
    }
  }
  if (!open) {
    // Cancelled or drained while registering: the call has ended already.
    state_.regions.Remove((*region)->id());
    return;
  }
  StartWrite(&response_);
}

void RegisterReactor::OnWriteDone(bool ok) {
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    finish = std::exchange(finish_after_write_, std::nullopt);
  }
  if (finish.has_value()) {
    FinishRpc(*finish);
  } else if (!ok) {
    End(grpc::Status(grpc::StatusCode::CANCELLED,
                     "the client went away; the region is unregistered"));
  }
}

void RegisterReactor::OnRemoved(bool unregistered) {
  {
    absl::MutexLock lock(&mu_);
    region_id_.clear();  // gone from the registry already
  }
  if (unregistered) End(grpc::Status::OK);
  Unref();
}

void RegisterReactor::End(const grpc::Status& status) {
  std::string region_id;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
    region_id = region_id_;
  }
  if (!region_id.empty()) state_.regions.Remove(region_id);
  {
    absl::MutexLock lock(&mu_);
    if (writing_) {
      finish_after_write_ = status;
      return;
    }
  }
  FinishRpc(status);
}

void RegisterReactor::FinishRpc(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
  }
  code_.store(status.error_code(), std::memory_order_release);
  Finish(status);
}

// Unregister and List: answered at once on the calling thread.
grpc::ServerUnaryReactor* Answer(ServiceState& state,
                                 grpc::CallbackServerContext* context,
                                 RpcMethod method,
                                 std::chrono::steady_clock::time_point started,
                                 absl::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!status.ok()) state.admission.RecordRejection(RequestRejection(status));
  const grpc::Status reply = ToGrpcStatus(status);
  state.metrics->RecordRequest(method, reply.error_code(),
                               SecondsSince(started));
  reactor->Finish(reply);
  return reactor;
}

}  // namespace

absl::StatusOr<PeerCredentials> SharedMemoryPeer(
    const grpc::CallbackServerContext& context,
    const SharedMemoryRegistry& regions) {
  const std::string peer = context.peer();
  const std::optional<UnixPeer> unix_peer = PeerOfCall(peer);
  if (!unix_peer.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shared memory is only for clients on the server's host, connected "
        "through its Unix socket (--unix_socket); this call came from ",
        BoundedForMessage(peer)));
  }
  if (absl::Status allowed = regions.CheckPeer(unix_peer->credentials);
      !allowed.ok()) {
    return allowed;
  }
  return unix_peer->credentials;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartRegisterSharedMemory(
    ServiceState& state, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request) {
  auto* reactor = new RegisterReactor(state, context, /*cuda=*/false);
  reactor->Start(request);
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartRegisterCudaMemory(
    ServiceState& state, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request) {
  auto* reactor = new RegisterReactor(state, context, /*cuda=*/true);
  reactor->Start(request);
  return reactor;
}

grpc::ServerUnaryReactor* UnregisterSharedMemory(
    ServiceState& state, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  const auto started = std::chrono::steady_clock::now();
  v1::UnregisterSharedMemoryRequest parsed;
  absl::Status status = SharedMemoryPeer(*context, state.regions).status();
  if (status.ok()) status = ParseRequest(*context, request, parsed);
  if (status.ok()) {
    status = state.regions.Unregister(ClientKey(*context), parsed.region_id());
  }
  if (status.ok()) {
    status = SerializeResponse(v1::UnregisterSharedMemoryResponse(), response);
  }
  return Answer(state, context, RpcMethod::kUnregisterSharedMemory, started,
                status);
}

grpc::ServerUnaryReactor* ListSharedMemory(ServiceState& state,
                                           grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) {
  const auto started = std::chrono::steady_clock::now();
  v1::ListSharedMemoryRequest parsed;
  absl::Status status = SharedMemoryPeer(*context, state.regions).status();
  if (status.ok()) status = ParseRequest(*context, request, parsed);
  if (status.ok()) {
    v1::ListSharedMemoryResponse list;
    for (const auto& region : state.regions.List(ClientKey(*context))) {
      FillRegion(*region, list.add_regions());
    }
    status = SerializeResponse(list, response);
  }
  return Answer(state, context, RpcMethod::kListSharedMemory, started, status);
}

}  // namespace matmul
