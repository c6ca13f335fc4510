// MultiplyStreamSession driven directly: decoded messages and the call's
// events in, the answers it writes, the jobs it submits (run by the host
// engine) and the end of the call out. No server and no gRPC: TestCall
// stands where the reactor does, carrying the session's actions out
// itself.
#include "server/stream/multiply_stream_session.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gpu/host/host_engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/rpc/multiply_wire.h"
#include "server/rpc/service_state.h"

namespace matmul {
namespace {

constexpr absl::Duration kWait = absl::Seconds(20);

// One call: its session, what it has written and how it ended. Writes
// complete at once unless hold_writes is set. Thread-safe: the engine's
// threads report steps while the test thread sends.
class TestCall final : public StreamCall {
 public:
  TestCall(ServiceState& state, const std::string& client)
      : state_(state), session_(state, this, client, absl::InfiniteFuture()) {}
  // As the reactor's OnDone: once the call has ended, every job and post
  // gives its reference back.
  ~TestCall() {
    state_.stripes.Forget(this);
    const absl::Time give_up = absl::Now() + kWait;
    while (refs_.load() != 1 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(refs_.load(), 1) << "a reference was not given back";
  }

  void Ref() override { refs_.fetch_add(1); }
  void Unref() override { refs_.fetch_sub(1); }
  void JoinResolved(uint64_t join_id,
                    absl::StatusOr<StripeMatch> match) override {
    Run([join_id, &match](MultiplyStreamSession& s, StreamActions& a) {
      s.JoinResolved(join_id, std::move(match), a);
    });
  }
  void Run(const Visit& visit) override {
    StreamActions actions;
    {
      absl::MutexLock lock(&mu_);
      visit(session_, actions);
      session_.Settle(actions);
    }
    Perform(actions);
  }
  absl::Status Abandoned() override {
    absl::MutexLock lock(&mu_);
    return session_.Abandoned();
  }

  // The test's side of the call.
  void Begin() {
    Run([](MultiplyStreamSession& s, StreamActions& a) { s.Start(a); });
  }
  void Send(const v1::MultiplyStreamRequest& message) {
    auto bytes =
        std::make_shared<const std::string>(message.SerializeAsString());
    std::vector<ByteChunk> chunks = {ByteChunk(
        reinterpret_cast<const unsigned char*>(bytes->data()), bytes->size())};
    SendDecoded(DecodeMultiplyStreamRequest(chunks), bytes);
  }
  void SendDecoded(absl::StatusOr<WireStreamRequest> request,
                   std::shared_ptr<const void> hold = nullptr) {
    StreamActions actions;
    {
      absl::MutexLock lock(&mu_);
      EXPECT_TRUE(reading_) << "a message the session did not ask for";
      reading_ = false;
      session_.Read(std::move(request), std::move(hold), actions);
      session_.Settle(actions);
    }
    Perform(actions);
  }
  void CloseInput() {
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
    }
    Run([](MultiplyStreamSession& s, StreamActions& a) {
      s.ReadClosed(/*cancelled=*/false, a);
    });
  }
  void Cancel() {
    Run([](MultiplyStreamSession& s, StreamActions& a) { s.Cancel(a); });
  }
  void Drain() {
    Run([](MultiplyStreamSession& s, StreamActions& a) { s.Drain(a); });
  }
  void CutForDrain() {
    Run([](MultiplyStreamSession& s, StreamActions& a) { s.CutForDrain(a); });
  }
  // Completes the write in progress (hold_writes).
  void WriteDone(bool ok = true) {
    {
      absl::MutexLock lock(&mu_);
      EXPECT_TRUE(writing_);
      writing_ = false;
    }
    Run([ok](MultiplyStreamSession& s, StreamActions& a) {
      s.WriteDone(ok, a);
    });
  }

  // Waits until `n` answers are written (or the call has ended).
  std::vector<v1::MultiplyStreamResponse> WaitForAnswers(size_t n) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return answers_.size() >= n || finished_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), kWait);
    return answers_;
  }
  // Waits for the call's end; its status.
  absl::Status WaitForEnd() {
    absl::MutexLock lock(&mu_);
    auto ended = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended), kWait)) {
      return absl::DeadlineExceededError("the call did not end");
    }
    return status_;
  }
  std::vector<v1::MultiplyStreamResponse> answers() {
    absl::MutexLock lock(&mu_);
    return answers_;
  }
  bool finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  bool reading() {
    absl::MutexLock lock(&mu_);
    return reading_;
  }
  int open() {
    absl::MutexLock lock(&mu_);
    return session_.OpenCount();
  }
  bool hold_writes = false;

 private:
  void Perform(StreamActions& actions) {
    for (auto& call : actions.calls) call();
    for (auto& job : actions.jobs) {
      Ref();
      actions.engine->Submit(std::move(job));
    }
    bool ack = false;
    {
      absl::MutexLock lock(&mu_);
      if (actions.moves.read) reading_ = true;
      if (actions.moves.write) {
        EXPECT_FALSE(writing_) << "two writes at once";
        writing_ = true;
        // A result chunk's head and data make its whole message.
        std::string bytes = actions.write->head;
        if (actions.write->product != nullptr) {
          auto data = actions.write->product->c();
          bytes.append(reinterpret_cast<const char*>(data.data()), data.size());
        }
        v1::MultiplyStreamResponse answer;
        EXPECT_TRUE(answer.ParseFromString(bytes));
        answers_.push_back(std::move(answer));
        ack = !hold_writes;
      }
      if (actions.moves.finish) {
        EXPECT_FALSE(finished_) << "finished twice";
        finished_ = true;
        status_ = actions.moves.finish_status;
      }
    }
    if (ack) WriteDone();
  }

  ServiceState& state_;
  std::atomic<int> refs_{1};
  absl::Mutex mu_;
  MultiplyStreamSession session_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::MultiplyStreamResponse> answers_ ABSL_GUARDED_BY(mu_);
};

class MultiplyStreamSessionTest : public ::testing::Test {
 protected:
  MultiplyStreamSessionTest() : state_(Limits(), HandleLimits{}, "test") {
    absl::StatusOr<std::unique_ptr<HostEngine>> engine =
        HostEngine::Create(HostEngineOptions{2});
    EXPECT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    state_.admission.SetEngine(engine_.get());
  }
  ~MultiplyStreamSessionTest() override { engine_->Shutdown(); }

  static RequestLimits Limits() {
    RequestLimits limits;
    limits.stripe_join_timeout_ms = 300;
    return limits;
  }

  // A: 2x3 (1..6), B: 3x2 (1..6), as float32; C = A·B.
  static std::vector<float> A() { return {1, 2, 3, 4, 5, 6}; }
  static std::vector<float> B() { return {1, 2, 3, 4, 5, 6}; }
  static std::vector<float> C() { return {22, 28, 49, 64}; }

  static v1::MultiplyStreamRequest Start(uint64_t id, int64_t result_chunk = 0,
                                         const std::string& key = "",
                                         int stripes = 0) {
    v1::MultiplyStreamRequest m;
    m.set_request_id(id);
    v1::MultiplyRequest* r = m.mutable_start()->mutable_request();
    r->mutable_a()->add_shape(2);
    r->mutable_a()->add_shape(3);
    r->mutable_a()->set_dtype(v1::DTYPE_FLOAT32);
    r->mutable_b()->add_shape(3);
    r->mutable_b()->add_shape(2);
    r->mutable_b()->set_dtype(v1::DTYPE_FLOAT32);
    m.mutable_start()->set_result_chunk_bytes(result_chunk);
    m.mutable_start()->set_stripe_key(key);
    m.mutable_start()->set_stripes(stripes);
    return m;
  }
  // Elements [from, to) of `values` as a chunk of `op`.
  static v1::MultiplyStreamRequest Chunk(uint64_t id, v1::Operand op,
                                         const std::vector<float>& values,
                                         size_t from, size_t to) {
    v1::MultiplyStreamRequest m;
    m.set_request_id(id);
    m.mutable_chunk()->set_operand(op);
    m.mutable_chunk()->set_offset(static_cast<int64_t>(from * sizeof(float)));
    m.mutable_chunk()->set_data(
        std::string(reinterpret_cast<const char*>(values.data() + from),
                    (to - from) * sizeof(float)));
    return m;
  }
  static v1::MultiplyStreamRequest Join(uint64_t id, const std::string& key) {
    v1::MultiplyStreamRequest m;
    m.set_request_id(id);
    m.mutable_join()->set_stripe_key(key);
    return m;
  }
  // The product the result chunks among `answers` for `id` carry.
  static std::vector<float> Product(
      const std::vector<v1::MultiplyStreamResponse>& answers, uint64_t id) {
    std::vector<float> c(4, -1);
    for (const v1::MultiplyStreamResponse& a : answers) {
      if (a.request_id() != id || !a.has_chunk()) continue;
      const std::string& data = a.chunk().data();
      EXPECT_LE(a.chunk().offset() + data.size(), c.size() * sizeof(float));
      std::memcpy(reinterpret_cast<char*>(c.data()) + a.chunk().offset(),
                  data.data(), data.size());
    }
    return c;
  }
  static int Errors(const std::vector<v1::MultiplyStreamResponse>& answers,
                    uint64_t id) {
    int n = 0;
    for (const auto& a : answers) n += a.request_id() == id && a.has_error();
    return n;
  }

  ServiceState state_;
  std::unique_ptr<HostEngine> engine_;
};

TEST_F(MultiplyStreamSessionTest, ChunksInAnyOrderGiveTheProduct) {
  TestCall call(state_, "alice");
  call.Begin();
  EXPECT_TRUE(call.reading());
  call.Send(Start(7));
  // B before A, and A's chunks from the back.
  call.Send(Chunk(7, v1::OPERAND_B, B(), 0, 6));
  call.Send(Chunk(7, v1::OPERAND_A, A(), 4, 6));
  call.Send(Chunk(7, v1::OPERAND_A, A(), 0, 4));
  call.CloseInput();
  ASSERT_TRUE(call.WaitForEnd().ok());
  const auto answers = call.answers();
  ASSERT_GE(answers.size(), 2u);
  // The result header first, then the product.
  ASSERT_TRUE(answers[0].has_result());
  EXPECT_EQ(answers[0].request_id(), 7u);
  EXPECT_EQ(answers[0].result().bytes(), 16);
  ASSERT_EQ(answers[0].result().shape_size(), 2);
  EXPECT_EQ(Product(answers, 7), C());
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
}

TEST_F(MultiplyStreamSessionTest, SmallResultChunksComeInOrderOneWriteAtATime) {
  TestCall call(state_, "alice");
  call.hold_writes = true;
  call.Begin();
  call.Send(Start(1, /*result_chunk=*/4));
  call.Send(Chunk(1, v1::OPERAND_A, A(), 0, 6));
  call.Send(Chunk(1, v1::OPERAND_B, B(), 0, 6));
  call.CloseInput();
  // Nothing more is written until the write in progress is done.
  for (size_t n = 1; n <= 5; ++n) {
    ASSERT_EQ(call.WaitForAnswers(n).size(), n);
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_EQ(call.answers().size(), n);
    call.WriteDone();
  }
  ASSERT_TRUE(call.WaitForEnd().ok());
  const auto answers = call.answers();
  ASSERT_EQ(answers.size(), 5u);
  EXPECT_TRUE(answers[0].has_result());
  for (size_t i = 1; i < answers.size(); ++i) {
    ASSERT_TRUE(answers[i].has_chunk());
    EXPECT_EQ(answers[i].chunk().data().size(), 4u);
  }
  EXPECT_EQ(Product(answers, 1), C());
}

TEST_F(MultiplyStreamSessionTest, AnOverlappingChunkFailsItsMultiplyOnce) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Send(Start(3));
  call.Send(Start(4));
  call.Send(Chunk(3, v1::OPERAND_A, A(), 0, 4));
  call.Send(Chunk(3, v1::OPERAND_A, A(), 2, 6));  // overlaps
  // Its late chunks are dropped without another word.
  call.Send(Chunk(3, v1::OPERAND_B, B(), 0, 6));
  // The other multiply goes on.
  call.Send(Chunk(4, v1::OPERAND_A, A(), 0, 6));
  call.Send(Chunk(4, v1::OPERAND_B, B(), 0, 6));
  call.CloseInput();
  ASSERT_TRUE(call.WaitForEnd().ok());
  const auto answers = call.answers();
  EXPECT_EQ(Errors(answers, 3), 1);
  for (const auto& a : answers) {
    if (a.request_id() == 3 && a.has_error()) {
      EXPECT_EQ(a.error().code(),
                static_cast<int>(absl::StatusCode::kInvalidArgument));
    }
  }
  EXPECT_EQ(Errors(answers, 4), 0);
  EXPECT_EQ(Product(answers, 4), C());
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
}

TEST_F(MultiplyStreamSessionTest, ChunksPastTheEndOrForNoOpenIdAreErrors) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Send(Chunk(9, v1::OPERAND_A, A(), 0, 6));  // never started
  call.Send(Chunk(9, v1::OPERAND_A, A(), 0, 6));  // quiet: already told
  std::vector<float> longer(8, 1.0f);
  call.Send(Start(5));
  call.Send(Chunk(5, v1::OPERAND_B, longer, 0, 8));  // 32 bytes into 24
  call.CloseInput();
  ASSERT_TRUE(call.WaitForEnd().ok());
  const auto answers = call.answers();
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(Errors(answers, 9), 1);
  EXPECT_EQ(Errors(answers, 5), 1);
  EXPECT_EQ(answers[1].error().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
}

TEST_F(MultiplyStreamSessionTest, AStartReusingAnOpenIdFailsTheOpenOne) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Send(Start(2));
  call.Send(Start(2));
  call.CloseInput();
  ASSERT_TRUE(call.WaitForEnd().ok());
  const auto answers = call.answers();
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].error().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
}

TEST_F(MultiplyStreamSessionTest, AnUndecodableMessageEndsTheCall) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Send(Start(1));
  call.SendDecoded(absl::InvalidArgumentError("not a MultiplyStreamRequest"));
  EXPECT_EQ(call.WaitForEnd().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call.open(), 0);
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
}

TEST_F(MultiplyStreamSessionTest, InputClosedWithBytesMissingFailsTheMultiply) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Send(Start(6));
  call.Send(Chunk(6, v1::OPERAND_A, A(), 0, 6));
  call.CloseInput();
  ASSERT_TRUE(call.WaitForEnd().ok());
  const auto answers = call.answers();
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].error().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(answers[0].error().message().find("operand b"), std::string::npos)
      << answers[0].error().message();
}

TEST_F(MultiplyStreamSessionTest, CancelEndsTheCallAndReleasesItsMultiplies) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Send(Start(1));
  call.Send(Chunk(1, v1::OPERAND_A, A(), 0, 6));
  EXPECT_EQ(state_.admission.inflight_requests(), 1);
  call.Cancel();
  EXPECT_EQ(call.WaitForEnd().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(call.open(), 0);
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
  // Steps still queued are abandoned.
  EXPECT_EQ(call.Abandoned().code(), absl::StatusCode::kCancelled);
}

TEST_F(MultiplyStreamSessionTest, ADrainEndsAnIdleCallAtOnce) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Drain();
  EXPECT_EQ(call.WaitForEnd().code(), absl::StatusCode::kUnavailable);
}

TEST_F(MultiplyStreamSessionTest, ADrainLetsOpenMultipliesFinishFirst) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Send(Start(1));
  call.Drain();
  EXPECT_FALSE(call.finished());
  call.Send(Chunk(1, v1::OPERAND_A, A(), 0, 6));
  call.Send(Chunk(1, v1::OPERAND_B, B(), 0, 6));
  EXPECT_EQ(call.WaitForEnd().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Product(call.answers(), 1), C());
}

TEST_F(MultiplyStreamSessionTest, TheDrainsDeadlineCutsOpenMultiplies) {
  TestCall call(state_, "alice");
  call.Begin();
  call.Send(Start(1));
  call.Drain();
  call.CutForDrain();
  EXPECT_EQ(call.WaitForEnd().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(call.open(), 0);
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
}

TEST_F(MultiplyStreamSessionTest, AClientGoneMidWriteEndsTheCallCancelled) {
  TestCall call(state_, "alice");
  call.hold_writes = true;
  call.Begin();
  call.Send(Start(1, /*result_chunk=*/4));
  call.Send(Chunk(1, v1::OPERAND_A, A(), 0, 6));
  call.Send(Chunk(1, v1::OPERAND_B, B(), 0, 6));
  ASSERT_EQ(call.WaitForAnswers(1).size(), 1u);
  call.WriteDone(/*ok=*/false);
  EXPECT_EQ(call.WaitForEnd().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
}

// Striping: one multiply over two calls of one client.
constexpr char kKey[] = "0123456789abcdef";

TEST_F(MultiplyStreamSessionTest, AStripedMultiplyAnswersOnBothCalls) {
  TestCall owner(state_, "alice");
  TestCall joiner(state_, "alice");
  owner.Begin();
  joiner.Begin();
  owner.Send(Start(1, /*result_chunk=*/4, kKey, 2));
  joiner.Send(Join(8, kKey));
  owner.Send(Chunk(1, v1::OPERAND_A, A(), 0, 6));
  joiner.Send(Chunk(8, v1::OPERAND_B, B(), 0, 6));  // forwarded to the owner
  owner.CloseInput();
  joiner.CloseInput();
  ASSERT_TRUE(owner.WaitForEnd().ok());
  ASSERT_TRUE(joiner.WaitForEnd().ok());
  const auto mine = owner.answers();
  const auto theirs = joiner.answers();
  // The header on each, under each call's own id; the product's chunks
  // spread over both.
  ASSERT_FALSE(mine.empty());
  ASSERT_FALSE(theirs.empty());
  EXPECT_TRUE(mine[0].has_result());
  EXPECT_EQ(mine[0].request_id(), 1u);
  EXPECT_TRUE(theirs[0].has_result());
  EXPECT_EQ(theirs[0].request_id(), 8u);
  EXPECT_EQ(mine.size() + theirs.size(), 2u + 4u);
  std::vector<float> c = Product(mine, 1);
  const std::vector<float> other = Product(theirs, 8);
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] == -1) c[i] = other[i];
  }
  EXPECT_EQ(c, C());
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
}

TEST_F(MultiplyStreamSessionTest, AJoinBeforeItsStartWaitsForIt) {
  TestCall owner(state_, "alice");
  TestCall joiner(state_, "alice");
  owner.Begin();
  joiner.Begin();
  joiner.Send(Join(8, kKey));
  // It reads nothing more until its start comes.
  EXPECT_FALSE(joiner.reading());
  owner.Send(Start(1, 0, kKey, 2));
  EXPECT_TRUE(joiner.reading());
  joiner.Send(Chunk(8, v1::OPERAND_A, A(), 0, 6));
  joiner.Send(Chunk(8, v1::OPERAND_B, B(), 0, 6));
  owner.CloseInput();
  joiner.CloseInput();
  ASSERT_TRUE(owner.WaitForEnd().ok());
  ASSERT_TRUE(joiner.WaitForEnd().ok());
  EXPECT_TRUE(owner.answers().at(0).has_result());
  EXPECT_TRUE(joiner.answers().at(0).has_result());
}

TEST_F(MultiplyStreamSessionTest, AJoinWhoseStartNeverComesTimesOut) {
  TestCall joiner(state_, "alice");
  joiner.Begin();
  joiner.Send(Join(8, kKey));
  const auto answers = joiner.WaitForAnswers(1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].error().code(),
            static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(joiner.reading());
  joiner.CloseInput();
  EXPECT_TRUE(joiner.WaitForEnd().ok());
}

TEST_F(MultiplyStreamSessionTest, AStripeThatNeverJoinsKeepsTheMultiplyOpen) {
  TestCall owner(state_, "alice");
  owner.Begin();
  owner.Send(Start(1, 0, kKey, 2));
  owner.Send(Chunk(1, v1::OPERAND_A, A(), 0, 6));
  owner.Send(Chunk(1, v1::OPERAND_B, B(), 0, 6));
  owner.CloseInput();
  // Every byte came, but the result waits for the other stream.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(owner.answers().empty());
  EXPECT_FALSE(owner.finished());
  // The client's cancel (or deadline) ends it.
  owner.Cancel();
  EXPECT_EQ(owner.WaitForEnd().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
  // Its key is free again.
  TestCall again(state_, "alice");
  again.Begin();
  again.Send(Start(2, 0, kKey, 2));
  EXPECT_EQ(again.open(), 1);
  again.Cancel();
  EXPECT_EQ(again.WaitForEnd().code(), absl::StatusCode::kCancelled);
}

TEST_F(MultiplyStreamSessionTest, ACancelledJoinerFailsTheOwnersMultiply) {
  TestCall owner(state_, "alice");
  TestCall joiner(state_, "alice");
  owner.Begin();
  joiner.Begin();
  owner.Send(Start(1, 0, kKey, 2));
  joiner.Send(Join(8, kKey));
  joiner.Send(Chunk(8, v1::OPERAND_A, A(), 0, 6));
  joiner.Cancel();
  EXPECT_EQ(joiner.WaitForEnd().code(), absl::StatusCode::kCancelled);
  const auto answers = owner.WaitForAnswers(1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].error().code(),
            static_cast<int>(absl::StatusCode::kCancelled));
  owner.CloseInput();
  EXPECT_TRUE(owner.WaitForEnd().ok());
  EXPECT_EQ(state_.admission.inflight_requests(), 0);
}

}  // namespace
}  // namespace matmul
