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
#include "server/rpc/call_registry.h"
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

class MultiplyStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public DrainableCall,
      public StripeCall {
 public:
  static constexpr int64_t kMaxHeldChunkBytes =
      StreamBounds::kMaxHeldChunkBytes;
  static constexpr int kMaxResultChunksInFlight =
      StreamBounds::kMaxResultChunksInFlight;
  static constexpr int kMaxOpenMultiplies = StreamBounds::kMaxOpenMultiplies;
  static constexpr int kMaxUnsentReplies = StreamBounds::kMaxUnsentReplies;
  static constexpr size_t kMaxRememberedFailures =
      StreamBounds::kMaxRememberedFailures;

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
    std::shared_ptr<const void> hold;  // what keeps `data`'s bytes alive
    std::vector<ByteChunk> data;
    int64_t at = 0;
    int64_t bytes = 0;
    // The joining call that read it and holds it in its chunk window
    // (referenced), or null: this call.
    MultiplyStreamReactor* held_by = nullptr;
  };

  struct StripeShare;

  // A multiply this call owns: started on it (for a striped multiply, the
  // call its start came on). Guarded by the reactor's mu_.
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
      MultiplyStreamReactor* call = nullptr;  // referenced; null for [0]
      std::shared_ptr<StripeShare> share;     // its share there (its lock)
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
  // Guarded by the joining reactor's mu_.
  struct StripeShare {
    uint64_t id = 0;  // the join's request_id on this call
    // The owning call (referenced until the share closes), its multiply
    // (opaque here: the owner's lock guards it) and which stripe this
    // call is.
    MultiplyStreamReactor* owner = nullptr;
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
  // (multiply_stream_steps.cc).
  class StepJob;
  enum class Step { kAllocate, kUpload, kMultiply, kDownload };

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
  // (`multiply` is the owner's, as the joiner's share names it):
  void StripeJoined(const std::shared_ptr<Multiply>& multiply, int stripe,
                    MultiplyStreamReactor* joiner, uint64_t join_id,
                    std::shared_ptr<StripeShare> share);
  void StripeChunk(const std::shared_ptr<Multiply>& multiply, int operand,
                   int64_t offset, Chunk chunk);
  void StripeSideClosed(const std::shared_ptr<Multiply>& multiply, int stripe);
  void StripeEnded(const std::shared_ptr<Multiply>& multiply, int stripe,
                   const absl::Status& why);
  void StripeChunkWritten(const std::shared_ptr<Multiply>& multiply,
                          int stripe);
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
  // What to do once the lock is released.
  struct Actions {
    std::vector<std::unique_ptr<MatmulJob>> jobs;
    StreamFlow::Moves moves;  // read, write, finish
    // Calls into other calls (and the registry), run first.
    std::vector<std::function<void()>> calls;
  };

  ~MultiplyStreamReactor() override = default;

  // The answer as gRPC's buffer: its head copied, a result chunk's data
  // sent from staging (released when gRPC is done with it).
  static grpc::ByteBuffer ToByteBuffer(StreamAnswer answer);

  void Handle(std::vector<grpc::Slice> slices, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleStart(const WireStreamRequest& request, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A start refused: its error sent, its chunks to be dropped quietly.
  void RefuseStart(uint64_t id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The multiply a planned start describes.
  static std::shared_ptr<Multiply> NewMultiply(uint64_t id,
                                               StreamStartPlan plan);
  // Admits `m` and opens its stripes, or refuses its start (false).
  bool AdmitStart(const std::shared_ptr<Multiply>& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleChunk(const WireStreamRequest& request,
                   std::shared_ptr<const void> hold, Actions& actions)
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
  // The join `join_id` matched: its share, and the owner told.
  void AttachJoin(uint64_t join_id, const StripeMatch& match)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the result header (on every stream of a striped multiply, once
  // all have joined) and starts its downloads.
  void MaybeAnswer(const std::shared_ptr<Multiply>& m, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends a downloaded product chunk on one of the multiply's streams.
  void SendResultChunk(const std::shared_ptr<Multiply>& m, int64_t offset,
                       JobResult result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A result chunk of a striped multiply was written (or dropped) on this
  // call: its owner's window, or (a share's) the owner told.
  void ResultChunkGone(const std::shared_ptr<Multiply>& striped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ShareChunkGone(const std::shared_ptr<StripeShare>& share)
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
  // A share whose product chunks are all queued closes.
  void MaybeCloseShare(const std::shared_ptr<StripeShare>& share)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tensor for both staged operands is allocated: views of it for
  // each, and the chunks that waited for it uploaded.
  void Allocated(const std::shared_ptr<Multiply>& m,
                 std::shared_ptr<ResidentTensor> buffer, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submits the multiply once every operand byte is on the device, or for
  // a paneled multiply each panel once B and its rows of A are
  // (PanelSchedule).
  void MaybeMultiply(const std::shared_ptr<Multiply>& m, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts downloads of products while the result-chunk budget allows.
  void PumpDownloads(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers `m` with an error and forgets it.
  void Fail(const std::shared_ptr<Multiply>& m, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a multiply's failure as a rejection where it is one.
  void RecordFailure(const absl::Status& status);
  void FailShare(const std::shared_ptr<StripeShare>& share,
                 const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails whatever is open under `id` (a start or join that reuses it);
  // false if nothing is.
  bool FailOpen(uint64_t id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Multiplies and shares open on this call.
  int OpenCount() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(open_.size() + shares_.size());
  }
  // Closes every multiply and share open on this call.
  void CloseAll(absl::StatusCode code) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An error for a multiply id that is not open.
  void SendError(uint64_t id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Remembers that `id` failed, so that its late chunks are dropped quietly;
  // forgets the oldest beyond kMaxRememberedFailures (a late chunk for a
  // forgotten id gets one more "not open" error).
  void RememberFailed(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `m` (answered in full or failed): metrics, log, bookkeeping.
  // By value: it erases open_'s slot, which a caller may have passed.
  void Close(std::shared_ptr<Multiply> m, absl::StatusCode code)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a share; unless its owner ended it (or it ended OK), the
  // multiply fails on the owner. By value, as Close.
  void CloseShare(std::shared_ptr<StripeShare> share, absl::StatusCode code)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a response message; Settle starts writing it. A striped
  // multiply's result chunk names its multiply (`striped`, on the owner)
  // or its share (on a joiner).
  void Queue(StreamAnswer message, bool result_chunk,
             std::shared_ptr<Multiply> striped = nullptr,
             std::shared_ptr<StripeShare> share = nullptr)
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
  // When the call reads, writes and ends; the chunk bytes it holds and
  // the answers it has not sent.
  StreamFlow flow_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer write_buffer_;  // the message being written
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
  std::deque<PendingWrite> writes_ ABSL_GUARDED_BY(mu_);
  // Open under their request_id: the multiplies this call owns, and its
  // shares of multiplies other calls own.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Multiply>> open_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<StripeShare>> shares_
      ABSL_GUARDED_BY(mu_);
  // Failed multiplies whose remaining chunks are dropped without a word.
  FailedRequests failed_ ABSL_GUARDED_BY(mu_){kMaxRememberedFailures};
  int result_chunks_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_result_chunk_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Multiply> writing_striped_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<StripeShare> writing_share_ ABSL_GUARDED_BY(mu_);
  // Calls into other calls, for the next Perform.
  std::vector<std::function<void()>> outbox_ ABSL_GUARDED_BY(mu_);
};

// Starts one MultiplyStream call; gRPC owns the returned reactor.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StartMultiplyStream(ServiceState& state, grpc::CallbackServerContext* context);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_MULTIPLY_STREAM_H_
