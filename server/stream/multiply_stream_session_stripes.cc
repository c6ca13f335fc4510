// MultiplyStreamSession, striping: one multiply carried by several calls
// (see the header's comment). The owning call keeps the multiply; joining
// calls keep a share of it (StripeShare) and talk to the owner, and the owner
// to them, only through Post (run once the caller's lock is released, holding a
// reference on the callee), so no call ever takes another's lock while
// holding its own.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/server_metrics.h"
#include "server/stream/multiply_stream_session.h"

namespace matmul {

void MultiplyStreamSession::Post(StreamCall* call, StreamCall::Visit visit) {
  call->Ref();
  outbox_.push_back([call, visit = std::move(visit)]() {
    call->Run(visit);
    call->Unref();
  });
}

void MultiplyStreamSession::DropChunk(Chunk& chunk) {
  if (chunk.held_by == nullptr) return;
  Post(chunk.held_by,
       [bytes = chunk.bytes](MultiplyStreamSession& joiner, Actions&) {
         joiner.StripeHeld(bytes);
       });
  chunk.held_by->Unref();  // the chunk's; Post holds its own
  chunk.held_by = nullptr;
  chunk.hold.reset();
  chunk.data.clear();
}

void MultiplyStreamSession::HandleJoin(const WireStreamRequest& request) {
  const uint64_t id = request.request_id;
  if (FailOpen(id,
               absl::InvalidArgumentError(absl::StrCat(
                   "request_id ", id, " was joined again while still open")))) {
    return;
  }
  failed_.Forget(id);
  auto refuse = [&](const absl::Status& status) {
    state_.admission.RecordRejection(RequestFault(status));
    SendError(id, status);
    RememberFailed(id);  // its chunks are dropped quietly
  };
  if (OpenCount() >= kMaxOpenMultiplies) {
    refuse(absl::ResourceExhaustedError(absl::StrCat(
        "this stream already has ", OpenCount(),
        " multiplies open, the most it may; wait for one to finish")));
    return;
  }
  const size_t key = request.stripe_key.size();
  if (key < 16 || key > 64) {
    refuse(absl::InvalidArgumentError(
        absl::StrCat("join.stripe_key: expected 16 to 64 bytes, got ", key)));
    return;
  }
  absl::StatusOr<std::optional<StripeMatch>> match =
      state_.stripes.Join(client_, request.stripe_key, self_, id);
  if (!match.ok()) {
    refuse(match.status());
  } else if (!match->has_value()) {
    // Its start has not come yet: read nothing more until it does (or the
    // registry times the join out); JoinResolved goes on.
    flow_.JoinWaiting(true);
  } else {
    AttachJoin(id, **match);
  }
}

void MultiplyStreamSession::JoinResolved(uint64_t join_id,
                                         absl::StatusOr<StripeMatch> match,
                                         Actions&) {
  flow_.JoinWaiting(false);
  if (!match.ok()) {
    if (!flow_.finished()) {
      state_.admission.RecordRejection(RequestFault(match.status()));
      SendError(join_id, match.status());
      RememberFailed(join_id);
    }
  } else {
    AttachJoin(join_id, *match);
  }
}

void MultiplyStreamSession::AttachJoin(uint64_t join_id,
                                       const StripeMatch& match) {
  // The match's reference on the owner passes to the share.
  auto* owner = static_cast<StreamCall*>(match.owner);
  std::shared_ptr<Multiply> owned =
      std::static_pointer_cast<Multiply>(match.multiply);
  if (flow_.finished()) {
    // This call ended before the join was decided: the multiply cannot
    // have all its streams.
    Post(owner, [owned, s = match.stripe](MultiplyStreamSession& o, Actions&) {
      o.StripeEnded(owned, s,
                    absl::CancelledError(absl::StrCat(
                        "stripe ", s,
                        "'s call of this striped multiply ended before it "
                        "joined")));
    });
    owner->Unref();
    return;
  }
  state_.metrics->RecordStripe(true);
  auto share = std::make_shared<StripeShare>();
  share->id = join_id;
  share->owner = owner;
  share->owned = owned;
  share->stripe = match.stripe;
  shares_[join_id] = share;
  self_->Ref();  // the owner's reference on this call, handed over in
                 // StripeJoined
  Post(owner, [owned, s = match.stripe, joiner = self_, join_id, share](
                  MultiplyStreamSession& o, Actions& actions) {
    o.StripeJoined(owned, s, joiner, join_id, share, actions);
  });
}

void MultiplyStreamSession::StripeJoined(const std::shared_ptr<Multiply>& m,
                                         int stripe, StreamCall* joiner,
                                         uint64_t join_id,
                                         std::shared_ptr<StripeShare> share,
                                         Actions& actions) {
  if (m->closed || m->stripes_ended || stripe <= 0 || stripe >= m->stripes) {
    absl::Status why =
        m->end_status.ok()
            ? absl::CancelledError(
                  "the striped multiply ended before this stream joined")
            : m->end_status;
    Post(joiner, [share, why](MultiplyStreamSession& j, Actions&) {
      j.StripeFailed(share, why);
    });
    joiner->Unref();
  } else {
    // With the reference on `joiner` AttachJoin took.
    m->stripe.Join(stripe, join_id, {joiner, std::move(share)});
    MaybeAnswer(m, actions);
    CheckStarved(m);
  }
}

void MultiplyStreamSession::StripeChunk(const std::shared_ptr<Multiply>& m,
                                        int operand, int64_t offset,
                                        Chunk chunk, Actions& actions) {
  if (m->closed || flow_.finished()) {
    DropChunk(chunk);
  } else {
    TakeChunk(m, operand, offset, std::move(chunk), actions);
  }
}

void MultiplyStreamSession::StripeSideClosed(const std::shared_ptr<Multiply>& m,
                                             int stripe) {
  if (!m->closed && stripe > 0 && stripe < m->stripes) {
    m->stripe.SideClosed(stripe);
    CheckStarved(m);
  }
}

void MultiplyStreamSession::StripeEnded(const std::shared_ptr<Multiply>& m,
                                        int stripe, const absl::Status& why) {
  if (!m->closed) {
    if (stripe > 0 && stripe < m->stripes) {
      // Its call is gone: nothing more goes to it.
      Multiply::Stripe& s = m->stripe[stripe];
      if (s.call != nullptr) s.call->Unref();
      s.call = nullptr;
      s.joined = false;
    }
    Fail(m, why);
  }
}

void MultiplyStreamSession::StripeChunkWritten(
    const std::shared_ptr<Multiply>& m, int stripe, Actions& actions) {
  --m->result_chunks_out;
  if (m->stripes > 1) m->stripe.ChunkWritten(stripe);
  if (!m->closed) PumpDownloads(actions);
}

void MultiplyStreamSession::ResultChunkGone(
    const std::shared_ptr<Multiply>& striped) {
  --striped->result_chunks_out;
  striped->stripe.ChunkWritten(0);
}

void MultiplyStreamSession::ShareChunkGone(
    const std::shared_ptr<StripeShare>& share) {
  if (share->closed) return;  // its multiply has ended on the owner too
  Post(share->owner, [owned = share->owned, s = share->stripe](
                         MultiplyStreamSession& owner, Actions& actions) {
    owner.StripeChunkWritten(owned, s, actions);
  });
}

void MultiplyStreamSession::StripeHeld(int64_t bytes) {
  flow_.Release(std::max<int64_t>(bytes, 0));
}

void MultiplyStreamSession::StripeHeader(
    const std::shared_ptr<StripeShare>& share, StreamAnswer message) {
  if (!flow_.finished() && !share->closed && !share->described) {
    share->described = true;
    Queue(std::move(message), false);
    for (StreamAnswer& chunk : share->early) {
      Queue(std::move(chunk), true, nullptr, share);
      ++share->queued;
    }
    share->early.clear();
    MaybeCloseShare(share);
  }
}

void MultiplyStreamSession::StripeResultChunk(
    const std::shared_ptr<StripeShare>& share, StreamAnswer message) {
  if (!flow_.finished() && !share->closed) {
    if (share->described) {
      Queue(std::move(message), true, nullptr, share);
      ++share->queued;
      MaybeCloseShare(share);
    } else {
      share->early.push_back(std::move(message));
    }
  }
  // Else the message goes (its staging with it); the multiply has failed.
}

void MultiplyStreamSession::StripeShareDone(
    const std::shared_ptr<StripeShare>& share, int64_t chunks) {
  if (!share->closed) {
    share->chunks = chunks;
    MaybeCloseShare(share);
  }
}

void MultiplyStreamSession::MaybeCloseShare(
    const std::shared_ptr<StripeShare>& share) {
  if (!share->described || share->chunks < 0 || share->queued < share->chunks) {
    return;
  }
  share->owner_done = true;
  CloseShare(share, absl::StatusCode::kOk);
}

void MultiplyStreamSession::StripeFailed(
    const std::shared_ptr<StripeShare>& share, const absl::Status& status) {
  if (!flow_.finished() && !share->closed) {
    SendError(share->id, status);
    RememberFailed(share->id);  // chunks still coming are dropped
    share->owner_done = true;
    CloseShare(share, status.code());
  }
}

void MultiplyStreamSession::CheckStarved(const std::shared_ptr<Multiply>& m) {
  if (m->closed || m->stripes <= 1) return;
  // Streams yet to join may still bring bytes.
  if (!m->stripe.Starved(m->intake.complete())) return;
  const int op = m->intake.missing();
  Fail(m, absl::InvalidArgumentError(absl::StrCat(
              "the client closed all ", m->stripes,
              " streams of striped request ", m->id, " before operand ",
              op == 0 ? "a" : "b", " arrived: ", m->intake.received(op), " of ",
              m->intake.need(op), " bytes")));
}

void MultiplyStreamSession::EndStripes(const std::shared_ptr<Multiply>& m,
                                       const absl::Status& status) {
  if (m->stripes_ended) return;
  m->stripes_ended = true;
  m->end_status = status;
  state_.stripes.Close(client_, m->stripe_key, m.get());
  for (int i = 1; i < m->stripes; ++i) {
    Multiply::Stripe& s = m->stripe[i];
    if (s.call == nullptr) continue;
    if (status.ok()) {
      Post(s.call, [share = s.share, chunks = s.chunks_sent](
                       MultiplyStreamSession& joiner, Actions&) {
        joiner.StripeShareDone(share, chunks);
      });
    } else {
      Post(s.call,
           [share = s.share, status](MultiplyStreamSession& joiner, Actions&) {
             joiner.StripeFailed(share, status);
           });
    }
    s.call->Unref();  // Post holds its own
    s.call = nullptr;
  }
}

}  // namespace matmul
