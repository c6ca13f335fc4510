#include "gpu/cuda/job_layout.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace matmul {

int64_t DeviceBytes(const MatmulSpec& spec) {
  return AlignUp(spec.a_bytes(), kDeviceAlignment) +
         AlignUp(spec.b_bytes(), kDeviceAlignment) +
         AlignUp(spec.c_bytes(), kDeviceAlignment);
}

absl::StatusOr<JobLayout> LayoutOf(const MatmulJob& job) {
  const MatmulSpec& spec = job.spec();
  const std::shared_ptr<ResidentTensor> ra = job.resident_a();
  const std::shared_ptr<ResidentTensor> rb = job.resident_b();
  const std::shared_ptr<ResidentTensor> target =
      job.kind() == JobKind::kUpload ? job.upload_target() : nullptr;
  JobLayout l;
  l.kind = job.kind();
  const bool upload = l.kind == JobKind::kUpload;
  const bool allocate = l.kind == JobKind::kAllocate;
  l.stage_a = l.kind != JobKind::kDownload && !allocate && !ra;
  l.stage_b = l.kind == JobKind::kMultiply && !rb;
  l.keep = (upload && target == nullptr) || allocate ||
           (l.kind == JobKind::kMultiply && job.keep_result());
  l.return_c = !l.keep && !upload;
  l.transient_bytes =
      (l.stage_a && !upload ? AlignUp(spec.a_bytes(), kDeviceAlignment) : 0) +
      (l.stage_b ? AlignUp(spec.b_bytes(), kDeviceAlignment) : 0) +
      (l.kind == JobKind::kMultiply && !l.keep
           ? AlignUp(spec.c_bytes(), kDeviceAlignment)
           : 0);
  l.kept_bytes = (upload || allocate) && l.keep
                     ? AlignUp(spec.a_bytes(), kDeviceAlignment)
                 : l.keep ? AlignUp(spec.c_bytes(), kDeviceAlignment)
                          : 0;
  const int64_t staged =
      (l.stage_a ? spec.a_bytes() : 0) + (l.stage_b ? spec.b_bytes() : 0);
  l.pinned_bytes =
      (job.prestaged() ? 0 : staged) + (l.return_c ? spec.c_bytes() : 0);
  l.moved_bytes = staged + (l.return_c ? spec.c_bytes() : 0);
  if (absl::Status bounds = CheckTransferBounds(job); !bounds.ok()) {
    return bounds;
  }
  l.byte_offset = job.byte_offset();
  l.required_device = job.device();
  for (const auto& r : {ra, rb, target}) {
    if (r == nullptr) continue;
    if (l.required_device >= 0 && l.required_device != r->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the operands live on different GPUs (", l.required_device, " and ",
          r->device(), "); download one and upload it to the other"));
    }
    l.required_device = r->device();
  }
  return l;
}

double EstimatedSeconds(const MatmulSpec& spec, const JobLayout& layout) {
  double rate = 50e12;  // float32 strict
  if (spec.dtype == DType::kFloat64) rate = 50e12;
  if (spec.dtype == DType::kFloat16 || spec.dtype == DType::kBFloat16) {
    rate = 600e12;
  }
  if (spec.dtype == DType::kFloat32 && spec.compute == ComputeMode::kTf32) {
    rate = 300e12;
  }
  const double flops = layout.kind == JobKind::kMultiply ? spec.flops() : 0.0;
  return static_cast<double>(layout.moved_bytes) / 40e9 + flops / rate + 10e-6;
}

}  // namespace matmul
