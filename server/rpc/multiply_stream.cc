#include "server/rpc/multiply_stream.h"

#include <memory>
#include <utility>
#include <vector>

#include "gpu/engine.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/multiply_wire.h"
#include "server/rpc/stored_tensors.h"

namespace matmul {
grpc::ByteBuffer MultiplyStreamReactor::ToByteBuffer(StreamAnswer answer) {
  grpc::Slice head(answer.head);
  if (answer.product == nullptr) return grpc::ByteBuffer(&head, 1);
  // Sent straight from staging; the staging goes back to the engine when
  // gRPC has sent it.
  auto* held = new std::shared_ptr<JobResult>(std::move(answer.product));
  const absl::Span<const std::byte> data = (*held)->c();
  grpc::Slice parts[2] = {
      std::move(head),
      grpc::Slice(
          const_cast<std::byte*>(data.data()), data.size(),
          [](void* p) { delete static_cast<std::shared_ptr<JobResult>*>(p); },
          held)};
  return grpc::ByteBuffer(parts, 2);
}

MultiplyStreamReactor::MultiplyStreamReactor(
    ServiceState& state, grpc::CallbackServerContext* context)
    : state_(state),
      context_(context),
      session_(state, this, ClientKey(*context), DeadlineOf(*context)) {
  state_.calls.AddOpen(this);
}

void MultiplyStreamReactor::Run(const Visit& visit) {
  StreamActions actions;
  {
    absl::MutexLock lock(&mu_);
    visit(session_, actions);
    session_.Settle(actions);
  }
  Perform(actions);
}

void MultiplyStreamReactor::Start() {
  Run([](MultiplyStreamSession& session, StreamActions& actions) {
    session.Start(actions);
  });
}

absl::Status MultiplyStreamReactor::Abandoned() {
  absl::MutexLock lock(&mu_);
  return session_.Abandoned();
}

void MultiplyStreamReactor::OnReadDone(bool ok) {
  if (!ok) {
    const bool cancelled = context_->IsCancelled();
    Run([cancelled](MultiplyStreamSession& session, StreamActions& actions) {
      session.ReadClosed(cancelled, actions);
    });
    return;
  }
  // One read at a time: read_buffer_ is this read's until the next
  // StartRead, which only the session's moves start.
  std::vector<grpc::Slice> slices;
  if (!read_buffer_.Dump(&slices).ok()) slices.clear();
  read_buffer_.Clear();
  std::vector<ByteChunk> chunks;
  chunks.reserve(slices.size());
  for (const grpc::Slice& s : slices) chunks.emplace_back(s.begin(), s.size());
  absl::StatusOr<WireStreamRequest> request =
      DecodeMultiplyStreamRequest(chunks);
  // A chunk's bytes stay in the message's slices, which it holds (moving
  // the vector keeps each slice where it is).
  std::shared_ptr<const void> hold;
  if (request.ok() && request->kind == WireStreamRequest::Kind::kChunk) {
    hold = std::make_shared<const std::vector<grpc::Slice>>(std::move(slices));
  }
  StreamActions actions;
  {
    absl::MutexLock lock(&mu_);
    session_.Read(std::move(request), std::move(hold), actions);
    session_.Settle(actions);
  }
  Perform(actions);
}

void MultiplyStreamReactor::Draining() {
  Run([](MultiplyStreamSession& session, StreamActions& actions) {
    session.Drain(actions);
  });
}

void MultiplyStreamReactor::CutForDrain() {
  Run([](MultiplyStreamSession& session, StreamActions& actions) {
    session.CutForDrain(actions);
  });
}

void MultiplyStreamReactor::JoinResolved(uint64_t join_id,
                                         absl::StatusOr<StripeMatch> match) {
  Run([join_id, &match](MultiplyStreamSession& session,
                        StreamActions& actions) {
    session.JoinResolved(join_id, std::move(match), actions);
  });
}

void MultiplyStreamReactor::Perform(StreamActions& actions) {
  // First, so that a joiner has queued a multiply's result header before
  // the downloads of its chunks are submitted.
  for (auto& call : actions.calls) call();
  for (std::unique_ptr<MatmulJob>& job : actions.jobs) {
    Ref();  // the job's, until its Done has run
    actions.engine->Submit(std::move(job));
  }
  if (actions.moves.read) StartRead(&read_buffer_);
  if (actions.moves.write) {
    write_buffer_ = ToByteBuffer(std::move(*actions.write));
    StartWrite(&write_buffer_);
  }
  if (actions.moves.finish) Finish(ToGrpcStatus(actions.moves.finish_status));
}

void MultiplyStreamReactor::OnWriteDone(bool ok) {
  write_buffer_.Clear();
  Run([ok](MultiplyStreamSession& session, StreamActions& actions) {
    session.WriteDone(ok, actions);
  });
}

void MultiplyStreamReactor::OnCancel() {
  StreamActions actions;
  {
    absl::MutexLock lock(&mu_);
    session_.Cancel(actions);
    session_.Settle(actions);  // the calls to other calls
  }
  state_.stripes.Forget(this);  // a join it had waiting
  Perform(actions);
}

void MultiplyStreamReactor::OnDone() {
  state_.calls.Remove(this);
  state_.stripes.Forget(this);
  Unref();
}

void MultiplyStreamReactor::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StartMultiplyStream(ServiceState& state, grpc::CallbackServerContext* context) {
  auto* reactor = new MultiplyStreamReactor(state, context);
  reactor->Start();
  return reactor;
}

}  // namespace matmul
