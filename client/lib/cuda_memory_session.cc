#include "client/lib/cuda_memory_session.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

// Client-side: `t`'s bytes lie inside `bytes`.
absl::Status CheckInside(const SharedTensor& t, int64_t bytes,
                         const char* name) {
  absl::StatusOr<int64_t> size = NumBytes(t.shape, t.dtype);
  if (!size.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", size.status().message()));
  }
  if (t.offset < 0 || t.offset > bytes || *size > bytes - t.offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", *size, " bytes at offset ", t.offset,
                     " do not lie inside the ", bytes, "-byte GPU range"));
  }
  return absl::OkStatus();
}

}  // namespace

struct CudaMemorySession::CallState {
  absl::Mutex mu;
  bool answered ABSL_GUARDED_BY(mu) = false;
  bool ended ABSL_GUARDED_BY(mu) = false;
  v1::SharedMemoryRegion region ABSL_GUARDED_BY(mu);
  absl::Status status ABSL_GUARDED_BY(mu);
};

// The RegisterCudaMemory call: reads the one answer, then keeps reading
// until the server ends the call (or the session cancels it).
class CudaMemorySession::RegistrationCall final
    : public grpc::ClientReadReactor<v1::RegisterCudaMemoryResponse> {
 public:
  explicit RegistrationCall(std::shared_ptr<CallState> state)
      : state_(std::move(state)) {}

  void Start(v1::MatmulService::Stub& stub) {
    stub.async()->RegisterCudaMemory(&context, &request, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    {
      absl::MutexLock lock(&state_->mu);
      if (!state_->answered) {
        state_->answered = true;
        state_->region = response_.region();
      }
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    const std::shared_ptr<CallState> state = state_;
    absl::MutexLock lock(&state->mu);
    state->status = FromGrpcStatus(status);
    state->ended = true;
  }

  grpc::ClientContext context;
  v1::RegisterCudaMemoryRequest request;

 private:
  const std::shared_ptr<CallState> state_;
  v1::RegisterCudaMemoryResponse response_;
};

CudaMemorySession::CudaMemorySession(MatmulClient* client, int64_t bytes,
                                     std::string client_id)
    : client_(client),
      bytes_(bytes),
      client_id_(std::move(client_id)),
      state_(std::make_shared<CallState>()) {}

absl::StatusOr<std::unique_ptr<CudaMemorySession>> CudaMemorySession::Create(
    MatmulClient* client, const CudaMemoryRange& range,
    const CudaMemoryOptions& options) {
  if (client == nullptr) {
    return absl::InvalidArgumentError("cuda memory: the client is null");
  }
  if (range.ipc_handle.size() != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda memory: expected the 64 bytes of a CUDA IPC "
                     "handle, got ",
                     range.ipc_handle.size()));
  }
  if (range.device_uuid.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda memory: expected the 16 bytes of a GPU UUID, got ",
                     range.device_uuid.size()));
  }
  if (range.bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda memory: expected a positive byte count, got ", range.bytes));
  }
  RETURN_IF_ERROR(CheckClientId(options.client_id));
  std::unique_ptr<CudaMemorySession> session(new CudaMemorySession(
      client, range.bytes,
      options.client_id.empty() ? client->client_id() : options.client_id));
  auto call = std::make_unique<RegistrationCall>(session->state_);
  call->request.set_ipc_handle(range.ipc_handle);
  call->request.set_bytes(range.bytes);
  call->request.set_device_uuid(range.device_uuid);
  client->PrepareContext(call->context, absl::InfiniteDuration(),
                         session->client_id_);
  call->Start(client->NextStub());
  session->call_ = std::move(call);

  absl::Status failed;
  {
    CallState& state = *session->state_;
    absl::MutexLock lock(&state.mu);
    auto answered_or_ended = [&state]()
                                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
                                   return state.answered || state.ended;
                                 };
    state.mu.AwaitWithTimeout(absl::Condition(&answered_or_ended),
                              options.register_timeout);
    if (state.answered && !state.ended) {
      session->info_ = state.region;
    } else if (state.ended) {
      failed = state.status.ok()
                   ? absl::InternalError(
                         "the server ended RegisterCudaMemory without "
                         "describing the region")
                   : state.status;
    } else {
      failed = absl::DeadlineExceededError(
          absl::StrCat("the server did not answer RegisterCudaMemory within ",
                       absl::FormatDuration(options.register_timeout)));
    }
  }
  // The destructor cancels the call and waits for it to end.
  if (!failed.ok()) return failed;
  if (session->info_.id().empty()) {
    return absl::InternalError(
        "the server's RegisterCudaMemoryResponse has no region id");
  }
  return session;
}

CudaMemorySession::~CudaMemorySession() {
  if (call_ != nullptr) {
    call_->context.TryCancel();
    absl::MutexLock lock(&state_->mu);
    state_->mu.Await(absl::Condition(&state_->ended));
  }
}

absl::Status CudaMemorySession::registration_status() const {
  absl::MutexLock lock(&state_->mu);
  if (!state_->ended) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the region's registration has ended: ",
                   state_->status.ok() ? "OK" : state_->status.ToString()));
}

absl::StatusOr<SharedTensor> CudaMemorySession::Multiply(
    const SharedTensor& a, const SharedTensor& b, int64_t c_offset,
    const MultiplyOptions& options) {
  RETURN_IF_ERROR(CheckInside(a, bytes_, "a"));
  RETURN_IF_ERROR(CheckInside(b, bytes_, "b"));
  ASSIGN_OR_RETURN(
      std::vector<int64_t> shape,
      ProductShape(a.shape, b.shape, options.transpose_a, options.transpose_b));
  RETURN_IF_ERROR(
      CheckInside(SharedTensor{shape, a.dtype, c_offset}, bytes_, "c"));
  ASSIGN_OR_RETURN(
      v1::MultiplyRequest request,
      MakeSharedMultiplyRequest(info_.id(), a, b, c_offset, options));
  MultiplyOptions call = options;
  if (call.client_id.empty()) call.client_id = client_id_;
  ASSIGN_OR_RETURN(const v1::MultiplyResponse response,
                   client_->MultiplyRaw(request, call));
  return SharedProductFromResponse(response, info_.id(), c_offset, bytes_);
}

}  // namespace matmul
