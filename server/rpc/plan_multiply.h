// PlanMultiply: a decoded unary Multiply request (server/rpc/multiply_wire.h)
// resolved into the engine job it asks for and what admission weighs of it.
// It looks up stored tensors named by handle and the shared-memory regions
// the request names, validates the shapes against the server's limits, and
// derives the bytes held in flight, the bytes stored and a kept product's
// lifetime; or it returns the Status the call is refused with. No gRPC and
// no reactor: the Multiply reactor (server/rpc/multiply.cc) decodes the
// request, calls this, and moves bytes.
//
// Refusals, in the order they are checked:
//   INVALID_ARGUMENT    an operand given two ways (data, shared, handle);
//                       keep_result with c_shared; a bad shape, dtype or byte
//                       count (ValidateMultiplyHeader); a region offset < 0
//                       or a range past its region's end (a product that
//                       does not fit its region); an offset into a CUDA
//                       region that is not a multiple of the dtype's size;
//                       a product that
//                       overlaps an operand in a region; a TTL < 0 or over
//                       the maximum (HandleRegistry::Ttl)
//   NOT_FOUND           an unknown handle (HandleRegistry::Get); an unknown
//                       region, or another client's (SharedMemoryRegistry)
//   RESOURCE_EXHAUSTED  past a request limit (ValidateMultiplyHeader); with a
//                       region named, a product over the message size that
//                       neither c_shared nor keep_result takes, or inline
//                       bytes over the in-flight limit
//   FAILED_PRECONDITION a region truncated since it was registered
// Load (the in-flight budget, quotas, device fit, deadline) is admission's
// to judge, with the plan's Admission().
//
// A pure function of its arguments and the registries' contents;
// thread-safe as the registries are.
#ifndef MATMUL_SERVER_RPC_PLAN_MULTIPLY_H_
#define MATMUL_SERVER_RPC_PLAN_MULTIPLY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/engine.h"
#include "server/admission/admission.h"
#include "server/handle_registry.h"
#include "server/request_limits.h"
#include "server/rpc/multiply_wire.h"
#include "server/shared_memory/region_registry.h"

namespace matmul {

// What PlanMultiply reads besides the request; the registries must outlive
// the call.
struct PlanContext {
  const RequestLimits& limits;
  const HandleRegistry& handles;
  const SharedMemoryRegistry& regions;
  // Whose call it is (ClientKey): regions are looked up, and a kept product
  // charged, under this name.
  std::string client;
};

// One unary multiply, planned. Move-only (it holds its regions).
struct MultiplyPlan {
  // The engine job: the validated spec and a MultiplyOp (resident operands,
  // prestaged operands, c_destination, keep_result).
  JobDescription job;

  // Admission's share (see Admission()): server memory held in flight, the
  // stored tensor a kept product charges to `client`.
  int64_t held_bytes = 0;
  std::optional<int64_t> stored_bytes;
  std::string client;  // set with stored_bytes

  // How long a kept product lives (keep_result); nullopt when not kept.
  std::optional<absl::Duration> keep_ttl;

  // Operands in regions that are staged beside an inline one (WriteOperands
  // copies them from here), and those given in regions when both are
  // (job's prestaged then points at the same bytes): where A's and B's
  // bytes lie in their regions; null for an inline or stored operand.
  const std::byte* in_region[2] = {nullptr, nullptr};
  // Where the product goes in its region (c_shared); null otherwise. The
  // job's c_destination.
  std::byte* c_in_region = nullptr;
  // The bytes the job's WriteOperands must get for A and B where staged:
  // an inline operand's data, or an operand in a region's whole size.
  int64_t staged_bytes[2] = {0, 0};
  // Operands and product in CUDA regions (a client's GPU memory): views of
  // it, which the job reads (resident_a/b) and writes (c_target) in place
  // on the region's GPU; null otherwise. Such an operand has no in_region.
  std::shared_ptr<ResidentTensor> in_cuda[3];
  // One hold per region used (SharedMemoryRegion::Use), to be kept until
  // the job is done.
  SharedMemoryRegion::Use regions[3];

  // The Operation to admit: kind kMultiply, held_bytes, stored_bytes,
  // client, and spec pointing at job.spec (so valid while this plan lives
  // and its job is not moved out). The deadline is the caller's to set.
  Operation Admission() const;
};

absl::StatusOr<MultiplyPlan> PlanMultiply(const WireMultiplyRequest& wire,
                                          const PlanContext& ctx);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_PLAN_MULTIPLY_H_
