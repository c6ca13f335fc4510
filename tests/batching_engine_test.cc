#include "gpu/batching_engine.h"

#include <chrono>
#include <future>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gpu/host/host_engine.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/fake_engine.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using testing::EngineJob;
using testing::JobOutcome;
using testing::MakeSpec;

// Fixed window unless `adaptive`.
std::unique_ptr<BatchingEngine> NewEngine(absl::Duration window, int max_batch,
                                          bool adaptive = false, int lanes = 2,
                                          bool gather_destinations = false) {
  HostEngineOptions host;
  host.lanes = lanes;
  BatchingOptions options;
  options.adaptive = adaptive;
  options.window = window;
  options.max_batch = max_batch;
  options.gather_destinations = gather_destinations;
  return std::make_unique<BatchingEngine>(*HostEngine::Create(host), options);
}

struct Pending {
  MatmulSpec spec;
  std::string a, b;
  std::string c;  // the product's destination, where the job names one
  std::future<JobOutcome> future;
  JobOutcome outcome;  // set by ExpectCorrect
};

// `gate`: when set, staging the job's operands waits for it (the job holds
// its lane meanwhile).
// `prestaged`: the job's operands are the Pending's own strings
// (MultiplyOp::prestaged), never written into staging.
// `to_destination`: the product goes into the Pending's `c`
// (MultiplyOp::c_destination).
std::unique_ptr<Pending> Submit(Engine& engine, const MatmulSpec& spec,
                                absl::BitGen& gen,
                                absl::Status abandoned = absl::OkStatus(),
                                absl::Notification* gate = nullptr,
                                bool prestaged = false,
                                bool to_destination = false) {
  auto p = std::make_unique<Pending>();
  p->spec = spec;
  p->a = testing::RandomBytes(spec.dtype, spec.a_elements(), gen);
  p->b = testing::RandomBytes(spec.dtype, spec.b_elements(), gen);
  std::promise<JobOutcome> promise;
  p->future = promise.get_future();
  EngineJob::Options options;
  options.a = p->a;
  options.b = p->b;
  if (prestaged || to_destination) {
    MultiplyOp multiply;
    if (prestaged) {
      multiply.prestaged = PrestagedOperands{
          reinterpret_cast<const std::byte*>(p->a.data()),
          reinterpret_cast<const std::byte*>(p->b.data()), false};
    }
    if (to_destination) {
      p->c.assign(static_cast<size_t>(spec.c_bytes()), '\xff');
      multiply.c_destination = reinterpret_cast<std::byte*>(p->c.data());
    }
    options.op = multiply;
  }
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
  // A product written into the job's destination comes back empty.
  if (!p.c.empty()) {
    EXPECT_TRUE(out.c.empty());
  }
  const std::string& c = p.c.empty() ? out.c : p.c;
  EXPECT_LT(
      testing::RelativeError(
          testing::ToDoubles(p.spec.dtype, c.data(), p.spec.c_elements()), ref),
      testing::Tolerance(p.spec.dtype, p.spec.compute));
}

// A BatchingEngine over a FakeEngine with one slot, whose jobs wait until
// the test lets them go; a 60 s window, so that nothing leaves on a timer.
struct OverFake {
  OverFake() {
    auto owned = std::make_unique<testing::FakeEngine>();
    fake = owned.get();
    BatchingOptions options;
    options.window = absl::Seconds(60);
    engine = std::make_unique<BatchingEngine>(std::move(owned), options);
  }
  testing::FakeEngine* fake;  // owned by `engine`
  std::unique_ptr<BatchingEngine> engine;
};

TEST(BatchingEngineTest, SameShapeRequestsShareBatchesAndStayCorrect) {
  // No timer: each batch goes when it is full.
  auto engine = NewEngine(absl::Seconds(60), 16);
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
  EXPECT_EQ(testing::JobsOnStreams(stats.devices[0]), 3);
}

// Prestaged requests batch as a gathered multiply: the engine reads each
// member's operands where the member keeps them (no staging copies).
TEST(BatchingEngineTest, PrestagedRequestsGatherIntoBatchesAndStayCorrect) {
  auto engine = NewEngine(absl::Seconds(60), 16);  // batches go when full
  absl::BitGen gen;
  std::vector<std::unique_ptr<Pending>> pending;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 16, 24, 20, false, true, false);
  for (int i = 0; i < 32; ++i) {
    pending.push_back(Submit(*engine, spec, gen, absl::OkStatus(), nullptr,
                             /*prestaged=*/true));
  }
  for (auto& p : pending) ExpectCorrect(*p);
  EXPECT_EQ(engine->batched_requests(), 32);
  EXPECT_EQ(engine->batches(), 2);
  for (auto& p : pending) EXPECT_DOUBLE_EQ(p->outcome.timings.share, 1.0 / 16);
  EXPECT_EQ(testing::JobsOnStreams(engine->stats().devices[0]), 2);
}

// 24 prestaged requests of one shape, alternately with a product
// destination and without.
std::vector<std::unique_ptr<Pending>> SubmitPrestagedHalfToDestinations(
    Engine& engine, absl::BitGen& gen) {
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 16, 24, 20, false, true, false);
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < 24; ++i) {
    pending.push_back(Submit(engine, spec, gen, absl::OkStatus(), nullptr,
                             /*prestaged=*/true,
                             /*to_destination=*/i % 2 == 0));
  }
  return pending;
}

// With gather_destinations, prestaged requests that name a product
// destination (a shared-memory client's c_shared) gather too, and each
// product lands in its own destination; they batch apart from prestaged
// ones whose product comes back, and a staged request with a destination
// goes alone. Without it, they all go alone.
TEST(BatchingEngineTest, PrestagedRequestsWithDestinationsGatherApart) {
  auto engine = NewEngine(absl::Seconds(60), 64, /*adaptive=*/false,
                          /*lanes=*/2, /*gather_destinations=*/true);
  absl::BitGen gen;
  std::vector<std::unique_ptr<Pending>> pending =
      SubmitPrestagedHalfToDestinations(*engine, gen);
  pending.push_back(Submit(*engine, pending.front()->spec, gen,
                           absl::OkStatus(), nullptr,
                           /*prestaged=*/false, /*to_destination=*/true));
  engine->Shutdown();  // what waits goes out, a batch a group (no timer)
  for (auto& p : pending) ExpectCorrect(*p);
  // Twelve of each prestaged kind, one batch each; the staged one alone,
  // past the batching engine.
  EXPECT_EQ(engine->batched_requests(), 24);
  EXPECT_EQ(engine->batches(), 2);
  EXPECT_EQ(testing::JobsOnStreams(engine->stats().devices[0]), 3);
}

TEST(BatchingEngineTest, WithoutTheOptionRequestsWithDestinationsGoAlone) {
  auto engine = NewEngine(absl::Seconds(60), 64);
  absl::BitGen gen;
  std::vector<std::unique_ptr<Pending>> pending =
      SubmitPrestagedHalfToDestinations(*engine, gen);
  engine->Shutdown();
  for (auto& p : pending) ExpectCorrect(*p);
  // The twelve whose product comes back, one batch; the other twelve alone.
  EXPECT_EQ(engine->batched_requests(), 12);
  EXPECT_EQ(engine->batches(), 1);
  EXPECT_EQ(testing::JobsOnStreams(engine->stats().devices[0]), 13);
}

// Staged and prestaged requests of one shape never share a batch (a batch
// either stages its members' operands or gathers them).
TEST(BatchingEngineTest, PrestagedRequestsBatchApartFromStagedOnes) {
  auto engine = NewEngine(absl::Seconds(60), 64);
  absl::BitGen gen;
  std::vector<std::unique_ptr<Pending>> pending;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 12, 10, 8, false, false, false);
  const MatmulSpec other =
      MakeSpec(DType::kFloat32, 1, 1, 6, 14, 9, true, false, false);
  for (int i = 0; i < 24; ++i) {
    pending.push_back(Submit(*engine, i % 3 == 2 ? other : spec, gen,
                             absl::OkStatus(), nullptr,
                             /*prestaged=*/i % 2 == 0));
  }
  engine->Shutdown();  // what waits goes out, a batch a group (no timer)
  for (auto& p : pending) ExpectCorrect(*p);
  EXPECT_EQ(engine->batched_requests(), 24);
  // One batch per shape, staged and prestaged apart.
  EXPECT_EQ(engine->batches(), 4);
}

TEST(BatchingEngineTest, DifferentShapesAndDtypesBatchApart) {
  auto engine = NewEngine(absl::Seconds(60), 64);
  absl::BitGen gen;
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < 30; ++i) {
    const DType dtype = i % 2 ? DType::kBFloat16 : DType::kFloat64;
    pending.push_back(Submit(
        *engine,
        MakeSpec(dtype, 1, 1, 8 + i % 3, 9, 10, i % 5 == 0, false, false),
        gen));
  }
  engine->Shutdown();  // what waits goes out, a batch a group (no timer)
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
  auto engine = NewEngine(absl::Milliseconds(200), 64, /*adaptive=*/true,
                          /*lanes=*/2);
  absl::BitGen gen;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 8, 8, 8, false, false, false);
  const MatmulSpec other =
      MakeSpec(DType::kFloat64, 1, 1, 8, 8, 8, false, false, false);
  absl::Notification gate;
  // Two slots, both held by gated jobs: the lanes are blocked, so the
  // group's 200 ms pass with no slot free; it goes to the wrapped engine
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

// Mixed shapes of one dtype (transposes too): `per_shape` requests of
// each, interleaved.
std::vector<MatmulSpec> MixedShapes(int per_shape) {
  const DType dtype = DType::kFloat32;
  const MatmulSpec shapes[] = {
      MakeSpec(dtype, 1, 1, 16, 16, 16, false, false, false),
      MakeSpec(dtype, 1, 1, 33, 7, 12, true, false, false),
      MakeSpec(dtype, 1, 1, 8, 40, 24, false, true, false),
      MakeSpec(dtype, 1, 1, 5, 9, 65, true, true, false)};
  std::vector<MatmulSpec> out;
  for (int i = 0; i < per_shape; ++i) {
    for (const MatmulSpec& s : shapes) out.push_back(s);
  }
  return out;
}

// A batch gathered while the slot was busy says its shape does not recur
// (its count varies from one dispatch to the next, so the CUDA engine
// records no graph for it); a request that goes out alone keeps its own
// description, whose shape does.
TEST(BatchingEngineTest, AGatheredBatchSaysItsShapeDoesNotRecur) {
  OverFake over;
  testing::FakeEngine* fake = over.fake;
  BatchingEngine& engine = *over.engine;
  absl::BitGen gen;
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 8, 8, 8, false, false, false);
  auto first = Submit(engine, spec, gen);
  fake->WaitForHeld(1);  // out at once, alone: the slot is now taken
  EXPECT_TRUE(fake->held_description(0).shape_recurs);
  EXPECT_EQ(fake->held_description(0).spec.batch, 1);
  std::vector<std::unique_ptr<Pending>> waiting;
  for (int i = 0; i < 3; ++i) waiting.push_back(Submit(engine, spec, gen));
  fake->ReleaseOne();
  ExpectCorrect(*first);
  fake->WaitForHeld(1);
  const JobDescription gathered = fake->held_description(0);
  EXPECT_FALSE(gathered.shape_recurs);
  EXPECT_EQ(gathered.spec.batch, 3);
  fake->ReleaseOne();
  for (auto& p : waiting) ExpectCorrect(*p);
}

// Requests of several shapes that wait together while the one lane is
// busy: one batch per shape when it frees.
TEST(BatchingEngineTest, MixedShapesQueuedWhileBusyBatchAShape) {
  auto engine = NewEngine(absl::Seconds(60), 64, /*adaptive=*/true,
                          /*lanes=*/1);
  absl::BitGen gen;
  absl::Notification gate;
  auto first = Submit(
      *engine, MakeSpec(DType::kFloat32, 1, 1, 8, 8, 8, false, false, false),
      gen, absl::OkStatus(), &gate);
  std::vector<std::unique_ptr<Pending>> waiting;
  for (const MatmulSpec& spec : MixedShapes(3)) {
    waiting.push_back(Submit(*engine, spec, gen));
  }
  gate.Notify();
  ExpectCorrect(*first);
  for (auto& p : waiting) ExpectCorrect(*p);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.batch_sizes.launches, 5);  // alone, then a batch a shape
  EXPECT_EQ(engine->batches(), 4);
}

}  // namespace
}  // namespace matmul
