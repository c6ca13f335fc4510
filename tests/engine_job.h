// Test support: a MatmulJob of any kind (multiply, upload, download, allocate)
// over byte strings and resident tensors, whose outcome lands in a future.
#ifndef MATMUL_TESTS_ENGINE_JOB_H_
#define MATMUL_TESTS_ENGINE_JOB_H_

#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "gpu/engine.h"

namespace matmul::testing {

struct JobOutcome {
  absl::Status status;
  std::string c;  // the returned result, if any
  std::shared_ptr<ResidentTensor> resident;
  Placement placement;
  StageTimings timings;
};

class EngineJob final : public MatmulJob {
 public:
  struct Options {
    JobKind kind = JobKind::kMultiply;
    std::string a;  // staged A (or the tensor to upload)
    std::string b;  // staged B
    std::shared_ptr<ResidentTensor> resident_a;
    std::shared_ptr<ResidentTensor> resident_b;
    bool keep_result = false;
    int device = -1;
    std::shared_ptr<ResidentTensor> upload_target;
    int64_t byte_offset = 0;
    std::optional<PrestagedOperands> prestaged;
  };

  EngineJob(const MatmulSpec& spec, Options options,
            std::promise<JobOutcome> promise)
      : spec_(spec),
        options_(std::move(options)),
        promise_(std::move(promise)) {}

  const MatmulSpec& spec() const override { return spec_; }
  JobKind kind() const override { return options_.kind; }
  std::shared_ptr<ResidentTensor> resident_a() const override {
    return options_.resident_a;
  }
  std::shared_ptr<ResidentTensor> resident_b() const override {
    return options_.resident_b;
  }
  bool keep_result() const override { return options_.keep_result; }
  int device() const override { return options_.device; }
  std::shared_ptr<ResidentTensor> upload_target() const override {
    return options_.upload_target;
  }
  int64_t byte_offset() const override { return options_.byte_offset; }
  std::optional<PrestagedOperands> prestaged() const override {
    return options_.prestaged;
  }

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    if (a.size() != (a.empty() ? 0 : options_.a.size()) ||
        b.size() != (b.empty() ? 0 : options_.b.size())) {
      return absl::InternalError("staging size mismatch");
    }
    if (!a.empty()) std::memcpy(a.data(), options_.a.data(), a.size());
    if (!b.empty()) std::memcpy(b.data(), options_.b.data(), b.size());
    return absl::OkStatus();
  }

  void Done(absl::StatusOr<JobResult> result) override {
    JobOutcome out;
    out.status = result.status();
    if (result.ok()) {
      out.c.assign(reinterpret_cast<const char*>(result->c().data()),
                   result->c().size());
      out.resident = result->resident();
      out.placement = result->placement();
      out.timings = result->timings();
    }
    { absl::StatusOr<JobResult> release = std::move(result); }
    promise_.set_value(std::move(out));
  }

 private:
  MatmulSpec spec_;
  Options options_;
  std::promise<JobOutcome> promise_;
};

inline JobOutcome Run(Engine& engine, const MatmulSpec& spec,
                      EngineJob::Options options) {
  std::promise<JobOutcome> promise;
  std::future<JobOutcome> future = promise.get_future();
  engine.Submit(std::make_unique<EngineJob>(spec, std::move(options),
                                            std::move(promise)));
  return future.get();
}

// Specs for moving one [batch, rows, cols] tensor.
inline MatmulSpec UploadSpec(DType dtype, int64_t batch, int64_t rows,
                             int64_t cols) {
  MatmulSpec s;
  s.dtype = dtype;
  s.a_batch = s.batch = batch;
  s.m = rows;
  s.k = cols;
  s.n = 0;
  return s;
}
inline MatmulSpec DownloadSpec(DType dtype, int64_t batch, int64_t rows,
                               int64_t cols) {
  MatmulSpec s;
  s.dtype = dtype;
  s.batch = batch;
  s.a_batch = s.b_batch = 0;
  s.m = rows;
  s.n = cols;
  s.k = 0;
  return s;
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_ENGINE_JOB_H_
