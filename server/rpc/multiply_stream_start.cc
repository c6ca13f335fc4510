// MultiplyStreamReactor, a multiply's start: the MultiplyStreamStart is
// checked (shapes, dtypes, limits, stored operands, stripes), the multiply
// is admitted and its operands' staging set up, or the start fails with
// its request's error.
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "gpu/engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/admission/admission.h"
#include "server/request_validation.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/multiply_stream.h"
#include "server/rpc/stored_tensors.h"

namespace matmul {
namespace {

constexpr int64_t kOperandAlignment = 256;  // B's place in the shared tensor

}  // namespace

void MultiplyStreamReactor::HandleStart(const WireStreamRequest& request,
                                        Actions& actions) {
  const uint64_t id = request.request_id;
  if (auto it = open_.find(id); it != open_.end()) {
    Fail(it->second,
         absl::InvalidArgumentError(absl::StrCat(
             "request_id ", id, " was started again while still open")));
    return;
  }
  failed_.erase(id);
  // Refused by the admission core (which counted the rejection), or by
  // `reject` below (which counts it first).
  auto refuse =
      [&](const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        state_.metrics->RecordRequest(RpcMethod::kMultiplyStream,
                                      ToGrpcStatus(status).error_code(), 0);
        SendError(id, status);
        RememberFailed(id);  // its chunks are dropped quietly
      };
  auto reject = [&](RejectReason reason, const absl::Status& status)
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                      state_.admission.RecordRejection(reason);
                      refuse(status);
                    };
  // Refused for what the request is (invalid, or too large).
  auto reject_request = [&](const absl::Status& status)
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                              reject(RequestFault(status), status);
                            };
  if (static_cast<int>(open_.size()) >= kMaxOpenMultiplies) {
    reject(RejectReason::kOverloaded,
           absl::ResourceExhaustedError(absl::StrCat(
               "this stream already has ", open_.size(),
               " multiplies open, the most it may; wait for one to finish")));
    return;
  }
  if (absl::Status open = state_.admission.CheckOpen(); !open.ok()) {
    refuse(open);
    return;
  }

  auto m = std::make_shared<Multiply>();
  m->id = id;
  m->started = std::chrono::steady_clock::now();
  const WireMultiplyRequest& wire = request.start;
  if (wire.a.shared.present || wire.b.shared.present || wire.c_shared.present) {
    // A region's bytes need no chunking: the unary call takes them
    // whatever their size.
    reject_request(absl::InvalidArgumentError(
        "shared-memory operands and products (Tensor.shared, c_shared) are "
        "not taken by MultiplyStream; use Multiply"));
    return;
  }
  MultiplyHeader header = wire.header();
  header.a.data_follows = header.b.data_follows = true;
  const std::string* handles[2] = {&wire.a_handle, &wire.b_handle};
  OperandHeader* headers[2] = {&header.a, &header.b};
  for (int op = 0; op < 2; ++op) {
    if (handles[op]->empty()) continue;
    if (absl::Status s =
            ResolveHandle(state_.handles, *handles[op], StreamOperandName(op),
                          *headers[op], m->operand[op], m->handle_shape[op]);
        !s.ok()) {
      reject_request(s);
      return;
    }
    headers[op]->data_follows = false;
  }
  // Operands are bounded by device memory here, not by message size.
  RequestLimits limits = state_.limits;
  limits.max_message_bytes = std::numeric_limits<int64_t>::max() / 4;
  limits.max_inflight_bytes = std::numeric_limits<int64_t>::max() / 4;
  absl::StatusOr<MatmulSpec> spec = ValidateMultiplyHeader(header, limits);
  if (!spec.ok()) {
    reject_request(spec.status());
    return;
  }
  m->spec = *spec;
  const int64_t elem = spec->elem_size();
  int64_t chunk = request.result_chunk_bytes;
  if (chunk < 0) {
    reject_request(absl::InvalidArgumentError(
        absl::StrCat("result_chunk_bytes: expected 0 or more, got ", chunk)));
    return;
  }
  if (chunk == 0) chunk = kDefaultResultChunkBytes;
  chunk = std::min(chunk, state_.limits.max_message_bytes - 64);
  m->result_chunk_bytes = std::max(elem, chunk / elem * elem);
  if (wire.keep_result) {
    absl::StatusOr<absl::Duration> ttl =
        state_.handles.Ttl(wire.result_ttl_seconds);
    if (!ttl.ok()) {
      reject_request(ttl.status());
      return;
    }
    m->keep = true;
    m->keep_ttl = *ttl;
  }
  if (request.stripe_key.empty()) {
    if (request.stripes != 0 && request.stripes != 1) {
      reject_request(absl::InvalidArgumentError(absl::StrCat(
          "start.stripes: expected 0 or 1 without a stripe_key, got ",
          request.stripes)));
      return;
    }
  } else {
    if (request.stripe_key.size() < 16 || request.stripe_key.size() > 64) {
      reject_request(absl::InvalidArgumentError(
          absl::StrCat("start.stripe_key: expected 16 to 64 bytes, got ",
                       request.stripe_key.size())));
      return;
    }
    if (request.stripes < 2 || request.stripes > 16) {
      reject_request(absl::InvalidArgumentError(absl::StrCat(
          "start.stripes: expected 2 to 16 with a stripe_key, got ",
          request.stripes)));
      return;
    }
    m->stripes = request.stripes;
    m->stripe_key = request.stripe_key;
    m->stripe.resize(m->stripes);
    m->stripe[0].request_id = id;
    m->stripe[0].joined = true;
  }
  m->c_shape = spec->c_is_3d
                   ? std::vector<int64_t>{spec->batch, spec->m, spec->n}
                   : std::vector<int64_t>{spec->m, spec->n};
  m->need[0] = m->operand[0] ? 0 : spec->a_bytes();
  m->need[1] = m->operand[1] ? 0 : spec->b_bytes();
  m->staged[0] = m->need[0] > 0;
  m->staged[1] = m->need[1] > 0;
  m->at[0] = 0;
  m->at[1] = m->staged[0] ? (m->need[0] + kOperandAlignment - 1) /
                                kOperandAlignment * kOperandAlignment
                          : 0;
  m->buffer_bytes = m->staged[1] ? m->at[1] + m->need[1] : m->need[0];
  // Row panels need op(A)'s rows contiguous (2-D, not transposed) and a
  // product that is sent, not kept as one tensor.
  m->paneled = m->staged[0] && !m->keep && !spec->c_is_3d && spec->batch == 1 &&
               spec->a_batch == 1 && !spec->transpose_a && spec->m >= 2 &&
               m->need[0] >= kMinPanelBytes;
  m->panel_rows = std::max<int64_t>(1, (spec->m + kPanels - 1) / kPanels);
  for (const auto& t : m->operand) {
    if (t != nullptr) m->device = t->device();
  }
  Operation op;
  op.kind = OperationKind::kStreamMultiply;
  op.spec = &m->spec;
  op.held_bytes = HeldBytes(*m);
  if (m->keep) {
    op.stored_bytes = spec->c_bytes();
    op.client = client_;
  }
  op.deadline = DeadlineOf(*context_);
  absl::StatusOr<Lease> lease = state_.admission.Admit(op);
  if (!lease.ok()) {
    refuse(lease.status());
    return;
  }
  m->lease = std::move(*lease);
  if (m->stripes > 1) {
    std::vector<StripeRegistry::Resolution> resolved;
    if (absl::Status opened = state_.stripes.Open(
            client_, m->stripe_key, m->stripes, this, m, &resolved);
        !opened.ok()) {
      m->lease.Release();
      reject(RejectReason::kInvalid, opened);
      return;
    }
    state_.metrics->RecordStripe(false);
    // Joins that came first go on (they call back with StripeJoined).
    if (!resolved.empty()) {
      outbox_.push_back([resolved = std::move(resolved)]() mutable {
        StripeRegistry::Deliver(resolved);
      });
    }
  }
  engine_.store(m->lease.engine(), std::memory_order_release);
  open_[id] = m;
  if (m->buffer_bytes > 0) {
    actions.jobs.push_back(NewJob(m, Step::kAllocate, 0, nullptr));
  } else {
    m->allocated = true;  // both operands are stored tensors
    MaybeMultiply(m, actions);
  }
}

}  // namespace matmul
