#include "server/matmul_service.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/grpc_status.h"
#include "server/multiply_stream_reactor.h"
#include "server/multiply_wire.h"
#include "server/request_validation.h"

namespace matmul {
namespace {

bool DeadlinePassed(std::chrono::system_clock::time_point deadline) {
  return deadline != std::chrono::system_clock::time_point::max() &&
         std::chrono::system_clock::now() >= deadline;
}

double SecondsSince(std::chrono::steady_clock::time_point since,
                    std::chrono::steady_clock::time_point now) {
  return std::chrono::duration<double>(now - since).count();
}

// The API shape of a [batch, rows, cols] tensor.
std::vector<int64_t> ApiShape(bool is_3d, int64_t batch, int64_t rows,
                              int64_t cols) {
  if (is_3d) return {batch, rows, cols};
  return {rows, cols};
}

}  // namespace

// The life cycle shared by RPCs whose work is an engine job. The reactor
// lives until both gRPC is done with it (OnDone) and, if a job was
// submitted, the engine has finished it (Complete): two references. The
// RPC is finished exactly once, by whichever comes first of the job's
// result and a cancellation (client cancel, deadline, or the drain
// deadline); a job that outlives its RPC never touches the request or the
// response again, so a stuck job cannot hold up shutdown.
class JobReactor : public grpc::ServerUnaryReactor {
 public:
  JobReactor(MatmulServiceImpl* service, grpc::CallbackServerContext* context,
             RpcMethod method)
      : service_(service),
        context_(context),
        method_(method),
        deadline_(context->deadline()) {}

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      // An operand copy in progress reads the request: let it end first.
      mu_.Await(absl::Condition(this, &JobReactor::NotWriting));
      if (finished_) return;
      finished_ = true;
    }
    RecordCancel();
    FinishRpc(grpc::Status(grpc::StatusCode::CANCELLED,
                           "the request was cancelled or its deadline passed"));
  }

  void OnDone() override {
    RecordDone();
    Unref();
  }

  // Engine side.
  absl::Status Abandoned() const {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ || finished_) {
        return absl::CancelledError("the request was cancelled");
      }
    }
    if (DeadlinePassed(deadline_)) {
      return absl::DeadlineExceededError(
          "the deadline passed while the request was queued");
    }
    return absl::OkStatus();
  }
  virtual absl::Status WriteOperands(absl::Span<std::byte> a,
                                     absl::Span<std::byte> b) = 0;
  void Complete(const MatmulSpec& spec, absl::StatusOr<JobResult> result) {
    absl::Cleanup unref = [this] { Unref(); };
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // cancelled meanwhile: the result is dropped
      finished_ = true;
    }
    // From here on nothing else touches the response until Finish.
    if (!result.ok()) {
      service_->admission_.RecordFailure(result.status());
      FinishRpc(ToGrpcStatus(result.status()));
      return;
    }
    if (method_ == RpcMethod::kMultiply) {
      service_->metrics_->RecordStages(result->timings());
    }
    computed_at_ = std::chrono::steady_clock::now();
    computed_ = true;
    FinishRpc(ToGrpcStatus(Respond(spec, *result)));
  }

  // The lease is a member: it is released when the reactor goes, after
  // both the RPC and the job are done.
  ~JobReactor() override = default;

  // Builds the response from a job's result (engine thread).
  virtual absl::Status Respond(const MatmulSpec& spec, JobResult& result) = 0;

  // False, with the RPC finished UNAVAILABLE, while the server drains or
  // the engine is starting: the admission core's early check.
  bool Open() {
    absl::Status open = service_->admission_.CheckOpen();
    if (open.ok()) return true;
    FinishWith(open);  // counted by the core
    return false;
  }

  // Admits `op` (the deadline is the call's), or finishes the RPC with the
  // core's refusal, and its retry hint when it has one; true if admitted.
  bool Admit(Operation op) {
    op.deadline = DeadlineOf(*context_);
    absl::StatusOr<Lease> lease = service_->admission_.Admit(op);
    if (!lease.ok()) {
      if (std::optional<int64_t> ms = RetryPushbackMs(lease.status())) {
        context_->AddTrailingMetadata("grpc-retry-pushback-ms",
                                      std::to_string(*ms));
      }
      FinishWith(lease.status());  // counted by the core
      return false;
    }
    lease_ = std::move(*lease);
    return true;
  }

  // Submits to the admitted lease's engine.
  void Submit(std::unique_ptr<MatmulJob> job) {
    refs_.fetch_add(1, std::memory_order_relaxed);  // the job's reference
    lease_.engine()->Submit(std::move(job));
  }

  // Runs `copy`, which reads the request, unless the RPC was cancelled;
  // OnCancel waits for it, since finishing lets gRPC free the request.
  absl::Status Copy(absl::FunctionRef<void()> copy) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ || finished_) {
        return absl::CancelledError("the request was cancelled");
      }
      writing_ = true;
    }
    copy();
    absl::MutexLock lock(&mu_);
    writing_ = false;
    return absl::OkStatus();
  }

  // Finishes the RPC unless a cancellation already did; true if it did.
  bool FinishWith(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return false;
      finished_ = true;
    }
    FinishRpc(ToGrpcStatus(status));
    return true;
  }

  // FinishWith, counted as a rejection for `reason`.
  void Reject(RejectReason reason, const absl::Status& status) {
    if (FinishWith(status)) service_->admission_.RecordRejection(reason);
  }

  MatmulServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  // What admission granted; empty until Admit.
  Lease lease_;

 private:
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Every Finish goes through here, so that OnDone knows the code. The
  // release store publishes what was recorded before it to OnDone, which
  // runs on another thread (gRPC's own ordering is invisible to TSan).
  void FinishRpc(const grpc::Status& status) {
    code_.store(status.error_code(), std::memory_order_release);
    Finish(status);
  }

  void RecordCancel() {
    // gRPC does not say why it cancelled. Its deadline timer can fire a few
    // milliseconds before the system clock reaches deadline_ (measured: up
    // to 3 ms), so a cancel that close to the deadline counts as the
    // deadline's.
    const bool deadline =
        deadline_ != std::chrono::system_clock::time_point::max() &&
        std::chrono::system_clock::now() + std::chrono::milliseconds(50) >=
            deadline_;
    service_->admission_.RecordRejection(deadline ? RejectReason::kDeadline
                                                  : RejectReason::kCancelled);
  }

  void RecordDone() {
    const grpc::StatusCode code = code_.load(std::memory_order_acquire);
    const auto now = std::chrono::steady_clock::now();
    ServerMetrics& metrics = *service_->metrics_;
    if (computed_ && method_ == RpcMethod::kMultiply) {
      metrics.RecordStage(Stage::kReply, SecondsSince(computed_at_, now));
    }
    metrics.RecordRequest(method_, code, SecondsSince(started_, now));
  }

  bool NotWriting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !writing_;
  }

  const RpcMethod method_;
  const std::chrono::system_clock::time_point deadline_;
  std::atomic<int> refs_{1};
  // For metrics; written before Finish, read in OnDone.
  const std::chrono::steady_clock::time_point started_ =
      std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point computed_at_;
  bool computed_ = false;
  std::atomic<grpc::StatusCode> code_{grpc::StatusCode::UNKNOWN};

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
};

namespace {

// The engine's view of a reactor's work.
class ReactorJob final : public MatmulJob {
 public:
  struct Plan {
    MatmulSpec spec;
    JobKind kind = JobKind::kMultiply;
    std::shared_ptr<ResidentTensor> resident_a;
    std::shared_ptr<ResidentTensor> resident_b;
    bool keep_result = false;
    int device = -1;
  };

  ReactorJob(JobReactor* reactor, Plan plan)
      : reactor_(reactor), plan_(std::move(plan)) {}

  const MatmulSpec& spec() const override { return plan_.spec; }
  JobKind kind() const override { return plan_.kind; }
  std::shared_ptr<ResidentTensor> resident_a() const override {
    return plan_.resident_a;
  }
  std::shared_ptr<ResidentTensor> resident_b() const override {
    return plan_.resident_b;
  }
  bool keep_result() const override { return plan_.keep_result; }
  int device() const override { return plan_.device; }
  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    return reactor_->WriteOperands(a, b);
  }
  void Done(absl::StatusOr<JobResult> result) override {
    reactor_->Complete(plan_.spec, std::move(result));
  }
  absl::Status Abandoned() const override { return reactor_->Abandoned(); }

 private:
  JobReactor* const reactor_;
  const Plan plan_;
};

}  // namespace

// Multiply, decoded from the wire without copying operand data.
class MultiplyReactor final : public JobReactor {
 public:
  MultiplyReactor(MatmulServiceImpl* service,
                  grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : JobReactor(service, context, RpcMethod::kMultiply),
        request_(request),
        response_(response) {}

  void Start();

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    const int64_t want_a = a.empty() ? 0 : wire_.a.data_bytes;
    const int64_t want_b = b.empty() ? 0 : wire_.b.data_bytes;
    if (static_cast<int64_t>(a.size()) != want_a ||
        static_cast<int64_t>(b.size()) != want_b) {
      return absl::InternalError(absl::StrCat("staging size mismatch: a ",
                                              a.size(), " vs ", want_a, ", b ",
                                              b.size(), " vs ", want_b));
    }
    absl::Status copied = Copy([&] {
      if (!a.empty()) CopyPieces(wire_.a.data, a.data());
      if (!b.empty()) CopyPieces(wire_.b.data, b.data());
    });
    if (copied.ok()) {
      service_->copied_operand_bytes_.fetch_add(
          static_cast<int64_t>(a.size() + b.size()), std::memory_order_relaxed);
    }
    return copied;
  }

 private:
  absl::Status Respond(const MatmulSpec& spec, JobResult& result) override;

  const grpc::ByteBuffer* const request_;
  grpc::ByteBuffer* const response_;
  std::vector<grpc::Slice> slices_;  // the request's bytes, referenced
  std::vector<ByteChunk> chunks_;
  WireMultiplyRequest wire_;
  std::vector<int64_t> a_shape_;  // of stored operands
  std::vector<int64_t> b_shape_;
  bool keep_result_ = false;
  absl::Duration keep_ttl_;
};

absl::Status MatmulServiceImpl::ResolveHandle(
    const HandleRegistry& handles, const std::string& handle, const char* name,
    OperandHeader& operand, std::shared_ptr<ResidentTensor>& tensor,
    std::vector<int64_t>& shape) {
  if (operand.present) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " and ", name, "_handle are both set; set exactly one"));
  }
  absl::StatusOr<HandleRegistry::Entry> entry = handles.Get(handle);
  if (!entry.ok()) {
    return absl::Status(
        entry.status().code(),
        absl::StrCat(name, "_handle: ", entry.status().message()));
  }
  tensor = entry->tensor;
  shape = entry->shape;
  operand.present = true;
  operand.shape = absl::MakeConstSpan(shape);
  operand.dtype = DTypeToProto(tensor->dtype());
  operand.data_bytes = tensor->bytes();
  return absl::OkStatus();
}

void MatmulServiceImpl::FillHandle(const HandleRegistry::Entry& entry,
                                   v1::TensorHandle* out) {
  out->set_id(entry.id);
  for (int64_t d : entry.shape) out->add_shape(d);
  out->set_dtype(DTypeToProto(entry.tensor->dtype()));
  out->set_device(entry.tensor->device());
  out->set_bytes(entry.tensor->bytes());
  out->set_expire_time_unix_ms(absl::ToUnixMillis(entry.expires));
}

void MultiplyReactor::Start() {
  if (!Open()) return;
  // gRPC still calls a raw handler whose request never fully arrived (the
  // client cancelled, or its deadline passed mid-upload), with an empty
  // buffer: that is the client's cancellation, not a malformed request.
  if (!request_->Valid() || context_->IsCancelled()) {
    const bool late = DeadlinePassed(context_->deadline());
    Reject(late ? RejectReason::kDeadline : RejectReason::kCancelled,
           late ? absl::DeadlineExceededError(
                      "the deadline passed before the request arrived")
                : absl::CancelledError(
                      "the request was cancelled before it arrived"));
    return;
  }
  if (grpc::Status dumped = request_->Dump(&slices_); !dumped.ok()) {
    Reject(RejectReason::kInvalid,
           absl::InvalidArgumentError("cannot read the request's bytes"));
    return;
  }
  chunks_.reserve(slices_.size());
  for (const grpc::Slice& slice : slices_) {
    chunks_.emplace_back(slice.begin(), slice.size());
  }
  absl::StatusOr<WireMultiplyRequest> wire = DecodeMultiplyRequest(chunks_);
  if (!wire.ok()) {
    Reject(RejectReason::kInvalid, wire.status());
    return;
  }
  wire_ = std::move(*wire);

  ReactorJob::Plan plan;
  MultiplyHeader header = wire_.header();
  if (!wire_.a_handle.empty()) {
    if (absl::Status s = MatmulServiceImpl::ResolveHandle(
            service_->handles_, wire_.a_handle, "a", header.a, plan.resident_a,
            a_shape_);
        !s.ok()) {
      Reject(RejectReason::kInvalid, s);
      return;
    }
  }
  if (!wire_.b_handle.empty()) {
    if (absl::Status s = MatmulServiceImpl::ResolveHandle(
            service_->handles_, wire_.b_handle, "b", header.b, plan.resident_b,
            b_shape_);
        !s.ok()) {
      Reject(RejectReason::kInvalid, s);
      return;
    }
  }
  absl::StatusOr<MatmulSpec> spec =
      ValidateMultiplyHeader(header, service_->limits_);
  if (!spec.ok()) {
    Reject(RejectReason::kInvalid, spec.status());
    return;
  }
  plan.spec = *spec;
  if (wire_.keep_result) {
    absl::StatusOr<absl::Duration> ttl =
        service_->handles_.Ttl(wire_.result_ttl_seconds);
    if (!ttl.ok()) {
      Reject(RejectReason::kInvalid, ttl.status());
      return;
    }
    keep_ttl_ = *ttl;
    keep_result_ = plan.keep_result = true;
  }
  Operation op;
  op.kind = OperationKind::kMultiply;
  op.spec = &plan.spec;
  // Bytes this request holds in server memory: its operands in gRPC's
  // buffers (until it finishes) and its product in staging.
  op.held_bytes = (plan.resident_a ? 0 : spec->a_bytes()) +
                  (plan.resident_b ? 0 : spec->b_bytes()) +
                  (plan.keep_result ? 0 : spec->c_bytes());
  if (plan.keep_result) {
    op.stored_bytes = spec->c_bytes();
    op.client = MatmulServiceImpl::ClientKey(*context_);
  }
  if (!Admit(std::move(op))) return;
  Submit(std::make_unique<ReactorJob>(this, std::move(plan)));
}

absl::Status MultiplyReactor::Respond(const MatmulSpec& spec,
                                      JobResult& result) {
  const std::vector<int64_t> c_shape =
      ApiShape(spec.c_is_3d, spec.batch, spec.m, spec.n);
  if (keep_result_) {
    if (result.resident() == nullptr || !lease_.has_reservation()) {
      return absl::InternalError("the engine kept no result");
    }
    const HandleRegistry::Entry entry = service_->handles_.Add(
        lease_.TakeReservation(), result.resident(), c_shape, keep_ttl_);
    v1::MultiplyResponse response;
    MatmulServiceImpl::FillHandle(entry, response.mutable_c_handle());
    response.mutable_placement()->set_device(result.placement().device);
    response.mutable_placement()->set_stream(result.placement().stream);
    const std::string bytes = response.SerializeAsString();
    grpc::Slice slice(bytes);
    *response_ = grpc::ByteBuffer(&slice, 1);
    return absl::OkStatus();
  }
  // The product goes out as its own slice, straight from staging; the
  // staging is released when gRPC has sent it.
  const ResponseFraming framing = FrameMultiplyResponse(
      c_shape, DTypeToProto(spec.dtype), spec.c_bytes(),
      result.placement().device, result.placement().stream);
  auto* held = new JobResult(std::move(result));
  grpc::Slice parts[3] = {
      grpc::Slice(framing.prefix),
      grpc::Slice(
          const_cast<std::byte*>(held->c().data()), held->c().size(),
          [](void* p) { delete static_cast<JobResult*>(p); }, held),
      grpc::Slice(framing.suffix)};
  *response_ = grpc::ByteBuffer(parts, 3);
  return absl::OkStatus();
}

// Upload and Download: one tensor into or out of engine memory.
class TransferReactor final : public JobReactor {
 public:
  TransferReactor(MatmulServiceImpl* service,
                  grpc::CallbackServerContext* context,
                  const v1::UploadRequest* upload,
                  v1::UploadResponse* upload_response)
      : JobReactor(service, context, RpcMethod::kUpload),
        upload_(upload),
        upload_response_(upload_response) {}
  TransferReactor(MatmulServiceImpl* service,
                  grpc::CallbackServerContext* context,
                  const v1::DownloadRequest* download,
                  v1::DownloadResponse* download_response)
      : JobReactor(service, context, RpcMethod::kDownload),
        download_(download),
        download_response_(download_response) {}

  void StartUpload();
  void StartDownload();

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte>) override {
    if (upload_ == nullptr || a.size() != upload_->tensor().data().size()) {
      return absl::InternalError("staging size mismatch");
    }
    const std::string& data = upload_->tensor().data();
    return Copy([&] { std::memcpy(a.data(), data.data(), a.size()); });
  }

 private:
  absl::Status Respond(const MatmulSpec& spec, JobResult& result) override;

  const v1::UploadRequest* const upload_ = nullptr;
  v1::UploadResponse* const upload_response_ = nullptr;
  const v1::DownloadRequest* const download_ = nullptr;
  v1::DownloadResponse* const download_response_ = nullptr;
  std::vector<int64_t> shape_;
  absl::Duration ttl_;
  std::shared_ptr<ResidentTensor> downloading_;
};

void TransferReactor::StartUpload() {
  if (!Open()) return;
  OperandHeader header;
  header.present = upload_->has_tensor();
  header.shape = absl::MakeConstSpan(upload_->tensor().shape().data(),
                                     upload_->tensor().shape_size());
  header.dtype = upload_->tensor().dtype();
  header.data_bytes = static_cast<int64_t>(upload_->tensor().data().size());
  absl::StatusOr<TensorDims> dims =
      ValidateTensor(header, "tensor", service_->limits_);
  if (!dims.ok()) {
    Reject(RejectReason::kInvalid, dims.status());
    return;
  }
  ReactorJob::Plan plan;
  plan.kind = JobKind::kUpload;
  plan.spec.dtype = dims->dtype;
  plan.spec.a_batch = plan.spec.batch = dims->batch;
  plan.spec.m = dims->rows;
  plan.spec.k = dims->cols;
  plan.spec.n = 0;
  absl::StatusOr<absl::Duration> ttl =
      service_->handles_.Ttl(upload_->ttl_seconds());
  if (!ttl.ok()) {
    Reject(RejectReason::kInvalid, ttl.status());
    return;
  }
  ttl_ = *ttl;
  shape_ = ApiShape(dims->is_3d, dims->batch, dims->rows, dims->cols);
  Operation op;
  op.kind = OperationKind::kUpload;
  op.spec = &plan.spec;
  op.held_bytes = header.data_bytes;  // the request, until it is staged
  op.stored_bytes = header.data_bytes;
  op.client = MatmulServiceImpl::ClientKey(*context_);
  if (!Admit(std::move(op))) return;
  if (upload_->has_device()) {
    const std::vector<DeviceInfo>& devices = lease_.engine()->info().devices;
    const bool known = std::any_of(
        devices.begin(), devices.end(),
        [&](const DeviceInfo& d) { return d.index == upload_->device(); });
    if (!known) {
      Reject(RejectReason::kInvalid,
             absl::InvalidArgumentError(absl::StrCat(
                 "device: no device ", upload_->device(), " (", devices.size(),
                 " on this server; see GetServerInfo)")));
      return;
    }
    plan.device = upload_->device();
  }
  Submit(std::make_unique<ReactorJob>(this, std::move(plan)));
}

void TransferReactor::StartDownload() {
  if (!Open()) return;
  absl::StatusOr<HandleRegistry::Entry> entry =
      service_->handles_.Get(download_->handle());
  if (!entry.ok()) {
    Reject(RejectReason::kInvalid,
           absl::Status(entry.status().code(),
                        absl::StrCat("handle: ", entry.status().message())));
    return;
  }
  shape_ = entry->shape;
  ReactorJob::Plan plan;
  plan.kind = JobKind::kDownload;
  plan.resident_a = entry->tensor;
  plan.spec.dtype = entry->tensor->dtype();
  plan.spec.batch = entry->tensor->batch();
  plan.spec.a_batch = plan.spec.b_batch = 0;
  plan.spec.m = entry->tensor->rows();
  plan.spec.n = entry->tensor->cols();
  plan.spec.k = 0;
  if (plan.spec.c_bytes() > service_->limits_.max_message_bytes - 128) {
    Reject(RejectReason::kInvalid,
           absl::ResourceExhaustedError(
               absl::StrCat("the stored tensor is ", plan.spec.c_bytes(),
                            " bytes, over the server's max message size of ",
                            service_->limits_.max_message_bytes, " bytes")));
    return;
  }
  Operation op;
  op.kind = OperationKind::kDownload;
  op.spec = &plan.spec;
  op.held_bytes = plan.spec.c_bytes();  // staging, then the response
  if (!Admit(std::move(op))) return;
  Submit(std::make_unique<ReactorJob>(this, std::move(plan)));
}

absl::Status TransferReactor::Respond(const MatmulSpec& spec,
                                      JobResult& result) {
  if (upload_ != nullptr) {
    if (result.resident() == nullptr) {
      return absl::InternalError("the engine stored nothing");
    }
    if (!lease_.has_reservation()) {
      return absl::InternalError("the upload holds no quota reservation");
    }
    const HandleRegistry::Entry entry = service_->handles_.Add(
        lease_.TakeReservation(), result.resident(), shape_, ttl_);
    MatmulServiceImpl::FillHandle(entry, upload_response_->mutable_handle());
    return absl::OkStatus();
  }
  v1::Tensor* tensor = download_response_->mutable_tensor();
  for (int64_t d : shape_) tensor->add_shape(d);
  tensor->set_dtype(DTypeToProto(spec.dtype));
  tensor->set_data(reinterpret_cast<const char*>(result.c().data()),
                   result.c().size());
  return absl::OkStatus();
}

MatmulServiceImpl::MatmulServiceImpl(const RequestLimits& limits,
                                     const HandleLimits& handle_limits,
                                     std::string version)
    : limits_(limits),
      version_(std::move(version)),
      handles_(handle_limits),
      admission_(limits.max_inflight_bytes, &handles_, metrics_.get()) {}

std::string MatmulServiceImpl::ClientKey(
    const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("x-matmul-client"); it != metadata.end()) {
    return std::string(it->second.data(), it->second.size());
  }
  // "ipv4:127.0.0.1:5000" -> "ipv4:127.0.0.1"; "unix:/path" stays.
  std::string peer = context.peer();
  if (peer.rfind("ipv4:", 0) == 0 || peer.rfind("ipv6:", 0) == 0) {
    const size_t colon = peer.rfind(':');
    if (colon != std::string::npos && colon > 4) peer.resize(colon);
  }
  return peer;
}

grpc::ServerUnaryReactor* MatmulServiceImpl::Multiply(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* reactor = new MultiplyReactor(this, context, request, response);
  reactor->Start();
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
MatmulServiceImpl::MultiplyStream(grpc::CallbackServerContext* context) {
  auto* reactor = new MultiplyStreamReactor(this, context);
  reactor->Start();
  return reactor;
}

grpc::ServerUnaryReactor* MatmulServiceImpl::Upload(
    grpc::CallbackServerContext* context, const v1::UploadRequest* request,
    v1::UploadResponse* response) {
  auto* reactor = new TransferReactor(this, context, request, response);
  reactor->StartUpload();
  return reactor;
}

grpc::ServerUnaryReactor* MatmulServiceImpl::Download(
    grpc::CallbackServerContext* context, const v1::DownloadRequest* request,
    v1::DownloadResponse* response) {
  auto* reactor = new TransferReactor(this, context, request, response);
  reactor->StartDownload();
  return reactor;
}

grpc::ServerUnaryReactor* MatmulServiceImpl::Delete(
    grpc::CallbackServerContext* context, const v1::DeleteRequest* request,
    v1::DeleteResponse* /*response*/) {
  const auto started = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = handles_.Delete(request->handle());
  if (!status.ok()) {
    status =
        absl::Status(status.code(), absl::StrCat("handle: ", status.message()));
  }
  const grpc::Status reply = ToGrpcStatus(status);
  metrics_->RecordRequest(
      RpcMethod::kDelete, reply.error_code(),
      SecondsSince(started, std::chrono::steady_clock::now()));
  reactor->Finish(reply);
  return reactor;
}

grpc::ServerUnaryReactor* MatmulServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context,
    const v1::GetServerInfoRequest* /*request*/,
    v1::GetServerInfoResponse* response) {
  const auto started = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto finish = [&](const grpc::Status& status) {
    metrics_->RecordRequest(
        RpcMethod::kGetServerInfo, status.error_code(),
        SecondsSince(started, std::chrono::steady_clock::now()));
    reactor->Finish(status);
  };
  Engine* engine = admission_.engine();
  if (engine == nullptr) {
    finish(
        ToGrpcStatus(absl::UnavailableError("the engine is still starting")));
    return reactor;
  }
  const EngineInfo& info = engine->info();
  response->set_engine(info.name);
  response->set_version(version_);
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
  limits->set_max_message_bytes(limits_.max_message_bytes);
  limits->set_max_elements_per_operand(limits_.max_elements_per_operand);
  limits->set_max_inflight_bytes(limits_.max_inflight_bytes);
  limits->set_max_dimension(limits_.max_dimension);
  const HandleLimits& handle_limits = handles_.limits();
  limits->set_max_stored_bytes_per_client(handle_limits.max_bytes_per_client);
  limits->set_max_handles_per_client(handle_limits.max_handles_per_client);
  limits->set_default_handle_ttl_seconds(
      absl::ToInt64Seconds(handle_limits.default_ttl));
  limits->set_max_handle_ttl_seconds(
      absl::ToInt64Seconds(handle_limits.max_ttl));
  finish(grpc::Status::OK);
  return reactor;
}

}  // namespace matmul
