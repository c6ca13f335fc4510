// StreamFlow: when one MultiplyStream call reads, writes and ends. The
// session tells it what happened (a read or write finished, the client
// cancelled, the server drains, chunk bytes are held or let go, answers
// are queued or sent, a join waits for its start) and asks it what to do
// next (Settle): read the next message, write the first queued answer, or
// end the call with a status. No gRPC: the reactor carries out the moves.
//
// The rules:
// - Reading stops while the chunk bytes held reach
//   StreamBounds::kMaxHeldChunkBytes, the answers not yet sent (other than
//   result chunks) reach kMaxUnsentReplies, a join waits for its start, or
//   once the client closed its side or cancelled; HTTP/2 flow control then
//   holds the client back.
// - One write at a time, in queue order.
// - The call ends OK once the client closed its side, nothing is open and
//   every answer is written; UNAVAILABLE once the server drains and nothing
//   is open and every answer is written; or with the status End is given
//   (cancelled, cut by the drain, a bad message). gRPC's Write and Finish
//   may each carry the response headers when none went yet (and it aborts
//   the process when both do), so an end decided while a write is in
//   progress waits for that write's completion (WriteDone).
//
// Not thread-safe: the session serializes.
#ifndef MATMUL_SERVER_STREAM_STREAM_FLOW_H_
#define MATMUL_SERVER_STREAM_STREAM_FLOW_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace matmul {

class StreamFlow {
 public:
  // What the call does next, once its lock is released.
  struct Moves {
    bool read = false;    // start reading the next message
    bool write = false;   // start writing the answer Settle took
    bool finish = false;  // end the call with `finish_status`
    absl::Status finish_status;
  };

  // A read finished: a message (ok), or the client closed its side.
  void ReadDone(bool ok) {
    reading_ = false;
    if (!ok) read_done_ = true;
  }
  // The write in progress finished; an end decided meanwhile goes now.
  void WriteDone(Moves& moves);
  void Cancelled() { cancelled_ = true; }
  void Draining() { draining_ = true; }
  void JoinWaiting(bool waiting) { join_waiting_ = waiting; }
  // Chunk bytes read and not yet staged.
  void Hold(int64_t bytes) { held_chunk_bytes_ += bytes; }
  void Release(int64_t bytes) { held_chunk_bytes_ -= bytes; }
  // Answers other than result chunks, queued until written.
  void ReplyQueued() { ++unsent_replies_; }
  void ReplySent() { --unsent_replies_; }

  // Ends the call with `status`: now, or after the write in progress.
  void End(absl::Status status, Moves& moves);

  // What to do now, given whether any multiply is open on the call and
  // whether an answer waits to be written. True when a write starts now
  // (moves.write): the caller takes the first queued answer and writes it.
  bool Settle(bool open, bool queued, Moves& moves);

  bool finished() const { return finished_; }
  bool cancelled() const { return cancelled_; }
  bool draining() const { return draining_; }
  bool read_done() const { return read_done_; }
  bool writing() const { return writing_; }
  int64_t held_chunk_bytes() const { return held_chunk_bytes_; }
  int unsent_replies() const { return unsent_replies_; }

 private:
  bool reading_ = false;
  bool read_done_ = false;  // the client closed its side
  bool cancelled_ = false;
  bool finished_ = false;
  bool draining_ = false;  // the server is going away
  bool writing_ = false;
  bool join_waiting_ = false;  // nothing is read meanwhile
  // The call's end, decided while a write was in progress.
  std::optional<absl::Status> finish_after_write_;
  int64_t held_chunk_bytes_ = 0;
  int unsent_replies_ = 0;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_STREAM_FLOW_H_
