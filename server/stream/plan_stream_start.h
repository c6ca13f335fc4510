// PlanStreamStart: a decoded MultiplyStreamStart (server/rpc/multiply_wire.h)
// resolved into what its multiply will be: the validated spec, the stored
// tensors its handles name, where each chunked operand goes in the one
// device tensor that holds both, whether A is multiplied in row panels, the
// result chunk size, a kept product's lifetime, its stripes, and the bytes
// admission charges it. No gRPC and no reactor: the MultiplyStream session
// (server/stream/multiply_stream_session_start.cc) checks what depends on
// the call (ids open, the open count, draining), calls this, admits the
// plan and stages its operands.
//
// Refusals, in the order they are checked:
//   INVALID_ARGUMENT    a shared-memory operand or product; a bad shape,
//                       dtype or byte count (ValidateMultiplyHeader);
//                       result_chunk_bytes < 0; a TTL < 0 or over the
//                       maximum; stripes other than 0 or 1 without a
//                       stripe_key; a stripe_key not 16 to 64 bytes, or
//                       stripes not 2 to 16 with one
//   NOT_FOUND           an unknown handle
//   RESOURCE_EXHAUSTED  past a request limit other than the message size
//                       (operands are bounded by device memory here)
//
// A pure function of its arguments and the registry's contents; thread-safe
// as the registry is.
#ifndef MATMUL_SERVER_STREAM_PLAN_STREAM_START_H_
#define MATMUL_SERVER_STREAM_PLAN_STREAM_START_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/engine.h"
#include "server/handle_registry.h"
#include "server/request_limits.h"
#include "server/rpc/multiply_wire.h"

namespace matmul {

// One streamed multiply, planned.
struct StreamStartPlan {
  MatmulSpec spec;
  std::vector<int64_t> c_shape;
  // Operands named by handle (the stored tensor and its shape); null for
  // an operand sent in chunks.
  std::shared_ptr<ResidentTensor> stored[2];
  std::vector<int64_t> handle_shape[2];
  // Sent in chunks: its bytes expected, and where they go in the tensor
  // that holds both staged operands (`buffer_bytes` long; 0: none).
  bool staged[2] = {false, false};
  int64_t need[2] = {0, 0};
  int64_t at[2] = {0, 0};
  int64_t buffer_bytes = 0;
  // The device of a stored operand, else -1 (any).
  int device = -1;
  // A multiplied in panels of at least `panel_rows` of its rows, each once
  // B and those rows are on the device (A large, 2-D, not transposed, the
  // product sent rather than kept).
  bool paneled = false;
  int64_t panel_rows = 0;
  // keep_result: the product is stored for this long.
  bool keep = false;
  absl::Duration keep_ttl;
  // The product's bytes per ResultChunk: a whole number of elements.
  int64_t result_chunk_bytes = 0;
  // Striping: 1, or 2 to 16 calls under `stripe_key`.
  int stripes = 1;
  std::string stripe_key;
  // The server memory it may hold at most (operands in the chunk windows,
  // product chunks in the result windows, one of each per stream), charged
  // to the in-flight budget; a kept product's bytes, charged to the quota.
  int64_t held_bytes = 0;
  std::optional<int64_t> stored_bytes;
};

// `limits`: the server's (max_message_bytes bounds the result chunk; it
// and the in-flight limit do not bound the operands).
absl::StatusOr<StreamStartPlan> PlanStreamStart(const WireStreamRequest& start,
                                                const RequestLimits& limits,
                                                const HandleRegistry& handles);

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_PLAN_STREAM_START_H_
