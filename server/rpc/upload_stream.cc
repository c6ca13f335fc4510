// UploadStream: a stored tensor whose bytes come in chunks. The first
// message is admitted as an Upload is (its bytes charged to the client's
// quota); an allocate job makes the tensor, each chunk is then an upload
// job into it, and the handle is added once the client has closed its side
// and every byte is in. A call that ends any other way drops the tensor
// and, with its lease, the quota it reserved.
#include <algorithm>
#include <chrono>
#include <cstring>
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
#include "server/request_validation.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/call_registry.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_messages.h"
#include "server/rpc/stored_tensor_streams.h"
#include "server/rpc/stored_tensors.h"

namespace matmul {
namespace {

class UploadStreamReactor;

// The engine's view of one step: the allocation, or one chunk's upload.
class UploadStepJob final : public MatmulJob {
 public:
  UploadStepJob(UploadStreamReactor* reactor, JobDescription description,
                std::string data)
      : MatmulJob(std::move(description)),
        reactor_(reactor),
        data_(std::move(data)) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte>) override;
  void Done(absl::StatusOr<JobResult> result) override;
  absl::Status Abandoned() const override;

 private:
  UploadStreamReactor* const reactor_;
  std::string data_;  // the chunk's bytes; empty for the allocation
};

class UploadStreamReactor final
    : public grpc::ServerReadReactor<grpc::ByteBuffer>,
      public DrainableCall {
 public:
  UploadStreamReactor(ServiceState& state, grpc::CallbackServerContext* context,
                      grpc::ByteBuffer* response)
      : state_(state),
        context_(context),
        response_(response),
        deadline_(context->deadline()) {
    state_.calls.AddRequest(this, started_);
  }

  void Begin() {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      read_pending_ = true;
      ++reads_starting_;
      actions.read = true;
    }
    Perform(actions);
  }

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override {
    state_.calls.Remove(this);
    state_.metrics->RecordRequest(RpcMethod::kUpload,
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
  void StepDone(bool allocation, int64_t bytes, BusBytes bus,
                absl::StatusOr<JobResult> result);
  void RecordPayload(int64_t bytes) {
    state_.metrics->RecordPayload(PayloadPath::kHandle, PayloadDirection::kIn,
                                  bytes);
  }

 private:
  // What to do once mu_ is released (calls never run under it: gRPC and the
  // engine may call back on the same thread).
  struct Actions {
    bool read = false;
    std::optional<grpc::Status> finish;
    std::vector<std::unique_ptr<MatmulJob>> jobs;
  };

  ~UploadStreamReactor() override = default;

  // The first message: validated and admitted, the allocation's job made.
  absl::Status Start(const v1::UploadRequest& start,
                     std::unique_ptr<MatmulJob>& allocation);
  // A chunk, checked against what came before; its job made.
  absl::Status Chunk(v1::TensorChunk& chunk, std::unique_ptr<MatmulJob>& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the call with `status` (unless it has ended), counted as a
  // rejection for `reason` if any.
  void FailLocked(const absl::Status& status, std::optional<RejectReason>,
                  Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads on while the window has room; answers once all is in.
  void ProgressLocked(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Perform(Actions& actions);

  ServiceState& state_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  const std::chrono::system_clock::time_point deadline_;
  const std::chrono::steady_clock::time_point started_ =
      std::chrono::steady_clock::now();
  std::atomic<int> refs_{1};  // gRPC's, and one per job in flight
  std::atomic<grpc::StatusCode> code_{grpc::StatusCode::UNKNOWN};
  grpc::ByteBuffer read_;  // one read at a time

  // Set by Start (OnReadDone, before any job exists), read after.
  std::string client_;
  Lease lease_;
  std::vector<int64_t> shape_;
  absl::Duration ttl_;
  DType dtype_ = DType::kFloat32;
  int64_t total_ = 0;

  mutable absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool read_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool started_call_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // the client's side
  // Reads decided and not yet started (Perform), and the ending that waits
  // for them.
  int reads_starting_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> finish_after_read_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ResidentTensor> tensor_ ABSL_GUARDED_BY(mu_);
  // Bytes received (the next chunk's offset), uploaded into tensor_, and
  // received but not yet uploaded.
  int64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t uploaded_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::Status UploadStepJob::WriteOperands(absl::Span<std::byte> a,
                                          absl::Span<std::byte>) {
  if (a.size() != data_.size()) {
    return absl::InternalError("staging size mismatch");
  }
  std::memcpy(a.data(), data_.data(), a.size());
  reactor_->RecordPayload(static_cast<int64_t>(a.size()));
  std::string().swap(data_);  // staged: the chunk's memory goes now
  return absl::OkStatus();
}

absl::Status UploadStepJob::Abandoned() const { return reactor_->Abandoned(); }

void UploadStepJob::Done(absl::StatusOr<JobResult> result) {
  const bool allocation = std::holds_alternative<AllocateOp>(op());
  reactor_->StepDone(allocation, allocation ? 0 : spec().a_bytes(),
                     JobBusBytes(description()), std::move(result));
}

void UploadStreamReactor::OnReadDone(bool ok) {
  Actions actions;
  v1::UploadStreamRequest message;
  absl::Status parsed = absl::OkStatus();
  if (ok) {
    parsed = ParseRequest(*context_, &read_, message);
    read_.Clear();
  }
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    read_pending_ = false;
    if (finished_) {
      // Ended meanwhile; nothing more is read.
    } else if (!ok) {
      closed_ = true;
      if (!started_call_) {
        FailLocked(absl::InvalidArgumentError(
                       "UploadStream: the call closed before its first "
                       "message (an UploadStreamRequest.start)"),
                   RejectReason::kInvalid, actions);
      } else if (received_ < total_) {
        FailLocked(absl::InvalidArgumentError(absl::StrCat(
                       "UploadStream: the chunks carried ", received_,
                       " of the tensor's ", total_, " bytes")),
                   RejectReason::kInvalid, actions);
      } else {
        ProgressLocked(actions);
      }
    } else if (!parsed.ok()) {
      FailLocked(parsed, RequestRejection(parsed), actions);
    } else if (!started_call_) {
      if (message.kind_case() != v1::UploadStreamRequest::kStart) {
        FailLocked(absl::InvalidArgumentError(
                       "UploadStream: the first message must be a start (an "
                       "UploadRequest), got a chunk or nothing"),
                   RejectReason::kInvalid, actions);
      } else {
        started_call_ = true;
        first = true;
      }
    } else if (message.kind_case() != v1::UploadStreamRequest::kChunk) {
      FailLocked(absl::InvalidArgumentError(
                     "UploadStream: a second start; every message after the "
                     "first must be a chunk"),
                 RejectReason::kInvalid, actions);
    } else {
      std::unique_ptr<MatmulJob> job;
      absl::Status chunk = Chunk(*message.mutable_chunk(), job);
      if (!chunk.ok()) {
        FailLocked(chunk, RejectReason::kInvalid, actions);
      } else {
        if (job != nullptr) actions.jobs.push_back(std::move(job));
        ProgressLocked(actions);
      }
    }
  }
  if (first) {
    // Admission and validation run outside the lock: no job exists yet,
    // and OnReadDone does not run twice at once.
    std::unique_ptr<MatmulJob> allocation;
    const absl::Status started = Start(message.start(), allocation);
    absl::MutexLock lock(&mu_);
    if (!started.ok()) {
      // Start counted its refusal (admission counts its own).
      FailLocked(started, std::nullopt, actions);
    } else {
      // Submitted even if the call ended meanwhile: the engine drops it
      // (Abandoned), and its Done gives its reference back.
      actions.jobs.push_back(std::move(allocation));
    }
  }
  Perform(actions);
}

absl::Status UploadStreamReactor::Start(const v1::UploadRequest& start,
                                        std::unique_ptr<MatmulJob>& job) {
  auto refuse = [&](RejectReason reason, absl::Status status) {
    return state_.admission.Refuse(reason, std::move(status));
  };
  if (absl::Status open = state_.admission.CheckOpen(); !open.ok()) {
    return open;  // counted by the core
  }
  const v1::Tensor& tensor = start.tensor();
  if (!tensor.data().empty() || tensor.has_shared()) {
    return refuse(RejectReason::kInvalid,
                  absl::InvalidArgumentError(absl::StrCat(
                      "start.tensor: expected shape and dtype only (the bytes "
                      "follow in TensorChunks), got ",
                      tensor.has_shared() ? "a shared-memory reference"
                                          : absl::StrCat(tensor.data().size(),
                                                         " bytes of data"))));
  }
  OperandHeader header;
  header.present = start.has_tensor();
  header.shape =
      absl::MakeConstSpan(tensor.shape().data(), tensor.shape_size());
  header.dtype = tensor.dtype();
  header.data_follows = true;
  absl::StatusOr<TensorDims> dims =
      ValidateTensor(header, "start.tensor", state_.limits);
  if (!dims.ok()) return refuse(RequestFault(dims.status()), dims.status());
  absl::StatusOr<absl::Duration> ttl = state_.handles.Ttl(start.ttl_seconds());
  if (!ttl.ok()) return refuse(RequestFault(ttl.status()), ttl.status());
  ttl_ = *ttl;
  dtype_ = dims->dtype;
  shape_ = ApiShape(dims->is_3d, dims->batch, dims->rows, dims->cols);
  JobDescription allocation;
  allocation.op = AllocateOp{};
  allocation.spec.dtype = dims->dtype;
  allocation.spec.a_batch = allocation.spec.batch = dims->batch;
  allocation.spec.m = dims->rows;
  allocation.spec.k = dims->cols;
  allocation.spec.n = 0;
  total_ = allocation.spec.a_bytes();
  client_ = ClientKey(*context_);
  Operation op;
  op.kind = OperationKind::kUpload;
  op.spec = &allocation.spec;
  // The chunks it holds: fewer than kUploadStreamMaxChunkBytes read ahead,
  // then one more (kUploadStreamMaxChunkBytes at most).
  op.held_bytes = std::min(total_, 2 * kUploadStreamMaxChunkBytes);
  op.stored_bytes = total_;
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
  if (start.has_device()) {
    const std::vector<DeviceInfo>& devices = lease_.engine()->info().devices;
    const bool known = std::any_of(
        devices.begin(), devices.end(),
        [&](const DeviceInfo& d) { return d.index == start.device(); });
    if (!known) {
      return refuse(
          RejectReason::kInvalid,
          absl::InvalidArgumentError(absl::StrCat(
              "start.device: no device ", start.device(), " (", devices.size(),
              " on this server; see GetServerInfo)")));
    }
    allocation.device = start.device();
  }
  Ref();  // the job's
  job = std::make_unique<UploadStepJob>(this, std::move(allocation),
                                        std::string());
  return absl::OkStatus();
}

absl::Status UploadStreamReactor::Chunk(v1::TensorChunk& chunk,
                                        std::unique_ptr<MatmulJob>& job) {
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t bytes = static_cast<int64_t>(chunk.data().size());
  const int64_t offset = chunk.offset();
  if (offset != received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UploadStream: a chunk at offset ", offset, "; expected ", received_,
        " (chunks come in order, each just past the one before)"));
  }
  if (bytes == 0 || bytes % elem != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UploadStream: a chunk of ", bytes, " bytes at offset ", offset,
        "; expected a whole number of ", elem, "-byte elements, at least one"));
  }
  if (bytes > kUploadStreamMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("UploadStream: a chunk of ",
                                                   bytes, " bytes; at most ",
                                                   kUploadStreamMaxChunkBytes));
  }
  if (bytes > total_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UploadStream: a chunk of ", bytes, " bytes at offset ", offset,
        " runs past the tensor's end (", total_, " bytes)"));
  }
  received_ += bytes;
  pending_ += bytes;
  JobDescription upload;
  upload.op = UploadOp{tensor_, offset};
  upload.spec.dtype = dtype_;
  upload.spec.a_batch = upload.spec.batch = 1;
  upload.spec.m = 1;
  upload.spec.k = bytes / elem;
  upload.spec.n = 0;
  // Its memory is the tensor's, allocated already.
  upload.wait_for_memory = false;
  Ref();  // the job's
  job = std::make_unique<UploadStepJob>(this, std::move(upload),
                                        std::move(*chunk.mutable_data()));
  return absl::OkStatus();
}

void UploadStreamReactor::StepDone(bool allocation, int64_t bytes, BusBytes bus,
                                   absl::StatusOr<JobResult> result) {
  if (result.ok()) {
    state_.metrics->client_usage().Record(client_, result->timings(), bus);
  }
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    if (!finished_) {
      if (!result.ok()) {
        state_.admission.RecordFailure(result.status());
        FailLocked(result.status(), std::nullopt, actions);
      } else if (allocation) {
        tensor_ = result->resident();
        if (tensor_ == nullptr) {
          FailLocked(absl::InternalError("the engine allocated nothing"),
                     std::nullopt, actions);
        } else {
          ProgressLocked(actions);
        }
      } else {
        uploaded_ += bytes;
        pending_ -= bytes;
        ProgressLocked(actions);
      }
    }
  }
  Perform(actions);
  Unref();  // the job's
}

void UploadStreamReactor::ProgressLocked(Actions& actions) {
  if (tensor_ == nullptr) return;  // reads wait for the allocation
  if (closed_) {
    if (uploaded_ < total_) return;  // the last chunks are still going in
    finished_ = true;
    if (!lease_.has_reservation()) {
      actions.finish = ToGrpcStatus(
          absl::InternalError("the upload holds no quota reservation"));
      return;
    }
    const HandleRegistry::Entry entry =
        state_.handles.Add(lease_.TakeReservation(), tensor_, shape_, ttl_);
    v1::UploadStreamResponse response;
    FillHandle(entry, response.mutable_handle());
    actions.finish = ToGrpcStatus(SerializeResponse(response, response_));
    return;
  }
  if (!read_pending_ && pending_ < kUploadStreamMaxChunkBytes) {
    read_pending_ = true;
    ++reads_starting_;
    actions.read = true;
  }
}

void UploadStreamReactor::FailLocked(const absl::Status& status,
                                     std::optional<RejectReason> reason,
                                     Actions& actions) {
  if (finished_) return;
  finished_ = true;
  if (reason.has_value()) state_.admission.RecordRejection(*reason);
  if (reads_starting_ > 0) {
    // A read decided before is about to start: no read may start after
    // Finish, so the one starting it finishes the call after it.
    finish_after_read_ = ToGrpcStatus(status);
  } else {
    actions.finish = ToGrpcStatus(status);
  }
}

void UploadStreamReactor::Perform(Actions& actions) {
  for (std::unique_ptr<MatmulJob>& job : actions.jobs) {
    lease_.engine()->Submit(std::move(job));
  }
  std::optional<grpc::Status> finish = std::move(actions.finish);
  if (actions.read) {
    StartRead(&read_);
    absl::MutexLock lock(&mu_);
    if (--reads_starting_ == 0 && finish_after_read_.has_value()) {
      finish = std::move(finish_after_read_);
      finish_after_read_.reset();
    }
  }
  if (finish.has_value()) {
    code_.store(finish->error_code(), std::memory_order_release);
    Finish(*finish);
  }
}

void UploadStreamReactor::OnCancel() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    const bool deadline = CancelledByDeadline(deadline_);
    FailLocked(
        absl::CancelledError("the upload was cancelled or its deadline passed"),
        deadline ? RejectReason::kDeadline : RejectReason::kCancelled, actions);
  }
  Perform(actions);
}

void UploadStreamReactor::CutForDrain() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    FailLocked(absl::UnavailableError(
                   "the server is shutting down and its drain ended before "
                   "this upload finished; retry it"),
               RejectReason::kDraining, actions);
  }
  Perform(actions);
}

absl::Status UploadStreamReactor::Abandoned() const {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return absl::CancelledError("the upload has ended");
  }
  if (DeadlinePassed(deadline_)) {
    return absl::DeadlineExceededError(
        "the deadline passed while the upload was queued");
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* StartUploadStream(
    ServiceState& state, grpc::CallbackServerContext* context,
    grpc::ByteBuffer* response) {
  auto* reactor = new UploadStreamReactor(state, context, response);
  reactor->Begin();
  return reactor;
}

}  // namespace matmul
