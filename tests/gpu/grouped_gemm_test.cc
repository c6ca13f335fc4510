// The CUDA engine's grouped multiply (GroupedMultiplyOp: one
// cublasGemmGroupedBatchedEx launch for requests of several shapes), and
// the batching engine sending mixed shapes to it as one job. Skips where no
// GPU is visible (CI); runs for real on a GPU host.
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/synchronization/notification.h"
#include "gpu/batching_engine.h"
#include "gpu/cuda/cublas_gemm.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/device_registry.h"
#include "gpu/grouped_job.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using testing::EngineJob;
using testing::JobOutcome;
using testing::MakeSpec;

#define SKIP_WITHOUT_GPU()                                   \
  do {                                                       \
    if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU"; \
  } while (0)

std::unique_ptr<CudaEngine> NewEngine(
    int64_t inline_dispatch_max_bytes =
        CudaEngineOptions().inline_dispatch_max_bytes) {
  CudaEngineOptions options;
  options.streams_per_device = 4;
  options.pinned_pool_bytes = int64_t{1} << 30;
  options.inline_dispatch_max_bytes = inline_dispatch_max_bytes;
  options.poison_outputs = true;  // a member left unwritten reads as NaN
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine =
      CudaEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

struct Member {
  MatmulSpec spec;
  std::string a, b;
  std::future<JobOutcome> future;
};

// Shapes between 64 and 512, square and not, with every transpose.
std::vector<MatmulSpec> Mix(DType dtype, ComputeMode compute) {
  const int64_t dims[][3] = {{64, 64, 64},    {128, 128, 128}, {256, 256, 256},
                             {512, 512, 512}, {64, 512, 128},  {300, 77, 200},
                             {128, 64, 512},  {96, 160, 72}};
  std::vector<MatmulSpec> out;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < std::size(dims); ++i) {
      const bool ta = (i + round) % 2 == 1;
      const bool tb = (i + round) % 3 == 1;
      out.push_back(MakeSpec(dtype, 1, 1, dims[i][0], dims[i][1], dims[i][2],
                             ta, tb, false, compute));
    }
  }
  return out;
}

std::unique_ptr<MatmulJob> NewMember(Member& m, const MatmulSpec& spec,
                                     absl::BitGen& gen) {
  m.spec = spec;
  m.a = testing::RandomBytes(spec.dtype, spec.a_elements(), gen);
  m.b = testing::RandomBytes(spec.dtype, spec.b_elements(), gen);
  std::promise<JobOutcome> promise;
  m.future = promise.get_future();
  EngineJob::Options options;
  options.a = m.a;
  options.b = m.b;
  return std::make_unique<EngineJob>(spec, options, std::move(promise));
}

void ExpectCorrect(Member& m, double* share_sum = nullptr) {
  const JobOutcome out = m.future.get();
  ASSERT_TRUE(out.status.ok()) << out.status;
  const std::vector<double> ref = testing::ReferenceGemm(
      m.spec, testing::ToDoubles(m.spec.dtype, m.a.data(), m.spec.a_elements()),
      testing::ToDoubles(m.spec.dtype, m.b.data(), m.spec.b_elements()));
  EXPECT_LT(
      testing::RelativeError(
          testing::ToDoubles(m.spec.dtype, out.c.data(), m.spec.c_elements()),
          ref),
      testing::Tolerance(m.spec.dtype, m.spec.compute))
      << m.spec.m << "x" << m.spec.k << "x" << m.spec.n
      << (m.spec.transpose_a ? " A^T" : "")
      << (m.spec.transpose_b ? " B^T" : "");
  if (share_sum != nullptr) *share_sum += out.timings.share;
}

class GroupedGemmTest
    : public ::testing::TestWithParam<std::pair<DType, ComputeMode>> {};

// One grouped job straight to the CUDA engine: every member's product
// within its dtype's tolerance of the float64 reference (float32 strict,
// tf32, and the rest), shares summing to 1.
TEST_P(GroupedGemmTest, EveryMemberOfAMixIsRight) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, compute] = GetParam();
  ASSERT_TRUE(GroupedGemmSupported(dtype, compute));
  auto engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  absl::BitGen gen;
  const std::vector<MatmulSpec> mix = Mix(dtype, compute);
  std::vector<Member> members(mix.size());
  std::vector<std::unique_ptr<MatmulJob>> jobs;
  for (size_t i = 0; i < mix.size(); ++i) {
    jobs.push_back(NewMember(members[i], mix[i], gen));
  }
  absl::Notification finished;
  engine->Submit(std::make_unique<GroupedJob>(
      std::move(jobs), [&finished]() { finished.Notify(); }));
  double shares = 0;
  for (Member& m : members) ExpectCorrect(m, &shares);
  EXPECT_TRUE(finished.HasBeenNotified());
  EXPECT_NEAR(shares, 1.0, 1e-9);
  // One job on the device, not one per member.
  // (The stats are a value: iterating over a member of the temporary
  // engine->stats() read freed memory.)
  const EngineStats stats = engine->stats();
  int64_t jobs_run = 0;
  for (const StreamStats& s : stats.devices[0].streams) {
    jobs_run += s.jobs;
  }
  EXPECT_EQ(jobs_run, 1);
  engine->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, GroupedGemmTest,
    ::testing::Values(std::make_pair(DType::kFloat32, ComputeMode::kStrict),
                      std::make_pair(DType::kFloat32, ComputeMode::kTf32),
                      std::make_pair(DType::kFloat64, ComputeMode::kStrict),
                      std::make_pair(DType::kFloat16, ComputeMode::kStrict),
                      std::make_pair(DType::kBFloat16, ComputeMode::kStrict)),
    [](const auto& info) {
      return std::string(DTypeName(info.param.first)) +
             (info.param.second == ComputeMode::kTf32 ? "_tf32" : "");
    });

// Through the batching engine: with its one slot held (a job whose staging
// waits on a gate), a mix of shapes gathers and goes out as one grouped
// job when the slot frees; every answer right.
TEST(GroupedGemmBatchingTest, MixedShapesWhileBusyRunAsOneGroupedLaunch) {
  SKIP_WITHOUT_GPU();
  // No inline dispatch: the gated job must block a lane thread, not this.
  auto cuda = NewEngine(/*inline_dispatch_max_bytes=*/0);
  ASSERT_NE(cuda, nullptr);
  BatchingOptions options;
  options.slots = 1;
  options.grouped = true;
  options.window = absl::Seconds(60);
  BatchingEngine engine(std::move(cuda), options);
  absl::BitGen gen;

  absl::Notification gate;
  class Gated final : public MatmulJob {
   public:
    Gated(std::unique_ptr<MatmulJob> inner, absl::Notification* gate)
        : MatmulJob(inner->description()),
          inner_(std::move(inner)),
          gate_(gate) {}
    absl::Status WriteOperands(absl::Span<std::byte> a,
                               absl::Span<std::byte> b) override {
      gate_->WaitForNotification();
      return inner_->WriteOperands(a, b);
    }
    void Done(absl::StatusOr<JobResult> r) override {
      inner_->Done(std::move(r));
    }

   private:
    std::unique_ptr<MatmulJob> inner_;
    absl::Notification* gate_;
  };
  Member first;
  engine.Submit(std::make_unique<Gated>(
      NewMember(
          first,
          MakeSpec(DType::kFloat32, 1, 1, 64, 64, 64, false, false, false),
          gen),
      &gate));
  const std::vector<MatmulSpec> mix =
      Mix(DType::kFloat32, ComputeMode::kStrict);
  std::vector<Member> members(mix.size());
  for (size_t i = 0; i < mix.size(); ++i) {
    engine.Submit(NewMember(members[i], mix[i], gen));
  }
  gate.Notify();
  ExpectCorrect(first);
  for (Member& m : members) ExpectCorrect(m);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.batch_sizes.grouped_launches, 1);
  EXPECT_EQ(stats.batch_sizes.grouped_requests,
            static_cast<int64_t>(mix.size()));
  engine.Shutdown();
}

}  // namespace
}  // namespace matmul
