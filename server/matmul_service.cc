#include "server/matmul_service.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/grpc_status.h"
#include "server/request_validation.h"

namespace matmul {

// One Multiply RPC. It lives until both gRPC is done with it (OnDone) and,
// if it was submitted, the engine has finished its job (Complete): two
// references. The RPC is finished exactly once, by whichever comes first of
// the engine's result and a cancellation (client cancel, deadline, or the
// server's drain deadline); a job that outlives its RPC never touches the
// request or response again, so a stuck job cannot hold up shutdown.
class MultiplyReactor final : public grpc::ServerUnaryReactor {
 public:
  MultiplyReactor(MatmulServiceImpl* service,
                  grpc::CallbackServerContext* context,
                  const v1::MultiplyRequest* request,
                  v1::MultiplyResponse* response)
      : service_(service),
        request_(request),
        response_(response),
        deadline_(context->deadline()) {}

  // Validates, admits and submits; or finishes at once with the reason not.
  void Start();

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      // An operand copy in progress reads the request: let it end first.
      mu_.Await(absl::Condition(this, &MultiplyReactor::NotWriting));
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

  // Called by the job, on engine threads.
  absl::Status Abandoned() const;
  absl::Status WriteOperands(absl::Span<std::byte> a, absl::Span<std::byte> b);
  void Complete(const MatmulSpec& spec, absl::StatusOr<JobResult> result);

 private:
  ~MultiplyReactor() override {
    if (admitted_) {
      service_->inflight_bytes_.Release(reserved_bytes_);
      service_->inflight_requests_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
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
    if (FinishWith(status)) service_->metrics_->RecordRejection(reason);
  }

  // Every Finish goes through here, so that OnDone knows the code. The
  // release store publishes what was recorded before it to OnDone, which
  // runs on another thread (gRPC's own ordering is invisible to TSan).
  void FinishRpc(const grpc::Status& status) {
    code_.store(status.error_code(), std::memory_order_release);
    Finish(status);
  }

  // Metrics: the rejection of a cancelled RPC; the end of every RPC.
  void RecordCancel();
  void RecordDone();

  MatmulServiceImpl* const service_;
  const v1::MultiplyRequest* const request_;
  v1::MultiplyResponse* const response_;
  const std::chrono::system_clock::time_point deadline_;
  std::atomic<int> refs_{1};
  bool admitted_ = false;
  int64_t reserved_bytes_ = 0;
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
  bool NotWriting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !writing_;
  }
};

namespace {

// The engine's view of a Multiply RPC.
class MultiplyJob final : public MatmulJob {
 public:
  MultiplyJob(MultiplyReactor* reactor, const MatmulSpec& spec)
      : reactor_(reactor), spec_(spec) {}

  const MatmulSpec& spec() const override { return spec_; }
  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    return reactor_->WriteOperands(a, b);
  }
  void Done(absl::StatusOr<JobResult> result) override {
    reactor_->Complete(spec_, std::move(result));
  }
  absl::Status Abandoned() const override { return reactor_->Abandoned(); }

 private:
  MultiplyReactor* const reactor_;
  const MatmulSpec spec_;
};

bool DeadlinePassed(std::chrono::system_clock::time_point deadline) {
  return deadline != std::chrono::system_clock::time_point::max() &&
         std::chrono::system_clock::now() >= deadline;
}

double SecondsSince(std::chrono::steady_clock::time_point since,
                    std::chrono::steady_clock::time_point now) {
  return std::chrono::duration<double>(now - since).count();
}

// The rejection an engine's error amounts to, if any (INTERNAL is a fault,
// not a rejection).
std::optional<RejectReason> EngineRejection(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
      return RejectReason::kOverloaded;
    case absl::StatusCode::kDeadlineExceeded:
      return RejectReason::kDeadline;
    case absl::StatusCode::kCancelled:
      return RejectReason::kCancelled;
    case absl::StatusCode::kUnavailable:
      return RejectReason::kUnavailable;
    default:
      return std::nullopt;
  }
}

}  // namespace

void MultiplyReactor::Start() {
  if (service_->draining_.load(std::memory_order_relaxed)) {
    Reject(RejectReason::kDraining,
           absl::UnavailableError("the server is shutting down"));
    return;
  }
  Engine* engine = service_->engine_.load(std::memory_order_acquire);
  if (engine == nullptr) {
    Reject(RejectReason::kUnavailable,
           absl::UnavailableError("the engine is still starting"));
    return;
  }
  absl::StatusOr<MatmulSpec> spec =
      ValidateMultiplyRequest(*request_, service_->limits_);
  if (!spec.ok()) {
    Reject(RejectReason::kInvalid, spec.status());
    return;
  }
  // A job that could never fit a device is the request's fault, not load.
  if (absl::Status fits = engine->CheckFits(*spec); !fits.ok()) {
    Reject(RejectReason::kInvalid, fits);
    return;
  }
  if (DeadlinePassed(deadline_)) {
    Reject(RejectReason::kDeadline,
           absl::DeadlineExceededError(
               "the deadline passed before the request was admitted"));
    return;
  }
  const int64_t bytes = spec->a_bytes() + spec->b_bytes() + spec->c_bytes();
  if (!service_->inflight_bytes_.TryAcquire(bytes)) {
    Reject(RejectReason::kOverloaded,
           absl::ResourceExhaustedError(absl::StrCat(
               "server busy: ", service_->inflight_bytes_.used(), " of ",
               service_->inflight_bytes_.limit(),
               " in-flight bytes are in use and this request needs ", bytes,
               "; retry later")));
    return;
  }
  admitted_ = true;
  reserved_bytes_ = bytes;
  service_->inflight_requests_.fetch_add(1, std::memory_order_relaxed);
  refs_.fetch_add(1, std::memory_order_relaxed);  // the job's reference
  engine->Submit(std::make_unique<MultiplyJob>(this, *spec));
}

absl::Status MultiplyReactor::Abandoned() const {
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

absl::Status MultiplyReactor::WriteOperands(absl::Span<std::byte> a,
                                            absl::Span<std::byte> b) {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finished_) {
      return absl::CancelledError("the request was cancelled");
    }
    writing_ = true;
  }
  absl::Cleanup done = [this] {
    absl::MutexLock lock(&mu_);
    writing_ = false;
  };
  const std::string& a_data = request_->a().data();
  const std::string& b_data = request_->b().data();
  if (a.size() != a_data.size() || b.size() != b_data.size()) {
    return absl::InternalError(
        absl::StrCat("staging size mismatch: a ", a.size(), " vs ",
                     a_data.size(), ", b ", b.size(), " vs ", b_data.size()));
  }
  std::memcpy(a.data(), a_data.data(), a.size());
  std::memcpy(b.data(), b_data.data(), b.size());
  return absl::OkStatus();
}

void MultiplyReactor::Complete(const MatmulSpec& spec,
                               absl::StatusOr<JobResult> result) {
  absl::Cleanup unref = [this] { Unref(); };
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // cancelled meanwhile: the result is dropped
    finished_ = true;
  }
  // From here on nothing else touches the response until Finish.
  if (!result.ok()) {
    if (std::optional<RejectReason> reason = EngineRejection(result.status())) {
      service_->metrics_->RecordRejection(*reason);
    }
    FinishRpc(ToGrpcStatus(result.status()));
    return;
  }
  service_->metrics_->RecordStages(result->timings());
  computed_at_ = std::chrono::steady_clock::now();
  computed_ = true;
  v1::Tensor* c = response_->mutable_c();
  if (spec.c_is_3d) c->add_shape(spec.batch);
  c->add_shape(spec.m);
  c->add_shape(spec.n);
  c->set_dtype(ToProto(spec.dtype));
  const absl::Span<const std::byte> bytes = result->c();
  c->set_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  v1::Placement* placement = response_->mutable_placement();
  placement->set_device(result->placement().device);
  placement->set_stream(result->placement().stream);
  FinishRpc(grpc::Status::OK);
}

void MultiplyReactor::RecordCancel() {
  // gRPC does not say why it cancelled. Its deadline timer can fire a few
  // milliseconds before the system clock reaches deadline_ (measured: up to
  // 3 ms), so a cancel that close to the deadline counts as the deadline's.
  const bool deadline =
      deadline_ != std::chrono::system_clock::time_point::max() &&
      std::chrono::system_clock::now() + std::chrono::milliseconds(50) >=
          deadline_;
  service_->metrics_->RecordRejection(deadline ? RejectReason::kDeadline
                                               : RejectReason::kCancelled);
}

void MultiplyReactor::RecordDone() {
  const grpc::StatusCode code = code_.load(std::memory_order_acquire);
  const auto now = std::chrono::steady_clock::now();
  ServerMetrics& metrics = *service_->metrics_;
  if (computed_) {
    metrics.RecordStage(Stage::kReply, SecondsSince(computed_at_, now));
  }
  metrics.RecordRequest(RpcMethod::kMultiply, code,
                        SecondsSince(started_, now));
}

MatmulServiceImpl::MatmulServiceImpl(const RequestLimits& limits,
                                     std::string version)
    : limits_(limits),
      version_(std::move(version)),
      inflight_bytes_(limits.max_inflight_bytes) {}

void MatmulServiceImpl::SetEngine(Engine* engine) {
  engine_.store(engine, std::memory_order_release);
}

void MatmulServiceImpl::StartDraining() {
  draining_.store(true, std::memory_order_relaxed);
}

grpc::ServerUnaryReactor* MatmulServiceImpl::Multiply(
    grpc::CallbackServerContext* context, const v1::MultiplyRequest* request,
    v1::MultiplyResponse* response) {
  auto* reactor = new MultiplyReactor(this, context, request, response);
  reactor->Start();
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
  Engine* engine = engine_.load(std::memory_order_acquire);
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
  for (DType t : info.dtypes) response->add_dtypes(ToProto(t));
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(limits_.max_message_bytes);
  limits->set_max_elements_per_operand(limits_.max_elements_per_operand);
  limits->set_max_inflight_bytes(limits_.max_inflight_bytes);
  limits->set_max_dimension(limits_.max_dimension);
  finish(grpc::Status::OK);
  return reactor;
}

}  // namespace matmul
