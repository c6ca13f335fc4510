// MultiplyStreamSession, engine side: the jobs of a multiply's steps
// (allocate, upload each chunk, multiply, download each result chunk) and
// what happens when each one is done. The message side is in
// multiply_stream_session.cc.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "gpu/engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/stored_tensors.h"
#include "server/stream/multiply_stream_session.h"

namespace matmul {
namespace {

// The bytes of a panel's product: all of it for a panel of every row (a
// batched product included), else its rows.
int64_t PanelBytes(const MatmulSpec& s, int64_t rows) {
  return rows == s.m ? s.c_bytes() : rows * s.n * s.elem_size();
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

}  // namespace

// The engine's view of one step of a multiply. It holds a reference on
// its call from its submission (the call's Perform) until Done has run.
class MultiplyStreamSession::StepJob final : public MatmulJob {
 public:
  // `offset`: an upload's or a download's place in the multiply's tensor;
  // `chunk`: an upload's bytes.
  StepJob(MultiplyStreamSession* session, std::shared_ptr<Multiply> multiply,
          Step step, int64_t held_bytes, JobDescription description,
          int64_t offset, Chunk chunk)
      : MatmulJob(std::move(description)),
        state_(session->state_),
        client_(session->client_),
        call_(session->self_),
        multiply_(std::move(multiply)),
        step_(step),
        held_bytes_(held_bytes),
        offset_(offset),
        chunk_(std::move(chunk)) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte>) override {
    if (static_cast<int64_t>(a.size()) != chunk_.bytes) {
      return absl::InternalError(absl::StrCat(
          "staging size mismatch: ", a.size(), " vs ", chunk_.bytes));
    }
    state_.staging_copier.Copy(chunk_.data, a.data());
    state_.copied_operand_bytes.fetch_add(chunk_.bytes,
                                          std::memory_order_relaxed);
    state_.metrics->RecordPayload(PayloadPath::kStream, PayloadDirection::kIn,
                                  chunk_.bytes);
    return absl::OkStatus();
  }
  void Done(absl::StatusOr<JobResult> result) override {
    if (result.ok()) {
      state_.metrics->client_usage().Record(client_, result->timings(),
                                            JobBusBytes(description()));
    }
    // Shared: a Visit is copyable, a JobResult is not.
    auto held = std::make_shared<absl::StatusOr<JobResult>>(std::move(result));
    StreamCall* const call = call_;
    call->Run([multiply = multiply_, step = step_, held_bytes = held_bytes_,
               offset = offset_, held_by = chunk_.held_by,
               held](MultiplyStreamSession& session, Actions& actions) {
      session.StepDone(multiply, step, held_bytes, offset, held_by,
                       std::move(*held), actions);
    });
    call->Unref();  // the job's; the call may be gone after it
  }
  absl::Status Abandoned() const override { return call_->Abandoned(); }

 private:
  ServiceState& state_;
  const std::string& client_;  // the session's, for usage
  StreamCall* const call_;
  const std::shared_ptr<Multiply> multiply_;
  const Step step_;
  const int64_t held_bytes_;
  const int64_t offset_;
  Chunk chunk_;
};

std::unique_ptr<MatmulJob> MultiplyStreamSession::NewJob(
    const std::shared_ptr<Multiply>& m, Step step, int64_t held_bytes,
    Chunk* chunk, size_t panel) {
  JobDescription work;
  int64_t offset = 0;
  Chunk bytes_in;
  const DType dtype = m->spec.dtype;
  const int64_t elem = m->spec.elem_size();
  work.device = m->device;
  // A step never waits for device memory: the memory may be held by other
  // multiplies whose own steps are queued behind this one.
  work.wait_for_memory = false;
  switch (step) {
    case Step::kAllocate:
      work.op = AllocateOp{};
      work.spec = VectorSpec(dtype, m->buffer_bytes / elem, false);
      break;
    case Step::kUpload:
      offset = chunk->at;
      work.op = UploadOp{m->buffer, offset};
      work.spec = VectorSpec(dtype, chunk->bytes / elem, false);
      bytes_in = std::move(*chunk);
      break;
    case Step::kMultiply: {
      // `offset`: the panel's first row.
      const Multiply::Panel& p = m->panels[panel];
      MultiplyOp multiply;
      multiply.resident_a = p.a;
      multiply.resident_b = m->operand[1];
      multiply.keep_result = true;
      work.op = std::move(multiply);
      work.spec = m->spec;
      work.spec.m = p.rows;
      offset = p.row0;
      break;
    }
    case Step::kDownload: {
      // `offset`: where the chunk goes in the whole product.
      Multiply::Panel& p = m->panels[panel];
      const int64_t bytes = std::min(
          m->result_chunk_bytes, PanelBytes(m->spec, p.rows) - p.next_download);
      offset = p.row0 * m->spec.n * elem + p.next_download;
      work.op = DownloadOp{p.product, p.next_download};
      work.spec = VectorSpec(dtype, bytes / elem, true);
      break;
    }
  }
  return std::make_unique<StepJob>(this, m, step, held_bytes, std::move(work),
                                   offset, std::move(bytes_in));
}

void MultiplyStreamSession::StepDone(const std::shared_ptr<Multiply>& m,
                                     Step step, int64_t held_bytes,
                                     int64_t offset, StreamCall* held_by,
                                     absl::StatusOr<JobResult> result,
                                     Actions& actions) {
  if (held_by != nullptr) {
    // Staged: the joiner that read the chunk may read on.
    Post(held_by, [held_bytes](MultiplyStreamSession& joiner, Actions&) {
      joiner.StripeHeld(held_bytes);
    });
    held_by->Unref();  // the chunk's; Post holds its own
  } else {
    flow_.Release(held_bytes);
  }
  if (step == Step::kUpload) --m->uploads_in_flight;
  if (step == Step::kDownload) --m->downloads_in_flight;
  // A download that sends nothing gives its place in the window back.
  auto download_gone = [&]() {
    if (step != Step::kDownload) return;
    if (m->stripes > 1) {
      --m->result_chunks_out;
    } else {
      --result_chunks_in_flight_;
    }
  };
  if (m->closed || flow_.finished()) {
    download_gone();
  } else if (!result.ok()) {
    download_gone();
    Fail(m, result.status());
  } else {
    switch (step) {
      case Step::kAllocate:
        Allocated(m, result->resident(), actions);
        break;
      case Step::kUpload: {
        m->uploaded += held_bytes;
        // `offset` is the chunk's place in the buffer: B's lie past A's.
        const int op = m->intake.OperandAt(offset);
        m->schedule.Uploaded(op, offset - m->intake.at(op), held_bytes);
        MaybeMultiply(m, actions);
        break;
      }
      case Step::kMultiply: {
        // `offset`: the panel's first row.
        auto p = std::find_if(
            m->panels.begin(), m->panels.end(),
            [offset](const Multiply::Panel& p) { return p.row0 == offset; });
        if (p == m->panels.end() || result->resident() == nullptr) {
          Fail(m, absl::InternalError("the engine kept no product"));
          break;
        }
        p->product = result->resident();
        p->a.reset();
        if (m->rows_computed == 0) m->placement = result->placement();
        m->rows_computed += p->rows;
        if (m->rows_computed == m->spec.m) {
          m->computed_s = SecondsSince(m->started);
          // The operands' memory can go now.
          m->operand[0].reset();
          m->operand[1].reset();
          m->buffer.reset();
        }
        MaybeAnswer(m, actions);
        break;
      }
      case Step::kDownload: {
        SendResultChunk(m, offset, std::move(*result));
        if (m->downloads_in_flight == 0 && m->downloaded == m->spec.c_bytes()) {
          if (m->stripes > 1) EndStripes(m, absl::OkStatus());
          Close(m, absl::StatusCode::kOk);
        }
        PumpDownloads(actions);
        break;
      }
    }
  }
}

void MultiplyStreamSession::Allocated(const std::shared_ptr<Multiply>& m,
                                      std::shared_ptr<ResidentTensor> buffer,
                                      Actions& actions) {
  m->buffer = std::move(buffer);
  const MatmulSpec& s = m->spec;
  const int64_t dims[2][3] = {
      {s.a_batch, s.transpose_a ? s.k : s.m, s.transpose_a ? s.m : s.k},
      {s.b_batch, s.transpose_b ? s.n : s.k, s.transpose_b ? s.k : s.n}};
  absl::Status viewed = m->buffer == nullptr
                            ? absl::InternalError("nothing allocated")
                            : absl::OkStatus();
  for (int op = 0; op < 2 && viewed.ok(); ++op) {
    if (!m->intake.staged(op)) continue;
    absl::StatusOr<std::shared_ptr<ResidentTensor>> view =
        ResidentView::Create(m->buffer, m->intake.at(op), s.dtype, dims[op][0],
                             dims[op][1], dims[op][2]);
    if (view.ok()) {
      m->operand[op] = *view;
    } else {
      viewed = view.status();
    }
  }
  if (!viewed.ok()) {
    Fail(m, absl::InternalError(viewed.message()));
    return;
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
}

void MultiplyStreamSession::MaybeMultiply(const std::shared_ptr<Multiply>& m,
                                          Actions& actions) {
  if (!m->allocated) return;
  const std::optional<PanelSchedule::Panel> ready = m->schedule.Ready();
  if (!ready.has_value()) return;
  const MatmulSpec& s = m->spec;
  Multiply::Panel p;
  p.row0 = ready->row0;
  p.rows = ready->rows;
  if (p.rows == s.m) {
    p.a = m->operand[0];
  } else {
    absl::StatusOr<std::shared_ptr<ResidentTensor>> rows = ResidentView::Create(
        m->operand[0], p.row0 * s.k * s.elem_size(), s.dtype, 1, p.rows, s.k);
    if (!rows.ok()) {
      Fail(m, absl::InternalError(rows.status().message()));
      return;
    }
    p.a = *rows;
  }
  m->schedule.Submit(*ready);
  m->panels.push_back(std::move(p));
  actions.jobs.push_back(
      NewJob(m, Step::kMultiply, 0, nullptr, m->panels.size() - 1));
}

void MultiplyStreamSession::PumpDownloads(Actions& actions) {
  for (const auto& [id, m] : open_) {
    if (!m->described || m->keep) continue;
    // A striped multiply has a window per stream (charged in its plan's
    // held_bytes); the others share this stream's.
    const bool striped = m->stripes > 1;
    int& out = striped ? m->result_chunks_out : result_chunks_in_flight_;
    const int window = striped ? m->stripes * kMaxResultChunksInFlight
                               : kMaxResultChunksInFlight;
    for (size_t i = 0; i < m->panels.size() && out < window; ++i) {
      Multiply::Panel& p = m->panels[i];
      if (p.product == nullptr) continue;  // not computed, or all sent
      const int64_t bytes = PanelBytes(m->spec, p.rows);
      while (out < window && p.next_download < bytes) {
        std::unique_ptr<MatmulJob> job =
            NewJob(m, Step::kDownload, 0, nullptr, i);
        p.next_download += job->spec().c_bytes();
        m->downloaded += job->spec().c_bytes();
        ++m->downloads_in_flight;
        ++out;
        actions.jobs.push_back(std::move(job));
      }
      // Its download jobs hold the product now.
      if (p.next_download == bytes) p.product.reset();
    }
  }
}

void MultiplyStreamSession::MaybeAnswer(const std::shared_ptr<Multiply>& m,
                                        Actions& actions) {
  if (m->closed || m->rows_computed == 0) return;
  if (m->described) {
    PumpDownloads(actions);  // a later panel
    return;
  }
  // A kept product is whole: one panel.
  if (m->keep && m->rows_computed < m->spec.m) return;
  // A striped multiply answers once every stream has joined.
  if (m->stripes > 1 && !m->stripe.all_joined()) return;
  m->described = true;
  v1::MultiplyStreamResponse response;
  v1::MultiplyStreamResult* r = response.mutable_result();
  for (int64_t d : m->c_shape) r->add_shape(d);
  r->set_dtype(static_cast<v1::Dtype>(DTypeToProto(m->spec.dtype)));
  r->set_bytes(m->spec.c_bytes());
  r->mutable_placement()->set_device(m->placement.device);
  r->mutable_placement()->set_stream(m->placement.stream);
  if (m->keep) {
    const HandleRegistry::Entry entry =
        state_.handles.Add(m->lease.TakeReservation(), m->panels[0].product,
                           m->c_shape, m->keep_ttl);
    FillHandle(entry, r->mutable_c_handle());
  }
  response.set_request_id(m->id);
  Queue(StreamAnswer::Message(response), false);
  for (int s = 1; s < m->stripes; ++s) {
    Multiply::Stripe& stripe = m->stripe[s];
    response.set_request_id(stripe.request_id);
    Post(stripe.call,
         [share = stripe.share, message = StreamAnswer::Message(response)](
             MultiplyStreamSession& joiner, Actions&) {
           joiner.StripeHeader(share, message);
         });
  }
  if (m->keep) {
    if (m->stripes > 1) EndStripes(m, absl::OkStatus());
    Close(m, absl::StatusCode::kOk);
    return;
  }
  PumpDownloads(actions);
}

void MultiplyStreamSession::SendResultChunk(const std::shared_ptr<Multiply>& m,
                                            int64_t offset, JobResult result) {
  // The stream it goes on: this one, or for a striped multiply the one
  // with the fewest of its chunks unwritten (then the fewest sent).
  const int to = m->stripes > 1 ? m->stripe.GiveChunk() : 0;
  const uint64_t request_id = m->stripes > 1 ? m->stripe[to].request_id : m->id;
  // Sent straight from staging (StreamAnswer::ResultChunk).
  StreamAnswer message =
      StreamAnswer::ResultChunk(request_id, offset, std::move(result));
  state_.metrics->RecordPayload(
      PayloadPath::kStream, PayloadDirection::kOut,
      static_cast<int64_t>(message.product->c().size()));
  if (m->stripes == 1) {
    Queue(std::move(message), true);
    return;
  }
  Multiply::Stripe& stripe = m->stripe[to];
  if (to == 0) {
    Queue(std::move(message), true, m);
    return;
  }
  Post(stripe.call, [share = stripe.share, message = std::move(message)](
                        MultiplyStreamSession& joiner, Actions&) {
    joiner.StripeResultChunk(share, message);
  });
}

}  // namespace matmul
