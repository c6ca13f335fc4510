#include "server/rpc/plan_multiply.h"

#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/request_validation.h"
#include "server/rpc/stored_tensors.h"

namespace matmul {
namespace {

// Where `ref` (the operand called `name`, `bytes` long) lies in one of
// `owner`'s regions: the region and the first byte.
absl::Status FindInRegion(const SharedMemoryRegistry& regions,
                          const std::string& owner, const WireSharedRef& ref,
                          const char* name, int64_t bytes,
                          std::shared_ptr<SharedMemoryRegion>& found,
                          std::byte*& at) {
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> region =
      regions.Find(owner, ref.region_id);
  if (!region.ok()) {
    return absl::Status(
        region.status().code(),
        absl::StrCat(name, ".region_id: ", region.status().message()));
  }
  const int64_t size = (*region)->bytes();
  if (ref.offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".offset: expected 0 or more, got ", ref.offset));
  }
  if (ref.offset > size || bytes > size - ref.offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", bytes, " bytes at offset ", ref.offset,
                     " run past the end of region ", (*region)->id(), " (",
                     size, " bytes)"));
  }
  if (absl::Status mapped = (*region)->CheckStillMapped(); !mapped.ok()) {
    return absl::Status(mapped.code(),
                        absl::StrCat(name, ": ", mapped.message()));
  }
  if ((*region)->kind() == SharedMemoryRegion::Kind::kCuda) {
    // Where in the client's GPU memory: the engine's address of it.
    at = static_cast<std::byte*>(
             const_cast<void*>((*region)->device_memory()->data())) +
         ref.offset;
  } else {
    at = (*region)->data() + ref.offset;
  }
  found = std::move(*region);
  return absl::OkStatus();
}

// A view of `bytes` of a CUDA region at `offset`, seen as `dtype` elements
// (GPU memory: the engine reads it in place). Element-aligned, as cuBLAS
// needs.
absl::StatusOr<std::shared_ptr<ResidentTensor>> CudaView(
    const SharedMemoryRegion& region, const WireSharedRef& ref,
    const char* name, DType dtype, int64_t bytes) {
  const auto size = static_cast<int64_t>(DTypeSize(dtype));
  if (ref.offset % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".offset: ", ref.offset, " is not a multiple of the dtype's ",
        size, " bytes; GPU memory is read and written in whole elements"));
  }
  return ResidentView::Create(region.device_memory(), ref.offset, dtype, 1, 1,
                              bytes / size);
}

// Resolves the operands and product given in regions (Tensor.shared,
// c_shared) against the validated spec: fills the plan's in_region,
// c_in_region and regions.
absl::Status ResolveShared(const WireMultiplyRequest& wire,
                           const MatmulSpec& spec, const PlanContext& ctx,
                           MultiplyPlan& plan) {
  const WireSharedRef* refs[3] = {&wire.a.shared, &wire.b.shared,
                                  &wire.c_shared};
  if (!refs[0]->present && !refs[1]->present && !refs[2]->present) {
    return absl::OkStatus();
  }
  if (refs[2]->present && wire.keep_result) {
    return absl::InvalidArgumentError(
        "keep_result and c_shared are both set; set at most one");
  }
  const char* names[3] = {"a.shared", "b.shared", "c_shared"};
  const int64_t bytes[3] = {spec.a_bytes(), spec.b_bytes(), spec.c_bytes()};
  std::byte* at[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    if (!refs[i]->present) continue;
    std::shared_ptr<SharedMemoryRegion> region;
    if (absl::Status s = FindInRegion(ctx.regions, ctx.client, *refs[i],
                                      names[i], bytes[i], region, at[i]);
        !s.ok()) {
      return s;
    }
    if (region->kind() == SharedMemoryRegion::Kind::kCuda) {
      absl::StatusOr<std::shared_ptr<ResidentTensor>> view =
          CudaView(*region, *refs[i], names[i], spec.dtype, bytes[i]);
      if (!view.ok()) return view.status();
      plan.in_cuda[i] = std::move(*view);
    }
    // One hold per region, however many of A, B and C are in it: it counts
    // one multiply in flight.
    bool held = false;
    for (const SharedMemoryRegion::Use& use : plan.regions) {
      held = held || use.get() == region.get();
    }
    if (!held) plan.regions[i] = SharedMemoryRegion::Use(std::move(region));
  }
  // The product must not overwrite an operand: what the operand holds when
  // it is read would then depend on the order of the engine's copies.
  for (int i = 0; i < 2; ++i) {
    if (at[2] != nullptr && at[i] != nullptr &&
        refs[2]->region_id == refs[i]->region_id && at[2] < at[i] + bytes[i] &&
        at[i] < at[2] + bytes[2]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "c_shared: the product's ", bytes[2], " bytes at offset ",
          refs[2]->offset, " overlap ", names[i], "'s ", bytes[i],
          " bytes at offset ", refs[i]->offset));
    }
  }
  // Host memory only: an operand or product in GPU memory is a view
  // (in_cuda), read and written by the engine in place.
  plan.in_region[0] = plan.in_cuda[0] == nullptr ? at[0] : nullptr;
  plan.in_region[1] = plan.in_cuda[1] == nullptr ? at[1] : nullptr;
  plan.c_in_region = plan.in_cuda[2] == nullptr ? at[2] : nullptr;
  return absl::OkStatus();
}

// The header to validate: an operand in a region is validated as an inline
// one (its byte count is checked against the region later), one named by
// handle takes the stored tensor's description (`shapes` keeps its shape).
absl::StatusOr<MultiplyHeader> ResolveOperands(
    const WireMultiplyRequest& wire, const PlanContext& ctx,
    MultiplyOp& multiply, std::vector<int64_t> (&shapes)[2]) {
  MultiplyHeader header = wire.header();
  const WireTensor* operands[2] = {&wire.a, &wire.b};
  const std::string* handles[2] = {&wire.a_handle, &wire.b_handle};
  OperandHeader* headers[2] = {&header.a, &header.b};
  for (int i = 0; i < 2; ++i) {
    if (!operands[i]->shared.present) continue;
    const char* name = i == 0 ? "a" : "b";
    if (operands[i]->data_bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": data and shared are both set; set exactly one"));
    }
    if (!handles[i]->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ".shared and ", name, "_handle are both set; set exactly one"));
    }
    headers[i]->data_follows = true;
  }
  if (!wire.a_handle.empty()) {
    if (absl::Status s =
            ResolveHandle(ctx.handles, wire.a_handle, "a", header.a,
                          multiply.resident_a, shapes[0]);
        !s.ok()) {
      return s;
    }
  }
  if (!wire.b_handle.empty()) {
    if (absl::Status s =
            ResolveHandle(ctx.handles, wire.b_handle, "b", header.b,
                          multiply.resident_b, shapes[1]);
        !s.ok()) {
      return s;
    }
  }
  return header;
}

// Bytes in regions cross no message and hold no server memory, so they are
// bounded by their regions (and the engine's fit), not by the message size
// or the in-flight budget; what does travel or stay in the server is checked
// against those once the regions are known (PlanMultiply).
absl::StatusOr<MatmulSpec> ValidateSpec(const WireMultiplyRequest& wire,
                                        const MultiplyHeader& header,
                                        bool any_shared,
                                        const RequestLimits& server_limits) {
  RequestLimits limits = server_limits;
  if (any_shared) {
    limits.max_message_bytes = std::numeric_limits<int64_t>::max() / 4;
    limits.max_inflight_bytes = std::numeric_limits<int64_t>::max() / 4;
  }
  // A kept product crosses no message either (it is downloaded in chunks).
  if (wire.keep_result) {
    limits.max_message_bytes = std::numeric_limits<int64_t>::max() / 4;
  }
  absl::StatusOr<MatmulSpec> spec = ValidateMultiplyHeader(header, limits);
  if (!spec.ok()) return spec.status();
  if (any_shared && !wire.c_shared.present && !wire.keep_result &&
      spec->c_bytes() > server_limits.max_message_bytes - 128) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the result would be ", spec->c_bytes(),
                     " bytes, over the server's max message size of ",
                     server_limits.max_message_bytes,
                     " bytes; have it written into a region (c_shared)"));
  }
  return spec;
}

}  // namespace

Operation MultiplyPlan::Admission() const {
  Operation op;
  op.kind = OperationKind::kMultiply;
  op.spec = &job.spec;
  op.held_bytes = held_bytes;
  op.stored_bytes = stored_bytes;
  op.client = client;
  return op;
}

absl::StatusOr<MultiplyPlan> PlanMultiply(const WireMultiplyRequest& wire,
                                          const PlanContext& ctx) {
  MultiplyPlan plan;
  MultiplyOp multiply;
  std::vector<int64_t> stored_shapes[2];  // of stored operands
  absl::StatusOr<MultiplyHeader> header =
      ResolveOperands(wire, ctx, multiply, stored_shapes);
  if (!header.ok()) return header.status();
  const bool any_shared =
      wire.a.shared.present || wire.b.shared.present || wire.c_shared.present;
  absl::StatusOr<MatmulSpec> spec =
      ValidateSpec(wire, *header, any_shared, ctx.limits);
  if (!spec.ok()) return spec.status();
  plan.job.spec = *spec;
  if (absl::Status s = ResolveShared(wire, *spec, ctx, plan); !s.ok()) {
    return s;
  }
  if (plan.in_cuda[0] != nullptr) multiply.resident_a = plan.in_cuda[0];
  if (plan.in_cuda[1] != nullptr) multiply.resident_b = plan.in_cuda[1];
  multiply.c_target = plan.in_cuda[2];
  const std::byte* const* in_region = plan.in_region;
  const bool a_elsewhere =
      in_region[0] != nullptr || multiply.resident_a != nullptr;
  const bool b_elsewhere =
      in_region[1] != nullptr || multiply.resident_b != nullptr;
  if ((in_region[0] != nullptr || in_region[1] != nullptr) && a_elsewhere &&
      b_elsewhere) {
    // No operand inline: those in regions go to the device straight from
    // there (registered, so the copy engines read them directly), with no
    // staging copy. Beside an inline operand, one in a region is instead
    // copied into staging with it (WriteOperands): one memcpy, as the
    // inline one's, and the engine's staging path is kept whole.
    // Both in one region: one allocation, so the engine may upload them
    // in one copy where B follows A.
    const bool one_region = in_region[0] != nullptr &&
                            in_region[1] != nullptr &&
                            wire.a.shared.region_id == wire.b.shared.region_id;
    multiply.prestaged =
        PrestagedOperands{in_region[0], in_region[1], one_region};
  }
  multiply.c_destination = plan.c_in_region;
  plan.staged_bytes[0] =
      in_region[0] != nullptr ? spec->a_bytes() : wire.a.data_bytes;
  plan.staged_bytes[1] =
      in_region[1] != nullptr ? spec->b_bytes() : wire.b.data_bytes;
  if (wire.keep_result) {
    absl::StatusOr<absl::Duration> ttl =
        ctx.handles.Ttl(wire.result_ttl_seconds);
    if (!ttl.ok()) return ttl.status();
    plan.keep_ttl = *ttl;
    multiply.keep_result = true;
  }
  // Bytes this request holds in server memory: its inline operands in
  // gRPC's buffers (until it finishes) and its product in staging. Operands
  // and products in shared-memory regions are not server memory in flight:
  // they are the client's own pages, charged once against its stored-bytes
  // quota when it registered the region; so they take none of the budget
  // (a region operand staged beside an inline one uses engine staging,
  // which the engine's pool bounds, as it does every staged copy). Such a
  // multiply is still admitted like any other: draining, device fit,
  // deadline, and at least one byte of the budget.
  plan.held_bytes =
      (multiply.resident_a || in_region[0] != nullptr ? 0 : spec->a_bytes()) +
      (multiply.resident_b || in_region[1] != nullptr ? 0 : spec->b_bytes()) +
      (multiply.keep_result || wire.c_shared.present ? 0 : spec->c_bytes());
  if (any_shared && plan.held_bytes > ctx.limits.max_inflight_bytes) {
    // What the validation skipped: never admissible, not load.
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request needs ", plan.held_bytes,
        " bytes in flight (inline operands and result), over the server's "
        "limit of ",
        ctx.limits.max_inflight_bytes, " bytes (--max-inflight-bytes)"));
  }
  if (multiply.keep_result) {
    plan.stored_bytes = spec->c_bytes();
    plan.client = ctx.client;
  }
  plan.job.op = std::move(multiply);
  return plan;
}

}  // namespace matmul
