// MultiplyStreamSession, a multiply's start: what depends on the call is
// checked here (an id still open, the open count, draining), the start is
// planned (PlanStreamStart: shapes, dtypes, limits, stored operands,
// stripes), the plan admitted and its operands' staging set up; or the
// start fails with its request's error.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/engine.h"
#include "server/admission/admission.h"
#include "server/request_validation.h"
#include "server/rpc/call_helpers.h"
#include "server/stream/multiply_stream_session.h"
#include "server/stream/plan_stream_start.h"

namespace matmul {

void MultiplyStreamSession::RefuseStart(uint64_t id,
                                        const absl::Status& status) {
  state_.metrics->RecordRequest(RpcMethod::kMultiplyStream,
                                static_cast<grpc::StatusCode>(status.code()),
                                0);
  SendError(id, status);
  RememberFailed(id);  // its chunks are dropped quietly
}

void MultiplyStreamSession::HandleStart(const WireStreamRequest& request,
                                        Actions& actions) {
  const uint64_t id = request.request_id;
  if (FailOpen(
          id, absl::InvalidArgumentError(absl::StrCat(
                  "request_id ", id, " was started again while still open")))) {
    return;
  }
  failed_.Forget(id);
  if (OpenCount() >= kMaxOpenMultiplies) {
    state_.admission.RecordRejection(RejectReason::kOverloaded);
    RefuseStart(id, absl::ResourceExhaustedError(absl::StrCat(
                        "this stream already has ", OpenCount(),
                        " multiplies open, the most it may; wait for one to "
                        "finish")));
    return;
  }
  if (absl::Status open = state_.admission.CheckOpen(); !open.ok()) {
    RefuseStart(id, open);  // counted by the admission core
    return;
  }
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<StreamStartPlan> plan =
      PlanStreamStart(request, state_.limits, state_.handles);
  if (!plan.ok()) {
    // Refused for what the request is (invalid, or too large).
    state_.admission.RecordRejection(RequestFault(plan.status()));
    RefuseStart(id, plan.status());
    return;
  }
  std::shared_ptr<Multiply> m = NewMultiply(id, std::move(*plan));
  m->started = started;
  if (!AdmitStart(m)) return;
  engine_ = m->lease.engine();
  open_[id] = m;
  if (m->buffer_bytes > 0) {
    actions.jobs.push_back(NewJob(m, Step::kAllocate, 0, nullptr));
  } else {
    m->allocated = true;  // both operands are stored tensors
    MaybeMultiply(m, actions);
  }
}

std::shared_ptr<MultiplyStreamSession::Multiply>
MultiplyStreamSession::NewMultiply(uint64_t id, StreamStartPlan plan) {
  auto m = std::make_shared<Multiply>();
  m->id = id;
  m->spec = plan.spec;
  m->intake = OperandIntake(plan);
  m->schedule = PanelSchedule(plan);
  m->c_shape = std::move(plan.c_shape);
  for (int op = 0; op < 2; ++op) {
    m->operand[op] = std::move(plan.stored[op]);
    m->handle_shape[op] = std::move(plan.handle_shape[op]);
  }
  m->buffer_bytes = plan.buffer_bytes;
  m->device = plan.device;
  m->keep = plan.keep;
  m->keep_ttl = plan.keep_ttl;
  m->result_chunk_bytes = plan.result_chunk_bytes;
  m->held_bytes = plan.held_bytes;
  m->stored_bytes = plan.stored_bytes;
  if (plan.stripes > 1) {
    m->stripes = plan.stripes;
    m->stripe_key = std::move(plan.stripe_key);
    m->stripe = StripeSet<Multiply::StripePeer>(m->stripes, id);
  }
  return m;
}

bool MultiplyStreamSession::AdmitStart(const std::shared_ptr<Multiply>& m) {
  Operation op;
  op.kind = OperationKind::kStreamMultiply;
  op.spec = &m->spec;
  op.held_bytes = m->held_bytes;
  if (m->stored_bytes.has_value()) {
    op.stored_bytes = *m->stored_bytes;
    op.client = client_;
  }
  op.deadline = deadline_;
  absl::StatusOr<Lease> lease = state_.admission.Admit(op);
  if (!lease.ok()) {
    RefuseStart(m->id, lease.status());  // counted by the admission core
    return false;
  }
  m->lease = std::move(*lease);
  if (m->stripes <= 1) return true;
  std::vector<StripeRegistry::Resolution> resolved;
  if (absl::Status opened = state_.stripes.Open(
          client_, m->stripe_key, m->stripes, self_, m, &resolved);
      !opened.ok()) {
    m->lease.Release();
    state_.admission.RecordRejection(RejectReason::kInvalid);
    RefuseStart(m->id, opened);
    return false;
  }
  state_.metrics->RecordStripe(false);
  // Joins that came first go on (they call back with StripeJoined).
  if (!resolved.empty()) {
    outbox_.push_back([resolved = std::move(resolved)]() mutable {
      StripeRegistry::Deliver(resolved);
    });
  }
  return true;
}

}  // namespace matmul
