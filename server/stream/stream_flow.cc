#include "server/stream/stream_flow.h"

#include <utility>

#include "server/stream/stream_bounds.h"

namespace matmul {

void StreamFlow::WriteDone(Moves& moves) {
  writing_ = false;
  if (finish_after_write_.has_value()) {
    moves.finish = true;
    moves.finish_status = *std::exchange(finish_after_write_, std::nullopt);
  }
}

void StreamFlow::End(absl::Status status, Moves& moves) {
  finished_ = true;
  if (writing_) {
    finish_after_write_ = std::move(status);
    return;
  }
  moves.finish = true;
  moves.finish_status = std::move(status);
}

bool StreamFlow::Settle(bool open, bool queued, Moves& moves) {
  if (finished_) return false;
  // Reading stops while the chunks held or the answers the client has not
  // taken are at their bounds; HTTP/2 flow control then holds the client.
  if (!reading_ && !read_done_ && !cancelled_ && !join_waiting_ &&
      held_chunk_bytes_ < StreamBounds::kMaxHeldChunkBytes &&
      unsent_replies_ < StreamBounds::kMaxUnsentReplies) {
    reading_ = true;
    moves.read = true;
  }
  if (!writing_ && queued) {
    writing_ = true;
    moves.write = true;
    return true;
  }
  if (!writing_ && read_done_ && !open && !join_waiting_) {
    End(absl::OkStatus(), moves);
  } else if (!writing_ && draining_ && !open && !join_waiting_) {
    // Every answer is out; the client may still have meant to send more.
    End(absl::UnavailableError(
            "the server is shutting down; open a new stream to go on"),
        moves);
  }
  return false;
}

}  // namespace matmul
