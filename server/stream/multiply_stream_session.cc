// MultiplyStreamSession, its messages and the call's events: a message
// read (a start, a chunk or a join), the input closed, a write done,
// cancel and drain; and how a multiply or share closes.
#include "server/stream/multiply_stream_session.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bounded_text.h"
#include "common/log.h"
#include "gpu/engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/admission/admission.h"
#include "server/request_validation.h"
#include "server/rpc/call_helpers.h"

namespace matmul {

MultiplyStreamSession::MultiplyStreamSession(ServiceState& state,
                                             StreamCall* self,
                                             std::string client,
                                             absl::Time deadline)
    : state_(state),
      self_(self),
      client_(std::move(client)),
      deadline_(deadline) {}

void MultiplyStreamSession::Start(Actions&) {
  // A stream opened once the drain began (after StartDraining looked at
  // the registered calls) ends at once too.
  if (state_.admission.draining()) flow_.Draining();
}

absl::Status MultiplyStreamSession::Abandoned() const {
  if (flow_.cancelled() || flow_.finished()) {
    return absl::CancelledError("the stream was cancelled");
  }
  return absl::OkStatus();
}

void MultiplyStreamSession::ReadClosed(bool cancelled, Actions&) {
  flow_.ReadDone(false);
  // Multiplies still missing bytes can never complete. A read that
  // failed because the client cancelled the call is not a short
  // operand: Cancel answers those multiplies CANCELLED (which of the
  // two runs first is gRPC's choice).
  cancelled = cancelled || flow_.cancelled();
  std::vector<std::shared_ptr<Multiply>> incomplete, striped;
  for (const auto& [id, share] : shares_) {
    // A joined multiply: its owner decides.
    Post(share->owner, [owned = share->owned, s = share->stripe](
                           MultiplyStreamSession& owner, Actions&) {
      owner.StripeSideClosed(owned, s);
    });
  }
  for (const auto& [id, m] : open_) {
    if (m->stripes > 1) {
      m->stripe.SideClosed(0);
      striped.push_back(m);
    } else if (!cancelled && !m->intake.complete()) {
      incomplete.push_back(m);
    }
  }
  for (const auto& m : striped) CheckStarved(m);
  for (const auto& m : incomplete) {
    const int op = m->intake.missing();
    Fail(m, absl::InvalidArgumentError(absl::StrCat(
                "the client closed the stream before operand ",
                StreamOperandName(op), " of request ", m->id, " arrived: ",
                m->intake.received(op), " of ", m->intake.need(op), " bytes")));
  }
}

void MultiplyStreamSession::Read(absl::StatusOr<WireStreamRequest> request,
                                 std::shared_ptr<const void> hold,
                                 Actions& actions) {
  flow_.ReadDone(true);
  if (flow_.finished()) return;
  if (!request.ok()) {
    // Nothing can be attributed to a multiply: the stream itself is bad.
    CloseAll(absl::StatusCode::kInvalidArgument);
    flow_.End(request.status(), actions.moves);
    state_.admission.RecordRejection(RequestFault(request.status()));
    return;
  }
  Handle(*request, std::move(hold), actions);
}

void MultiplyStreamSession::Handle(const WireStreamRequest& request,
                                   std::shared_ptr<const void> hold,
                                   Actions& actions) {
  switch (request.kind) {
    case WireStreamRequest::Kind::kStart:
      HandleStart(request, actions);
      return;
    case WireStreamRequest::Kind::kChunk:
      // The chunk's bytes stay in the message, which `hold` keeps.
      HandleChunk(request, std::move(hold), actions);
      return;
    case WireStreamRequest::Kind::kJoin:
      HandleJoin(request);
      return;
    case WireStreamRequest::Kind::kNone:
      SendError(request.request_id,
                absl::InvalidArgumentError(
                    "MultiplyStreamRequest: none of start, chunk and join is "
                    "set"));
      return;
  }
}

void MultiplyStreamSession::SendError(uint64_t id, const absl::Status& status) {
  // As ToGrpcStatus (server/rpc/grpc_status.h) makes a call's status: the
  // same code, the message bounded.
  Queue(StreamAnswer::Error(
            id, static_cast<int32_t>(status.code()),
            BoundedForMessage(status.message(), kMaxStatusMessageBytes - 32)),
        false);
}
void MultiplyStreamSession::RememberFailed(uint64_t id) {
  failed_.Remember(id);
}

void MultiplyStreamSession::RecordFailure(const absl::Status& status) {
  if (std::optional<RejectReason> reason = RejectionOf(status)) {
    state_.metrics->RecordRejection(*reason);
  } else if (status.code() == absl::StatusCode::kInvalidArgument) {
    state_.metrics->RecordRejection(RejectReason::kInvalid);
  }
}

bool MultiplyStreamSession::FailOpen(uint64_t id, const absl::Status& status) {
  // Copies: closing erases the slot in open_ (or shares_).
  if (auto it = open_.find(id); it != open_.end()) {
    const std::shared_ptr<Multiply> m = it->second;
    Fail(m, status);
    return true;
  }
  if (auto it = shares_.find(id); it != shares_.end()) {
    const std::shared_ptr<StripeShare> share = it->second;
    FailShare(share, status);
    return true;
  }
  return false;
}

void MultiplyStreamSession::FailShare(const std::shared_ptr<StripeShare>& share,
                                      const absl::Status& status) {
  if (share->closed) return;
  RecordFailure(status);
  SendError(share->id, status);
  CloseShare(share, status.code());
}

void MultiplyStreamSession::CloseAll(absl::StatusCode code) {
  std::vector<std::shared_ptr<Multiply>> all;
  for (const auto& [id, m] : open_) all.push_back(m);
  std::vector<std::shared_ptr<StripeShare>> shares;
  for (const auto& [id, share] : shares_) shares.push_back(share);
  for (const auto& share : shares) CloseShare(share, code);
  for (const auto& m : all) Close(m, code);
}

void MultiplyStreamSession::Fail(const std::shared_ptr<Multiply>& m,
                                 const absl::Status& status) {
  if (m->closed) return;
  RecordFailure(status);
  SendError(m->id, status);
  // Chunks the client sent before it saw the error are dropped quietly.
  if (!m->intake.complete()) {
    RememberFailed(m->id);
  }
  if (m->stripes > 1) EndStripes(m, status);
  Close(m, status.code());
}

void MultiplyStreamSession::Close(std::shared_ptr<Multiply> m,
                                  absl::StatusCode code) {
  if (m->closed) return;
  m->closed = true;
  if (auto it = open_.find(m->id); it != open_.end() && it->second == m) {
    open_.erase(it);
  }
  if (m->stripes > 1 && !m->stripes_ended) {
    // This call ended (cancelled, cut, or a bad message): the multiply
    // fails on the joined streams.
    EndStripes(
        m, absl::CancelledError(absl::StrCat(
               "stripe 0's call of this striped multiply (request_id ", m->id,
               " there) ended (", absl::StatusCodeToString(code), ")")));
  }
  for (Chunk& chunk : m->waiting) {
    if (chunk.held_by != nullptr) {
      DropChunk(chunk);
    } else {
      flow_.Release(chunk.bytes);
    }
  }
  const double seconds = SecondsSince(m->started);
  state_.metrics->RecordRequest(RpcMethod::kMultiplyStream,
                                static_cast<grpc::StatusCode>(code), seconds);
  const int64_t operand_bytes = m->intake.need_total();
  if (code == absl::StatusCode::kOk && operand_bytes >= (int64_t{256} << 20)) {
    // What shows that H2D overlapped receipt: how much of the operands was
    // already on the device when their last byte arrived.
    LogLine(absl::StrFormat(
        "stream request %d: %d x %d x %d, %d operand bytes in %d chunks "
        "received %.3f-%.3f s, %.1f%% already on the GPU at the last chunk; "
        "computed at %.3f s, answered at %.3f s",
        m->id, m->spec.m, m->spec.k, m->spec.n, operand_bytes, m->chunks,
        m->first_chunk_s, m->last_chunk_s,
        100.0 * static_cast<double>(m->uploaded_by_last_chunk) /
            static_cast<double>(operand_bytes),
        m->computed_s, seconds));
  }
  m->waiting.clear();
  m->operand[0].reset();
  m->operand[1].reset();
  m->buffer.reset();
  m->panels.clear();
  m->lease.Release();  // budget, request count, and quota unless stored
}

void MultiplyStreamSession::CloseShare(std::shared_ptr<StripeShare> share,
                                       absl::StatusCode code) {
  if (share->closed) return;
  share->closed = true;
  if (auto it = shares_.find(share->id);
      it != shares_.end() && it->second == share) {
    shares_.erase(it);
  }
  // Unless its owner ended it, the multiply fails there (and on its other
  // streams).
  if (!share->owner_done && code != absl::StatusCode::kOk) {
    Post(share->owner,
         [owned = share->owned, s = share->stripe,
          why = absl::CancelledError(absl::StrCat(
              "stripe ", share->stripe,
              "'s call of this striped multiply (request_id ", share->id,
              " there) ended (", absl::StatusCodeToString(code), ")"))](
             MultiplyStreamSession& owner, Actions&) {
           owner.StripeEnded(owned, s, why);
         });
  }
  share->owner->Unref();  // Post holds its own reference
  share->owner = nullptr;
  share->owned.reset();
  share->early.clear();  // their staging goes back
}

void MultiplyStreamSession::Queue(StreamAnswer message, bool result_chunk,
                                  std::shared_ptr<Multiply> striped,
                                  std::shared_ptr<StripeShare> share) {
  if (!result_chunk) flow_.ReplyQueued();
  writes_.push_back(
      {std::move(message), result_chunk, std::move(striped), std::move(share)});
}

void MultiplyStreamSession::Settle(Actions& actions) {
  for (auto& call : outbox_) actions.calls.push_back(std::move(call));
  outbox_.clear();
  actions.engine = engine_;
  if (flow_.Settle(OpenCount() > 0, !writes_.empty(), actions.moves)) {
    actions.write = std::move(writes_.front().message);
    writing_result_chunk_ = writes_.front().result_chunk;
    writing_striped_ = std::move(writes_.front().striped);
    writing_share_ = std::move(writes_.front().share);
    writes_.pop_front();
  }
}

void MultiplyStreamSession::Drain(Actions&) { flow_.Draining(); }

void MultiplyStreamSession::CutForDrain(Actions& actions) {
  flow_.Cancelled();  // no more reads; queued steps are dropped
  const bool any = OpenCount() > 0;
  CloseAll(absl::StatusCode::kUnavailable);
  if (any) {
    state_.admission.RecordRejection(RejectReason::kDraining);
  }
  if (!flow_.finished()) {
    flow_.End(absl::UnavailableError(
                  "the server is shutting down and its drain ended before "
                  "this stream's multiplies finished; retry them"),
              actions.moves);
  }
}

void MultiplyStreamSession::WriteDone(bool ok, Actions& actions) {
  flow_.WriteDone(actions.moves);
  if (writing_striped_ != nullptr) {
    ResultChunkGone(writing_striped_);
    writing_striped_.reset();
  } else if (writing_share_ != nullptr) {
    ShareChunkGone(writing_share_);
    writing_share_.reset();
  } else if (writing_result_chunk_) {
    --result_chunks_in_flight_;
  } else {
    flow_.ReplySent();
  }
  writing_result_chunk_ = false;
  if (ok) {
    PumpDownloads(actions);
    return;
  }
  // The client is gone: nothing more can be sent.
  for (const PendingWrite& w : writes_) {
    if (w.striped != nullptr) {
      ResultChunkGone(w.striped);
    } else if (w.share != nullptr) {
      ShareChunkGone(w.share);
    } else if (w.result_chunk) {
      --result_chunks_in_flight_;
    } else {
      flow_.ReplySent();
    }
  }
  writes_.clear();
  CloseAll(absl::StatusCode::kCancelled);
  if (!flow_.finished()) {
    flow_.End(absl::CancelledError("the client went away"), actions.moves);
  }
}

void MultiplyStreamSession::Cancel(Actions& actions) {
  flow_.Cancelled();
  const bool any = OpenCount() > 0;
  CloseAll(absl::StatusCode::kCancelled);
  if (any) {
    state_.metrics->RecordRejection(RejectReason::kCancelled);
  }
  if (!flow_.finished()) {
    flow_.End(absl::CancelledError("the stream was cancelled"), actions.moves);
  }
}

}  // namespace matmul
