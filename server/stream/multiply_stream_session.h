// MultiplyStreamSession: the protocol of one MultiplyStream call (a
// bidirectional stream of chunked multiplies; see the rpc's comment in
// matmul/v1/matmul.proto), without gRPC. Decoded stream messages, the
// call's events (its input closed, a write done, cancel, drain) and the
// results of the engine steps it asked for go in; actions come out
// (Actions: answers to write, jobs to submit, calls into other calls, and
// whether to read, write or end the call). The gRPC reactor
// (server/rpc/multiply_stream.h) only moves bytes: it reads and decodes,
// calls the session under its lock, and carries the actions out once the
// lock is released.
//
// Each multiply on the stream goes through the engine as a chain of jobs:
//   start  -> allocate one device tensor that will hold both staged operands
//   chunks -> one upload job per chunk, writing it at its offset in that
//             tensor: its H2D runs while the next chunk is still arriving
//   last   -> multiply views of the tensor (or stored tensors named by
//             handle), keeping the product on the device; for a large A,
//             once B is whole, one multiply per row panel of A as its rows
//             arrive, so the GEMM overlaps the rest of the upload
//   result -> download jobs, each reading one result chunk into staging,
//             sent from there as a slice of the response (no copy)
// so an operand's size is bounded by device memory, not by a message, and
// the wire, the bus and the GPU work at once.
//
// Memory bounds: the chunks a stream holds (received, not yet staged) stay
// under kMaxHeldChunkBytes: beyond it the session stops reading, and HTTP/2
// flow control holds the client back. At most kMaxResultChunksInFlight
// result chunks per stream sit in staging or in the send queue. A client
// that sends but never reads cannot grow the server either: while more than
// kMaxUnsentReplies other answers (result headers, per-multiply errors) wait
// to be sent, the session stops reading (flow control, not an error), at
// most kMaxOpenMultiplies multiplies are open, and the ids of failed
// multiplies whose late chunks are dropped quietly are remembered for the
// kMaxRememberedFailures most recent only.
//
// Admission: each multiply passes the admission core at its start, like a
// unary Multiply (server/admission/admission.h): draining, engine, device
// fit, the call's deadline, the quota of a kept product, and the in-flight
// budget, charged up front from the declared shapes (PlanStreamStart's
// held_bytes: the most of its operands the chunk window can hold, plus the
// most of its product the result-chunk window can hold; a striped multiply,
// one of each per stream). The lease is held until the multiply is answered or
// fails.
//
// Chunks may come in any order: each operand's coverage is tracked, and a
// chunk that overlaps another or runs past the end fails its multiply.
//
// Striping (MultiplyStreamStart.stripe_key): one multiply carried by
// several calls. The call its start came on owns it (the Multiply, its
// lease, its engine steps); each joining call (MultiplyStreamJoin) keeps
// its StripeShare of it in shares_ and forwards the chunks it reads
// under the join's request_id to the owner, holding them in its own chunk
// window until the owner has staged them. Once every join has come and the
// product is ready, the owner sends the result header on every stream and
// gives each product chunk to the stream with the fewest unwritten; each
// joiner's share closes when its product chunks are queued. A failure on any
// call fails the multiply on all of them. Calls reach each other only through
// their outbox: closures run once the lock is released (Actions::calls),
// each holding a reference on the call it reaches (StreamCall::Run); the
// cross-call side is multiply_stream_session_stripes.cc, the registry of open
// keys server/rpc/stripe_registry.h.
//
// The session's parts: its messages and the call's events
// multiply_stream_session.cc, starts _start.cc, chunks _chunks.cc, the
// engine steps and their completions _steps.cc, striping _stripes.cc.
//
// Thread safety: none. The call that owns a session (a StreamCall) runs
// every method under one lock of its own; nothing here blocks, and calls
// into other calls (and the stripe registry's Deliver) run only from
// Actions::calls, once that lock is released.
#ifndef MATMUL_SERVER_STREAM_MULTIPLY_STREAM_SESSION_H_
#define MATMUL_SERVER_STREAM_MULTIPLY_STREAM_SESSION_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/engine.h"
#include "server/admission/admission.h"
#include "server/rpc/multiply_wire.h"
#include "server/rpc/service_state.h"
#include "server/rpc/stripe_registry.h"
#include "server/stream/failed_requests.h"
#include "server/stream/operand_intake.h"
#include "server/stream/panel_schedule.h"
#include "server/stream/plan_stream_start.h"
#include "server/stream/stream_answer.h"
#include "server/stream/stream_bounds.h"
#include "server/stream/stream_flow.h"
#include "server/stream/stripe_set.h"

namespace matmul {

class MultiplyStreamSession;

// What a session asks its call to do once the call's lock is released.
struct StreamActions {
  // Calls into other calls (and the stripe registry), run first, so that
  // a joiner has queued a multiply's result header before the downloads
  // of its chunks are submitted.
  std::vector<std::function<void()>> calls;
  // Engine jobs to submit to `engine`; each holds a reference on the call
  // (StreamCall::Ref) from its submission until its Done has run.
  std::vector<std::unique_ptr<MatmulJob>> jobs;
  Engine* engine = nullptr;
  StreamFlow::Moves moves;  // read, write, finish
  // With moves.write: the answer to write.
  std::optional<StreamAnswer> write;
};

// A MultiplyStream call as a session sees it (its own and the others it
// reaches): referenced, and able to run a closure on its session under its
// lock and carry out what that decided. Implemented by the gRPC reactor,
// and by the session's unit tests.
class StreamCall : public StripeCall {
 public:
  using Visit = std::function<void(MultiplyStreamSession&, StreamActions&)>;
  // Runs `visit` on the call's session under its lock, settles, and
  // carries out the actions once the lock is released. Never called with
  // any call's lock held.
  virtual void Run(const Visit& visit) = 0;
  // Whether the call's queued steps should be dropped (the stream was
  // cancelled or has ended): MatmulJob::Abandoned.
  virtual absl::Status Abandoned() = 0;

 protected:
  ~StreamCall() = default;
};

class MultiplyStreamSession {
 public:
  static constexpr int64_t kMaxHeldChunkBytes =
      StreamBounds::kMaxHeldChunkBytes;
  static constexpr int kMaxResultChunksInFlight =
      StreamBounds::kMaxResultChunksInFlight;
  static constexpr int kMaxOpenMultiplies = StreamBounds::kMaxOpenMultiplies;
  static constexpr int kMaxUnsentReplies = StreamBounds::kMaxUnsentReplies;
  static constexpr size_t kMaxRememberedFailures =
      StreamBounds::kMaxRememberedFailures;

  using Actions = StreamActions;

  // `self`: the call that owns this session (it outlives the session's
  // use of it). `client`: whose stream it is (for quotas and usage: the
  // same for every multiply and step of the stream). `deadline`: the
  // call's, for admission.
  MultiplyStreamSession(ServiceState& state, StreamCall* self,
                        std::string client, absl::Time deadline);
  MultiplyStreamSession(const MultiplyStreamSession&) = delete;
  MultiplyStreamSession& operator=(const MultiplyStreamSession&) = delete;

  // Every public method below leaves what to do in `actions`; the owner
  // calls Settle before it releases its lock and carries them out.

  // The call begins: reads its first message (or ends at once, UNAVAILABLE,
  // if the server is draining).
  void Start(Actions& actions);
  // A message read: decoded (or why it could not be), and what holds the
  // bytes its chunk's data points into.
  void Read(absl::StatusOr<WireStreamRequest> request,
            std::shared_ptr<const void> hold, Actions& actions);
  // The client closed its side (or the read failed; `cancelled`: because
  // the call was cancelled).
  void ReadClosed(bool cancelled, Actions& actions);
  // The write Settle handed out finished (ok: sent; else the client is
  // gone).
  void WriteDone(bool ok, Actions& actions);
  // The client cancelled (or the deadline passed).
  void Cancel(Actions& actions);
  // The server drains: with no multiply open the call ends at once,
  // UNAVAILABLE, and with multiplies open after their last answer.
  void Drain(Actions& actions);
  // The drain's deadline: whatever is open is cut, UNAVAILABLE.
  void CutForDrain(Actions& actions);
  // A join that waited for its start is decided.
  void JoinResolved(uint64_t join_id, absl::StatusOr<StripeMatch> match,
                    Actions& actions);
  // Decides whether to read on, what to write next and whether the call
  // ends; moves the calls into other calls into `actions`.
  void Settle(Actions& actions);

  // Whether the engine should drop this call's queued steps.
  absl::Status Abandoned() const;

  // Multiplies and shares open on this call.
  int OpenCount() const {
    return static_cast<int>(open_.size() + shares_.size());
  }

  // A received chunk: its bytes (pieces of the message's slices, which it
  // holds) and where they go in the multiply's device tensor.
  struct Chunk {
    std::shared_ptr<const void> hold;  // what keeps `data`'s bytes alive
    std::vector<ByteChunk> data;
    int64_t at = 0;
    int64_t bytes = 0;
    // The joining call that read it and holds it in its chunk window
    // (referenced), or null: this call.
    StreamCall* held_by = nullptr;
  };

  struct StripeShare;

  // A multiply this call owns: started on it (for a striped multiply, the
  // call its start came on).
  struct Multiply {
    uint64_t id = 0;
    MatmulSpec spec;
    std::vector<int64_t> c_shape;
    std::vector<int64_t> handle_shape[2];  // of operands named by handle
    // Operands for the multiply: stored tensors, or views of `buffer`.
    std::shared_ptr<ResidentTensor> operand[2];
    // The operands sent in chunks: which bytes arrived, and where they go
    // in `buffer`.
    OperandIntake intake;
    int64_t buffer_bytes = 0;
    int device = -1;
    std::shared_ptr<ResidentTensor> buffer;  // both staged operands
    bool allocated = false;
    std::vector<Chunk> waiting;  // arrived before the allocation finished
    int uploads_in_flight = 0;
    int64_t uploaded = 0;
    // The product, in panels of op(A)'s rows: one panel with all of them,
    // or (paneled: A large, 2-D, not transposed, the product not kept)
    // several, each multiplied once B and its rows of A are on the device
    // and sent while the rest of A is still uploading. `schedule` knows
    // which operand bytes are uploaded and when the next panel is ready.
    PanelSchedule schedule;
    struct Panel {
      int64_t row0 = 0;
      int64_t rows = 0;
      std::shared_ptr<ResidentTensor> a;        // its rows of A
      std::shared_ptr<ResidentTensor> product;  // until its downloads go
      int64_t next_download = 0;  // bytes of its product given downloads
    };
    std::vector<Panel> panels;
    int64_t rows_computed = 0;
    Placement placement;
    bool keep = false;
    // What admission charges it (StreamStartPlan).
    int64_t held_bytes = 0;
    std::optional<int64_t> stored_bytes;
    // The in-flight budget and quota this multiply holds (admission core).
    Lease lease;
    absl::Duration keep_ttl;
    int64_t result_chunk_bytes = 0;
    int64_t downloaded = 0;  // product bytes given to downloads
    int downloads_in_flight = 0;
    bool closed = false;
    // For the log line of large multiplies.
    std::chrono::steady_clock::time_point started;
    double first_chunk_s = -1;
    double last_chunk_s = -1;
    double computed_s = -1;
    int64_t uploaded_by_last_chunk = 0;
    int64_t chunks = 0;
    bool described = false;  // its result header is queued

    // Striping, on the owning call (stripes > 1): the streams that carry
    // it, [0] this one, [i] the i-th join once it has come.
    // What the owner keeps of each joining call.
    struct StripePeer {
      StreamCall* call = nullptr;          // referenced; null for [0]
      std::shared_ptr<StripeShare> share;  // its share there (its lock)
    };
    using Stripe = StripeSet<StripePeer>::Stripe;
    int stripes = 1;
    std::string stripe_key;
    StripeSet<StripePeer> stripe;  // empty unless striped
    int result_chunks_out = 0;     // downloads in flight + chunks unwritten
    bool stripes_ended = false;    // the joiners were told how it ended
    absl::Status end_status;       // why it failed, for joins still to come
  };

  // A joining call's share of a striped multiply another call owns: its
  // record on the joining call, open under the join's request_id. Its
  // chunks go to the owner; the owner sends it the result header and its
  // share of the product chunks, and tells it how the multiply ended.
  struct StripeShare {
    uint64_t id = 0;  // the join's request_id on this call
    // The owning call (referenced until the share closes), its multiply
    // (opaque here: the owner's lock guards it) and which stripe this
    // call is.
    StreamCall* owner = nullptr;
    std::shared_ptr<Multiply> owned;
    int stripe = 0;
    int64_t chunks = -1;     // product chunks coming here, once known
    int64_t queued = 0;      // of them queued
    bool described = false;  // the result header is queued
    // Chunks that overtook the result header (from another thread of the
    // owner's): queued after it.
    std::vector<StreamAnswer> early;
    bool owner_done = false;  // the owner ended it: nothing to tell it
    bool closed = false;
  };
  // The engine's view of one step of a multiply
  // (multiply_stream_session_steps.cc).
  class StepJob;
  enum class Step { kAllocate, kUpload, kMultiply, kDownload };

  // A step's job is done. `offset`: the step's byte offset (where a
  // downloaded chunk goes). `held_by`: the joining call whose window held
  // an upload's chunk.
  void StepDone(const std::shared_ptr<Multiply>& multiply, Step step,
                int64_t held_bytes, int64_t offset, StreamCall* held_by,
                absl::StatusOr<JobResult> result, Actions& actions);

  // Striping, between calls (multiply_stream_session_stripes.cc); each
  // runs on the session of the call it is posted to (StreamCall::Run).
  // On the owning call, from a joiner (`multiply` is the owner's, as the
  // joiner's share names it):
  void StripeJoined(const std::shared_ptr<Multiply>& multiply, int stripe,
                    StreamCall* joiner, uint64_t join_id,
                    std::shared_ptr<StripeShare> share, Actions& actions);
  void StripeChunk(const std::shared_ptr<Multiply>& multiply, int operand,
                   int64_t offset, Chunk chunk, Actions& actions);
  void StripeSideClosed(const std::shared_ptr<Multiply>& multiply, int stripe);
  void StripeEnded(const std::shared_ptr<Multiply>& multiply, int stripe,
                   const absl::Status& why);
  void StripeChunkWritten(const std::shared_ptr<Multiply>& multiply, int stripe,
                          Actions& actions);
  // On a joining call, from the owner (`share` is this call's):
  void StripeHeld(int64_t bytes);
  void StripeHeader(const std::shared_ptr<StripeShare>& share,
                    StreamAnswer message);
  void StripeResultChunk(const std::shared_ptr<StripeShare>& share,
                         StreamAnswer message);
  void StripeShareDone(const std::shared_ptr<StripeShare>& share,
                       int64_t chunks);
  void StripeFailed(const std::shared_ptr<StripeShare>& share,
                    const absl::Status& status);

 private:
  void Handle(const WireStreamRequest& request,
              std::shared_ptr<const void> hold, Actions& actions);
  void HandleStart(const WireStreamRequest& request, Actions& actions);
  // A start refused: its error sent, its chunks to be dropped quietly.
  void RefuseStart(uint64_t id, const absl::Status& status);
  // The multiply a planned start describes.
  static std::shared_ptr<Multiply> NewMultiply(uint64_t id,
                                               StreamStartPlan plan);
  // Admits `m` and opens its stripes, or refuses its start (false).
  bool AdmitStart(const std::shared_ptr<Multiply>& m);
  void HandleChunk(const WireStreamRequest& request,
                   std::shared_ptr<const void> hold, Actions& actions);
  void HandleJoin(const WireStreamRequest& request);
  // Checks a chunk of `m` (read here, or forwarded by a joiner) and
  // stages it.
  void TakeChunk(const std::shared_ptr<Multiply>& m, int operand,
                 int64_t offset, Chunk chunk, Actions& actions);
  // A chunk that will not be staged: its joiner's window gets it back.
  void DropChunk(Chunk& chunk);
  // Runs `visit` on `call`'s session once this call's lock is released,
  // holding a reference on `call` until then.
  void Post(StreamCall* call, StreamCall::Visit visit);
  // The join `join_id` matched: its share, and the owner told.
  void AttachJoin(uint64_t join_id, const StripeMatch& match);
  // Sends the result header (on every stream of a striped multiply, once
  // all have joined) and starts its downloads.
  void MaybeAnswer(const std::shared_ptr<Multiply>& m, Actions& actions);
  // Sends a downloaded product chunk on one of the multiply's streams.
  void SendResultChunk(const std::shared_ptr<Multiply>& m, int64_t offset,
                       JobResult result);
  // A result chunk of a striped multiply was written (or dropped) on this
  // call: its owner's window, or (a share's) the owner told.
  void ResultChunkGone(const std::shared_ptr<Multiply>& striped);
  void ShareChunkGone(const std::shared_ptr<StripeShare>& share);
  // A striped multiply fails once every stream has closed its side with
  // operand bytes still missing.
  void CheckStarved(const std::shared_ptr<Multiply>& m);
  // Tells the joiners of `m` how it ended (ok: their shares are queued)
  // and lets go of them.
  void EndStripes(const std::shared_ptr<Multiply>& m,
                  const absl::Status& status);
  // A share whose product chunks are all queued closes.
  void MaybeCloseShare(const std::shared_ptr<StripeShare>& share);
  // The tensor for both staged operands is allocated: views of it for
  // each, and the chunks that waited for it uploaded.
  void Allocated(const std::shared_ptr<Multiply>& m,
                 std::shared_ptr<ResidentTensor> buffer, Actions& actions);
  // Submits the multiply once every operand byte is on the device, or for
  // a paneled multiply each panel once B and its rows of A are
  // (PanelSchedule).
  void MaybeMultiply(const std::shared_ptr<Multiply>& m, Actions& actions);
  // Starts downloads of products while the result-chunk budget allows.
  void PumpDownloads(Actions& actions);
  // Answers `m` with an error and forgets it.
  void Fail(const std::shared_ptr<Multiply>& m, const absl::Status& status);
  // Counts a multiply's failure as a rejection where it is one.
  void RecordFailure(const absl::Status& status);
  void FailShare(const std::shared_ptr<StripeShare>& share,
                 const absl::Status& status);
  // Fails whatever is open under `id` (a start or join that reuses it);
  // false if nothing is.
  bool FailOpen(uint64_t id, const absl::Status& status);
  // Closes every multiply and share open on this call.
  void CloseAll(absl::StatusCode code);
  // An error for a multiply id that is not open.
  void SendError(uint64_t id, const absl::Status& status);
  // Remembers that `id` failed, so that its late chunks are dropped quietly;
  // forgets the oldest beyond kMaxRememberedFailures (a late chunk for a
  // forgotten id gets one more "not open" error).
  void RememberFailed(uint64_t id);
  // Ends `m` (answered in full or failed): metrics, log, bookkeeping.
  // By value: it erases open_'s slot, which a caller may have passed.
  void Close(std::shared_ptr<Multiply> m, absl::StatusCode code);
  // Ends a share; unless its owner ended it (or it ended OK), the
  // multiply fails on the owner. By value, as Close.
  void CloseShare(std::shared_ptr<StripeShare> share, absl::StatusCode code);
  // Queues a response message; Settle hands it out to write. A striped
  // multiply's result chunk names its multiply (`striped`, on the owner)
  // or its share (on a joiner).
  void Queue(StreamAnswer message, bool result_chunk,
             std::shared_ptr<Multiply> striped = nullptr,
             std::shared_ptr<StripeShare> share = nullptr);
  // The job for one step; an upload takes `chunk` (moved from); a
  // multiply or a download is of panel `panel`.
  std::unique_ptr<MatmulJob> NewJob(const std::shared_ptr<Multiply>& m,
                                    Step step, int64_t held_bytes, Chunk* chunk,
                                    size_t panel = 0);

  ServiceState& state_;
  StreamCall* const self_;
  const std::string client_;
  const absl::Time deadline_;
  Engine* engine_ = nullptr;  // set by the first start

  // When the call reads, writes and ends; the chunk bytes it holds and
  // the answers it has not sent.
  StreamFlow flow_;
  // Messages waiting to be written, each marked if it is a result chunk
  // (counted in result_chunks_in_flight_ until written).
  struct PendingWrite {
    StreamAnswer message;
    bool result_chunk = false;
    // A striped multiply's chunk (the owner's multiply, or a joiner's
    // share): counted there, not in result_chunks_in_flight_.
    std::shared_ptr<Multiply> striped;
    std::shared_ptr<StripeShare> share;
  };
  std::deque<PendingWrite> writes_;
  // Open under their request_id: the multiplies this call owns, and its
  // shares of multiplies other calls own.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Multiply>> open_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<StripeShare>> shares_;
  // Failed multiplies whose remaining chunks are dropped without a word.
  FailedRequests failed_{kMaxRememberedFailures};
  int result_chunks_in_flight_ = 0;
  // The write in progress (handed out by Settle).
  bool writing_result_chunk_ = false;
  std::shared_ptr<Multiply> writing_striped_;
  std::shared_ptr<StripeShare> writing_share_;
  // Calls into other calls, for the next Settle.
  std::vector<std::function<void()>> outbox_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_MULTIPLY_STREAM_SESSION_H_
