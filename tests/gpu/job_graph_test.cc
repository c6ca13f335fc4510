// Small multiplies replayed from CUDA graphs (gpu/cuda/job_graph.h) on a real
// GPU: every accuracy case recorded and then replayed with other operands,
// more shapes than a stream keeps (eviction), many jobs in flight on every
// stream, operands from engine-allocated host memory and a product written
// into caller memory, jobs too big to record, and graphs off. Skips where no
// GPU is visible (CI).
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/job_layout.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_job.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using gpu_test::AllCases;
using gpu_test::Case;
using gpu_test::CaseName;
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
  options.pinned_bytes_per_device = int64_t{1} << 30;
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
// the second replays it with other operands (other staging, other events).
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

// Many jobs of three shapes in flight on four streams at once: each stream
// replays its own graphs back to back, so a job's C must be read back before
// the next job's GEMM overwrites the graph's device memory.
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
  EXPECT_EQ(counts.jobs, kJobs);
  EXPECT_LE(counts.recorded, 12);  // at most three shapes on each stream
  EXPECT_EQ(counts.evicted, 0);
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
