// What the CUDA engine's GPU tests share: submitting a multiply of two byte
// strings without copying them (SubmitJob), the skip where no GPU is
// visible, and the accuracy cases (every dtype, shapes from 1x1x1 to 1024^3,
// batches, broadcasts and transposes).
#ifndef MATMUL_TESTS_GPU_CUDA_TEST_JOB_H_
#define MATMUL_TESTS_GPU_CUDA_TEST_JOB_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/device_registry.h"
#include "gpu/engine.h"
#include "gpu/matmul_spec.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace gpu_test {

#define SKIP_WITHOUT_GPU()                                             \
  do {                                                                 \
    if (::matmul::VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU"; \
  } while (0)

using Outcome = testing::JobOutcome;

// A multiply of two byte strings that the job only points at: nothing is
// copied on the submitting thread (tests/engine_job.h's EngineJob owns
// copies, which for large operands delays each submit by their copy and
// keeps jobs from overlapping on the device). The strings must outlive the
// job. What is done with the result is the subclass's.
class BorrowedOperandsJob : public MatmulJob {
 public:
  BorrowedOperandsJob(const MatmulSpec& spec, const std::string* a,
                      const std::string* b)
      : MatmulJob(JobDescription{spec, MultiplyOp{}}), a_(a), b_(b) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    if (a.size() != a_->size() || b.size() != b_->size()) {
      return absl::InternalError("staging size mismatch");
    }
    std::memcpy(a.data(), a_->data(), a.size());
    std::memcpy(b.data(), b_->data(), b.size());
    return absl::OkStatus();
  }

 private:
  const std::string* a_;
  const std::string* b_;
};

// A BorrowedOperandsJob whose outcome (the product copied out, the
// placement and timings) goes to a promise, its result let go of first.
class BorrowingJob final : public BorrowedOperandsJob {
 public:
  BorrowingJob(const MatmulSpec& spec, const std::string* a,
               const std::string* b, std::promise<Outcome> promise)
      : BorrowedOperandsJob(spec, a, b), promise_(std::move(promise)) {}

  void Done(absl::StatusOr<JobResult> result) override {
    Outcome out;
    out.status = result.status();
    if (result.ok()) {
      out.c.assign(reinterpret_cast<const char*>(result->c().data()),
                   result->c().size());
      out.placement = result->placement();
      out.timings = result->timings();
    }
    { absl::StatusOr<JobResult> release = std::move(result); }
    promise_.set_value(std::move(out));
  }

 private:
  std::promise<Outcome> promise_;
};

// Fails the jobs whose ids are listed, at one point of their path, with
// the status given.
class ListFaults final : public FaultInjector {
 public:
  ListFaults(Point point, std::vector<int64_t> jobs, absl::Status status)
      : point_(point), jobs_(std::move(jobs)), status_(std::move(status)) {}
  absl::Status Inject(Point point, int64_t job) override {
    if (point == point_ &&
        std::find(jobs_.begin(), jobs_.end(), job) != jobs_.end()) {
      return status_;
    }
    return absl::OkStatus();
  }

 private:
  const Point point_;
  const std::vector<int64_t> jobs_;
  const absl::Status status_;
};

// The test-name suffix of a fault point, for INSTANTIATE_TEST_SUITE_P.
inline std::string FaultPointName(
    const ::testing::TestParamInfo<FaultInjector::Point>& info) {
  switch (info.param) {
    case FaultInjector::Point::kDeviceAlloc:
      return "DeviceAlloc";
    case FaultInjector::Point::kGemm:
      return "Gemm";
    case FaultInjector::Point::kCompletion:
      return "Completion";
    case FaultInjector::Point::kContext:
      return "Context";
  }
  return "Unknown";
}

// Submits the multiply of `a` and `b`, which must outlive the job.
inline std::future<Outcome> SubmitJob(Engine& engine, const MatmulSpec& spec,
                                      const std::string* a,
                                      const std::string* b) {
  std::promise<Outcome> promise;
  std::future<Outcome> future = promise.get_future();
  engine.Submit(std::make_unique<BorrowingJob>(spec, a, b, std::move(promise)));
  return future;
}

// Checks a multiply's outcome: OK, C of the right size, and within the
// tolerance of the float64 reference product of `a` and `b` (a NaN or Inf
// anywhere makes RelativeError infinite).
inline void ExpectMatchesReference(const MatmulSpec& spec, const std::string& a,
                                   const std::string& b, const Outcome& out) {
  EXPECT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(static_cast<int64_t>(out.c.size()), spec.c_bytes());
  if (!out.status.ok() ||
      static_cast<int64_t>(out.c.size()) != spec.c_bytes()) {
    return;
  }
  const std::vector<double> ref = testing::ReferenceGemm(
      spec, testing::ToDoubles(spec.dtype, a.data(), spec.a_elements()),
      testing::ToDoubles(spec.dtype, b.data(), spec.b_elements()));
  const double err = testing::RelativeError(
      testing::ToDoubles(spec.dtype, out.c.data(), spec.c_elements()), ref);
  EXPECT_LT(err, testing::Tolerance(spec.dtype, spec.compute))
      << "relative error " << err;
}

// Multiplies fresh random operands (absl::BitGen is seeded
// nondeterministically) and checks the product against the float64
// reference: with the engine's poison_outputs a C never written holds NaN
// bytes, and a NaN or Inf anywhere makes RelativeError infinite. Returns
// the outcome for further checks.
inline Outcome MultiplyAndCheck(Engine& engine, const MatmulSpec& spec,
                                absl::BitGen& gen) {
  const std::string a =
      testing::RandomBytes(spec.dtype, spec.a_elements(), gen);
  const std::string b =
      testing::RandomBytes(spec.dtype, spec.b_elements(), gen);
  Outcome out = SubmitJob(engine, spec, &a, &b).get();
  ExpectMatchesReference(spec, a, b, out);
  return out;
}

// (dtype, compute, batch_a, batch_b, m, n, k, transpose_a, transpose_b, 3d)
using Case = std::tuple<DType, ComputeMode, int64_t, int64_t, int64_t, int64_t,
                        int64_t, bool, bool, bool>;

inline std::vector<Case> AllCases() {
  struct Shape {
    int64_t ba, bb, m, n, k;
    bool is3d;
  };
  const Shape shapes[] = {
      {1, 1, 1, 1, 1, false},       {1, 1, 1, 257, 33, false},
      {1, 1, 257, 1, 33, false},    {1, 1, 17, 33, 9, false},
      {1, 1, 255, 129, 511, false}, {1, 1, 1024, 1024, 1024, false},
      {3, 3, 65, 31, 47, true},     {5, 1, 64, 48, 80, true},
      {1, 4, 33, 65, 17, true},
  };
  std::vector<Case> cases;
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (const Shape& s : shapes) {
      for (int t = 0; t < 4; ++t) {
        cases.emplace_back(dtype, ComputeMode::kStrict, s.ba, s.bb, s.m, s.n,
                           s.k, (t & 1) != 0, (t & 2) != 0, s.is3d);
      }
    }
  }
  for (const Shape& s : shapes) {
    cases.emplace_back(DType::kFloat32, ComputeMode::kTf32, s.ba, s.bb, s.m,
                       s.n, s.k, false, true, s.is3d);
  }
  return cases;
}

inline std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const auto [dtype, compute, ba, bb, m, n, k, ta, tb, is3d] = info.param;
  return absl::StrCat(DTypeName(dtype), "_", ComputeModeName(compute), "_b", ba,
                      "x", bb, "_", m, "x", n, "x", k, ta ? "_ta" : "",
                      tb ? "_tb" : "", is3d ? "_3d" : "");
}

}  // namespace gpu_test
}  // namespace matmul

#endif  // MATMUL_TESTS_GPU_CUDA_TEST_JOB_H_
