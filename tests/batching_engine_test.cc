#include "gpu/batching_engine.h"

#include <future>
#include <memory>
#include <vector>

#include "gpu/host/host_engine.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using testing::EngineJob;
using testing::JobOutcome;
using testing::MakeSpec;

std::unique_ptr<BatchingEngine> NewEngine(absl::Duration window,
                                          int max_batch) {
  HostEngineOptions host;
  host.lanes = 2;
  BatchingOptions options;
  options.window = window;
  options.max_batch = max_batch;
  return std::make_unique<BatchingEngine>(*HostEngine::Create(host), options);
}

struct Pending {
  MatmulSpec spec;
  std::string a, b;
  std::future<JobOutcome> future;
};

std::unique_ptr<Pending> Submit(Engine& engine, const MatmulSpec& spec,
                                absl::BitGen& gen,
                                absl::Status abandoned = absl::OkStatus()) {
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
    Job(std::unique_ptr<EngineJob> inner, absl::Status abandoned)
        : MatmulJob(inner->description()),
          inner_(std::move(inner)),
          abandoned_(std::move(abandoned)) {}
    absl::Status WriteOperands(absl::Span<std::byte> a,
                               absl::Span<std::byte> b) override {
      if (!abandoned_.ok()) return abandoned_;
      return inner_->WriteOperands(a, b);
    }
    void Done(absl::StatusOr<JobResult> r) override {
      inner_->Done(std::move(r));
    }

   private:
    std::unique_ptr<EngineJob> inner_;
    absl::Status abandoned_;
  };
  engine.Submit(std::make_unique<Job>(
      std::make_unique<EngineJob>(spec, options, std::move(promise)),
      abandoned));
  return p;
}

void ExpectCorrect(Pending& p) {
  JobOutcome out = p.future.get();
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

}  // namespace
}  // namespace matmul
