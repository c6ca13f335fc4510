#include "gpu/batching_engine.h"

#include <chrono>
#include <future>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gpu/host/host_engine.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using testing::EngineJob;
using testing::JobOutcome;
using testing::MakeSpec;

// Fixed window unless `adaptive`.
std::unique_ptr<BatchingEngine> NewEngine(absl::Duration window, int max_batch,
                                          bool adaptive = false,
                                          int lanes = 2) {
  HostEngineOptions host;
  host.lanes = lanes;
  BatchingOptions options;
  options.adaptive = adaptive;
  options.window = window;
  options.max_batch = max_batch;
  return std::make_unique<BatchingEngine>(*HostEngine::Create(host), options);
}

struct Pending {
  MatmulSpec spec;
  std::string a, b;
  std::future<JobOutcome> future;
  JobOutcome outcome;  // set by ExpectCorrect
};

// `gate`: when set, staging the job's operands waits for it (the job holds
// its lane meanwhile).
std::unique_ptr<Pending> Submit(Engine& engine, const MatmulSpec& spec,
                                absl::BitGen& gen,
                                absl::Status abandoned = absl::OkStatus(),
                                absl::Notification* gate = nullptr) {
  auto p = std::make_unique<Pending>();
  p->spec = spec;
  p->a = testing::RandomBytes(spec.dtype, spec.a_elements(), gen);
  p->b = testing::RandomBytes(spec.dtype, spec.b_elements(), gen);
  std::promise<JobOutcome> promise;
  p->future = promise.get_future();
  EngineJob::Options options;
  options.a = p->a;
  options.b = p->b;
  class Job final : public MatmulJob {
   public:
    Job(std::unique_ptr<EngineJob> inner, absl::Status abandoned,
        absl::Notification* gate)
        : MatmulJob(inner->description()),
          inner_(std::move(inner)),
          abandoned_(std::move(abandoned)),
          gate_(gate) {}
    absl::Status WriteOperands(absl::Span<std::byte> a,
                               absl::Span<std::byte> b) override {
      if (gate_ != nullptr) gate_->WaitForNotification();
      if (!abandoned_.ok()) return abandoned_;
      return inner_->WriteOperands(a, b);
    }
    void Done(absl::StatusOr<JobResult> r) override {
      inner_->Done(std::move(r));
    }

   private:
    std::unique_ptr<EngineJob> inner_;
    absl::Status abandoned_;
    absl::Notification* gate_;
  };
  engine.Submit(std::make_unique<Job>(
      std::make_unique<EngineJob>(spec, options, std::move(promise)), abandoned,
      gate));
  return p;
}

void ExpectCorrect(Pending& p) {
  p.outcome = p.future.get();
  const JobOutcome& out = p.outcome;
  ASSERT_TRUE(out.status.ok()) << out.status;
  const std::vector<double> ref = testing::ReferenceGemm(
      p.spec, testing::ToDoubles(p.spec.dtype, p.a.data(), p.spec.a_elements()),
      testing::ToDoubles(p.spec.dtype, p.b.data(), p.spec.b_elements()));
  EXPECT_LT(
      testing::RelativeError(
          testing::ToDoubles(p.spec.dtype, out.c.data(), p.spec.c_elements()),
          ref),
      testing::Tolerance(p.spec.dtype, p.spec.compute));
}

TEST(BatchingEngineTest, SameShapeRequestsShareBatchesAndStayCorrect) {
  auto engine = NewEngine(absl::Milliseconds(20), 16);
  absl::BitGen gen;
  std::vector<std::unique_ptr<Pending>> pending;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 16, 24, 20, false, true, false);
  for (int i = 0; i < 48; ++i) pending.push_back(Submit(*engine, spec, gen));
  for (auto& p : pending) ExpectCorrect(*p);
  EXPECT_EQ(engine->batched_requests(), 48);
  EXPECT_EQ(engine->batches(), 3);
  // Each member carries the batch's times and a sixteenth of them as its
  // share (what its client is charged).
  for (auto& p : pending) EXPECT_DOUBLE_EQ(p->outcome.timings.share, 1.0 / 16);
  // The wrapped engine ran three jobs, not 48.
  const EngineStats stats = engine->stats();
  int64_t jobs = 0;
  for (const StreamStats& s : stats.devices[0].streams) jobs += s.jobs;
  EXPECT_EQ(jobs, 3);
}

TEST(BatchingEngineTest, DifferentShapesAndDtypesBatchApart) {
  auto engine = NewEngine(absl::Milliseconds(20), 64);
  absl::BitGen gen;
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < 30; ++i) {
    const DType dtype = i % 2 ? DType::kBFloat16 : DType::kFloat64;
    pending.push_back(Submit(
        *engine,
        MakeSpec(dtype, 1, 1, 8 + i % 3, 9, 10, i % 5 == 0, false, false),
        gen));
  }
  for (auto& p : pending) ExpectCorrect(*p);
  // A group of one runs alone; most requests share a batch.
  EXPECT_GE(engine->batched_requests(), 20);
  // 2 dtypes x 3 shapes x 2 transposes of A = at most 12 groups.
  EXPECT_LE(engine->batches(), 12);
}

TEST(BatchingEngineTest, AMemberThatFailsToStageFailsAlone) {
  auto engine = NewEngine(absl::Milliseconds(20), 8);
  absl::BitGen gen;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 12, 12, 12, false, false, false);
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < 8; ++i) {
    pending.push_back(
        Submit(*engine, spec, gen,
               i == 3 ? absl::CancelledError("went away") : absl::OkStatus()));
  }
  for (int i = 0; i < 8; ++i) {
    if (i == 3) {
      EXPECT_EQ(pending[i]->future.get().status.code(),
                absl::StatusCode::kCancelled);
    } else {
      ExpectCorrect(*pending[i]);
    }
  }
}

TEST(BatchingEngineTest, LargeAndBatchedRequestsPassThrough) {
  auto engine = NewEngine(absl::Milliseconds(20), 8);
  absl::BitGen gen;
  auto big = Submit(
      *engine,
      MakeSpec(DType::kFloat32, 1, 1, 600, 600, 600, false, false, false), gen);
  auto batched =
      Submit(*engine,
             MakeSpec(DType::kFloat32, 3, 3, 8, 8, 8, false, false, true), gen);
  ExpectCorrect(*big);
  ExpectCorrect(*batched);
  EXPECT_EQ(engine->batches(), 0);
}

TEST(BatchingEngineTest, ShutdownFlushesWaitingRequests) {
  auto engine = NewEngine(absl::Seconds(60), 64);
  absl::BitGen gen;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 5, 6, 7, false, false, false);
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < 5; ++i) pending.push_back(Submit(*engine, spec, gen));
  engine->Shutdown();
  for (auto& p : pending) ExpectCorrect(*p);
}

// Adaptive: with a free slot, a request goes out at once, alone, however
// long the window (a fixed window of 60 s would hold it for 60 s).
TEST(BatchingEngineTest, AdaptiveSendsARequestAtOnceWhileASlotIsFree) {
  auto engine = NewEngine(absl::Seconds(60), 64, /*adaptive=*/true);
  absl::BitGen gen;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 16, 16, 16, false, false, false);
  for (int i = 0; i < 3; ++i) {  // one after another, as one client would
    auto p = Submit(*engine, spec, gen);
    ASSERT_EQ(p->future.wait_for(std::chrono::seconds(30)),
              std::future_status::ready);
    ExpectCorrect(*p);
  }
  EXPECT_EQ(engine->batches(), 0);
  const EngineStats stats = engine->stats();
  ASSERT_TRUE(stats.batching);
  EXPECT_EQ(stats.batch_sizes.launches, 3);
  EXPECT_EQ(stats.batch_sizes.counts[0], 3);  // three launches of 1
}

// Adaptive: while every slot is taken, requests gather; when a job
// finishes, what gathered goes out as one batch.
TEST(BatchingEngineTest, AdaptiveBatchesWhatArrivesWhileEverySlotIsBusy) {
  auto engine = NewEngine(absl::Seconds(60), 64, /*adaptive=*/true,
                          /*lanes=*/1);  // one slot
  absl::BitGen gen;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 12, 20, 8, false, true, false);
  absl::Notification gate;
  auto first = Submit(*engine, spec, gen, absl::OkStatus(), &gate);
  std::vector<std::unique_ptr<Pending>> waiting;
  for (int i = 0; i < 10; ++i) waiting.push_back(Submit(*engine, spec, gen));
  // The slot is held by the first: the ten wait (the window is 60 s).
  EXPECT_EQ(waiting[0]->future.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  gate.Notify();
  ExpectCorrect(*first);
  for (auto& p : waiting) ExpectCorrect(*p);
  EXPECT_EQ(engine->batches(), 1);
  EXPECT_EQ(engine->batched_requests(), 10);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.batch_sizes.launches, 2);
  EXPECT_EQ(stats.batch_sizes.requests, 11);
  EXPECT_EQ(stats.batch_sizes.counts[0], 1);  // the first, alone
  EXPECT_EQ(stats.batch_sizes.counts[4], 1);  // the ten: in (8, 16]
}

// Adaptive: the window still bounds the wait when no slot frees up.
TEST(BatchingEngineTest, AdaptiveWaitsNoLongerThanTheWindow) {
  auto engine = NewEngine(absl::Milliseconds(20), 64, /*adaptive=*/true,
                          /*lanes=*/2);
  absl::BitGen gen;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 8, 8, 8, false, false, false);
  const MatmulSpec other =
      MakeSpec(DType::kFloat64, 1, 1, 8, 8, 8, false, false, false);
  absl::Notification gate;
  // Two slots, both held by gated jobs: the lanes are blocked, so the
  // group's 20 ms pass with no slot free; it goes to the wrapped engine
  // then, and runs when the gate opens.
  auto held1 = Submit(*engine, other, gen, absl::OkStatus(), &gate);
  auto held2 = Submit(*engine, other, gen, absl::OkStatus(), &gate);
  std::vector<std::unique_ptr<Pending>> waiting;
  for (int i = 0; i < 4; ++i) waiting.push_back(Submit(*engine, spec, gen));
  for (int i = 0; i < 500 && engine->stats().batch_sizes.launches < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(engine->stats().batch_sizes.launches, 3);  // two alone, a batch
  gate.Notify();
  ExpectCorrect(*held1);
  ExpectCorrect(*held2);
  for (auto& p : waiting) ExpectCorrect(*p);
  EXPECT_EQ(engine->batches(), 1);
}

}  // namespace
}  // namespace matmul
