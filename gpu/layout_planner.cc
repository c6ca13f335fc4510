#include "gpu/layout_planner.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace matmul {
namespace {

// OK unless an upload into upload_target() or a download at byte_offset()
// would reach outside its tensor.
absl::Status CheckTransferBounds(const MatmulJob& job) {
  const int64_t offset = job.byte_offset();
  std::shared_ptr<ResidentTensor> tensor;
  int64_t bytes = 0;
  const char* what = "";
  if (job.kind() == JobKind::kUpload && job.upload_target() != nullptr) {
    tensor = job.upload_target();
    bytes = job.spec().a_bytes();
    what = "upload";
  } else if (job.kind() == JobKind::kDownload) {
    tensor = job.resident_a();
    bytes = job.spec().c_bytes();
    what = "download";
  } else {
    return absl::OkStatus();
  }
  const int64_t size = tensor == nullptr ? 0 : tensor->bytes();
  if (offset < 0 || offset > size || bytes > size - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", bytes, " bytes at offset ", offset,
                     " runs outside its ", size, "-byte tensor"));
  }
  return absl::OkStatus();
}

}  // namespace

GemmStrides StridesOf(const MatmulSpec& spec) {
  GemmStrides s;
  s.lda = spec.transpose_a ? spec.m : spec.k;
  s.ldb = spec.transpose_b ? spec.k : spec.n;
  s.ldc = spec.n;
  s.stride_a = spec.a_batch == 1 ? 0 : spec.m * spec.k;
  s.stride_b = spec.b_batch == 1 ? 0 : spec.k * spec.n;
  s.stride_c = spec.m * spec.n;
  return s;
}

absl::StatusOr<LayoutPlan> PlanLayout(const MatmulJob& job) {
  const MatmulSpec& spec = job.spec();
  LayoutPlan p;
  p.kind = job.kind();
  const bool multiply = p.kind == JobKind::kMultiply;
  const bool upload = p.kind == JobKind::kUpload;
  const bool download = p.kind == JobKind::kDownload;
  const bool allocate = p.kind == JobKind::kAllocate;
  const std::shared_ptr<ResidentTensor> ra = job.resident_a();
  const std::shared_ptr<ResidentTensor> rb = job.resident_b();
  const std::shared_ptr<ResidentTensor> target =
      upload ? job.upload_target() : nullptr;

  if (absl::Status bounds = CheckTransferBounds(job); !bounds.ok()) {
    return bounds;
  }
  p.required_device = job.device();
  for (const auto& r : {ra, rb, target}) {
    if (r == nullptr) continue;
    if (p.required_device >= 0 && p.required_device != r->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the operands live on different GPUs (", p.required_device, " and ",
          r->device(), "); download one and upload it to the other"));
    }
    p.required_device = r->device();
  }

  p.stage_a = !download && !allocate && ra == nullptr;
  p.stage_b = multiply && rb == nullptr;
  p.prestaged = job.prestaged().has_value();
  p.gemm = multiply;
  p.keeps_a = (upload && target == nullptr) || allocate;
  p.keep = p.keeps_a || (multiply && job.keep_result());
  if (p.keeps_a) {
    p.kept = {spec.a_batch, spec.m, spec.k};
    p.kept_tensor_bytes = spec.a_bytes();
  } else if (p.keep) {
    p.kept = {spec.batch, spec.m, spec.n};
    p.kept_tensor_bytes = spec.c_bytes();
  }
  p.return_c = !p.keep && !upload;
  p.transient_a = p.stage_a && !upload;
  p.transient_b = p.stage_b;
  p.transient_c = multiply && !p.keep;

  const int64_t staged =
      (p.stage_a ? spec.a_bytes() : 0) + (p.stage_b ? spec.b_bytes() : 0);
  if (!p.prestaged) {
    p.staged_a_bytes = p.stage_a ? spec.a_bytes() : 0;
    p.staged_b_bytes = p.stage_b ? spec.b_bytes() : 0;
  }
  p.returned_c_bytes = p.return_c ? spec.c_bytes() : 0;
  p.staging_bytes = p.staged_a_bytes + p.staged_b_bytes + p.returned_c_bytes;
  p.moved_bytes = staged + p.returned_c_bytes;
  p.byte_offset =
      (upload && target != nullptr) || download ? job.byte_offset() : 0;
  if (multiply) p.strides = StridesOf(spec);
  return p;
}

}  // namespace matmul
