// Test support: a MatmulJob of any operation (multiply, upload, download,
// allocate) over byte strings and resident tensors, whose outcome lands in a
// future.
#ifndef MATMUL_TESTS_ENGINE_JOB_H_
#define MATMUL_TESTS_ENGINE_JOB_H_

#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
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
    EngineOp op;    // a multiply by default
    std::string a;  // staged A (or the tensor to upload)
    std::string b;  // staged B
    int device = -1;
  };

  EngineJob(const MatmulSpec& spec, Options options,
            std::promise<JobOutcome> promise)
      : MatmulJob(JobDescription{spec, options.op, options.device}),
        a_(std::move(options.a)),
        b_(std::move(options.b)),
        promise_(std::move(promise)) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    if (a.size() != (a.empty() ? 0 : a_.size()) ||
        b.size() != (b.empty() ? 0 : b_.size())) {
      return absl::InternalError("staging size mismatch");
    }
    if (!a.empty()) std::memcpy(a.data(), a_.data(), a.size());
    if (!b.empty()) std::memcpy(b.data(), b_.data(), b.size());
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
  std::string a_;
  std::string b_;
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

// How many jobs ran on the device's streams, all together.
inline int64_t JobsOnStreams(const DeviceStats& d) {
  int64_t jobs = 0;
  for (const StreamStats& s : d.streams) jobs += s.jobs;
  return jobs;
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_ENGINE_JOB_H_
