// UnaryJobReactor: the life cycle shared by the unary RPCs whose work is one
// engine job (Multiply, Upload, Download). An adapter derives from it,
// translates its request into an Operation and a JobDescription (the
// engine's typed operation, gpu/engine.h), admits the one through the
// admission core (server/admission/admission.h) and submits the other; the
// engine's completion thread then calls Respond.
//
// The reactor lives until both gRPC is done with it (OnDone) and, if a job
// was submitted, the engine has finished it: two references. The RPC is
// finished exactly once, by whichever comes first of the job's result and a
// cancellation (client cancel, deadline, or the drain deadline); a job that
// outlives its RPC never touches the request or the response again, so a
// stuck job cannot hold up shutdown.
#ifndef MATMUL_SERVER_RPC_UNARY_JOB_REACTOR_H_
#define MATMUL_SERVER_RPC_UNARY_JOB_REACTOR_H_

#include <google/protobuf/message_lite.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "gpu/engine.h"
#include "server/admission/admission.h"
#include "server/rpc/call_registry.h"
#include "server/rpc/service_state.h"
#include "server/server_metrics.h"

namespace matmul {

class UnaryJobReactor : public grpc::ServerUnaryReactor, public DrainableCall {
 public:
  UnaryJobReactor(ServiceState& state, grpc::CallbackServerContext* context,
                  RpcMethod method);

  void OnCancel() override;
  void OnDone() override;

  // DrainableCall. A unary call ends with its answer; at the drain's
  // deadline it is answered UNAVAILABLE and its job, if any, dropped.
  void Ref() override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() override;
  void Draining() override {}
  void CutForDrain() override;

  // Engine side, through the job.
  absl::Status Abandoned() const;
  virtual absl::Status WriteOperands(absl::Span<std::byte> a,
                                     absl::Span<std::byte> b) = 0;
  void Complete(const MatmulSpec& spec, absl::StatusOr<JobResult> result);

 protected:
  // The lease is a member: it is released when the reactor goes, after
  // both the RPC and the job are done.
  ~UnaryJobReactor() override = default;

  // Builds the response from a job's result (engine thread).
  virtual absl::Status Respond(const MatmulSpec& spec, JobResult& result) = 0;

  // The engine is done with the job (engine thread, before Respond and
  // whether or not the RPC still wants the result): what only the job used
  // may go now.
  virtual void JobFinished() {}

  // False, with the RPC finished UNAVAILABLE, while the server drains or
  // the engine is starting: the admission core's early check.
  bool Open();

  // Admits `op` (the deadline is the call's), or finishes the RPC with the
  // core's refusal, and its retry hint when it has one; true if admitted.
  bool Admit(Operation op);

  // Submits a job of `description` to the admitted lease's engine.
  void Submit(JobDescription description);

  // Whose call it is (ClientKey), worked out on first use and kept: the
  // plan, admission and the job's usage record all need it. The RPC's
  // start path only (not thread-safe).
  const std::string& Client();

  // Runs `copy`, which reads the request, unless the RPC was cancelled.
  // Finishing lets gRPC free the request, so a cancel or a drain's cut that
  // comes during the copy does not finish the RPC: it leaves that to the
  // copy, which ends it when it is done (CANCELLED is then returned). No
  // gRPC thread waits for a copy.
  absl::Status Copy(absl::FunctionRef<void()> copy);

  // Finishes the RPC unless a cancellation already did; true if it did.
  bool FinishWith(const absl::Status& status);

  // FinishWith, counted as a rejection for `reason`.
  void Reject(RejectReason reason, const absl::Status& status);
  // Reject for what the request is: invalid, or too large (RequestFault).
  void RejectRequest(const absl::Status& status) {
    Reject(RequestFault(status), status);
  }

  // Parses the raw `request` into `message` (ParseRequest,
  // server/rpc/raw_messages.h), or finishes the RPC: CANCELLED or
  // DEADLINE_EXCEEDED when its bytes never arrived, INVALID_ARGUMENT when
  // they are not a `message`; true if parsed.
  bool Parse(const grpc::ByteBuffer* request,
             google::protobuf::MessageLite& message);

  ServiceState& state_;
  grpc::CallbackServerContext* const context_;
  // What admission granted; empty until Admit.
  Lease lease_;

 private:
  std::optional<std::string> client_;  // Client()'s
  // Every Finish goes through here, so that OnDone knows the code. The
  // release store publishes what was recorded before it to OnDone, which
  // runs on another thread (gRPC's own ordering is invisible to TSan).
  void FinishRpc(const grpc::Status& status);
  void RecordCancel();
  void RecordDone();
  // How a cancel or a drain's cut ends the RPC (on whichever thread gets to
  // end it: the one that saw it, or the copy it came during).
  enum class Ending { kNone, kCancelled, kDrained };
  // Marks the RPC cancelled and ends it, or, while an operand copy reads
  // the request, leaves the ending to that copy.
  void EndUnlessCopying(Ending ending);
  void End(Ending ending);

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
  // Set by a cancel or a drain's cut during a copy; the copy ends the RPC.
  Ending end_after_copy_ ABSL_GUARDED_BY(mu_) = Ending::kNone;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_UNARY_JOB_REACTOR_H_
