#include "gpu/cuda/job_layout.h"

namespace matmul {

int64_t DeviceBytes(const MatmulSpec& spec) {
  return AlignUp(spec.a_bytes(), kDeviceAlignment) +
         AlignUp(spec.b_bytes(), kDeviceAlignment) +
         AlignUp(spec.c_bytes(), kDeviceAlignment);
}

JobLayout DeviceLayoutOf(const LayoutPlan& plan) {
  JobLayout l;
  static_cast<LayoutPlan&>(l) = plan;
  l.transient_bytes =
      (plan.transient_a ? AlignUp(plan.a_bytes, kDeviceAlignment) : 0) +
      (plan.transient_b ? AlignUp(plan.b_bytes, kDeviceAlignment) : 0) +
      (plan.transient_c ? AlignUp(plan.c_bytes, kDeviceAlignment) : 0);
  l.kept_bytes = AlignUp(plan.kept_tensor_bytes, kDeviceAlignment);
  return l;
}

absl::StatusOr<JobLayout> LayoutOf(const JobDescription& job) {
  absl::StatusOr<LayoutPlan> plan = PlanLayout(job);
  if (!plan.ok()) return plan.status();
  return DeviceLayoutOf(*plan);
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
  const double flops = layout.gemm ? layout.flops : 0.0;
  return static_cast<double>(layout.moved_bytes) / 40e9 + flops / rate + 10e-6;
}

}  // namespace matmul
