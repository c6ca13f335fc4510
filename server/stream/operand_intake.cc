#include "server/stream/operand_intake.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

OperandIntake::OperandIntake(const StreamStartPlan& plan)
    : elem_(plan.spec.elem_size()) {
  for (int op = 0; op < 2; ++op) {
    staged_[op] = plan.staged[op];
    need_[op] = plan.need[op];
    at_[op] = plan.at[op];
  }
}

absl::StatusOr<int64_t> OperandIntake::Take(int operand, int64_t offset,
                                            int64_t bytes) {
  const int op = operand - v1::OPERAND_A;
  if (operand != v1::OPERAND_A && operand != v1::OPERAND_B) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.operand: expected OPERAND_A or OPERAND_B, got ", operand));
  }
  const char* name = StreamOperandName(op);
  if (!staged_[op]) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for operand ", name, ", which is given by ", name,
                     "_handle and takes no chunks"));
  }
  if (bytes <= 0 || bytes % elem_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.data: expected a positive whole number of ", elem_,
                     "-byte elements, got ", bytes, " bytes"));
  }
  if (offset < 0 || offset % elem_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.offset: expected a whole number of ", elem_,
                     "-byte elements in operand ", name, ", got ", offset));
  }
  if (offset > need_[op] - bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operand ", name, ": the chunk of ", bytes, " bytes at offset ", offset,
        " runs past its end at ", need_[op], " bytes"));
  }
  if (std::optional<ByteCoverage::Range> seen =
          coverage_[op].Overlap(offset, bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operand ", name, ": the chunk of bytes [", offset, ", ",
        offset + bytes, ") overlaps bytes [", seen->first, ", ", seen->second,
        ") that arrived before (each byte comes once)"));
  }
  coverage_[op].Add(offset, bytes);
  received_[op] += bytes;
  return at_[op] + offset;
}

}  // namespace matmul
