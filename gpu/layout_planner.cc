#include "gpu/layout_planner.h"

#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace matmul {
namespace {

// OK unless an upload into a target or a download would reach outside its
// tensor.
absl::Status CheckTransferBounds(const JobDescription& job) {
  std::shared_ptr<ResidentTensor> tensor;
  int64_t offset = 0;
  int64_t bytes = 0;
  const char* what = "";
  if (const auto* up = std::get_if<UploadOp>(&job.op);
      up != nullptr && up->target != nullptr) {
    tensor = up->target;
    offset = up->byte_offset;
    bytes = job.spec.a_bytes();
    what = "upload";
  } else if (const auto* down = std::get_if<DownloadOp>(&job.op)) {
    tensor = down->source;
    offset = down->byte_offset;
    bytes = job.spec.c_bytes();
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

double FlopsOf(const JobDescription& job) { return job.spec.flops(); }

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

ResidentOperands ResidentOperandsOf(const JobDescription& job) {
  ResidentOperands r;
  if (const auto* mul = std::get_if<MultiplyOp>(&job.op)) {
    r.a = mul->resident_a;
    r.b = mul->resident_b;
    r.c = mul->c_target;
  } else if (const auto* up = std::get_if<UploadOp>(&job.op)) {
    r.target = up->target;
  } else if (const auto* down = std::get_if<DownloadOp>(&job.op)) {
    r.a = down->source;
  }
  return r;
}

std::optional<PrestagedOperands> PrestagedOf(const JobDescription& job) {
  const auto* mul = std::get_if<MultiplyOp>(&job.op);
  return mul != nullptr ? mul->prestaged : std::nullopt;
}

absl::StatusOr<LayoutPlan> PlanLayout(const JobDescription& job) {
  const MatmulSpec& spec = job.spec;
  const auto* mul = std::get_if<MultiplyOp>(&job.op);
  const auto* up = std::get_if<UploadOp>(&job.op);
  const auto* down = std::get_if<DownloadOp>(&job.op);
  LayoutPlan p;
  p.gemm = mul != nullptr;
  p.upload = up != nullptr;
  p.download = down != nullptr;
  p.allocate = std::holds_alternative<AllocateOp>(job.op);
  const ResidentOperands r = ResidentOperandsOf(job);

  if (absl::Status bounds = CheckTransferBounds(job); !bounds.ok()) {
    return bounds;
  }
  if (mul != nullptr && !mul->gathered.empty()) {
    const auto members = static_cast<int64_t>(mul->gathered.size());
    if (spec.batch != members || spec.a_batch != members ||
        spec.b_batch != members || mul->prestaged.has_value() ||
        r.a != nullptr || r.b != nullptr || mul->keep_result ||
        mul->c_destination != nullptr || r.c != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a gathered multiply of ", members,
          " members needs batch, a_batch and b_batch of that many, and no "
          "prestaged, resident or kept operands and no product destination "
          "(got batch ",
          spec.batch, ", a_batch ", spec.a_batch, ", b_batch ", spec.b_batch,
          ")"));
    }
    const bool to_destinations = mul->gathered.front().c_destination != nullptr;
    for (const GatheredMember& member : mul->gathered) {
      if (member.operands.a == nullptr || member.operands.b == nullptr) {
        return absl::InvalidArgumentError(
            "a gathered multiply's member has no operand memory");
      }
      if ((member.c_destination != nullptr) != to_destinations) {
        return absl::InvalidArgumentError(
            "a gathered multiply's members must all have a product "
            "destination, or none");
      }
    }
    p.gathered = members;
  }
  p.required_device = job.device;
  if (r.c != nullptr) {
    if (mul->keep_result || mul->c_destination != nullptr) {
      return absl::InvalidArgumentError(
          "a multiply writes its product into at most one of c_target, "
          "c_destination and a kept tensor");
    }
    if (r.c->bytes() < spec.c_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the product's ", spec.c_bytes(),
                       " bytes do not fit its ", r.c->bytes(), "-byte target"));
    }
  }
  for (const auto& t : {r.a, r.b, r.target, r.c}) {
    if (t == nullptr) continue;
    if (p.required_device >= 0 && p.required_device != t->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the operands live on different GPUs (", p.required_device, " and ",
          t->device(), "); download one and upload it to the other"));
    }
    p.required_device = t->device();
  }

  p.stage_a = (p.gemm && r.a == nullptr) || p.upload;
  p.stage_b = p.gemm && r.b == nullptr;
  p.prestaged = PrestagedOf(job).has_value() || p.gathered > 0;
  p.keeps_a = (p.upload && r.target == nullptr) || p.allocate;
  p.keep = p.keeps_a || (p.gemm && mul->keep_result);
  if (p.keeps_a) {
    p.kept = {spec.a_batch, spec.m, spec.k};
    p.kept_tensor_bytes = spec.a_bytes();
  } else if (p.keep) {
    p.kept = {spec.batch, spec.m, spec.n};
    p.kept_tensor_bytes = spec.c_bytes();
  }
  p.c_in_place = p.gemm && r.c != nullptr;
  p.return_c = !p.keep && !p.upload && !p.c_in_place;
  p.transient_a = p.stage_a && !p.upload;
  p.transient_b = p.stage_b;
  p.transient_c = p.gemm && !p.keep && !p.c_in_place;

  const int64_t staged =
      (p.stage_a ? spec.a_bytes() : 0) + (p.stage_b ? spec.b_bytes() : 0);
  if (!p.prestaged) {
    p.staged_a_bytes = p.stage_a ? spec.a_bytes() : 0;
    p.staged_b_bytes = p.stage_b ? spec.b_bytes() : 0;
  }
  p.c_to_destination =
      p.return_c && p.gemm &&
      (mul->c_destination != nullptr ||
       (p.gathered > 0 && mul->gathered.front().c_destination != nullptr));
  p.c_out_bytes = p.return_c ? spec.c_bytes() : 0;
  p.returned_c_bytes = p.c_to_destination ? 0 : p.c_out_bytes;
  p.staging_bytes = p.staged_a_bytes + p.staged_b_bytes + p.returned_c_bytes;
  p.moved_bytes = staged + p.c_out_bytes;
  if (up != nullptr && up->target != nullptr) p.byte_offset = up->byte_offset;
  if (down != nullptr) p.byte_offset = down->byte_offset;
  if (p.gemm) p.strides = StridesOf(spec);
  p.a_bytes = spec.a_bytes();
  p.b_bytes = spec.b_bytes();
  p.c_bytes = spec.c_bytes();
  p.flops = spec.flops();
  return p;
}

}  // namespace matmul
