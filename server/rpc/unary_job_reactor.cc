#include "server/rpc/unary_job_reactor.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_messages.h"
#include "server/rpc/stored_tensors.h"

namespace matmul {
namespace {

// The engine's view of a unary RPC's work.
class UnaryJob final : public MatmulJob {
 public:
  UnaryJob(UnaryJobReactor* reactor, JobDescription description,
           ClientUsage* usage, std::string client)
      : MatmulJob(std::move(description)),
        reactor_(reactor),
        usage_(usage),
        client_(std::move(client)) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    return reactor_->WriteOperands(a, b);
  }
  void Done(absl::StatusOr<JobResult> result) override {
    // Charged whether or not the RPC still wants the result: the work is done.
    if (result.ok()) {
      usage_->Record(client_, result->timings(), JobBusBytes(description()));
    }
    reactor_->Complete(spec(), std::move(result));
  }
  absl::Status Abandoned() const override { return reactor_->Abandoned(); }

 private:
  UnaryJobReactor* const reactor_;
  ClientUsage* const usage_;
  const std::string client_;
};

}  // namespace

UnaryJobReactor::UnaryJobReactor(ServiceState& state,
                                 grpc::CallbackServerContext* context,
                                 RpcMethod method)
    : state_(state),
      context_(context),
      method_(method),
      deadline_(context->deadline()) {
  state_.calls.AddRequest(this, started_);
}

void UnaryJobReactor::OnCancel() { EndUnlessCopying(Ending::kCancelled); }

void UnaryJobReactor::EndUnlessCopying(Ending ending) {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;  // the job, if still queued, is dropped
    if (finished_) return;
    if (writing_) {
      // An operand copy in progress reads the request: it ends the RPC.
      if (end_after_copy_ == Ending::kNone) end_after_copy_ = ending;
      return;
    }
    finished_ = true;
  }
  End(ending);
}

void UnaryJobReactor::End(Ending ending) {
  if (ending == Ending::kCancelled) {
    RecordCancel();
    FinishRpc(grpc::Status(grpc::StatusCode::CANCELLED,
                           "the request was cancelled or its deadline passed"));
  } else if (ending == Ending::kDrained) {
    state_.admission.RecordRejection(RejectReason::kDraining);
    FinishRpc(ToGrpcStatus(absl::UnavailableError(
        "the server is shutting down and its drain ended before this request "
        "finished; retry it")));
  }
}

void UnaryJobReactor::OnDone() {
  state_.calls.Remove(this);
  RecordDone();
  Unref();
}

void UnaryJobReactor::CutForDrain() { EndUnlessCopying(Ending::kDrained); }

absl::Status UnaryJobReactor::Abandoned() const {
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

void UnaryJobReactor::Complete(const MatmulSpec& spec,
                               absl::StatusOr<JobResult> result) {
  absl::Cleanup unref = [this] { Unref(); };
  JobFinished();
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // cancelled meanwhile: the result is dropped
    finished_ = true;
  }
  // From here on nothing else touches the response until Finish.
  if (!result.ok()) {
    state_.admission.RecordFailure(result.status());
    FinishRpc(ToGrpcStatus(result.status()));
    return;
  }
  if (method_ == RpcMethod::kMultiply) {
    state_.metrics->RecordStages(result->timings());
  }
  computed_at_ = std::chrono::steady_clock::now();
  computed_ = true;
  FinishRpc(ToGrpcStatus(Respond(spec, *result)));
}

bool UnaryJobReactor::Open() {
  absl::Status open = state_.admission.CheckOpen();
  if (open.ok()) return true;
  FinishWith(open);  // counted by the core
  return false;
}

bool UnaryJobReactor::Admit(Operation op) {
  op.deadline = DeadlineOf(*context_);
  absl::StatusOr<Lease> lease = state_.admission.Admit(op);
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

void UnaryJobReactor::Submit(JobDescription description) {
  refs_.fetch_add(1, std::memory_order_relaxed);  // the job's reference
  lease_.engine()->Submit(std::make_unique<UnaryJob>(
      this, std::move(description), &state_.metrics->client_usage(), Client()));
}

const std::string& UnaryJobReactor::Client() {
  if (!client_.has_value()) client_ = ClientKey(*context_);
  return *client_;
}

absl::Status UnaryJobReactor::Copy(absl::FunctionRef<void()> copy) {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finished_) {
      return absl::CancelledError("the request was cancelled");
    }
    writing_ = true;
  }
  copy();
  Ending ending = Ending::kNone;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    ending = std::exchange(end_after_copy_, Ending::kNone);
    if (ending != Ending::kNone) {
      if (finished_) {
        ending = Ending::kNone;
      } else {
        finished_ = true;
      }
    }
  }
  if (ending == Ending::kNone) return absl::OkStatus();
  End(ending);
  return absl::CancelledError("the request was cancelled during its copy");
}

bool UnaryJobReactor::FinishWith(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    finished_ = true;
  }
  FinishRpc(ToGrpcStatus(status));
  return true;
}

void UnaryJobReactor::Reject(RejectReason reason, const absl::Status& status) {
  if (FinishWith(status)) state_.admission.RecordRejection(reason);
}

bool UnaryJobReactor::Parse(const grpc::ByteBuffer* request,
                            google::protobuf::MessageLite& message) {
  const absl::Status parsed = ParseRequest(*context_, request, message);
  if (parsed.ok()) return true;
  Reject(RequestRejection(parsed), parsed);
  return false;
}

void UnaryJobReactor::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void UnaryJobReactor::FinishRpc(const grpc::Status& status) {
  code_.store(status.error_code(), std::memory_order_release);
  Finish(status);
}

void UnaryJobReactor::RecordCancel() {
  const bool deadline = CancelledByDeadline(deadline_);
  state_.admission.RecordRejection(deadline ? RejectReason::kDeadline
                                            : RejectReason::kCancelled);
}

void UnaryJobReactor::RecordDone() {
  const grpc::StatusCode code = code_.load(std::memory_order_acquire);
  const auto now = std::chrono::steady_clock::now();
  ServerMetrics& metrics = *state_.metrics;
  if (computed_ && method_ == RpcMethod::kMultiply) {
    metrics.RecordStage(Stage::kReply, SecondsSince(computed_at_, now));
  }
  metrics.RecordRequest(method_, code, SecondsSince(started_, now));
}

}  // namespace matmul
