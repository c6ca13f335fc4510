#include "gpu/host/host_engine.h"

#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gathered_checks.h"
#include "tests/reference_gemm.h"
#include "tests/resident_checks.h"

namespace matmul {
namespace {

using testing::MakeSpec;
using testing::RandomBytes;
using testing::ReferenceGemm;
using testing::RelativeError;
using testing::ToDoubles;
using testing::Tolerance;

// A job over operand byte strings; the result (or status) lands in a future.
class TestJob final : public MatmulJob {
 public:
  struct Outcome {
    absl::Status status;
    std::string c;
    Placement placement;
    StageTimings timings;
  };

  TestJob(const MatmulSpec& spec, std::string a, std::string b,
          std::promise<Outcome> promise)
      : MatmulJob(JobDescription{spec, MultiplyOp{}}),
        a_(std::move(a)),
        b_(std::move(b)),
        promise_(std::move(promise)) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    wrote_ = true;
    if (!write_status_.ok()) return write_status_;
    EXPECT_EQ(a.size(), a_.size());
    EXPECT_EQ(b.size(), b_.size());
    std::memcpy(a.data(), a_.data(), a.size());
    std::memcpy(b.data(), b_.data(), b.size());
    return absl::OkStatus();
  }
  void Done(absl::StatusOr<JobResult> result) override {
    Outcome outcome;
    outcome.status = result.status();
    if (result.ok()) {
      outcome.c.assign(reinterpret_cast<const char*>(result->c().data()),
                       result->c().size());
      outcome.placement = result->placement();
      outcome.timings = result->timings();
    }
    outcome_wrote_ = wrote_;
    {
      // Release the staging before reporting, so stats seen after the
      // future resolves no longer count it.
      absl::StatusOr<JobResult> release = std::move(result);
    }
    promise_.set_value(std::move(outcome));
  }
  absl::Status Abandoned() const override { return abandoned_; }

  absl::Status abandoned_ = absl::OkStatus();
  absl::Status write_status_ = absl::OkStatus();
  static inline std::atomic<bool> outcome_wrote_{false};

 private:
  std::string a_;
  std::string b_;
  std::promise<Outcome> promise_;
  bool wrote_ = false;
};

std::unique_ptr<HostEngine> NewEngine(int lanes = 4) {
  HostEngineOptions options;
  options.lanes = lanes;
  absl::StatusOr<std::unique_ptr<HostEngine>> engine =
      HostEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

TestJob::Outcome RunJob(Engine& engine, const MatmulSpec& spec,
                        const std::string& a, const std::string& b) {
  std::promise<TestJob::Outcome> promise;
  std::future<TestJob::Outcome> future = promise.get_future();
  engine.Submit(std::make_unique<TestJob>(spec, a, b, std::move(promise)));
  return future.get();
}

// (dtype, compute, batch_a, batch_b, m, n, k, transpose_a, transpose_b, 3d)
using Case = std::tuple<DType, ComputeMode, int64_t, int64_t, int64_t, int64_t,
                        int64_t, bool, bool, bool>;

class HostEngineGemmTest : public ::testing::TestWithParam<Case> {};

TEST_P(HostEngineGemmTest, MatchesFloat64Reference) {
  const auto [dtype, compute, ba, bb, m, n, k, ta, tb, is3d] = GetParam();
  const MatmulSpec spec =
      MakeSpec(dtype, ba, bb, m, n, k, ta, tb, is3d, compute);
  absl::BitGen gen;
  const std::string a = RandomBytes(dtype, spec.a_elements(), gen);
  const std::string b = RandomBytes(dtype, spec.b_elements(), gen);
  std::unique_ptr<HostEngine> engine = NewEngine();
  const TestJob::Outcome out = RunJob(*engine, spec, a, b);
  ASSERT_TRUE(out.status.ok()) << out.status;
  ASSERT_EQ(static_cast<int64_t>(out.c.size()), spec.c_bytes());
  // Against the size of the terms: the cases include products of one
  // element, which cancel or (float16) underflow by chance.
  const double err =
      testing::ProductError(spec, ToDoubles(dtype, a.data(), spec.a_elements()),
                            ToDoubles(dtype, b.data(), spec.b_elements()),
                            ToDoubles(dtype, out.c.data(), spec.c_elements()));
  EXPECT_LT(err, Tolerance(dtype, compute));
  EXPECT_EQ(out.placement.device, -1);
  EXPECT_GE(out.placement.stream, 0);
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const auto [dtype, compute, ba, bb, m, n, k, ta, tb, is3d] = info.param;
  return absl::StrCat(DTypeName(dtype), "_", ComputeModeName(compute), "_b", ba,
                      "x", bb, "_", m, "x", n, "x", k, ta ? "_ta" : "",
                      tb ? "_tb" : "", is3d ? "_3d" : "");
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  struct Shape {
    int64_t ba, bb, m, n, k;
    bool is3d;
  };
  const Shape shapes[] = {
      {1, 1, 1, 1, 1, false},   {1, 1, 1, 37, 5, false},
      {1, 1, 37, 1, 5, false},  {1, 1, 5, 7, 1, false},
      {1, 1, 17, 33, 9, false}, {1, 1, 64, 64, 64, false},
      {3, 3, 5, 6, 7, true},    {4, 1, 5, 6, 7, true},  // B broadcast
      {1, 4, 5, 6, 7, true},                            // A broadcast
  };
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (const Shape& s : shapes) {
      for (int t = 0; t < 4; ++t) {
        cases.emplace_back(dtype, ComputeMode::kStrict, s.ba, s.bb, s.m, s.n,
                           s.k, (t & 1) != 0, (t & 2) != 0, s.is3d);
      }
    }
  }
  cases.emplace_back(DType::kFloat32, ComputeMode::kTf32, 1, 1, 31, 29, 23,
                     false, true, false);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllShapes, HostEngineGemmTest,
                         ::testing::ValuesIn(AllCases()), CaseName);

// A gathered multiply (MultiplyOp::gathered) reads each member's operands
// from the member's own memory and writes each product into the member's
// destination, or back to back into staging: every dtype, operands in one
// buffer or two.
// The tests' error measures: a product whose terms cancel has no relative
// error to speak of, but its error against the terms' size is small.
TEST(ReferenceGemmTest, ProductErrorMeasuresAgainstTheTermsNotTheirSum) {
  const MatmulSpec spec =
      MakeSpec(DType::kFloat64, 1, 1, 1, 1, 2, false, false, false);
  const std::vector<double> a = {1.0, 1.0};
  const std::vector<double> b = {1.0, -1.0};  // A·B = 0, |A|·|B| = 2
  const std::vector<double> out = {1e-7};
  EXPECT_EQ(RelativeError(out, ReferenceGemm(spec, a, b)),
            std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(testing::ProductError(spec, a, b, out), 5e-8);
  EXPECT_EQ(testing::ProductError(spec, a, b, {0.0}), 0.0);
  EXPECT_EQ(testing::ProductError(spec, a, b, {std::nan("")}),
            std::numeric_limits<double>::infinity());
  EXPECT_EQ(testing::ProductError(spec, a, b, {0.0, 0.0}),
            std::numeric_limits<double>::infinity());
  // float16: a product that underflows is rounded to the nearest subnormal
  // step, 2^-24; half a step off is rounding, not error.
  const MatmulSpec half =
      MakeSpec(DType::kFloat16, 1, 1, 1, 1, 1, false, false, false);
  const std::vector<double> x = {std::ldexp(1.0, -13)};      // x·x = 2^-26
  EXPECT_EQ(testing::ProductError(half, x, x, {0.0}), 0.0);  // rounded down
  // Off by 3·2^-26, half a step (2^-25) more than rounding allows: the
  // excess, 2^-26, is the error, as large as the product.
  EXPECT_DOUBLE_EQ(testing::ProductError(half, x, x, {std::ldexp(1.0, -24)}),
                   1.0);
}

TEST(HostEngineTest, GatheredMultiplyUsesEachMembersMemory) {
  auto engine = NewEngine();
  for (const DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (const bool one_buffer : {false, true}) {
      for (const bool to_destinations : {false, true}) {
        testing::ExpectGatheredMultiplyExact(
            *engine,
            testing::MakeSpec(dtype, 1, 1, 12, 10, 9, false, true, false), 5,
            one_buffer, to_destinations);
      }
    }
  }
  engine->Shutdown();
}

TEST(HostEngineTest, AbandonedJobIsDroppedBeforeStaging) {
  std::unique_ptr<HostEngine> engine = NewEngine(1);
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 2, 2, 2, false, false, false);
  std::promise<TestJob::Outcome> promise;
  auto future = promise.get_future();
  auto job = std::make_unique<TestJob>(
      spec, std::string(16, '\0'), std::string(16, '\0'), std::move(promise));
  job->abandoned_ = absl::CancelledError("client went away");
  engine->Submit(std::move(job));
  const TestJob::Outcome out = future.get();
  EXPECT_EQ(out.status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(TestJob::outcome_wrote_);
}

TEST(HostEngineTest, WriteOperandsFailureFailsTheJob) {
  std::unique_ptr<HostEngine> engine = NewEngine(1);
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 2, 2, 2, false, false, false);
  std::promise<TestJob::Outcome> promise;
  auto future = promise.get_future();
  auto job = std::make_unique<TestJob>(
      spec, std::string(16, '\0'), std::string(16, '\0'), std::move(promise));
  job->write_status_ = absl::DataLossError("payload vanished");
  engine->Submit(std::move(job));
  EXPECT_EQ(future.get().status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(engine->stats().devices[0].staging_used_bytes, 0);
}

TEST(HostEngineTest, SubmitAfterShutdownIsUnavailable) {
  std::unique_ptr<HostEngine> engine = NewEngine(2);
  engine->Shutdown();
  engine->Shutdown();  // idempotent
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 2, 2, 2, false, false, false);
  const TestJob::Outcome out =
      RunJob(*engine, spec, std::string(16, '\0'), std::string(16, '\0'));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kUnavailable);
}

TEST(HostEngineTest, ShutdownFinishesQueuedJobs) {
  std::unique_ptr<HostEngine> engine = NewEngine(2);
  const MatmulSpec spec =
      MakeSpec(DType::kFloat32, 1, 1, 96, 96, 96, false, false, false);
  absl::BitGen gen;
  const std::string a = RandomBytes(DType::kFloat32, spec.a_elements(), gen);
  std::vector<std::future<TestJob::Outcome>> futures;
  for (int i = 0; i < 20; ++i) {
    std::promise<TestJob::Outcome> promise;
    futures.push_back(promise.get_future());
    engine->Submit(std::make_unique<TestJob>(spec, a, a, std::move(promise)));
  }
  engine->Shutdown();
  for (auto& f : futures) EXPECT_TRUE(f.get().status.ok());
}

TEST(HostEngineTest, StatsCountJobsFlopsAndReturnStaging) {
  std::unique_ptr<HostEngine> engine = NewEngine(3);
  const MatmulSpec spec =
      MakeSpec(DType::kFloat64, 1, 1, 40, 50, 60, false, false, false);
  absl::BitGen gen;
  const std::string a = RandomBytes(DType::kFloat64, spec.a_elements(), gen);
  const std::string b = RandomBytes(DType::kFloat64, spec.b_elements(), gen);
  std::vector<std::future<TestJob::Outcome>> futures;
  for (int i = 0; i < 30; ++i) {
    std::promise<TestJob::Outcome> promise;
    futures.push_back(promise.get_future());
    engine->Submit(std::make_unique<TestJob>(spec, a, b, std::move(promise)));
  }
  std::vector<int> per_lane(3, 0);
  for (auto& f : futures) {
    TestJob::Outcome out = f.get();
    ASSERT_TRUE(out.status.ok());
    ++per_lane[out.placement.stream];
  }
  const EngineStats stats = engine->stats();
  ASSERT_EQ(stats.devices.size(), 1u);
  const DeviceStats& d = stats.devices[0];
  EXPECT_EQ(d.label, "host");
  ASSERT_EQ(d.streams.size(), 3u);
  int64_t jobs = 0;
  double lane_busy = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(d.streams[i].jobs, per_lane[i]);
    jobs += d.streams[i].jobs;
    lane_busy += d.streams[i].busy_seconds;
  }
  EXPECT_EQ(jobs, 30);
  EXPECT_DOUBLE_EQ(d.flops[static_cast<int>(DType::kFloat64)],
                   30 * spec.flops());
  EXPECT_GT(d.busy_seconds, 0);
  // The union of the lanes' busy time is at most their sum.
  EXPECT_LE(d.busy_seconds, lane_busy + 1e-9);
  EXPECT_EQ(d.staging_used_bytes, 0);  // every result already released
  EXPECT_EQ(d.queued_jobs, 0);
}

TEST(HostEngineTest, ResidentTensorsFloat32) {
  std::unique_ptr<HostEngine> engine = NewEngine(2);
  testing::CheckResidentTensors(*engine, DType::kFloat32);
}

TEST(HostEngineTest, ResidentTensorsBFloat16) {
  std::unique_ptr<HostEngine> engine = NewEngine(2);
  testing::CheckResidentTensors(*engine, DType::kBFloat16);
}

TEST(HostEngineTest, PiecewiseTransfer) {
  std::unique_ptr<HostEngine> engine = NewEngine(2);
  testing::CheckPiecewiseTransfer(*engine, DType::kFloat32);
  testing::CheckPiecewiseTransfer(*engine, DType::kFloat16);
}

TEST(HostEngineTest, RejectsInvalidLaneCount) {
  HostEngineOptions options;
  options.lanes = 0;
  EXPECT_EQ(HostEngine::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace matmul
