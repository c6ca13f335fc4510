#include "server/rpc/multiply_stream.h"

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
#include "server/rpc/stored_tensors.h"

namespace matmul {
grpc::ByteBuffer MultiplyStreamReactor::Serialize(
    const v1::MultiplyStreamResponse& response) {
  const std::string bytes = response.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

MultiplyStreamReactor::MultiplyStreamReactor(
    ServiceState& state, grpc::CallbackServerContext* context)
    : state_(state), context_(context), client_(ClientKey(*context)) {
  state_.calls.AddOpen(this);
}

int64_t MultiplyStreamReactor::HeldBytes(const Multiply& m) {
  // A striped multiply's chunks are held in the window of each of its
  // streams, and its product chunks fill a window per stream.
  const int64_t windows = std::max(1, m.stripes);
  const int64_t operands =
      std::min(m.need[0] + m.need[1], windows * kMaxHeldChunkBytes);
  const int64_t product =
      m.keep ? 0
             : std::min(m.spec.c_bytes(), windows * kMaxResultChunksInFlight *
                                              m.result_chunk_bytes);
  return operands + product;
}

void MultiplyStreamReactor::Start() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    // A stream opened once the drain began (after StartDraining looked at
    // the registered calls) ends at once too.
    draining_ = state_.admission.draining();
    Settle(actions);
  }
  Perform(actions);
}

absl::Status MultiplyStreamReactor::Abandoned() const {
  absl::MutexLock lock(&mu_);
  if (cancelled_ || finished_) {
    return absl::CancelledError("the stream was cancelled");
  }
  return absl::OkStatus();
}

void MultiplyStreamReactor::OnReadDone(bool ok) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    if (!ok) {
      read_done_ = true;
      // Multiplies still missing bytes can never complete. A read that
      // failed because the client cancelled the call is not a short
      // operand: OnCancel answers those multiplies CANCELLED (which of the
      // two runs first is gRPC's choice).
      const bool cancelled = cancelled_ || context_->IsCancelled();
      std::vector<std::shared_ptr<Multiply>> incomplete, striped;
      for (const auto& [id, m] : open_) {
        if (m->owner != nullptr) {
          // A joined multiply: its owner decides.
          Post(m->owner, [owned = m->owned,
                          s = m->stripe_index](MultiplyStreamReactor& owner) {
            owner.StripeSideClosed(owned, s);
          });
        } else if (m->stripes > 1) {
          m->stripe[0].side_closed = true;
          striped.push_back(m);
        } else if (!cancelled && (m->received[0] < m->need[0] ||
                                  m->received[1] < m->need[1])) {
          incomplete.push_back(m);
        }
      }
      for (const auto& m : striped) CheckStarved(m);
      for (const auto& m : incomplete) {
        const int op = m->received[0] < m->need[0] ? 0 : 1;
        Fail(m, absl::InvalidArgumentError(absl::StrCat(
                    "the client closed the stream before operand ",
                    StreamOperandName(op), " of request ", m->id, " arrived: ",
                    m->received[op], " of ", m->need[op], " bytes")));
      }
    } else if (!finished_) {
      std::vector<grpc::Slice> slices;
      if (!read_buffer_.Dump(&slices).ok()) slices.clear();
      read_buffer_.Clear();
      Handle(std::move(slices), actions);
    }
    Settle(actions);
  }
  Perform(actions);
}

void MultiplyStreamReactor::Handle(std::vector<grpc::Slice> slices,
                                   Actions& actions) {
  std::vector<ByteChunk> chunks;
  chunks.reserve(slices.size());
  for (const grpc::Slice& s : slices) chunks.emplace_back(s.begin(), s.size());
  absl::StatusOr<WireStreamRequest> request =
      DecodeMultiplyStreamRequest(chunks);
  if (!request.ok()) {
    // Nothing can be attributed to a multiply: the stream itself is bad.
    std::vector<std::shared_ptr<Multiply>> all;
    for (const auto& [id, m] : open_) all.push_back(m);
    for (const auto& m : all) Close(m, grpc::StatusCode::INVALID_ARGUMENT);
    EndCall(ToGrpcStatus(request.status()), actions);
    state_.admission.RecordRejection(RequestFault(request.status()));
    return;
  }
  switch (request->kind) {
    case WireStreamRequest::Kind::kStart:
      HandleStart(*request, actions);
      return;
    case WireStreamRequest::Kind::kChunk:
      HandleChunk(*request, slices, actions);
      return;
    case WireStreamRequest::Kind::kJoin:
      HandleJoin(*request);
      return;
    case WireStreamRequest::Kind::kNone:
      SendError(request->request_id,
                absl::InvalidArgumentError(
                    "MultiplyStreamRequest: none of start, chunk and join is "
                    "set"));
      return;
  }
}

void MultiplyStreamReactor::SendError(uint64_t id, const absl::Status& status) {
  v1::MultiplyStreamResponse response;
  response.set_request_id(id);
  const grpc::Status g = ToGrpcStatus(status);
  response.mutable_error()->set_code(static_cast<int32_t>(g.error_code()));
  response.mutable_error()->set_message(g.error_message());
  Queue(Serialize(response), false);
}

void MultiplyStreamReactor::RememberFailed(uint64_t id) {
  const uint64_t when = ++failures_;
  failed_[id] = when;
  failed_order_.emplace_back(id, when);
  while (failed_order_.size() > kMaxRememberedFailures) {
    const auto [old, at] = failed_order_.front();
    failed_order_.pop_front();
    if (auto it = failed_.find(old); it != failed_.end() && it->second == at) {
      failed_.erase(it);
    }
  }
}

void MultiplyStreamReactor::Fail(const std::shared_ptr<Multiply>& m,
                                 const absl::Status& status) {
  if (m->closed) return;
  if (std::optional<RejectReason> reason = RejectionOf(status)) {
    state_.metrics->RecordRejection(*reason);
  } else if (status.code() == absl::StatusCode::kInvalidArgument) {
    state_.metrics->RecordRejection(RejectReason::kInvalid);
  }
  SendError(m->id, status);
  // Chunks the client sent before it saw the error are dropped quietly.
  if (m->received[0] < m->need[0] || m->received[1] < m->need[1]) {
    RememberFailed(m->id);
  }
  if (m->stripes > 1) EndStripes(m, status);
  Close(m, ToGrpcStatus(status).error_code());
}

void MultiplyStreamReactor::Close(const std::shared_ptr<Multiply>& m,
                                  grpc::StatusCode code) {
  if (m->closed) return;
  m->closed = true;
  if (auto it = open_.find(m->id); it != open_.end() && it->second == m) {
    open_.erase(it);
  }
  if (m->owner != nullptr) {
    // A joined record: unless its owner ended it, the multiply fails there
    // (and on its other streams).
    if (!m->owner_done && code != grpc::StatusCode::OK) {
      Post(m->owner,
           [owned = m->owned, s = m->stripe_index,
            why = absl::CancelledError(absl::StrCat(
                "stripe ", m->stripe_index,
                "'s call of this striped multiply (request_id ", m->id,
                " there) ended (",
                absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
                ")"))](MultiplyStreamReactor& owner) {
             owner.StripeEnded(owned, s, why);
           });
    }
    m->owner->Unref();  // Post holds its own reference
    m->owner = nullptr;
    m->owned.reset();
    m->early.clear();  // their staging goes back
    return;
  }
  if (m->stripes > 1 && !m->stripes_ended) {
    // This call ended (cancelled, cut, or a bad message): the multiply
    // fails on the joined streams.
    EndStripes(
        m, absl::CancelledError(absl::StrCat(
               "stripe 0's call of this striped multiply (request_id ", m->id,
               " there) ended (",
               absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
               ")")));
  }
  for (Chunk& chunk : m->waiting) {
    if (chunk.held_by != nullptr) {
      DropChunk(chunk);
    } else {
      held_chunk_bytes_ -= chunk.bytes;
    }
  }
  const double seconds = SecondsSince(m->started);
  state_.metrics->RecordRequest(RpcMethod::kMultiplyStream, code, seconds);
  const int64_t operand_bytes = m->need[0] + m->need[1];
  if (code == grpc::StatusCode::OK && operand_bytes >= (int64_t{256} << 20)) {
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
  m->early.clear();
  m->operand[0].reset();
  m->operand[1].reset();
  m->buffer.reset();
  m->panels.clear();
  m->lease.Release();  // budget, request count, and quota unless stored
}

void MultiplyStreamReactor::Queue(grpc::ByteBuffer message, bool result_chunk,
                                  std::shared_ptr<Multiply> striped) {
  if (!result_chunk) ++unsent_replies_;
  writes_.push_back({std::move(message), result_chunk, std::move(striped)});
}

void MultiplyStreamReactor::Settle(Actions& actions) {
  for (auto& call : outbox_) actions.calls.push_back(std::move(call));
  outbox_.clear();
  if (finished_) return;
  // Reading stops while the chunks held or the answers the client has not
  // taken are at their bounds; HTTP/2 flow control then holds the client.
  if (!reading_ && !read_done_ && !cancelled_ && !join_waiting_ &&
      held_chunk_bytes_ < kMaxHeldChunkBytes &&
      unsent_replies_ < kMaxUnsentReplies) {
    reading_ = true;
    actions.read = true;
  }
  if (!writing_ && !writes_.empty()) {
    writing_ = true;
    write_buffer_ = std::move(writes_.front().message);
    writing_result_chunk_ = writes_.front().result_chunk;
    writing_striped_ = std::move(writes_.front().striped);
    writes_.pop_front();
    actions.write = true;
  } else if (!writing_ && read_done_ && open_.empty() && !join_waiting_) {
    EndCall(grpc::Status::OK, actions);
  } else if (!writing_ && draining_ && open_.empty() && !join_waiting_) {
    // Every answer is out; the client may still have meant to send more.
    EndCall(ToGrpcStatus(absl::UnavailableError(
                "the server is shutting down; open a new stream to go on")),
            actions);
  }
}

void MultiplyStreamReactor::EndCall(grpc::Status status, Actions& actions) {
  finished_ = true;
  if (writing_) {
    finish_after_write_ = std::move(status);
    return;
  }
  actions.finish = true;
  actions.finish_status = std::move(status);
}

void MultiplyStreamReactor::Draining() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    Settle(actions);
  }
  Perform(actions);
}

void MultiplyStreamReactor::CutForDrain() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;  // no more reads; queued steps are dropped
    std::vector<std::shared_ptr<Multiply>> all;
    for (const auto& [id, m] : open_) all.push_back(m);
    for (const auto& m : all) Close(m, grpc::StatusCode::UNAVAILABLE);
    if (!all.empty()) {
      state_.admission.RecordRejection(RejectReason::kDraining);
    }
    if (!finished_) {
      EndCall(ToGrpcStatus(absl::UnavailableError(
                  "the server is shutting down and its drain ended before "
                  "this stream's multiplies finished; retry them")),
              actions);
    }
    Settle(actions);  // the calls to other calls
  }
  Perform(actions);
}

void MultiplyStreamReactor::Perform(Actions& actions) {
  // First, so that a joiner has queued a multiply's result header before
  // the downloads of its chunks are submitted.
  for (auto& call : actions.calls) call();
  for (std::unique_ptr<MatmulJob>& job : actions.jobs) {
    refs_.fetch_add(1, std::memory_order_relaxed);
    engine_.load(std::memory_order_acquire)->Submit(std::move(job));
  }
  if (actions.read) StartRead(&read_buffer_);
  if (actions.write) StartWrite(&write_buffer_);
  if (actions.finish) Finish(actions.finish_status);
}

void MultiplyStreamReactor::OnWriteDone(bool ok) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    write_buffer_.Clear();
    if (finish_after_write_.has_value()) {
      actions.finish = true;
      actions.finish_status = *std::exchange(finish_after_write_, std::nullopt);
    }
    if (writing_striped_ != nullptr) {
      ResultChunkGone(writing_striped_);
      writing_striped_.reset();
    } else if (writing_result_chunk_) {
      --result_chunks_in_flight_;
    } else {
      --unsent_replies_;
    }
    writing_result_chunk_ = false;
    if (!ok) {
      // The client is gone: nothing more can be sent.
      for (const PendingWrite& w : writes_) {
        if (w.striped != nullptr) {
          ResultChunkGone(w.striped);
        } else if (w.result_chunk) {
          --result_chunks_in_flight_;
        } else {
          --unsent_replies_;
        }
      }
      writes_.clear();
      std::vector<std::shared_ptr<Multiply>> all;
      for (const auto& [id, m] : open_) all.push_back(m);
      for (const auto& m : all) Close(m, grpc::StatusCode::CANCELLED);
      if (!finished_) {
        EndCall(
            grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"),
            actions);
      }
      Settle(actions);  // the calls to other calls
    } else {
      PumpDownloads(actions);
      Settle(actions);
    }
  }
  Perform(actions);
}

void MultiplyStreamReactor::OnCancel() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    std::vector<std::shared_ptr<Multiply>> all;
    for (const auto& [id, m] : open_) all.push_back(m);
    for (const auto& m : all) Close(m, grpc::StatusCode::CANCELLED);
    if (!all.empty()) {
      state_.metrics->RecordRejection(RejectReason::kCancelled);
    }
    if (!finished_) {
      EndCall(
          grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"),
          actions);
    }
    Settle(actions);  // the calls to other calls
  }
  state_.stripes.Forget(this);  // a join it had waiting
  Perform(actions);
}

void MultiplyStreamReactor::OnDone() {
  state_.calls.Remove(this);
  state_.stripes.Forget(this);
  Unref();
}

void MultiplyStreamReactor::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StartMultiplyStream(ServiceState& state, grpc::CallbackServerContext* context) {
  auto* reactor = new MultiplyStreamReactor(state, context);
  reactor->Start();
  return reactor;
}

}  // namespace matmul
