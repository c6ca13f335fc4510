// OperandIntake: the chunks of one streamed multiply's operands as they
// arrive, in any order and on any stream of a striped multiply. Each chunk
// is checked against its operand (sent in chunks, not by handle), the
// element size, the operand's end and the bytes that came before (each
// byte comes exactly once); a chunk that passes is counted and placed in
// the one device tensor that holds both staged operands. No gRPC.
//
// Not thread-safe: the session that owns the multiply serializes.
#ifndef MATMUL_SERVER_STREAM_OPERAND_INTAKE_H_
#define MATMUL_SERVER_STREAM_OPERAND_INTAKE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/rpc/byte_coverage.h"
#include "server/stream/plan_stream_start.h"

namespace matmul {

// "a" or "b", for messages about operand 0 or 1.
inline const char* StreamOperandName(int operand) {
  return operand == 0 ? "a" : "b";
}

class OperandIntake {
 public:
  OperandIntake() = default;
  explicit OperandIntake(const StreamStartPlan& plan);

  // A chunk of `bytes` bytes at `offset` in `operand` (a raw
  // matmul.v1.Operand value): its place in the staging tensor, or
  // INVALID_ARGUMENT saying what is wrong with it (nothing is counted
  // then).
  absl::StatusOr<int64_t> Take(int operand, int64_t offset, int64_t bytes);

  // Whether operand 0 (A) or 1 (B) comes in chunks.
  bool staged(int op) const { return staged_[op]; }
  // Bytes expected and received; where the operand starts in the tensor.
  int64_t need(int op) const { return need_[op]; }
  int64_t received(int op) const { return received_[op]; }
  int64_t at(int op) const { return at_[op]; }
  int64_t need_total() const { return need_[0] + need_[1]; }
  bool complete() const {
    return received_[0] == need_[0] && received_[1] == need_[1];
  }
  // The first operand still missing bytes (0 or 1); 1 when complete.
  int missing() const { return received_[0] < need_[0] ? 0 : 1; }
  // Which operand a byte `offset` of the staging tensor belongs to.
  int OperandAt(int64_t offset) const {
    return staged_[1] && offset >= at_[1] ? 1 : 0;
  }

 private:
  int64_t elem_ = 1;
  bool staged_[2] = {false, false};
  int64_t need_[2] = {0, 0};
  int64_t at_[2] = {0, 0};
  int64_t received_[2] = {0, 0};
  ByteCoverage coverage_[2];
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_OPERAND_INTAKE_H_
