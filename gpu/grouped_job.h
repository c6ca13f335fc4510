// GroupedJob: several small multiplies of different shapes (one dtype and
// compute mode) that the batching engine (gpu/batching_engine.h) sends to
// the wrapped engine as ONE job, a GroupedMultiplyOp (gpu/engine.h): their
// operands share one staging slot and one device region, laid out by
// GroupLayoutOf (gpu/grouped_layout.h), and the engine runs them in one
// launch (CUDA: cublasGemmGroupedBatchedEx; host: one after another). Each
// member gets its own part of the shared product as its JobResult; the
// staging goes when the last member lets go of its result. A member that
// fails to stage its operands fails alone (its part is computed on zeros
// and dropped); the job is abandoned only when every member is. Each
// member's StageTimings are the job's, with `share` its part of the job's
// floating-point operations (the shares sum to the job's share, 1).
#ifndef MATMUL_GPU_GROUPED_JOB_H_
#define MATMUL_GPU_GROUPED_JOB_H_

#include <memory>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/engine.h"
#include "gpu/grouped_layout.h"

namespace matmul {

class GroupedJob final : public MatmulJob {
 public:
  // `members`: plain multiplies with staged operands and returned results,
  // all of one dtype and compute mode (at least one). `finished` runs first
  // in Done, before any member is answered.
  GroupedJob(std::vector<std::unique_ptr<MatmulJob>> members,
             absl::AnyInvocable<void() &&> finished);

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override;
  void Done(absl::StatusOr<JobResult> result) override;
  absl::Status Abandoned() const override;

  size_t size() const { return members_.size(); }

 private:
  static JobDescription Describe(
      const std::vector<std::unique_ptr<MatmulJob>>& members);

  std::vector<std::unique_ptr<MatmulJob>> members_;
  absl::AnyInvocable<void() &&> finished_;
  GroupLayout layout_;
  std::vector<absl::Status> failed_;  // each member's staging
};

}  // namespace matmul

#endif  // MATMUL_GPU_GROUPED_JOB_H_
