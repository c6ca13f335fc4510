#include "client/lib/shared_memory_session.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/dtype_mapping.h"

namespace matmul {
namespace {

absl::Status CheckShape(absl::Span<const int64_t> shape, const char* name) {
  if (shape.size() != 2 && shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": shape ", ShapeString(shape), " has ", shape.size(),
        " dimension(s); expected 2-D [rows, cols] or 3-D [batch, rows, cols]"));
  }
  absl::StatusOr<int64_t> elements = NumElements(shape);
  if (!elements.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", elements.status().message()));
  }
  return absl::OkStatus();
}

// The bytes of `t`, checked to lie inside a region of `region_bytes`.
absl::StatusOr<int64_t> PlacedBytes(const SharedTensor& t, int64_t region_bytes,
                                    const char* name) {
  RETURN_IF_ERROR(CheckShape(t.shape, name));
  absl::StatusOr<int64_t> bytes = NumBytes(t.shape, t.dtype);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", bytes.status().message()));
  }
  if (t.offset < 0 || t.offset > region_bytes ||
      *bytes > region_bytes - t.offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", *bytes, " bytes at offset ", t.offset,
                     " do not lie inside the ", region_bytes, "-byte region"));
  }
  return *bytes;
}

}  // namespace

// What the registration call shares with the session; the call's reactions
// hold a reference of their own, so the session may free the call as soon
// as `ended` is set.
struct SharedMemorySession::CallState {
  absl::Mutex mu;
  bool answered ABSL_GUARDED_BY(mu) = false;
  bool ended ABSL_GUARDED_BY(mu) = false;
  v1::SharedMemoryRegion region ABSL_GUARDED_BY(mu);
  absl::Status status ABSL_GUARDED_BY(mu);
};

// The RegisterSharedMemory call: reads the one answer, then keeps reading
// until the server ends the call (or the session cancels it).
class SharedMemorySession::RegistrationCall final
    : public grpc::ClientReadReactor<v1::RegisterSharedMemoryResponse> {
 public:
  explicit RegistrationCall(std::shared_ptr<CallState> state)
      : state_(std::move(state)) {}

  void Start(v1::MatmulService::Stub& stub) {
    stub.async()->RegisterSharedMemory(&context, &request, this);
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
  v1::RegisterSharedMemoryRequest request;

 private:
  const std::shared_ptr<CallState> state_;
  v1::RegisterSharedMemoryResponse response_;
};

absl::StatusOr<std::vector<int64_t>> ProductShape(absl::Span<const int64_t> a,
                                                  absl::Span<const int64_t> b,
                                                  bool transpose_a,
                                                  bool transpose_b) {
  RETURN_IF_ERROR(CheckShape(a, "a"));
  RETURN_IF_ERROR(CheckShape(b, "b"));
  const size_t ar = a.size(), br = b.size();
  const int64_t m = transpose_a ? a[ar - 1] : a[ar - 2];
  const int64_t ka = transpose_a ? a[ar - 2] : a[ar - 1];
  const int64_t kb = transpose_b ? b[br - 1] : b[br - 2];
  const int64_t n = transpose_b ? b[br - 2] : b[br - 1];
  if (ka != kb) {
    return absl::InvalidArgumentError(
        absl::StrCat("inner dimensions differ: op(a) is ", m, " x ", ka,
                     ", op(b) is ", kb, " x ", n));
  }
  if (ar == 2 && br == 2) return std::vector<int64_t>{m, n};
  const int64_t ab = ar == 3 ? a[0] : 1, bb = br == 3 ? b[0] : 1;
  if (ab != bb && ab != 1 && bb != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batches differ: a has ", ab, ", b has ", bb, " (and neither is 1)"));
  }
  return std::vector<int64_t>{std::max(ab, bb), m, n};
}

absl::StatusOr<v1::MultiplyRequest> MakeSharedMultiplyRequest(
    absl::string_view region_id, const SharedTensor& a, const SharedTensor& b,
    int64_t c_offset, const MultiplyOptions& options) {
  if (region_id.empty()) {
    return absl::InvalidArgumentError("shared memory: the region id is empty");
  }
  if (options.keep_result) {
    return absl::InvalidArgumentError(
        "MultiplyOptions.keep_result is set: a shared-memory multiply writes "
        "the product into the region");
  }
  RETURN_IF_ERROR(CheckShape(a.shape, "a"));
  RETURN_IF_ERROR(CheckShape(b.shape, "b"));
  if (a.dtype != b.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("a is ", DTypeName(a.dtype), " and b is ",
                     DTypeName(b.dtype), "; both must have the same dtype"));
  }
  for (auto [offset, name] :
       {std::make_pair(a.offset, "a"), std::make_pair(b.offset, "b"),
        std::make_pair(c_offset, "c")}) {
    if (offset < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": negative offset ", offset));
    }
  }
  v1::MultiplyRequest request;
  for (auto [t, out] : {std::make_pair(&a, request.mutable_a()),
                        std::make_pair(&b, request.mutable_b())}) {
    out->mutable_shape()->Assign(t->shape.begin(), t->shape.end());
    out->set_dtype(DTypeToProto(t->dtype));
    out->mutable_shared()->set_region_id(std::string(region_id));
    out->mutable_shared()->set_offset(t->offset);
  }
  request.mutable_c_shared()->set_region_id(std::string(region_id));
  request.mutable_c_shared()->set_offset(c_offset);
  request.set_transpose_a(options.transpose_a);
  request.set_transpose_b(options.transpose_b);
  request.set_compute_mode(ComputeModeToProto(options.compute));
  return request;
}

absl::StatusOr<SharedTensor> SharedProductFromResponse(
    const v1::MultiplyResponse& response, absl::string_view region_id,
    int64_t c_offset, int64_t region_bytes) {
  auto malformed = [](absl::string_view why) {
    return absl::InternalError(absl::StrCat(
        "the server's answer to a shared-memory multiply is malformed: ", why));
  };
  if (!response.has_c()) return malformed("it has no c");
  const v1::Tensor& c = response.c();
  if (!c.data().empty()) {
    return malformed("c carries data instead of a place in the region");
  }
  if (!c.has_shared() || c.shared().region_id() != region_id ||
      c.shared().offset() != c_offset) {
    return malformed(absl::StrCat("c is not at offset ", c_offset,
                                  " of region ", region_id));
  }
  std::optional<DType> dtype = DTypeFromProto(c.dtype());
  if (!dtype.has_value()) {
    return malformed(absl::StrCat("unknown dtype ", c.dtype()));
  }
  SharedTensor out;
  out.shape.assign(c.shape().begin(), c.shape().end());
  out.dtype = *dtype;
  out.offset = c_offset;
  absl::StatusOr<int64_t> bytes = PlacedBytes(out, region_bytes, "c");
  if (!bytes.ok()) return malformed(bytes.status().message());
  return out;
}

SharedMemorySession::SharedMemorySession(MatmulClient* client,
                                         SharedMemoryObject region,
                                         std::string client_id)
    : client_(client),
      object_(std::move(region)),
      client_id_(std::move(client_id)),
      state_(std::make_shared<CallState>()) {}

absl::StatusOr<std::unique_ptr<SharedMemorySession>>
SharedMemorySession::Create(MatmulClient* client, int64_t bytes,
                            const SharedMemoryOptions& options) {
  if (client == nullptr) {
    return absl::InvalidArgumentError("shared memory: the client is null");
  }
  RETURN_IF_ERROR(CheckClientId(options.client_id));
  ASSIGN_OR_RETURN(SharedMemoryObject region,
                   SharedMemoryObject::Create(bytes, options.object));
  std::unique_ptr<SharedMemorySession> session(new SharedMemorySession(
      client, std::move(region),
      options.client_id.empty() ? client->client_id() : options.client_id));
  auto call = std::make_unique<RegistrationCall>(session->state_);
  call->request.set_name(session->object_.name());
  call->request.set_bytes(session->object_.size());
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
                         "the server ended RegisterSharedMemory without "
                         "describing the region")
                   : state.status;
    } else {
      failed = absl::DeadlineExceededError(
          absl::StrCat("the server did not answer RegisterSharedMemory within ",
                       absl::FormatDuration(options.register_timeout)));
    }
  }
  // The destructor cancels the call and waits for it to end.
  if (!failed.ok()) return failed;
  if (session->info_.id().empty()) {
    return absl::InternalError(
        "the server's RegisterSharedMemoryResponse has no region id");
  }
  if (options.unlink_when_registered) {
    RETURN_IF_ERROR(session->object_.Unlink());
  }
  return session;
}

SharedMemorySession::~SharedMemorySession() {
  if (call_ != nullptr) {
    call_->context.TryCancel();
    absl::MutexLock lock(&state_->mu);
    state_->mu.Await(absl::Condition(&state_->ended));
  }
  // call_ and then object_ go with the members.
}

absl::Status SharedMemorySession::registration_status() const {
  absl::MutexLock lock(&state_->mu);
  if (!state_->ended) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the region's registration has ended: ",
                   state_->status.ok() ? "OK" : state_->status.ToString()));
}

absl::StatusOr<SharedTensor> SharedMemorySession::Allocate(
    std::vector<int64_t> shape, DType dtype) {
  RETURN_IF_ERROR(CheckShape(shape, "tensor"));
  absl::StatusOr<int64_t> bytes = NumBytes(shape, dtype);
  if (!bytes.ok()) return absl::InvalidArgumentError(bytes.status().message());
  absl::MutexLock lock(&mu_);
  const int64_t at = (next_offset_ + kSharedTensorAlignment - 1) /
                     kSharedTensorAlignment * kSharedTensorAlignment;
  if (at > object_.size() || *bytes > object_.size() - at) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "shared memory: a ", ShapeString(shape), " ", DTypeName(dtype),
        " tensor (", *bytes, " bytes) does not fit at offset ", at, " of the ",
        object_.size(), "-byte region"));
  }
  next_offset_ = at + *bytes;
  return SharedTensor{std::move(shape), dtype, at};
}

void SharedMemorySession::Reset() {
  absl::MutexLock lock(&mu_);
  next_offset_ = 0;
}

absl::StatusOr<absl::Span<char>> SharedMemorySession::Bytes(
    const SharedTensor& t) {
  ASSIGN_OR_RETURN(const int64_t bytes,
                   PlacedBytes(t, object_.size(), "tensor"));
  return absl::MakeSpan(object_.data() + t.offset, static_cast<size_t>(bytes));
}

absl::StatusOr<SharedTensor> SharedMemorySession::Put(
    const HostTensor& tensor) {
  RETURN_IF_ERROR(CheckHostTensor(tensor));
  ASSIGN_OR_RETURN(SharedTensor t, Allocate(tensor.shape, tensor.dtype));
  ASSIGN_OR_RETURN(absl::Span<char> bytes, Bytes(t));
  if (!bytes.empty())
    std::memcpy(bytes.data(), tensor.data.data(), bytes.size());
  return t;
}

absl::StatusOr<HostTensor> SharedMemorySession::Get(const SharedTensor& t) {
  ASSIGN_OR_RETURN(absl::Span<char> bytes, Bytes(t));
  HostTensor out;
  out.shape = t.shape;
  out.dtype = t.dtype;
  out.data.assign(bytes.data(), bytes.size());
  return out;
}

absl::StatusOr<SharedTensor> SharedMemorySession::Multiply(
    const SharedTensor& a, const SharedTensor& b, int64_t c_offset,
    const MultiplyOptions& options) {
  RETURN_IF_ERROR(PlacedBytes(a, object_.size(), "a").status());
  RETURN_IF_ERROR(PlacedBytes(b, object_.size(), "b").status());
  ASSIGN_OR_RETURN(
      std::vector<int64_t> shape,
      ProductShape(a.shape, b.shape, options.transpose_a, options.transpose_b));
  RETURN_IF_ERROR(
      PlacedBytes(SharedTensor{shape, a.dtype, c_offset}, object_.size(), "c")
          .status());
  ASSIGN_OR_RETURN(
      v1::MultiplyRequest request,
      MakeSharedMultiplyRequest(info_.id(), a, b, c_offset, options));
  MultiplyOptions call = options;
  if (call.client_id.empty()) call.client_id = client_id_;
  ASSIGN_OR_RETURN(const v1::MultiplyResponse response,
                   client_->MultiplyRaw(request, call));
  return SharedProductFromResponse(response, info_.id(), c_offset,
                                   object_.size());
}

absl::Status SharedMemorySession::Unregister(absl::Duration timeout) {
  RETURN_IF_ERROR(UnregisterById(client_, info_.id(), timeout, client_id_));
  absl::MutexLock lock(&state_->mu);
  if (!state_->mu.AwaitWithTimeout(absl::Condition(&state_->ended), timeout)) {
    return absl::DeadlineExceededError(
        "UnregisterSharedMemory succeeded, but the registration call has not "
        "ended");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::SharedMemoryRegion>> SharedMemorySession::List(
    MatmulClient* client, absl::Duration timeout,
    const std::string& client_id) {
  RETURN_IF_ERROR(CheckClientId(client_id));
  grpc::ClientContext context;
  client->PrepareContext(context, timeout, client_id);
  v1::ListSharedMemoryResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(client->NextStub().ListSharedMemory(
      &context, v1::ListSharedMemoryRequest(), &response)));
  return std::vector<v1::SharedMemoryRegion>(response.regions().begin(),
                                             response.regions().end());
}

absl::Status SharedMemorySession::UnregisterById(MatmulClient* client,
                                                 const std::string& region_id,
                                                 absl::Duration timeout,
                                                 const std::string& client_id) {
  if (region_id.empty()) {
    return absl::InvalidArgumentError("shared memory: the region id is empty");
  }
  RETURN_IF_ERROR(CheckClientId(client_id));
  grpc::ClientContext context;
  client->PrepareContext(context, timeout, client_id);
  v1::UnregisterSharedMemoryRequest request;
  request.set_region_id(region_id);
  v1::UnregisterSharedMemoryResponse response;
  return FromGrpcStatus(
      client->NextStub().UnregisterSharedMemory(&context, request, &response));
}

}  // namespace matmul
