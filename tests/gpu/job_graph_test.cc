// Small multiplies replayed from CUDA graphs (gpu/cuda/job_graph.h) on a real
// GPU: every accuracy case recorded and then replayed with other operands,
// more shapes than a stream keeps (eviction), many jobs in flight on every
// stream, results held (their instances busy) while more jobs of their
// shape come, poisoned outputs, shutdown with results still held, injected
// faults on replayed jobs, operands from engine-allocated host memory and a
// product written into caller memory, jobs too big to record, batches
// that BatchingEngine gathered, and graphs off. Skips where no GPU is visible
// (CI).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gpu/batching_engine.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/job_layout.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_job.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using gpu_test::AllCases;
using gpu_test::BorrowedOperandsJob;
using gpu_test::Case;
using gpu_test::CaseName;
using gpu_test::ExpectMatchesReference;
using gpu_test::FaultPointName;
using gpu_test::ListFaults;
using gpu_test::MultiplyAndCheck;
using gpu_test::Outcome;
using gpu_test::SubmitJob;
using testing::MakeSpec;
using testing::RandomBytes;
using testing::ReferenceGemm;
using testing::RelativeError;
using testing::ToDoubles;
using testing::Tolerance;

const int64_t kMaxGraphBytes = CudaEngineOptions().job_graph_max_device_bytes;

// Records a shape the first time it comes (min_sightings 1), unless told
// otherwise, so that a test's second job of a shape is a replay.
std::unique_ptr<CudaEngine> GraphEngine(int streams, int graphs_per_stream,
                                        int min_sightings = 1) {
  CudaEngineOptions options;
  options.streams_per_device = streams;
  options.pinned_pool_bytes = int64_t{1} << 30;
  options.poison_outputs = true;  // a C never written cannot pass
  options.job_graphs_per_stream = graphs_per_stream;
  options.job_graph_min_sightings = min_sightings;
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine =
      CudaEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

struct GraphCounts {
  int64_t jobs = 0;
  int64_t recorded = 0;
  int64_t evicted = 0;
};

GraphCounts CountsOf(const Engine& engine) {
  GraphCounts counts;
  for (const DeviceStats& d : engine.stats().devices) {
    counts.jobs += d.graph_jobs;
    counts.recorded += d.graphs_recorded;
    counts.evicted += d.graphs_evicted;
  }
  return counts;
}

MatmulSpec Square(DType dtype, int64_t n) {
  return MakeSpec(dtype, 1, 1, n, n, n, false, false, false,
                  ComputeMode::kStrict);
}

class JobGraphAccuracyTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    if (VisibleCudaDevices() > 0) engine_ = GraphEngine(1, 8).release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  static CudaEngine* engine_;
};
CudaEngine* JobGraphAccuracyTest::engine_ = nullptr;

// Each case twice on one stream: the first job records its shape's graph,
// the second replays it with other operands written into the same staging
// (the first job's result has been let go of, so its instance is free).
TEST_P(JobGraphAccuracyTest, RecordedThenReplayedMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  ASSERT_NE(engine_, nullptr);
  const auto [dtype, compute, ba, bb, m, n, k, ta, tb, is3d] = GetParam();
  const MatmulSpec spec =
      MakeSpec(dtype, ba, bb, m, n, k, ta, tb, is3d, compute);
  const GraphCounts before = CountsOf(*engine_);
  absl::BitGen gen;
  MultiplyAndCheck(*engine_, spec, gen);
  MultiplyAndCheck(*engine_, spec, gen);
  const GraphCounts after = CountsOf(*engine_);
  const bool replayable = DeviceBytes(spec) <= kMaxGraphBytes;
  EXPECT_EQ(after.jobs - before.jobs, replayable ? 2 : 0);
}

INSTANTIATE_TEST_SUITE_P(AllShapes, JobGraphAccuracyTest,
                         ::testing::ValuesIn(AllCases()), CaseName);

TEST(JobGraphTest, OffByDefault) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = GraphEngine(2, 0);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(CudaEngineOptions().job_graphs_per_stream, 0);
  absl::BitGen gen;
  for (int i = 0; i < 3; ++i) {
    MultiplyAndCheck(*engine, Square(DType::kFloat32, 64), gen);
  }
  const GraphCounts counts = CountsOf(*engine);
  EXPECT_EQ(counts.jobs, 0);
  EXPECT_EQ(counts.recorded, 0);
}

// By default a shape is recorded the second time it comes without a graph:
// a shape seen once (an odd batch size, say) costs no recording.
TEST(JobGraphTest, AShapeIsRecordedOnItsSecondSighting) {
  SKIP_WITHOUT_GPU();
  CudaEngineOptions defaults;
  ASSERT_EQ(defaults.job_graph_min_sightings, 2);
  std::unique_ptr<CudaEngine> engine =
      GraphEngine(1, 8, defaults.job_graph_min_sightings);
  ASSERT_NE(engine, nullptr);
  absl::BitGen gen;
  const MatmulSpec once = Square(DType::kFloat32, 40);
  const MatmulSpec often = Square(DType::kFloat32, 72);
  MultiplyAndCheck(*engine, often, gen);  // seen once: call by call
  MultiplyAndCheck(*engine, once, gen);
  GraphCounts counts = CountsOf(*engine);
  EXPECT_EQ(counts.jobs, 0);
  EXPECT_EQ(counts.recorded, 0);
  MultiplyAndCheck(*engine, often, gen);  // recorded and launched
  MultiplyAndCheck(*engine, often, gen);  // replayed
  counts = CountsOf(*engine);
  EXPECT_EQ(counts.jobs, 2);
  EXPECT_EQ(counts.recorded, 1);
}

// One stream keeping two graphs, five shapes in turn, three rounds: every
// job misses, records its shape again and evicts the least recently used.
TEST(JobGraphTest, MoreShapesThanAStreamKeepsAreEvictedAndStayCorrect) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = GraphEngine(1, 2);
  ASSERT_NE(engine, nullptr);
  const int64_t sizes[] = {16, 48, 64, 100, 256};
  absl::BitGen gen;
  for (int round = 0; round < 3; ++round) {
    for (int64_t n : sizes)
      MultiplyAndCheck(*engine, Square(DType::kFloat32, n), gen);
  }
  const GraphCounts counts = CountsOf(*engine);
  EXPECT_EQ(counts.jobs, 15);
  EXPECT_EQ(counts.recorded, 15);
  EXPECT_EQ(counts.evicted, 13);
  // The graphs' device memory goes back when they are evicted: only the
  // two kept remain reserved once no job is in flight.
  int64_t reserved = 0;
  for (const DeviceStats& d : engine->stats().devices) {
    reserved += d.device_memory_used_bytes;
  }
  EXPECT_EQ(reserved, DeviceBytes(Square(DType::kFloat32, 100)) +
                          DeviceBytes(Square(DType::kFloat32, 256)));
}

// Many jobs of three shapes in flight on four streams at once: a stream
// records more instances of a shape while its others are held by jobs in
// flight (up to its eight), runs the rest call by call, and evicts a free
// instance of one shape to record another; every job is right whichever
// way it ran.
TEST(JobGraphTest, ManyJobsInFlightOnEveryStreamAreAllCorrect) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = GraphEngine(4, 8);
  ASSERT_NE(engine, nullptr);
  const MatmulSpec specs[] = {
      Square(DType::kFloat32, 64),
      MakeSpec(DType::kBFloat16, 1, 1, 96, 80, 112, false, true, false,
               ComputeMode::kStrict),
      MakeSpec(DType::kFloat32, 4, 4, 33, 65, 17, true, false, true,
               ComputeMode::kTf32)};
  constexpr int kJobs = 192;
  absl::BitGen gen;
  std::vector<std::string> a(kJobs), b(kJobs);
  std::vector<std::future<Outcome>> futures;
  for (int i = 0; i < kJobs; ++i) {
    const MatmulSpec& spec = specs[i % 3];
    a[i] = RandomBytes(spec.dtype, spec.a_elements(), gen);
    b[i] = RandomBytes(spec.dtype, spec.b_elements(), gen);
  }
  for (int i = 0; i < kJobs; ++i) {
    futures.push_back(SubmitJob(*engine, specs[i % 3], &a[i], &b[i]));
  }
  for (int i = 0; i < kJobs; ++i) {
    const MatmulSpec& spec = specs[i % 3];
    Outcome out = futures[i].get();
    ASSERT_TRUE(out.status.ok()) << "job " << i << ": " << out.status;
    const std::vector<double> ref = ReferenceGemm(
        spec, ToDoubles(spec.dtype, a[i].data(), spec.a_elements()),
        ToDoubles(spec.dtype, b[i].data(), spec.b_elements()));
    const double err = RelativeError(
        ToDoubles(spec.dtype, out.c.data(), spec.c_elements()), ref);
    EXPECT_LT(err, Tolerance(spec.dtype, spec.compute))
        << "job " << i << ": relative error " << err;
  }
  const GraphCounts counts = CountsOf(*engine);
  EXPECT_GT(counts.jobs, 0);
  EXPECT_LE(counts.jobs, kJobs);
  // At most eight instances on each of the four streams at any time.
  EXPECT_LE(counts.recorded - counts.evicted, 4 * 8);
}

// A multiply of two byte strings (which must outlive it) whose result the
// test keeps: its graph instance stays busy, as while a reply is being
// sent, until the test lets go of the result.
class HoldingJob final : public BorrowedOperandsJob {
 public:
  HoldingJob(const MatmulSpec& spec, const std::string* a, const std::string* b,
             std::promise<absl::StatusOr<JobResult>> promise)
      : BorrowedOperandsJob(spec, a, b), promise_(std::move(promise)) {}

  // A second call would throw from the promise: each job is answered once.
  void Done(absl::StatusOr<JobResult> result) override {
    promise_.set_value(std::move(result));
  }

 private:
  std::promise<absl::StatusOr<JobResult>> promise_;
};

// A job's operands, the future of its kept result, and its reference.
struct Held {
  MatmulSpec spec;
  std::string a, b;
  std::future<absl::StatusOr<JobResult>> future;
  absl::StatusOr<JobResult> result = absl::UnknownError("not yet");
};

std::unique_ptr<Held> SubmitHeld(Engine& engine, const MatmulSpec& spec,
                                 absl::BitGen& gen) {
  auto held = std::make_unique<Held>();
  held->spec = spec;
  held->a = RandomBytes(spec.dtype, spec.a_elements(), gen);
  held->b = RandomBytes(spec.dtype, spec.b_elements(), gen);
  std::promise<absl::StatusOr<JobResult>> promise;
  held->future = promise.get_future();
  engine.Submit(std::make_unique<HoldingJob>(spec, &held->a, &held->b,
                                             std::move(promise)));
  return held;
}

// Checks the kept result against the reference: its bytes are still in
// the staging (a graph instance's, or the job's own lease) while held.
void ExpectStillRight(const Held& held, const std::string& what) {
  ASSERT_TRUE(held.result.ok()) << what << ": " << held.result.status();
  const MatmulSpec& spec = held.spec;
  ASSERT_EQ(static_cast<int64_t>(held.result->c().size()), spec.c_bytes())
      << what;
  const std::vector<double> ref = ReferenceGemm(
      spec, ToDoubles(spec.dtype, held.a.data(), spec.a_elements()),
      ToDoubles(spec.dtype, held.b.data(), spec.b_elements()));
  const double err = RelativeError(
      ToDoubles(spec.dtype,
                reinterpret_cast<const char*>(held.result->c().data()),
                spec.c_elements()),
      ref);
  EXPECT_LT(err, Tolerance(spec.dtype, spec.compute))
      << what << ": relative error " << err;
}

// Waits for the result (keeping it) and checks it against the reference.
void ExpectRight(Held& held, const std::string& what) {
  held.result = held.future.get();
  ExpectStillRight(held, what);
}

// One stream keeping four instances; jobs of one shape in batches of six,
// each job's result held until its batch is done (as replies still being
// sent): the first batch records four instances (a held one cannot be
// replayed) and runs the other two call by call, and every held result
// stays right to the end of its batch; once the results are let go, every
// later batch replays the same four and records nothing.
TEST(JobGraphTest, HeldResultsKeepTheirInstancesAndFreedOnesAreReplayed) {
  SKIP_WITHOUT_GPU();
  constexpr int kCap = 4;
  constexpr int kBatch = 6;
  constexpr int kRounds = 5;
  std::unique_ptr<CudaEngine> engine = GraphEngine(1, kCap);
  ASSERT_NE(engine, nullptr);
  const MatmulSpec spec = MakeSpec(DType::kFloat32, 1, 1, 96, 80, 112, false,
                                   true, false, ComputeMode::kStrict);
  absl::BitGen gen;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::unique_ptr<Held>> batch;
    for (int i = 0; i < kBatch; ++i) {
      batch.push_back(SubmitHeld(*engine, spec, gen));
      // One after another: each job finds the ones before it still held.
      ExpectRight(*batch.back(), absl::StrCat("round ", round, " job ", i));
      // Stage times from the events the job used (an instance's or its own).
      const StageTimings& t = batch.back()->result->timings();
      EXPECT_GE(t.h2d, 0);
      EXPECT_GE(t.compute, 0);
      EXPECT_GE(t.d2h, 0);
      EXPECT_GT(t.h2d + t.compute + t.d2h, 0);
      EXPECT_GT(t.enqueue, 0);  // the launch, or the calls
    }
    // No held result was overwritten by a later job: a busy instance is
    // never replayed.
    for (int i = 0; i < kBatch; ++i) {
      ExpectStillRight(*batch[i],
                       absl::StrCat("round ", round, " job ", i, ", held"));
    }
    const GraphCounts counts = CountsOf(*engine);
    EXPECT_EQ(counts.recorded, kCap) << "round " << round;
    EXPECT_EQ(counts.jobs, int64_t{kCap} * (round + 1)) << "round " << round;
    EXPECT_EQ(counts.evicted, 0);
    batch.clear();  // lets go of the results: the instances are free
  }
  // Only the instances' own memory is left.
  const DeviceStats d = engine->stats().devices[0];
  EXPECT_EQ(d.device_memory_used_bytes, kCap * DeviceBytes(spec));
  EXPECT_EQ(d.queued_jobs, 0);
  EXPECT_EQ(testing::JobsOnStreams(d), kBatch * kRounds);
}

// With poison_outputs every result buffer holds NaN bytes until the job
// writes it, the instance's staging included (which otherwise still holds
// the previous job's product): replays that alternate two operand pairs
// must each bring back their own product, every element finite. And the
// check used here does catch the poison pattern.
TEST(JobGraphTest, PoisonedOutputsAreOverwrittenOnEveryReplay) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = GraphEngine(1, 2);
  ASSERT_NE(engine, nullptr);
  const MatmulSpec spec = Square(DType::kFloat32, 64);
  absl::BitGen gen;
  const std::string a[2] = {RandomBytes(spec.dtype, spec.a_elements(), gen),
                            RandomBytes(spec.dtype, spec.a_elements(), gen)};
  const std::string b[2] = {RandomBytes(spec.dtype, spec.b_elements(), gen),
                            RandomBytes(spec.dtype, spec.b_elements(), gen)};
  std::vector<double> ref[2];
  for (int i = 0; i < 2; ++i) {
    ref[i] = ReferenceGemm(
        spec, ToDoubles(spec.dtype, a[i].data(), spec.a_elements()),
        ToDoubles(spec.dtype, b[i].data(), spec.b_elements()));
  }
  const std::string poison(static_cast<size_t>(spec.c_bytes()), '\xff');
  EXPECT_FALSE(
      RelativeError(ToDoubles(spec.dtype, poison.data(), spec.c_elements()),
                    ref[0]) < Tolerance(spec.dtype, spec.compute))
      << "the check does not catch a C never written";
  for (int i = 0; i < 8; ++i) {
    const GraphCounts before = CountsOf(*engine);
    Outcome out = SubmitJob(*engine, spec, &a[i % 2], &b[i % 2]).get();
    ASSERT_TRUE(out.status.ok()) << "job " << i << ": " << out.status;
    EXPECT_EQ(CountsOf(*engine).jobs, before.jobs + 1) << "job " << i;
    const std::vector<double> got =
        ToDoubles(spec.dtype, out.c.data(), spec.c_elements());
    EXPECT_TRUE(std::all_of(got.begin(), got.end(),
                            [](double v) { return std::isfinite(v); }))
        << "job " << i;
    EXPECT_LT(RelativeError(got, ref[i % 2]),
              Tolerance(spec.dtype, spec.compute))
        << "job " << i;
  }
  EXPECT_EQ(CountsOf(*engine).recorded, 1);
}

// Jobs of two shapes submitted at once on two streams, the engine shut down
// while they are in flight, their results still held: every job is answered
// exactly once (a second answer would throw from its promise) and right,
// and letting go of the results afterwards, then destroying the engine, is
// safe.
TEST(JobGraphTest, ShutdownWithGraphJobsInFlightAndResultsHeld) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = GraphEngine(2, 4);
  ASSERT_NE(engine, nullptr);
  const MatmulSpec specs[] = {Square(DType::kFloat32, 48),
                              MakeSpec(DType::kFloat16, 2, 2, 40, 72, 56, false,
                                       false, true, ComputeMode::kStrict)};
  constexpr int kJobs = 64;
  absl::BitGen gen;
  std::vector<std::unique_ptr<Held>> held;
  for (int i = 0; i < kJobs; ++i) {
    held.push_back(SubmitHeld(*engine, specs[i % 2], gen));
  }
  engine->Shutdown();
  for (int i = 0; i < kJobs; ++i) {
    ExpectRight(*held[i], absl::StrCat("job ", i));
  }
  EXPECT_GT(CountsOf(*engine).jobs, 0);
  held.clear();
  engine.reset();
}

class JobGraphFaultTest
    : public ::testing::TestWithParam<FaultInjector::Point> {};

// One stream, one shape, jobs one after another: the 1st records an
// instance, the 2nd replays it, the 3rd meets an injected fault on its
// replay and fails with it; its instance is never replayed again, so the
// 4th records a new one, and the 4th and 5th are right.
TEST_P(JobGraphFaultTest, AFailedReplayDropsItsInstanceAndTheNextJobIsRight) {
  SKIP_WITHOUT_GPU();
  const FaultInjector::Point point = GetParam();
  ListFaults faults(
      point, {3},
      absl::InternalError("injected: CUBLAS_STATUS_EXECUTION_FAILED"));
  CudaEngineOptions options;
  options.streams_per_device = 1;
  options.pinned_pool_bytes = int64_t{256} << 20;
  options.poison_outputs = true;
  options.fault_injector = &faults;
  options.job_graphs_per_stream = 2;
  options.job_graph_min_sightings = 1;
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine =
      CudaEngine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const MatmulSpec spec = MakeSpec(DType::kFloat32, 1, 1, 72, 40, 88, true,
                                   false, false, ComputeMode::kStrict);
  absl::BitGen gen;
  // One after another, so job ids are 1..5 in this order.
  for (int i = 1; i <= 5; ++i) {
    if (i != 3) {
      MultiplyAndCheck(**engine, spec, gen);
      continue;
    }
    const std::string a = RandomBytes(spec.dtype, spec.a_elements(), gen);
    const std::string b = RandomBytes(spec.dtype, spec.b_elements(), gen);
    Outcome out = SubmitJob(**engine, spec, &a, &b).get();
    EXPECT_EQ(out.status.code(), absl::StatusCode::kInternal) << out.status;
    EXPECT_NE(out.status.message().find("CUBLAS_STATUS_EXECUTION_FAILED"),
              absl::string_view::npos)
        << out.status;
  }
  const GraphCounts counts = CountsOf(**engine);
  EXPECT_EQ(counts.recorded, 2);
  // The 3rd job's graph was launched only when the fault came at completion.
  EXPECT_EQ(counts.jobs, point == FaultInjector::Point::kCompletion ? 5 : 4);
  // The failed job's instance is gone, its memory with it.
  const DeviceStats d = (*engine)->stats().devices[0];
  EXPECT_EQ(d.device_memory_used_bytes, DeviceBytes(spec));
  EXPECT_EQ(testing::JobsOnStreams(d), 4);
}

INSTANTIATE_TEST_SUITE_P(EveryPoint, JobGraphFaultTest,
                         ::testing::Values(FaultInjector::Point::kDeviceAlloc,
                                           FaultInjector::Point::kGemm,
                                           FaultInjector::Point::kCompletion),
                         FaultPointName);

// Idle graph instances hold pinned staging: a job that cannot have its own
// at once makes its stream let go of them rather than wait on them. A
// 32 MiB pool, four instances of a 3 MiB shape (12 MiB, kept while free),
// then a job that needs 21 MiB of staging and is too big to record.
TEST(JobGraphTest, AJobWithoutStagingLetsTheIdleInstancesGo) {
  SKIP_WITHOUT_GPU();
  CudaEngineOptions options;
  options.streams_per_device = 1;
  options.pinned_pool_bytes = int64_t{32} << 20;
  options.poison_outputs = true;
  options.job_graphs_per_stream = 4;
  options.job_graph_min_sightings = 1;
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine =
      CudaEngine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const MatmulSpec small = Square(DType::kFloat32, 512);
  absl::BitGen gen;
  {
    std::vector<std::unique_ptr<Held>> held;
    for (int i = 0; i < 4; ++i) {
      held.push_back(SubmitHeld(**engine, small, gen));
      ExpectRight(*held.back(), absl::StrCat("small job ", i));
    }
  }
  GraphCounts counts = CountsOf(**engine);
  ASSERT_EQ(counts.recorded, 4);
  ASSERT_EQ(counts.evicted, 0);
  EXPECT_EQ((*engine)->stats().devices[0].staging_used_bytes,
            4 * (small.a_bytes() + small.b_bytes() + small.c_bytes()));
  const MatmulSpec big = MakeSpec(DType::kFloat32, 1, 1, 4096, 64, 1280, false,
                                  false, false, ComputeMode::kStrict);
  ASSERT_GT(big.a_bytes() + big.b_bytes() + big.c_bytes(), int64_t{20} << 20);
  ASSERT_GT(DeviceBytes(big), kMaxGraphBytes);
  MultiplyAndCheck(**engine, big, gen);
  counts = CountsOf(**engine);
  EXPECT_EQ(counts.evicted, 4);
  EXPECT_EQ(counts.recorded, 4);
  const DeviceStats d = (*engine)->stats().devices[0];
  EXPECT_EQ(d.staging_used_bytes, 0);
  EXPECT_EQ(d.device_memory_used_bytes, 0);
  // The shape is recorded again when it comes back.
  MultiplyAndCheck(**engine, small, gen);
  EXPECT_EQ(CountsOf(**engine).recorded, 5);
}

TEST(JobGraphTest, JobsOverTheLimitRunCallByCall) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = GraphEngine(1, 8);
  ASSERT_NE(engine, nullptr);
  const MatmulSpec big = Square(DType::kFloat32, 1536);  // 27 MiB
  ASSERT_GT(DeviceBytes(big), kMaxGraphBytes);
  absl::BitGen gen;
  MultiplyAndCheck(*engine, big, gen);
  MultiplyAndCheck(*engine, Square(DType::kFloat32, 128), gen);
  const GraphCounts counts = CountsOf(*engine);
  EXPECT_EQ(counts.jobs, 1);
  EXPECT_EQ(counts.recorded, 1);
}

// Batches that BatchingEngine gathers (shape_recurs false: their count
// varies from one dispatch to the next) run call by call and record
// nothing, even when the same count comes again; the engine's own
// single multiplies still replay.
TEST(JobGraphTest, GatheredBatchesRunCallByCall) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> graphs = GraphEngine(1, 8);
  ASSERT_NE(graphs, nullptr);
  CudaEngine* inner = graphs.get();
  BatchingOptions options;
  options.adaptive = false;
  options.window = absl::Seconds(60);  // each batch goes out when full
  options.max_batch = 4;
  BatchingEngine engine(std::move(graphs), options);
  absl::BitGen gen;
  const MatmulSpec spec = Square(DType::kFloat32, 64);
  for (int round = 0; round < 3; ++round) {
    std::vector<std::string> a, b;
    for (int i = 0; i < 4; ++i) {
      a.push_back(RandomBytes(spec.dtype, spec.a_elements(), gen));
      b.push_back(RandomBytes(spec.dtype, spec.b_elements(), gen));
    }
    std::vector<std::future<Outcome>> futures;
    for (int i = 0; i < 4; ++i) {
      futures.push_back(SubmitJob(engine, spec, &a[i], &b[i]));
    }
    for (int i = 0; i < 4; ++i) {
      ExpectMatchesReference(spec, a[i], b[i], futures[i].get());
    }
  }
  EXPECT_EQ(engine.batches(), 3);
  EXPECT_EQ(engine.batched_requests(), 12);
  GraphCounts counts = CountsOf(*inner);
  EXPECT_EQ(counts.jobs, 0);
  EXPECT_EQ(counts.recorded, 0);
  // The same shape submitted to the CUDA engine alone is recorded and
  // replayed (min_sightings 1).
  MultiplyAndCheck(*inner, spec, gen);
  MultiplyAndCheck(*inner, spec, gen);
  counts = CountsOf(*inner);
  EXPECT_EQ(counts.jobs, 2);
  EXPECT_EQ(counts.recorded, 1);
}

// Operands prestaged in engine-allocated host memory (as the pipeline bench
// and shared memory do) and C copied straight into caller memory: memory
// the caller frees after its job, which a graph's copy nodes would keep
// pointing at (updating them then crashed the process on an H100). Such
// jobs run call by call, exact (small integers make every product exact),
// each round in memory of its own.
class PrestagedJob final : public MatmulJob {
 public:
  PrestagedJob(const MatmulSpec& spec, const std::byte* a, const std::byte* b,
               std::byte* c, std::promise<absl::Status> done)
      : MatmulJob(JobDescription{spec, Op(a, b, c)}), done_(std::move(done)) {}
  void Done(absl::StatusOr<JobResult> result) override {
    absl::Status status = result.status();
    { absl::StatusOr<JobResult> release = std::move(result); }
    done_.set_value(status);
  }

 private:
  static MultiplyOp Op(const std::byte* a, const std::byte* b, std::byte* c) {
    MultiplyOp op;
    op.prestaged = PrestagedOperands{a, b};
    op.c_destination = c;
    return op;
  }
  std::promise<absl::Status> done_;
};

TEST(JobGraphTest, PrestagedOperandsAndCallerDestinationRunCallByCall) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> engine = GraphEngine(1, 8);
  ASSERT_NE(engine, nullptr);
  const MatmulSpec spec = MakeSpec(DType::kFloat32, 1, 1, 70, 90, 50, false,
                                   false, false, ComputeMode::kStrict);
  absl::BitGen gen;
  for (int round = 0; round < 4; ++round) {
    absl::StatusOr<HostBuffer> a = engine->AllocateHostBuffer(spec.a_bytes());
    absl::StatusOr<HostBuffer> b = engine->AllocateHostBuffer(spec.b_bytes());
    absl::StatusOr<HostBuffer> c = engine->AllocateHostBuffer(spec.c_bytes());
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    std::vector<float> av(spec.a_elements()), bv(spec.b_elements());
    for (float& v : av) v = static_cast<float>(absl::Uniform(gen, -4, 5));
    for (float& v : bv) v = static_cast<float>(absl::Uniform(gen, -4, 5));
    std::memcpy(a->data(), av.data(), spec.a_bytes());
    std::memcpy(b->data(), bv.data(), spec.b_bytes());
    std::memset(c->data(), 0xff, spec.c_bytes());
    std::promise<absl::Status> done;
    std::future<absl::Status> status = done.get_future();
    engine->Submit(std::make_unique<PrestagedJob>(spec, a->data(), b->data(),
                                                  c->data(), std::move(done)));
    const absl::Status outcome = status.get();
    ASSERT_TRUE(outcome.ok()) << "round " << round << ": " << outcome;
    const std::vector<double> ref =
        ReferenceGemm(spec, ToDoubles(DType::kFloat32, a->data(), av.size()),
                      ToDoubles(DType::kFloat32, b->data(), bv.size()));
    const std::vector<double> got =
        ToDoubles(DType::kFloat32, c->data(), spec.c_elements());
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(got[i], ref[i]) << "round " << round << " element " << i;
    }
  }
  const GraphCounts counts = CountsOf(*engine);
  EXPECT_EQ(counts.jobs, 0);
  EXPECT_EQ(counts.recorded, 0);
}

}  // namespace
}  // namespace matmul
