#include "server/stream/plan_stream_start.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/request_validation.h"
#include "server/rpc/stored_tensors.h"
#include "server/stream/stream_bounds.h"

namespace matmul {
namespace {

const char* OperandName(int operand) { return operand == 0 ? "a" : "b"; }

// The validated spec, with operands named by handle resolved into `plan`.
absl::StatusOr<MatmulSpec> ResolveSpec(const WireMultiplyRequest& wire,
                                       const RequestLimits& server_limits,
                                       const HandleRegistry& handles,
                                       StreamStartPlan& plan) {
  if (wire.a.shared.present || wire.b.shared.present || wire.c_shared.present) {
    // A region's bytes need no chunking: the unary call takes them
    // whatever their size.
    return absl::InvalidArgumentError(
        "shared-memory operands and products (Tensor.shared, c_shared) are "
        "not taken by MultiplyStream; use Multiply");
  }
  MultiplyHeader header = wire.header();
  header.a.data_follows = header.b.data_follows = true;
  const std::string* names[2] = {&wire.a_handle, &wire.b_handle};
  OperandHeader* headers[2] = {&header.a, &header.b};
  for (int op = 0; op < 2; ++op) {
    if (names[op]->empty()) continue;
    if (absl::Status s =
            ResolveHandle(handles, *names[op], OperandName(op), *headers[op],
                          plan.stored[op], plan.handle_shape[op]);
        !s.ok()) {
      return s;
    }
    headers[op]->data_follows = false;
  }
  // Operands are bounded by device memory here, not by message size.
  RequestLimits limits = server_limits;
  limits.max_message_bytes = std::numeric_limits<int64_t>::max() / 4;
  limits.max_inflight_bytes = std::numeric_limits<int64_t>::max() / 4;
  return ValidateMultiplyHeader(header, limits);
}

absl::Status PlanStripes(const WireStreamRequest& start,
                         StreamStartPlan& plan) {
  if (start.stripe_key.empty()) {
    if (start.stripes != 0 && start.stripes != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "start.stripes: expected 0 or 1 without a stripe_key, got ",
          start.stripes));
    }
    return absl::OkStatus();
  }
  if (start.stripe_key.size() < StreamBounds::kMinStripeKeyBytes ||
      start.stripe_key.size() > StreamBounds::kMaxStripeKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.stripe_key: expected 16 to 64 bytes, got ",
                     start.stripe_key.size()));
  }
  if (start.stripes < StreamBounds::kMinStripes ||
      start.stripes > StreamBounds::kMaxStripes) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.stripes: expected 2 to 16 with a stripe_key, got ",
                     start.stripes));
  }
  plan.stripes = start.stripes;
  plan.stripe_key = start.stripe_key;
  return absl::OkStatus();
}

// Where the operands go, the panels, and what admission charges.
void PlanLayout(StreamStartPlan& plan) {
  const MatmulSpec& spec = plan.spec;
  plan.c_shape = spec.c_is_3d ? std::vector<int64_t>{spec.batch, spec.m, spec.n}
                              : std::vector<int64_t>{spec.m, spec.n};
  plan.need[0] = plan.stored[0] ? 0 : spec.a_bytes();
  plan.need[1] = plan.stored[1] ? 0 : spec.b_bytes();
  plan.staged[0] = plan.need[0] > 0;
  plan.staged[1] = plan.need[1] > 0;
  constexpr int64_t kAlign = StreamBounds::kOperandAlignment;
  plan.at[0] = 0;
  plan.at[1] =
      plan.staged[0] ? (plan.need[0] + kAlign - 1) / kAlign * kAlign : 0;
  plan.buffer_bytes = plan.staged[1] ? plan.at[1] + plan.need[1] : plan.need[0];
  // Row panels need op(A)'s rows contiguous (2-D, not transposed) and a
  // product that is sent, not kept as one tensor.
  plan.paneled = plan.staged[0] && !plan.keep && !spec.c_is_3d &&
                 spec.batch == 1 && spec.a_batch == 1 && !spec.transpose_a &&
                 spec.m >= 2 && plan.need[0] >= StreamBounds::kMinPanelBytes;
  plan.panel_rows = std::max<int64_t>(
      1, (spec.m + StreamBounds::kPanels - 1) / StreamBounds::kPanels);
  for (const auto& t : plan.stored) {
    if (t != nullptr) plan.device = t->device();
  }
  // A striped multiply's chunks are held in the window of each of its
  // streams, and its product chunks fill a window per stream.
  const int64_t windows = std::max(1, plan.stripes);
  const int64_t operands = std::min(plan.need[0] + plan.need[1],
                                    windows * StreamBounds::kMaxHeldChunkBytes);
  const int64_t product =
      plan.keep ? 0
                : std::min(spec.c_bytes(),
                           windows * StreamBounds::kMaxResultChunksInFlight *
                               plan.result_chunk_bytes);
  plan.held_bytes = operands + product;
  if (plan.keep) plan.stored_bytes = spec.c_bytes();
}

}  // namespace

absl::StatusOr<StreamStartPlan> PlanStreamStart(const WireStreamRequest& start,
                                                const RequestLimits& limits,
                                                const HandleRegistry& handles) {
  StreamStartPlan plan;
  const WireMultiplyRequest& wire = start.start;
  absl::StatusOr<MatmulSpec> spec = ResolveSpec(wire, limits, handles, plan);
  if (!spec.ok()) return spec.status();
  plan.spec = *spec;
  const int64_t elem = spec->elem_size();
  int64_t chunk = start.result_chunk_bytes;
  if (chunk < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("result_chunk_bytes: expected 0 or more, got ", chunk));
  }
  if (chunk == 0) chunk = StreamBounds::kDefaultResultChunkBytes;
  chunk = std::min(chunk, limits.max_message_bytes - 64);
  plan.result_chunk_bytes = std::max(elem, chunk / elem * elem);
  if (wire.keep_result) {
    absl::StatusOr<absl::Duration> ttl = handles.Ttl(wire.result_ttl_seconds);
    if (!ttl.ok()) return ttl.status();
    plan.keep = true;
    plan.keep_ttl = *ttl;
  }
  if (absl::Status s = PlanStripes(start, plan); !s.ok()) return s;
  PlanLayout(plan);
  return plan;
}

}  // namespace matmul
