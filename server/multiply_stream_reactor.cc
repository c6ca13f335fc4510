#include "server/multiply_stream_reactor.h"

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
#include "server/grpc_status.h"
#include "server/matmul_service.h"
#include "server/request_validation.h"

namespace matmul {
namespace {

constexpr int64_t kOperandAlignment = 256;  // B's place in the shared tensor

double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

MatmulSpec VectorSpec(DType dtype, int64_t elements, bool download) {
  MatmulSpec s;
  s.dtype = dtype;
  if (download) {
    s.batch = 1;
    s.a_batch = s.b_batch = 0;
    s.m = 1;
    s.n = elements;
    s.k = 0;
  } else {
    s.a_batch = s.batch = 1;
    s.m = 1;
    s.k = elements;
    s.n = 0;
  }
  return s;
}

grpc::ByteBuffer Serialize(const v1::MultiplyStreamResponse& response) {
  const std::string bytes = response.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

const char* OperandName(int operand) { return operand == 0 ? "a" : "b"; }

}  // namespace

// A received chunk: its bytes (pieces of the message's slices, which it
// holds) and where they go in the multiply's device tensor.
struct MultiplyStreamReactor::Chunk {
  std::vector<grpc::Slice> slices;
  std::vector<ByteChunk> data;
  int64_t at = 0;
  int64_t bytes = 0;
};

// One multiply of the stream. Guarded by the reactor's mu_.
struct MultiplyStreamReactor::Multiply {
  uint64_t id = 0;
  MatmulSpec spec;
  std::vector<int64_t> c_shape;
  std::vector<int64_t> handle_shape[2];  // of operands named by handle
  // Operands for the multiply: stored tensors, or views of `buffer`.
  std::shared_ptr<ResidentTensor> operand[2];
  bool staged[2] = {false, false};  // sent in chunks
  int64_t need[2] = {0, 0};         // bytes expected
  int64_t received[2] = {0, 0};
  int64_t at[2] = {0, 0};  // offset in `buffer`
  int64_t buffer_bytes = 0;
  int device = -1;
  std::shared_ptr<ResidentTensor> buffer;  // both staged operands
  bool allocated = false;
  std::vector<Chunk> waiting;  // arrived before the allocation finished
  int uploads_in_flight = 0;
  int64_t uploaded = 0;
  bool multiply_submitted = false;
  std::shared_ptr<ResidentTensor> product;
  Placement placement;
  bool keep = false;
  // The in-flight budget and quota this multiply holds (admission core).
  Lease lease;
  absl::Duration keep_ttl;
  int64_t result_chunk_bytes = 0;
  int64_t next_download = 0;
  int downloads_in_flight = 0;
  bool closed = false;
  // For the log line of large multiplies.
  std::chrono::steady_clock::time_point started;
  double first_chunk_s = -1;
  double last_chunk_s = -1;
  double computed_s = -1;
  int64_t uploaded_by_last_chunk = 0;
  int64_t chunks = 0;
};

// The engine's view of one step of a multiply.
class MultiplyStreamReactor::StepJob final : public MatmulJob {
 public:
  StepJob(MultiplyStreamReactor* reactor, std::shared_ptr<Multiply> multiply,
          Step step, int64_t held_bytes)
      : reactor_(reactor),
        multiply_(std::move(multiply)),
        step_(step),
        held_bytes_(held_bytes) {}

  const MatmulSpec& spec() const override { return spec_; }
  JobKind kind() const override { return kind_; }
  std::shared_ptr<ResidentTensor> resident_a() const override {
    return resident_a_;
  }
  std::shared_ptr<ResidentTensor> resident_b() const override {
    return resident_b_;
  }
  bool keep_result() const override { return step_ == Step::kMultiply; }
  // A step never waits for device memory: the memory may be held by other
  // multiplies whose own steps are queued behind this one.
  bool wait_for_memory() const override { return false; }
  int device() const override { return device_; }
  std::shared_ptr<ResidentTensor> upload_target() const override {
    return upload_target_;
  }
  int64_t byte_offset() const override { return byte_offset_; }

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte>) override {
    if (static_cast<int64_t>(a.size()) != chunk_.bytes) {
      return absl::InternalError(absl::StrCat(
          "staging size mismatch: ", a.size(), " vs ", chunk_.bytes));
    }
    CopyPieces(chunk_.data, a.data());
    reactor_->service_->copied_operand_bytes_.fetch_add(
        chunk_.bytes, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  void Done(absl::StatusOr<JobResult> result) override {
    reactor_->StepDone(multiply_, step_, held_bytes_, byte_offset_,
                       std::move(result));
  }
  absl::Status Abandoned() const override { return reactor_->Abandoned(); }

 private:
  friend class MultiplyStreamReactor;

  MultiplyStreamReactor* const reactor_;
  const std::shared_ptr<Multiply> multiply_;
  const Step step_;
  const int64_t held_bytes_;
  MatmulSpec spec_;
  JobKind kind_ = JobKind::kMultiply;
  std::shared_ptr<ResidentTensor> resident_a_;
  std::shared_ptr<ResidentTensor> resident_b_;
  std::shared_ptr<ResidentTensor> upload_target_;
  int64_t byte_offset_ = 0;
  int device_ = -1;
  Chunk chunk_;
};

MultiplyStreamReactor::MultiplyStreamReactor(
    MatmulServiceImpl* service, grpc::CallbackServerContext* context)
    : service_(service), context_(context) {}

int64_t MultiplyStreamReactor::HeldBytes(const Multiply& m) {
  const int64_t operands = std::min(m.need[0] + m.need[1], kMaxHeldChunkBytes);
  const int64_t product =
      m.keep ? 0
             : std::min(m.spec.c_bytes(),
                        kMaxResultChunksInFlight * m.result_chunk_bytes);
  return operands + product;
}

void MultiplyStreamReactor::Start() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
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
      // Multiplies still missing bytes can never complete.
      std::vector<std::shared_ptr<Multiply>> incomplete;
      for (const auto& [id, m] : open_) {
        if (m->received[0] < m->need[0] || m->received[1] < m->need[1]) {
          incomplete.push_back(m);
        }
      }
      for (const auto& m : incomplete) {
        const int op = m->received[0] < m->need[0] ? 0 : 1;
        Fail(m,
             absl::InvalidArgumentError(absl::StrCat(
                 "the client closed the stream before operand ",
                 OperandName(op), " of request ", m->id,
                 " arrived: ", m->received[op], " of ", m->need[op], " bytes")),
             actions);
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
    finished_ = true;
    actions.finish = true;
    actions.finish_status = ToGrpcStatus(request.status());
    service_->metrics_->RecordRejection(RejectReason::kInvalid);
    return;
  }
  switch (request->kind) {
    case WireStreamRequest::Kind::kStart:
      HandleStart(*request, actions);
      return;
    case WireStreamRequest::Kind::kChunk:
      HandleChunk(*request, slices, actions);
      return;
    case WireStreamRequest::Kind::kNone:
      SendError(request->request_id,
                absl::InvalidArgumentError(
                    "MultiplyStreamRequest: neither start nor chunk is set"),
                actions);
      return;
  }
}

void MultiplyStreamReactor::HandleStart(const WireStreamRequest& request,
                                        Actions& actions) {
  const uint64_t id = request.request_id;
  if (auto it = open_.find(id); it != open_.end()) {
    Fail(it->second,
         absl::InvalidArgumentError(absl::StrCat(
             "request_id ", id, " was started again while still open")),
         actions);
    return;
  }
  failed_.erase(id);
  // Refused by the admission core (which counted the rejection), or by
  // `reject` below (which counts it first).
  auto refuse = [&](const absl::Status& status) {
    service_->metrics_->RecordRequest(RpcMethod::kMultiplyStream,
                                      ToGrpcStatus(status).error_code(), 0);
    SendError(id, status, actions);
    failed_.insert(id);  // its chunks are dropped quietly
  };
  auto reject = [&](RejectReason reason, const absl::Status& status) {
    service_->admission_.RecordRejection(reason);
    refuse(status);
  };
  if (static_cast<int>(open_.size()) >= kMaxOpenMultiplies) {
    reject(RejectReason::kOverloaded,
           absl::ResourceExhaustedError(absl::StrCat(
               "this stream already has ", open_.size(),
               " multiplies open, the most it may; wait for one to finish")));
    return;
  }
  if (absl::Status open = service_->admission_.CheckOpen(); !open.ok()) {
    refuse(open);
    return;
  }

  auto m = std::make_shared<Multiply>();
  m->id = id;
  m->started = std::chrono::steady_clock::now();
  const WireMultiplyRequest& wire = request.start;
  MultiplyHeader header = wire.header();
  header.a.data_follows = header.b.data_follows = true;
  const std::string* handles[2] = {&wire.a_handle, &wire.b_handle};
  OperandHeader* headers[2] = {&header.a, &header.b};
  for (int op = 0; op < 2; ++op) {
    if (handles[op]->empty()) continue;
    if (absl::Status s = MatmulServiceImpl::ResolveHandle(
            service_->handles_, *handles[op], OperandName(op), *headers[op],
            m->operand[op], m->handle_shape[op]);
        !s.ok()) {
      reject(RejectReason::kInvalid, s);
      return;
    }
    headers[op]->data_follows = false;
  }
  // Operands are bounded by device memory here, not by message size.
  RequestLimits limits = service_->limits_;
  limits.max_message_bytes = std::numeric_limits<int64_t>::max() / 4;
  limits.max_inflight_bytes = std::numeric_limits<int64_t>::max() / 4;
  absl::StatusOr<MatmulSpec> spec = ValidateMultiplyHeader(header, limits);
  if (!spec.ok()) {
    reject(RejectReason::kInvalid, spec.status());
    return;
  }
  m->spec = *spec;
  const int64_t elem = spec->elem_size();
  int64_t chunk = request.result_chunk_bytes;
  if (chunk < 0) {
    reject(RejectReason::kInvalid,
           absl::InvalidArgumentError(absl::StrCat(
               "result_chunk_bytes: expected 0 or more, got ", chunk)));
    return;
  }
  if (chunk == 0) chunk = kDefaultResultChunkBytes;
  chunk = std::min(chunk, service_->limits_.max_message_bytes - 64);
  m->result_chunk_bytes = std::max(elem, chunk / elem * elem);
  if (wire.keep_result) {
    absl::StatusOr<absl::Duration> ttl =
        service_->handles_.Ttl(wire.result_ttl_seconds);
    if (!ttl.ok()) {
      reject(RejectReason::kInvalid, ttl.status());
      return;
    }
    m->keep = true;
    m->keep_ttl = *ttl;
  }
  m->c_shape = spec->c_is_3d
                   ? std::vector<int64_t>{spec->batch, spec->m, spec->n}
                   : std::vector<int64_t>{spec->m, spec->n};
  m->need[0] = m->operand[0] ? 0 : spec->a_bytes();
  m->need[1] = m->operand[1] ? 0 : spec->b_bytes();
  m->staged[0] = m->need[0] > 0;
  m->staged[1] = m->need[1] > 0;
  m->at[0] = 0;
  m->at[1] = m->staged[0] ? (m->need[0] + kOperandAlignment - 1) /
                                kOperandAlignment * kOperandAlignment
                          : 0;
  m->buffer_bytes = m->staged[1] ? m->at[1] + m->need[1] : m->need[0];
  for (const auto& t : m->operand) {
    if (t != nullptr) m->device = t->device();
  }
  Operation op;
  op.kind = OperationKind::kStreamMultiply;
  op.spec = &m->spec;
  op.held_bytes = HeldBytes(*m);
  if (m->keep) {
    op.stored_bytes = spec->c_bytes();
    op.client = MatmulServiceImpl::ClientKey(*context_);
  }
  op.deadline = DeadlineOf(*context_);
  absl::StatusOr<Lease> lease = service_->admission_.Admit(op);
  if (!lease.ok()) {
    refuse(lease.status());
    return;
  }
  m->lease = std::move(*lease);
  engine_.store(m->lease.engine(), std::memory_order_release);
  open_[id] = m;
  if (m->buffer_bytes > 0) {
    actions.jobs.push_back(NewJob(m, Step::kAllocate, 0, nullptr));
  } else {
    m->allocated = true;  // both operands are stored tensors
    MaybeMultiply(m, actions);
  }
}

void MultiplyStreamReactor::HandleChunk(const WireStreamRequest& request,
                                        std::vector<grpc::Slice>& slices,
                                        Actions& actions) {
  const uint64_t id = request.request_id;
  auto it = open_.find(id);
  if (it == open_.end()) {
    if (failed_.contains(id)) return;  // its error was sent already
    SendError(id,
              absl::InvalidArgumentError(absl::StrCat(
                  "chunk for request_id ", id,
                  ", which is not open on this stream (send its start first)")),
              actions);
    failed_.insert(id);
    return;
  }
  std::shared_ptr<Multiply> m = it->second;
  if (m->multiply_submitted) {
    Fail(m,
         absl::InvalidArgumentError(absl::StrCat(
             "chunk for request_id ", id, " after all its operand bytes")),
         actions);
    return;
  }
  const int op = request.operand - v1::OPERAND_A;
  if (request.operand != v1::OPERAND_A && request.operand != v1::OPERAND_B) {
    Fail(m,
         absl::InvalidArgumentError(absl::StrCat(
             "chunk.operand: expected OPERAND_A or OPERAND_B, got ",
             request.operand)),
         actions);
    return;
  }
  const char* name = OperandName(op);
  const int64_t elem = m->spec.elem_size();
  if (!m->staged[op]) {
    Fail(m,
         absl::InvalidArgumentError(
             absl::StrCat("chunk for operand ", name, ", which is given by ",
                          name, "_handle and takes no chunks")),
         actions);
    return;
  }
  if (request.offset != m->received[op]) {
    Fail(m,
         absl::InvalidArgumentError(absl::StrCat(
             "chunk.offset: expected ", m->received[op], " (operand ", name,
             "'s chunks come in order), got ", request.offset)),
         actions);
    return;
  }
  if (request.data_bytes <= 0 || request.data_bytes % elem != 0) {
    Fail(m,
         absl::InvalidArgumentError(absl::StrCat(
             "chunk.data: expected a positive whole number of ", elem,
             "-byte elements, got ", request.data_bytes, " bytes")),
         actions);
    return;
  }
  if (request.data_bytes > m->need[op] - m->received[op]) {
    Fail(m,
         absl::InvalidArgumentError(
             absl::StrCat("operand ", name, ": chunks carry more than its ",
                          m->need[op], " bytes (", m->received[op],
                          " so far, then ", request.data_bytes, ")")),
         actions);
    return;
  }
  const double now = SecondsSince(m->started);
  if (m->chunks++ == 0) m->first_chunk_s = now;
  Chunk chunk;
  chunk.slices = std::move(slices);
  chunk.data = request.data;
  chunk.at = m->at[op] + request.offset;
  chunk.bytes = request.data_bytes;
  m->received[op] += request.data_bytes;
  held_chunk_bytes_ += chunk.bytes;
  if (m->received[0] == m->need[0] && m->received[1] == m->need[1]) {
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

std::unique_ptr<MatmulJob> MultiplyStreamReactor::NewJob(
    const std::shared_ptr<Multiply>& m, Step step, int64_t held_bytes,
    Chunk* chunk) {
  auto job = std::make_unique<StepJob>(this, m, step, held_bytes);
  const DType dtype = m->spec.dtype;
  const int64_t elem = m->spec.elem_size();
  job->device_ = m->device;
  switch (step) {
    case Step::kAllocate:
      job->kind_ = JobKind::kAllocate;
      job->spec_ = VectorSpec(dtype, m->buffer_bytes / elem, false);
      break;
    case Step::kUpload:
      job->kind_ = JobKind::kUpload;
      job->spec_ = VectorSpec(dtype, chunk->bytes / elem, false);
      job->upload_target_ = m->buffer;
      job->byte_offset_ = chunk->at;
      job->chunk_ = std::move(*chunk);
      break;
    case Step::kMultiply:
      job->kind_ = JobKind::kMultiply;
      job->spec_ = m->spec;
      job->resident_a_ = m->operand[0];
      job->resident_b_ = m->operand[1];
      break;
    case Step::kDownload: {
      const int64_t bytes =
          std::min(m->result_chunk_bytes, m->spec.c_bytes() - m->next_download);
      job->kind_ = JobKind::kDownload;
      job->spec_ = VectorSpec(dtype, bytes / elem, true);
      job->resident_a_ = m->product;
      job->byte_offset_ = m->next_download;
      break;
    }
  }
  return job;
}

void MultiplyStreamReactor::StepDone(const std::shared_ptr<Multiply>& m,
                                     Step step, int64_t held_bytes,
                                     int64_t offset,
                                     absl::StatusOr<JobResult> result) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    held_chunk_bytes_ -= held_bytes;
    if (step == Step::kUpload) --m->uploads_in_flight;
    if (step == Step::kDownload) --m->downloads_in_flight;
    if (m->closed || finished_) {
      if (step == Step::kDownload) --result_chunks_in_flight_;
    } else if (!result.ok()) {
      if (step == Step::kDownload) --result_chunks_in_flight_;
      Fail(m, result.status(), actions);
    } else {
      switch (step) {
        case Step::kAllocate: {
          m->buffer = result->resident();
          const MatmulSpec& s = m->spec;
          const int64_t dims[2][3] = {
              {s.a_batch, s.transpose_a ? s.k : s.m, s.transpose_a ? s.m : s.k},
              {s.b_batch, s.transpose_b ? s.n : s.k,
               s.transpose_b ? s.k : s.n}};
          absl::Status viewed = m->buffer == nullptr
                                    ? absl::InternalError("nothing allocated")
                                    : absl::OkStatus();
          for (int op = 0; op < 2 && viewed.ok(); ++op) {
            if (!m->staged[op]) continue;
            absl::StatusOr<std::shared_ptr<ResidentTensor>> view =
                ResidentView::Create(m->buffer, m->at[op], s.dtype, dims[op][0],
                                     dims[op][1], dims[op][2]);
            if (view.ok()) {
              m->operand[op] = *view;
            } else {
              viewed = view.status();
            }
          }
          if (!viewed.ok()) {
            Fail(m, absl::InternalError(viewed.message()), actions);
            break;
          }
          m->device = m->buffer->device();
          m->allocated = true;
          for (Chunk& chunk : m->waiting) {
            ++m->uploads_in_flight;
            const int64_t held = chunk.bytes;
            actions.jobs.push_back(NewJob(m, Step::kUpload, held, &chunk));
          }
          m->waiting.clear();
          MaybeMultiply(m, actions);
          break;
        }
        case Step::kUpload:
          m->uploaded += held_bytes;
          MaybeMultiply(m, actions);
          break;
        case Step::kMultiply: {
          m->computed_s = SecondsSince(m->started);
          m->product = result->resident();
          m->placement = result->placement();
          // The operands' memory can go now.
          m->operand[0].reset();
          m->operand[1].reset();
          m->buffer.reset();
          if (m->product == nullptr) {
            Fail(m, absl::InternalError("the engine kept no product"), actions);
            break;
          }
          v1::MultiplyStreamResponse response;
          response.set_request_id(m->id);
          v1::MultiplyStreamResult* r = response.mutable_result();
          for (int64_t d : m->c_shape) r->add_shape(d);
          r->set_dtype(static_cast<v1::Dtype>(DTypeToProto(m->spec.dtype)));
          r->set_bytes(m->spec.c_bytes());
          r->mutable_placement()->set_device(m->placement.device);
          r->mutable_placement()->set_stream(m->placement.stream);
          if (m->keep) {
            const HandleRegistry::Entry entry =
                service_->handles_.Add(m->lease.TakeReservation(), m->product,
                                       m->c_shape, m->keep_ttl);
            MatmulServiceImpl::FillHandle(entry, r->mutable_c_handle());
            Queue(Serialize(response), false);
            Close(m, grpc::StatusCode::OK);
            break;
          }
          Queue(Serialize(response), false);
          PumpDownloads(actions);
          break;
        }
        case Step::kDownload: {
          // Sent straight from staging; the staging goes back to the
          // engine when gRPC has sent it.
          auto* held = new JobResult(std::move(*result));
          const std::string prefix =
              FrameResultChunk(m->id, offset, held->c().size());
          grpc::Slice parts[2] = {
              grpc::Slice(prefix),
              grpc::Slice(
                  const_cast<std::byte*>(held->c().data()), held->c().size(),
                  [](void* p) { delete static_cast<JobResult*>(p); }, held)};
          Queue(grpc::ByteBuffer(parts, 2), true);
          if (m->downloads_in_flight == 0 &&
              m->next_download == m->spec.c_bytes()) {
            Close(m, grpc::StatusCode::OK);
          }
          PumpDownloads(actions);
          break;
        }
      }
    }
    Settle(actions);
  }
  Perform(actions);
  Unref();
}

void MultiplyStreamReactor::MaybeMultiply(const std::shared_ptr<Multiply>& m,
                                          Actions& actions) {
  if (!m->allocated || m->multiply_submitted || m->uploads_in_flight > 0 ||
      !m->waiting.empty() || m->received[0] < m->need[0] ||
      m->received[1] < m->need[1]) {
    return;
  }
  m->multiply_submitted = true;
  actions.jobs.push_back(NewJob(m, Step::kMultiply, 0, nullptr));
}

void MultiplyStreamReactor::PumpDownloads(Actions& actions) {
  for (const auto& [id, m] : open_) {
    if (result_chunks_in_flight_ >= kMaxResultChunksInFlight) return;
    if (m->product == nullptr || m->keep) continue;
    while (result_chunks_in_flight_ < kMaxResultChunksInFlight &&
           m->next_download < m->spec.c_bytes()) {
      std::unique_ptr<MatmulJob> job = NewJob(m, Step::kDownload, 0, nullptr);
      m->next_download += job->spec().c_bytes();
      ++m->downloads_in_flight;
      ++result_chunks_in_flight_;
      actions.jobs.push_back(std::move(job));
    }
  }
}

void MultiplyStreamReactor::SendError(uint64_t id, const absl::Status& status,
                                      Actions& actions) {
  v1::MultiplyStreamResponse response;
  response.set_request_id(id);
  const grpc::Status g = ToGrpcStatus(status);
  response.mutable_error()->set_code(static_cast<int32_t>(g.error_code()));
  response.mutable_error()->set_message(g.error_message());
  Queue(Serialize(response), false);
}

void MultiplyStreamReactor::Fail(const std::shared_ptr<Multiply>& m,
                                 const absl::Status& status, Actions& actions) {
  if (m->closed) return;
  if (std::optional<RejectReason> reason = RejectionOf(status)) {
    service_->metrics_->RecordRejection(*reason);
  } else if (status.code() == absl::StatusCode::kInvalidArgument) {
    service_->metrics_->RecordRejection(RejectReason::kInvalid);
  }
  SendError(m->id, status, actions);
  // Chunks the client sent before it saw the error are dropped quietly.
  if (m->received[0] < m->need[0] || m->received[1] < m->need[1]) {
    failed_.insert(m->id);
  }
  Close(m, ToGrpcStatus(status).error_code());
}

void MultiplyStreamReactor::Close(const std::shared_ptr<Multiply>& m,
                                  grpc::StatusCode code) {
  if (m->closed) return;
  m->closed = true;
  if (auto it = open_.find(m->id); it != open_.end() && it->second == m) {
    open_.erase(it);
  }
  const double seconds = SecondsSince(m->started);
  service_->metrics_->RecordRequest(RpcMethod::kMultiplyStream, code, seconds);
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
  m->operand[0].reset();
  m->operand[1].reset();
  m->buffer.reset();
  m->product.reset();
  m->lease.Release();  // budget, request count, and quota unless stored
}

void MultiplyStreamReactor::Queue(grpc::ByteBuffer message, bool result_chunk) {
  writes_.push_back({std::move(message), result_chunk});
}

void MultiplyStreamReactor::Settle(Actions& actions) {
  if (finished_) return;
  if (!reading_ && !read_done_ && !cancelled_ &&
      held_chunk_bytes_ < kMaxHeldChunkBytes) {
    reading_ = true;
    actions.read = true;
  }
  if (!writing_ && !writes_.empty()) {
    writing_ = true;
    write_buffer_ = std::move(writes_.front().message);
    writing_result_chunk_ = writes_.front().result_chunk;
    writes_.pop_front();
    actions.write = true;
  } else if (!writing_ && read_done_ && open_.empty()) {
    finished_ = true;
    actions.finish = true;
    actions.finish_status = grpc::Status::OK;
  }
}

void MultiplyStreamReactor::Perform(Actions& actions) {
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
    if (writing_result_chunk_) --result_chunks_in_flight_;
    writing_result_chunk_ = false;
    if (!ok) {
      // The client is gone: nothing more can be sent.
      for (const PendingWrite& w : writes_) {
        if (w.result_chunk) --result_chunks_in_flight_;
      }
      writes_.clear();
      std::vector<std::shared_ptr<Multiply>> all;
      for (const auto& [id, m] : open_) all.push_back(m);
      for (const auto& m : all) Close(m, grpc::StatusCode::CANCELLED);
      if (!finished_) {
        finished_ = true;
        actions.finish = true;
        actions.finish_status =
            grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
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
      service_->metrics_->RecordRejection(RejectReason::kCancelled);
    }
    if (!finished_) {
      finished_ = true;
      actions.finish = true;
      actions.finish_status =
          grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled");
    }
  }
  Perform(actions);
}

void MultiplyStreamReactor::OnDone() { Unref(); }

void MultiplyStreamReactor::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

}  // namespace matmul
