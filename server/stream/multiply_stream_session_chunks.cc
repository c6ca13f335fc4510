// MultiplyStreamSession, chunk intake: an operand chunk read on this call
// (or, for a striped multiply, forwarded by a joining call) is checked
// against what its operand has received so far and staged at its offset.
// Chunks may come in any order; each operand byte comes exactly once.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "matmul/v1/matmul.pb.h"
#include "server/rpc/call_helpers.h"
#include "server/stream/multiply_stream_session.h"

namespace matmul {
void MultiplyStreamSession::HandleChunk(const WireStreamRequest& request,
                                        std::shared_ptr<const void> hold,
                                        Actions& actions) {
  const uint64_t id = request.request_id;
  Chunk chunk;
  chunk.hold = std::move(hold);
  chunk.data = request.data;
  chunk.bytes = request.data_bytes;
  if (auto it = open_.find(id); it != open_.end()) {
    // A copy: closing the multiply erases its slot in open_.
    const std::shared_ptr<Multiply> m = it->second;
    TakeChunk(m, request.operand, request.offset, std::move(chunk), actions);
    return;
  }
  auto share = shares_.find(id);
  if (share == shares_.end()) {
    if (failed_.Contains(id)) return;  // its error was sent already
    SendError(id, absl::InvalidArgumentError(absl::StrCat(
                      "chunk for request_id ", id,
                      ", which is not open on this stream (send its start or "
                      "join first)")));
    RememberFailed(id);
    return;
  }
  // A joined multiply: its owner checks and stages the chunk, which this
  // stream's window holds until then.
  flow_.Hold(std::max<int64_t>(chunk.bytes, 0));
  self_->Ref();
  chunk.held_by = self_;
  Post(share->second->owner,
       [owned = share->second->owned, op = request.operand,
        offset = request.offset, chunk = std::move(chunk)](
           MultiplyStreamSession& owner, Actions& actions) {
         owner.StripeChunk(owned, op, offset, chunk, actions);
       });
}

void MultiplyStreamSession::TakeChunk(const std::shared_ptr<Multiply>& m,
                                      int operand, int64_t offset, Chunk chunk,
                                      Actions& actions) {
  // Fails `m`; a forwarded chunk goes back to its joiner's window.
  auto fail = [&](const absl::Status& status) {
    DropChunk(chunk);
    Fail(m, status);
  };
  if (m->schedule.all_submitted()) {
    fail(absl::InvalidArgumentError(absl::StrCat(
        "chunk for request_id ", m->id, " after all its operand bytes")));
    return;
  }
  absl::StatusOr<int64_t> at = m->intake.Take(operand, offset, chunk.bytes);
  if (!at.ok()) {
    fail(at.status());
    return;
  }
  const double now = SecondsSince(m->started);
  if (m->chunks++ == 0) m->first_chunk_s = now;
  chunk.at = *at;
  if (chunk.held_by == nullptr) flow_.Hold(chunk.bytes);
  if (m->intake.complete()) {
    m->last_chunk_s = now;
    m->uploaded_by_last_chunk = m->uploaded;
  }
  if (m->allocated) {
    const int64_t held = chunk.bytes;
    ++m->uploads_in_flight;
    actions.jobs.push_back(NewJob(m, Step::kUpload, held, &chunk));
  } else {
    m->waiting.push_back(std::move(chunk));
  }
}

}  // namespace matmul
