// The layout planner: from one job's description, everything about where its
// operands and result live that both engines need. Which operands this job
// copies in (staged, from staging or prestaged memory) and which are already
// resident; whether the result is kept in engine memory or returned; the
// staging slot's parts and the bytes each direction moves; where a transfer
// reads or writes inside its tensor (checked against the tensor's size); the
// device the job must run on; and the GEMM's per-batch strides and leading
// dimensions (batch broadcast, transposes).
//
// Engine-neutral: no CUDA header. The CUDA engine adds its device-memory
// layout on top (gpu/cuda/job_layout.h); the host engine uses it as is.
// Plain values and pure functions; thread-compatible.
#ifndef MATMUL_GPU_LAYOUT_PLANNER_H_
#define MATMUL_GPU_LAYOUT_PLANNER_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "gpu/engine.h"
#include "gpu/matmul_spec.h"

namespace matmul {

// How one (batched) GEMM walks its row-major operands, in elements. Batch
// entry i of A starts at i * stride_a (0 for a broadcast A, a_batch of 1),
// likewise B and C. Leading dimensions are the row lengths as stored: A is
// [ta ? k : m, ta ? m : k], B is [tb ? n : k, tb ? k : n], C is [m, n].
struct GemmStrides {
  int64_t lda = 0;
  int64_t ldb = 0;
  int64_t ldc = 0;
  int64_t stride_a = 0;
  int64_t stride_b = 0;
  int64_t stride_c = 0;
};

GemmStrides StridesOf(const MatmulSpec& spec);

// A tensor's shape: `batch` row-major rows x cols matrices.
struct TensorShape {
  int64_t batch = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// The engine memory a job reads or writes in place, taken from its
// operation: `a` is a multiply's resident A or a download's source, `b` a
// multiply's resident B, `target` an upload's target, `c` a multiply's
// c_target. Null where none.
struct ResidentOperands {
  std::shared_ptr<ResidentTensor> a;
  std::shared_ptr<ResidentTensor> b;
  std::shared_ptr<ResidentTensor> target;
  std::shared_ptr<ResidentTensor> c;
};

ResidentOperands ResidentOperandsOf(const JobDescription& job);

// A multiply's prestaged operands, if it has them.
std::optional<PrestagedOperands> PrestagedOf(const JobDescription& job);

struct LayoutPlan {
  // Which operation (exactly one is set).
  bool gemm = false;  // multiply: the job runs a GEMM
  bool upload = false;
  bool download = false;
  bool allocate = false;
  // A (B) is copied into engine memory by this job, from staging or from
  // the caller's prestaged memory; otherwise it is resident or absent.
  bool stage_a = false;
  bool stage_b = false;
  // The staged operands are in the caller's prestaged host memory:
  // WriteOperands is not called and staging holds no operands.
  bool prestaged = false;
  // A gathered multiply (MultiplyOp::gathered): its members, each with its
  // operands in memory of its own (prestaged is then set too); 0 otherwise.
  int64_t gathered = 0;
  // The job makes a new resident tensor: A itself (upload of a new tensor,
  // allocate: keeps_a) or the product C (multiply with keep_result).
  bool keep = false;
  bool keeps_a = false;
  TensorShape kept;               // the new resident tensor (keep only)
  int64_t kept_tensor_bytes = 0;  // its size
  bool return_c = false;  // C comes back through staging (multiply, download)
  // ... or, for a multiply with MultiplyOp::c_destination, straight into
  // the caller's host memory there; staging then holds no C.
  bool c_to_destination = false;
  // ... or, for a multiply with MultiplyOp::c_target, written by the GEMM
  // straight into that engine memory: nothing comes back, no C of its own.
  bool c_in_place = false;
  // Engine memory for operands that live only as long as the job: staged A
  // (not for uploads, whose A is kept or written in place), staged B, and
  // a multiply's C unless kept (a download reads C in place).
  bool transient_a = false;
  bool transient_b = false;
  bool transient_c = false;
  // The staging slot: [staged A][staged B][returned C], each part present
  // only when needed (staged parts not when prestaged).
  int64_t staged_a_bytes = 0;
  int64_t staged_b_bytes = 0;
  int64_t returned_c_bytes = 0;  // C's part of staging
  int64_t staging_bytes = 0;     // the sum of the three
  // C's bytes copied back to the host, into staging or its destination.
  int64_t c_out_bytes = 0;
  int64_t b_staging_offset() const { return staged_a_bytes; }
  int64_t c_staging_offset() const { return staged_a_bytes + staged_b_bytes; }
  // Over the bus (host to engine memory and back): staged operands, whether
  // prestaged or not, and the returned C (c_out_bytes).
  int64_t moved_bytes = 0;
  // Upload into a target: where A goes in it. Download: where C begins in
  // its source. 0 for every other job.
  int64_t byte_offset = 0;
  // Where resident operands (or the upload target) are, or the device the
  // job asked for; -1: any.
  int required_device = -1;
  GemmStrides strides;  // multiply only
  // A, B and C as the job moves them, in bytes (the spec's sizes), and its
  // floating-point operations.
  int64_t a_bytes = 0;
  int64_t b_bytes = 0;
  int64_t c_bytes = 0;
  double flops = 0;
};

// The job's floating-point operations, without planning it.
double FlopsOf(const JobDescription& job);

// The plan for `job`. INVALID_ARGUMENT when an upload into a target or a
// download would reach outside its tensor (with the numbers), or when the
// job's resident operands, upload target and asked device name different
// devices.
absl::StatusOr<LayoutPlan> PlanLayout(const JobDescription& job);

}  // namespace matmul

#endif  // MATMUL_GPU_LAYOUT_PLANNER_H_
