// What the CUDA engine's GPU tests share: a job that multiplies two byte
// strings and hands back its outcome (TestJob, SubmitJob), the skip where no
// GPU is visible, and the accuracy cases (every dtype, shapes from 1x1x1 to
// 1024^3, batches, broadcasts and transposes).
#ifndef MATMUL_TESTS_GPU_CUDA_TEST_JOB_H_
#define MATMUL_TESTS_GPU_CUDA_TEST_JOB_H_

#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "gpu/cuda/device_registry.h"
#include "gpu/engine.h"
#include "gpu/matmul_spec.h"
#include "gtest/gtest.h"

namespace matmul {
namespace gpu_test {

#define SKIP_WITHOUT_GPU()                                             \
  do {                                                                 \
    if (::matmul::VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU"; \
  } while (0)

struct Outcome {
  absl::Status status;
  std::string c;
  Placement placement;
  StageTimings timings;
};

class TestJob final : public MatmulJob {
 public:
  TestJob(const MatmulSpec& spec, const std::string* a, const std::string* b,
          std::promise<Outcome> promise)
      : MatmulJob(JobDescription{spec, MultiplyOp{}}),
        a_(a),
        b_(b),
        promise_(std::move(promise)) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    if (a.size() != a_->size() || b.size() != b_->size()) {
      return absl::InternalError("staging size mismatch");
    }
    std::memcpy(a.data(), a_->data(), a.size());
    std::memcpy(b.data(), b_->data(), b.size());
    return absl::OkStatus();
  }
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
  const std::string* a_;
  const std::string* b_;
  std::promise<Outcome> promise_;
};

inline std::future<Outcome> SubmitJob(Engine& engine, const MatmulSpec& spec,
                                      const std::string* a,
                                      const std::string* b) {
  std::promise<Outcome> promise;
  std::future<Outcome> future = promise.get_future();
  engine.Submit(std::make_unique<TestJob>(spec, a, b, std::move(promise)));
  return future;
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
