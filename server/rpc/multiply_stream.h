// MultiplyStreamReactor: one MultiplyStream call (a bidirectional stream of
// chunked multiplies; see the rpc's comment in matmul/v1/matmul.proto).
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
// under kMaxHeldChunkBytes: beyond it the reactor stops reading, and HTTP/2
// flow control holds the client back. At most kMaxResultChunksInFlight
// result chunks per stream sit in staging or in the send queue. A client
// that sends but never reads cannot grow the server either: while more than
// kMaxUnsentReplies other answers (result headers, per-multiply errors) wait
// to be sent, the reactor stops reading (flow control, not an error), at
// most kMaxOpenMultiplies multiplies are open, and the ids of failed
// multiplies whose late chunks are dropped quietly are remembered for the
// kMaxRememberedFailures most recent only.
//
// Admission: each multiply passes the admission core at its start, like a
// unary Multiply (server/admission/admission.h): draining, engine, device
// fit, the call's deadline, the quota of a kept product, and the in-flight
// budget, charged up front from the declared shapes with HeldBytes (the
// most of its operands the chunk window can hold, plus the most of its
// product the result-chunk window can hold; a striped multiply, one of
// each per stream). The lease is held until the multiply is answered or
// fails.
//
// Chunks may come in any order: each operand's coverage is tracked, and a
// chunk that overlaps another or runs past the end fails its multiply.
//
// Striping (MultiplyStreamStart.stripe_key): one multiply carried by
// several calls. The call its start came on owns it (the Multiply, its
// lease, its engine steps); each joining call (MultiplyStreamJoin) keeps a
// record of it in its open_ (`owner` set) and forwards the chunks it reads
// under the join's request_id to the owner, holding them in its own chunk
// window until the owner has staged them. Once every join has come and the
// product is ready, the owner sends the result header on every stream and
// gives each product chunk to the stream with the fewest unwritten; each
// joiner's record closes when its share is queued. A failure on any call
// fails the multiply on all of them. Calls reach each other only through
// their outbox: closures run once the lock is released (Perform), each
// holding a reference on the call it reaches; the cross-call side is
// multiply_stream_stripes.cc, the registry of open keys stripe_registry.h.
//
// The reactor lives until gRPC is done with it (OnDone) and every job it
// submitted has finished: a reference count. Its message side (reading,
// starts, writing) is multiply_stream.cc, the chunks it takes
// multiply_stream_chunks.cc; its engine side (the step jobs and their
// completions) multiply_stream_steps.cc.
#ifndef MATMUL_SERVER_RPC_MULTIPLY_STREAM_H_
#define MATMUL_SERVER_RPC_MULTIPLY_STREAM_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/engine.h"
#include "grpcpp/grpcpp.h"
#include "matmul/v1/matmul.pb.h"
#include "server/admission/admission.h"
#include "server/rpc/byte_coverage.h"
#include "server/rpc/call_registry.h"
#include "server/rpc/multiply_wire.h"
#include "server/rpc/service_state.h"
#include "server/rpc/stripe_registry.h"

namespace matmul {

// "a" or "b", for messages about operand 0 or 1.
inline const char* StreamOperandName(int operand) {
  return operand == 0 ? "a" : "b";
}

class MultiplyStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public DrainableCall,
      public StripeCall {
 public:
  static constexpr int64_t kMaxHeldChunkBytes = int64_t{256} << 20;
  static constexpr int kMaxResultChunksInFlight = 8;
  static constexpr int kMaxOpenMultiplies = 64;
  static constexpr int kMaxUnsentReplies = 64;
  static constexpr size_t kMaxRememberedFailures = 4096;
  static constexpr int64_t kDefaultResultChunkBytes = int64_t{4} << 20;
  // Row panels: an A of at least kMinPanelBytes is multiplied in panels
  // of at least 1/kPanels of its rows.
  static constexpr int64_t kMinPanelBytes = int64_t{1} << 20;
  static constexpr int64_t kPanels = 8;

  MultiplyStreamReactor(ServiceState& state,
                        grpc::CallbackServerContext* context);

  // Begins reading; call once, right after construction.
  void Start();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // DrainableCall. Once the server drains, a stream with no multiply open
  // ends at once, UNAVAILABLE, and one with multiplies open after their
  // last answer; at the drain's deadline, whatever is open is cut.
  void Ref() override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() override;
  void Draining() override;
  void CutForDrain() override;

  // StripeCall: a join that waited for its start is decided.
  void JoinResolved(uint64_t join_id,
                    absl::StatusOr<StripeMatch> match) override;

  // A received chunk: its bytes (pieces of the message's slices, which it
  // holds) and where they go in the multiply's device tensor.
  struct Chunk {
    std::vector<grpc::Slice> slices;
    std::vector<ByteChunk> data;
    int64_t at = 0;
    int64_t bytes = 0;
    // The joining call that read it and holds it in its chunk window
    // (referenced), or null: this call.
    MultiplyStreamReactor* held_by = nullptr;
  };

  // One multiply of the stream. Guarded by the reactor's mu_.
  struct Multiply {
    uint64_t id = 0;
    MatmulSpec spec;
    std::vector<int64_t> c_shape;
    std::vector<int64_t> handle_shape[2];  // of operands named by handle
    // Operands for the multiply: stored tensors, or views of `buffer`.
    std::shared_ptr<ResidentTensor> operand[2];
    bool staged[2] = {false, false};  // sent in chunks
    int64_t need[2] = {0, 0};         // bytes expected
    int64_t received[2] = {0, 0};
    ByteCoverage coverage[2];  // which of their bytes arrived
    int64_t at[2] = {0, 0};    // offset in `buffer`
    int64_t buffer_bytes = 0;
    int device = -1;
    std::shared_ptr<ResidentTensor> buffer;  // both staged operands
    bool allocated = false;
    std::vector<Chunk> waiting;  // arrived before the allocation finished
    int uploads_in_flight = 0;
    int64_t uploaded = 0;
    ByteCoverage on_device[2];  // which operand bytes are uploaded
    // The product, in panels of op(A)'s rows: one panel with all of them,
    // or (`paneled`: A large, 2-D, not transposed, the product not kept)
    // several, each multiplied once B and its rows of A are on the device
    // and sent while the rest of A is still uploading.
    struct Panel {
      int64_t row0 = 0;
      int64_t rows = 0;
      std::shared_ptr<ResidentTensor> a;        // its rows of A
      std::shared_ptr<ResidentTensor> product;  // until its downloads go
      int64_t next_download = 0;  // bytes of its product given downloads
    };
    bool paneled = false;
    int64_t panel_rows = 0;  // the fewest rows a panel waits for
    std::vector<Panel> panels;
    int64_t rows_submitted = 0;
    int64_t rows_computed = 0;
    bool multiply_submitted = false;  // every row's panel is submitted
    Placement placement;
    bool keep = false;
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
    struct Stripe {
      MultiplyStreamReactor* call = nullptr;  // referenced; null for [0]
      uint64_t request_id = 0;
      std::shared_ptr<Multiply> record;  // its record there (its lock)
      bool joined = false;
      bool side_closed = false;  // the client closed that call's side
      int chunks_out = 0;        // product chunks given it, not yet written
      int64_t chunks_sent = 0;   // product chunks given it
    };
    int stripes = 1;
    std::string stripe_key;
    std::vector<Stripe> stripe;
    int joins = 0;
    int result_chunks_out = 0;   // downloads in flight + chunks unwritten
    bool stripes_ended = false;  // the joiners were told how it ended
    absl::Status end_status;     // why it failed, for joins still to come

    // A joined record, on a joining call: the owning call (referenced
    // until the record closes), its multiply (opaque here: the owner's
    // lock guards it) and which stripe this call is.
    bool joined_record = false;
    MultiplyStreamReactor* owner = nullptr;
    std::shared_ptr<Multiply> owned;
    int stripe_index = 0;
    int64_t share_chunks = -1;  // product chunks coming here, once known
    int64_t share_got = 0;      // of them queued
    // Chunks that overtook the result header (from another thread of the
    // owner's): queued after it.
    std::vector<grpc::ByteBuffer> early;
    bool owner_done = false;  // the owner ended it: nothing to tell it
  };
  // The engine's view of one step of a multiply
  // (multiply_stream_steps.cc).
  class StepJob;
  enum class Step { kAllocate, kUpload, kMultiply, kDownload };

  // The server memory one multiply may hold at most, charged to the
  // in-flight budget at its start.
  static int64_t HeldBytes(const Multiply& m);

  // Engine side (StepJob).
  absl::Status Abandoned() const;
  // `offset`: the step's byte offset (where a downloaded chunk goes).
  // `held_by`: the joining call whose window held an upload's chunk.
  void StepDone(const std::shared_ptr<Multiply>& multiply, Step step,
                int64_t held_bytes, int64_t offset,
                MultiplyStreamReactor* held_by,
                absl::StatusOr<JobResult> result);

  // Striping, between calls (multiply_stream_stripes.cc); each takes the
  // lock of the call it is called on. On the owning call, from a joiner
  // (`multiply` is the owner's, as the joiner's record names it):
  void StripeJoined(const std::shared_ptr<Multiply>& multiply, int stripe,
                    MultiplyStreamReactor* joiner, uint64_t join_id,
                    std::shared_ptr<Multiply> record);
  void StripeChunk(const std::shared_ptr<Multiply>& multiply, int operand,
                   int64_t offset, Chunk chunk);
  void StripeSideClosed(const std::shared_ptr<Multiply>& multiply, int stripe);
  void StripeEnded(const std::shared_ptr<Multiply>& multiply, int stripe,
                   const absl::Status& why);
  void StripeChunkWritten(const std::shared_ptr<Multiply>& multiply,
                          int stripe);
  // On a joining call, from the owner (`record` is this call's):
  void StripeHeld(int64_t bytes);
  void StripeHeader(const std::shared_ptr<Multiply>& record,
                    grpc::ByteBuffer message);
  void StripeResultChunk(const std::shared_ptr<Multiply>& record,
                         grpc::ByteBuffer message);
  void StripeShareDone(const std::shared_ptr<Multiply>& record, int64_t chunks);
  void StripeFailed(const std::shared_ptr<Multiply>& record,
                    const absl::Status& status);

 private:
  // What to do once the lock is released.
  struct Actions {
    std::vector<std::unique_ptr<MatmulJob>> jobs;
    bool read = false;
    bool write = false;
    bool finish = false;
    grpc::Status finish_status;
    // Calls into other calls (and the registry), run first.
    std::vector<std::function<void()>> calls;
  };

  ~MultiplyStreamReactor() override = default;

  static grpc::ByteBuffer Serialize(const v1::MultiplyStreamResponse& response);

  // Ends the call with `status` (finished_): Finish now, or, while a write
  // is in progress, from its OnWriteDone. gRPC's Write and Finish may each
  // carry the response headers when none went yet, and it aborts the
  // process when both do, so the two never overlap.
  void EndCall(grpc::Status status, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Handle(std::vector<grpc::Slice> slices, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleStart(const WireStreamRequest& request, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleChunk(const WireStreamRequest& request,
                   std::vector<grpc::Slice>& slices, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleJoin(const WireStreamRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a chunk of `m` (read here, or forwarded by a joiner) and
  // stages it.
  void TakeChunk(const std::shared_ptr<Multiply>& m, int operand,
                 int64_t offset, Chunk chunk, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A chunk that will not be staged: its joiner's window gets it back.
  void DropChunk(Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `f` on `call` once the lock is released, holding a reference.
  void Post(MultiplyStreamReactor* call,
            std::function<void(MultiplyStreamReactor&)> f)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The join `join_id` matched: its record, and the owner told.
  void AttachJoin(uint64_t join_id, const StripeMatch& match)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the result header (on every stream of a striped multiply, once
  // all have joined) and starts its downloads.
  void MaybeAnswer(const std::shared_ptr<Multiply>& m, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends a downloaded product chunk on one of the multiply's streams.
  void SendResultChunk(const std::shared_ptr<Multiply>& m, int64_t offset,
                       JobResult result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A result chunk was written (or dropped) on this call.
  void ResultChunkGone(const std::shared_ptr<Multiply>& striped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A striped multiply fails once every stream has closed its side with
  // operand bytes still missing.
  void CheckStarved(const std::shared_ptr<Multiply>& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the joiners of `m` how it ended (ok: their shares are queued)
  // and lets go of them.
  void EndStripes(const std::shared_ptr<Multiply>& m,
                  const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A joiner's record whose share is all queued closes.
  void MaybeCloseShare(const std::shared_ptr<Multiply>& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submits the multiply once every operand byte is on the device, or for
  // a paneled multiply each panel once B and its rows of A are.
  void MaybeMultiply(const std::shared_ptr<Multiply>& m, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts downloads of products while the result-chunk budget allows.
  void PumpDownloads(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers `m` with an error and forgets it.
  void Fail(const std::shared_ptr<Multiply>& m, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An error for a multiply id that is not open.
  void SendError(uint64_t id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Remembers that `id` failed, so that its late chunks are dropped quietly;
  // forgets the oldest beyond kMaxRememberedFailures (a late chunk for a
  // forgotten id gets one more "not open" error).
  void RememberFailed(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `m` (answered in full or failed): metrics, log, bookkeeping.
  void Close(const std::shared_ptr<Multiply>& m, grpc::StatusCode code)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a response message; Settle starts writing it.
  void Queue(grpc::ByteBuffer message, bool result_chunk,
             std::shared_ptr<Multiply> striped = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job for one step; an upload takes `chunk` (moved from); a
  // multiply or a download is of panel `panel`.
  std::unique_ptr<MatmulJob> NewJob(const std::shared_ptr<Multiply>& m,
                                    Step step, int64_t held_bytes, Chunk* chunk,
                                    size_t panel = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides whether to read on, and whether the call can end.
  void Settle(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Carries out `actions` (without the lock).
  void Perform(Actions& actions);

  ServiceState& state_;
  grpc::CallbackServerContext* const context_;
  // Whose stream it is (ClientKey: the certificate's identity, the
  // x-matmul-client header or the peer), for quotas and usage; the same for
  // every multiply and step of the stream, so found once.
  const std::string client_;
  std::atomic<int> refs_{1};  // gRPC's, and one per job in the engine
  std::atomic<Engine*> engine_{nullptr};  // set by the first start

  mutable absl::Mutex mu_;
  grpc::ByteBuffer read_buffer_;  // the message being read
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;  // the client closed its side
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // the server is going away
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // The call's end, decided while a write was in progress: Finished then
  // once OnWriteDone has come (EndCall).
  std::optional<grpc::Status> finish_after_write_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer write_buffer_;  // the message being written
  // Messages waiting to be written, each marked if it is a result chunk
  // (counted in result_chunks_in_flight_ until written).
  struct PendingWrite {
    grpc::ByteBuffer message;
    bool result_chunk = false;
    // A striped multiply's chunk (the owner's multiply, or a joiner's
    // record): counted there, not in result_chunks_in_flight_.
    std::shared_ptr<Multiply> striped;
  };
  std::deque<PendingWrite> writes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Multiply>> open_
      ABSL_GUARDED_BY(mu_);
  // Failed multiplies whose remaining chunks are dropped without a word:
  // id -> when it was remembered, and the ids in that order (an id started
  // again and failed again appears twice; only its latest entry counts).
  absl::flat_hash_map<uint64_t, uint64_t> failed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, uint64_t>> failed_order_ ABSL_GUARDED_BY(mu_);
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  // Queued or being written, other than result chunks.
  int unsent_replies_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t held_chunk_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int result_chunks_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_result_chunk_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Multiply> writing_striped_ ABSL_GUARDED_BY(mu_);
  // A join waiting for its start: nothing is read meanwhile.
  bool join_waiting_ ABSL_GUARDED_BY(mu_) = false;
  // Calls into other calls, for the next Perform.
  std::vector<std::function<void()>> outbox_ ABSL_GUARDED_BY(mu_);
};

// Starts one MultiplyStream call; gRPC owns the returned reactor.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StartMultiplyStream(ServiceState& state, grpc::CallbackServerContext* context);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_MULTIPLY_STREAM_H_
