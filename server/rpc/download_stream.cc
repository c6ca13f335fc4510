// DownloadStream: a stored tensor's bytes sent back in chunks. Admitted as
// a Download is, for the chunks it holds at once; each chunk is a download
// job out of the tensor, a few in flight, written in order after the
// message that describes the tensor.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gpu/engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/client_usage.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/call_registry.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_messages.h"
#include "server/rpc/stored_tensor_streams.h"
#include "server/rpc/stored_tensors.h"

namespace matmul {
namespace {

class DownloadStreamReactor;

// The engine's view of one chunk's download.
class DownloadStepJob final : public MatmulJob {
 public:
  DownloadStepJob(DownloadStreamReactor* reactor, JobDescription description,
                  int64_t offset)
      : MatmulJob(std::move(description)), reactor_(reactor), offset_(offset) {}

  void Done(absl::StatusOr<JobResult> result) override;
  absl::Status Abandoned() const override;

 private:
  DownloadStreamReactor* const reactor_;
  const int64_t offset_;
};

class DownloadStreamReactor final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
      public DrainableCall {
 public:
  DownloadStreamReactor(ServiceState& state,
                        grpc::CallbackServerContext* context)
      : state_(state), context_(context), deadline_(context->deadline()) {
    state_.calls.AddRequest(this, started_);
  }

  void Begin(const grpc::ByteBuffer* request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override {
    state_.calls.Remove(this);
    state_.metrics->RecordRequest(RpcMethod::kDownload,
                                  code_.load(std::memory_order_acquire),
                                  SecondsSince(started_));
    Unref();
  }

  // DrainableCall: a request, ended by its answer; at the drain's deadline
  // it is answered UNAVAILABLE.
  void Ref() override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() override {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  void Draining() override {}
  void CutForDrain() override;

  // Engine side.
  absl::Status Abandoned() const;
  void ChunkDone(int64_t offset, BusBytes bus,
                 absl::StatusOr<JobResult> result);

 private:
  struct Actions {
    std::optional<grpc::Status> finish;
    std::vector<std::unique_ptr<MatmulJob>> jobs;
    // The message to write, if any (the one write gRPC allows at a time).
    std::optional<grpc::ByteBuffer> write;
  };

  ~DownloadStreamReactor() override = default;

  absl::Status Start(const grpc::ByteBuffer* request, grpc::ByteBuffer& first);
  // Makes the jobs the window has room for, writes the next message in
  // order, finishes once all is written.
  void ProgressLocked(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(const absl::Status& status,
                  std::optional<RejectReason> reason, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Perform(Actions& actions);

  ServiceState& state_;
  grpc::CallbackServerContext* const context_;
  const std::chrono::system_clock::time_point deadline_;
  const std::chrono::steady_clock::time_point started_ =
      std::chrono::steady_clock::now();
  std::atomic<int> refs_{1};  // gRPC's, and one per job in flight
  std::atomic<grpc::StatusCode> code_{grpc::StatusCode::UNKNOWN};

  // Set by Start, before any job exists.
  std::string client_;
  Lease lease_;
  std::shared_ptr<ResidentTensor> tensor_;
  int64_t total_ = 0;
  int64_t chunk_bytes_ = 0;

  mutable absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Writes decided and not yet started (Perform), and the ending that waits
  // for them: no write may start after Finish.
  int writes_starting_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> finish_after_write_ ABSL_GUARDED_BY(mu_);
  // The next chunk to download, the next to write, and the chunks out
  // (downloading, or downloaded and not yet written).
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_write_ ABSL_GUARDED_BY(mu_) = 0;
  int chunks_out_ ABSL_GUARDED_BY(mu_) = 0;
  // Messages ready to write, by offset (the first, the handle, at -1).
  std::map<int64_t, grpc::ByteBuffer> ready_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer writing_buffer_;  // the write in progress
};

void DownloadStepJob::Done(absl::StatusOr<JobResult> result) {
  reactor_->ChunkDone(offset_, JobBusBytes(description()), std::move(result));
}

absl::Status DownloadStepJob::Abandoned() const {
  return reactor_->Abandoned();
}

void DownloadStreamReactor::Begin(const grpc::ByteBuffer* request) {
  grpc::ByteBuffer first;
  const absl::Status started = Start(request, first);
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    if (!started.ok()) {
      FailLocked(started, std::nullopt, actions);  // Start counted it
    } else {
      next_write_ = -1;
      ready_.emplace(-1, std::move(first));
      ProgressLocked(actions);
    }
  }
  Perform(actions);
}

absl::Status DownloadStreamReactor::Start(const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer& first) {
  v1::DownloadStreamRequest parsed;
  if (absl::Status s = ParseRequest(*context_, request, parsed); !s.ok()) {
    return state_.admission.Refuse(RequestRejection(s), s);
  }
  if (absl::Status open = state_.admission.CheckOpen(); !open.ok()) {
    return open;  // counted by the core
  }
  if (parsed.chunk_bytes() < 0) {
    return state_.admission.Refuse(
        RejectReason::kInvalid,
        absl::InvalidArgumentError(
            absl::StrCat("chunk_bytes: expected 0 (the default) or more, got ",
                         parsed.chunk_bytes())));
  }
  absl::StatusOr<HandleRegistry::Entry> entry =
      state_.handles.Get(parsed.handle());
  if (!entry.ok()) {
    return state_.admission.Refuse(
        RejectReason::kInvalid,
        absl::Status(entry.status().code(),
                     absl::StrCat("handle: ", entry.status().message())));
  }
  tensor_ = entry->tensor;
  total_ = tensor_->bytes();
  const int64_t elem = static_cast<int64_t>(DTypeSize(tensor_->dtype()));
  int64_t chunk = parsed.chunk_bytes() == 0 ? kDownloadStreamDefaultChunkBytes
                                            : parsed.chunk_bytes();
  // Room for the message's framing under the largest message.
  chunk = std::min(chunk, state_.limits.max_message_bytes - 128);
  chunk_bytes_ = std::max(elem, chunk / elem * elem);
  client_ = ClientKey(*context_);
  MatmulSpec spec;
  spec.dtype = tensor_->dtype();
  spec.batch = 1;
  spec.a_batch = spec.b_batch = 0;
  spec.m = 1;
  spec.n = std::min(chunk_bytes_, total_) / elem;
  spec.k = 0;
  Operation op;
  op.kind = OperationKind::kDownload;
  op.spec = &spec;
  // The chunks out at once: in staging, then in their messages.
  op.held_bytes =
      std::min(total_, kDownloadStreamChunksInFlight * chunk_bytes_);
  op.client = client_;
  op.deadline = DeadlineOf(*context_);
  absl::StatusOr<Lease> lease = state_.admission.Admit(op);
  if (!lease.ok()) {
    if (std::optional<int64_t> ms = RetryPushbackMs(lease.status())) {
      context_->AddTrailingMetadata("grpc-retry-pushback-ms",
                                    std::to_string(*ms));
    }
    return lease.status();  // counted by the core
  }
  lease_ = *std::move(lease);
  v1::DownloadStreamResponse response;
  FillHandle(*entry, response.mutable_handle());
  return SerializeResponse(response, &first);
}

void DownloadStreamReactor::ProgressLocked(Actions& actions) {
  if (finished_) return;
  while (chunks_out_ < kDownloadStreamChunksInFlight && next_job_ < total_) {
    const int64_t bytes = std::min(chunk_bytes_, total_ - next_job_);
    const int64_t elem = static_cast<int64_t>(DTypeSize(tensor_->dtype()));
    JobDescription job;
    job.op = DownloadOp{tensor_, next_job_};
    job.spec.dtype = tensor_->dtype();
    job.spec.batch = 1;
    job.spec.a_batch = job.spec.b_batch = 0;
    job.spec.m = 1;
    job.spec.n = bytes / elem;
    job.spec.k = 0;
    job.device = tensor_->device();
    Ref();  // the job's
    actions.jobs.push_back(
        std::make_unique<DownloadStepJob>(this, std::move(job), next_job_));
    next_job_ += bytes;
    ++chunks_out_;
  }
  if (writing_) return;
  if (next_write_ >= total_) {
    finished_ = true;
    actions.finish = grpc::Status::OK;
    return;
  }
  auto next = ready_.find(next_write_);
  if (next == ready_.end()) return;
  writing_ = true;
  ++writes_starting_;
  actions.write = std::move(next->second);
  ready_.erase(next);
}

void DownloadStreamReactor::ChunkDone(int64_t offset, BusBytes bus,
                                      absl::StatusOr<JobResult> result) {
  if (result.ok()) {
    state_.metrics->client_usage().Record(client_, result->timings(), bus);
  }
  // The chunk's message is built here, outside the lock: the one copy of
  // its bytes out of staging.
  grpc::ByteBuffer message;
  absl::Status built = result.status();
  if (result.ok()) {
    v1::DownloadStreamResponse response;
    v1::TensorChunk* chunk = response.mutable_chunk();
    chunk->set_offset(offset);
    chunk->set_data(reinterpret_cast<const char*>(result->c().data()),
                    result->c().size());
    const int64_t bytes = static_cast<int64_t>(result->c().size());
    state_.copied_result_bytes.fetch_add(bytes, std::memory_order_relaxed);
    state_.metrics->RecordPayload(PayloadPath::kHandle, PayloadDirection::kOut,
                                  bytes);
    result = absl::CancelledError("released");  // staging goes now
    built = SerializeResponse(response, &message);
  }
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    if (!built.ok()) {
      if (!finished_) state_.admission.RecordFailure(built);
      FailLocked(built, std::nullopt, actions);
    } else if (!finished_) {
      ready_.emplace(offset, std::move(message));
      ProgressLocked(actions);
    }
  }
  Perform(actions);
  Unref();  // the job's
}

void DownloadStreamReactor::OnWriteDone(bool ok) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    writing_buffer_.Clear();
    if (!ok) {
      FailLocked(absl::CancelledError("the client stopped reading"),
                 RejectReason::kCancelled, actions);
    } else {
      if (next_write_ < 0) {
        next_write_ = 0;
      } else {
        next_write_ = std::min(total_, next_write_ + chunk_bytes_);
        --chunks_out_;
      }
      ProgressLocked(actions);
    }
  }
  Perform(actions);
}

void DownloadStreamReactor::FailLocked(const absl::Status& status,
                                       std::optional<RejectReason> reason,
                                       Actions& actions) {
  if (finished_) return;
  finished_ = true;
  ready_.clear();
  if (reason.has_value()) state_.admission.RecordRejection(*reason);
  if (writes_starting_ > 0) {
    finish_after_write_ = ToGrpcStatus(status);
  } else {
    actions.finish = ToGrpcStatus(status);
  }
}

void DownloadStreamReactor::Perform(Actions& actions) {
  for (std::unique_ptr<MatmulJob>& job : actions.jobs) {
    lease_.engine()->Submit(std::move(job));
  }
  std::optional<grpc::Status> finish = std::move(actions.finish);
  if (actions.write.has_value()) {
    // Only one write is out at a time, so writing_buffer_ is free.
    writing_buffer_ = std::move(*actions.write);
    StartWrite(&writing_buffer_);
    absl::MutexLock lock(&mu_);
    if (--writes_starting_ == 0 && finish_after_write_.has_value()) {
      finish = std::move(finish_after_write_);
      finish_after_write_.reset();
    }
  }
  if (finish.has_value()) {
    code_.store(finish->error_code(), std::memory_order_release);
    Finish(*finish);
  }
}

void DownloadStreamReactor::OnCancel() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    const bool deadline = CancelledByDeadline(deadline_);
    FailLocked(absl::CancelledError(
                   "the download was cancelled or its deadline passed"),
               deadline ? RejectReason::kDeadline : RejectReason::kCancelled,
               actions);
  }
  Perform(actions);
}

void DownloadStreamReactor::CutForDrain() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    FailLocked(absl::UnavailableError(
                   "the server is shutting down and its drain ended before "
                   "this download finished; retry it"),
               RejectReason::kDraining, actions);
  }
  Perform(actions);
}

absl::Status DownloadStreamReactor::Abandoned() const {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return absl::CancelledError("the download has ended");
  }
  if (DeadlinePassed(deadline_)) {
    return absl::DeadlineExceededError(
        "the deadline passed while the download was queued");
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartDownloadStream(
    ServiceState& state, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request) {
  auto* reactor = new DownloadStreamReactor(state, context);
  reactor->Begin(request);
  return reactor;
}

}  // namespace matmul
