// Where the members of a grouped multiply (GroupedMultiplyOp, gpu/engine.h)
// live in the job's memory: every member's A back to back in one region,
// every B in a second, every C in a third, each part starting at a multiple
// of kGroupAlignment bytes (cuBLAS wants 16-byte aligned matrices for its
// fast paths; 256 matches the CUDA engine's device blocks). The same layout
// holds in staging, in device memory and in the returned C, so one copy
// moves each region. Engine-neutral; plain values and pure functions.
#ifndef MATMUL_GPU_GROUPED_LAYOUT_H_
#define MATMUL_GPU_GROUPED_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/matmul_spec.h"

namespace matmul {

inline constexpr int64_t kGroupAlignment = 256;

// One member: its product and where its A, B and C begin within the A, B
// and C regions, in bytes.
struct GroupMember {
  MatmulSpec spec;
  int64_t a_offset = 0;
  int64_t b_offset = 0;
  int64_t c_offset = 0;
};

struct GroupLayout {
  std::vector<GroupMember> members;
  // The regions' sizes (every part padded to kGroupAlignment).
  int64_t a_bytes = 0;
  int64_t b_bytes = 0;
  int64_t c_bytes = 0;
  // The members' floating-point operations, summed.
  double flops = 0;
  // GEMMs the group runs: the members' batches, summed.
  int64_t problems = 0;
};

// The layout of `members`, in order. INVALID_ARGUMENT when there are none,
// or when a member's dtype or compute mode differs from `spec`'s (the job's).
absl::StatusOr<GroupLayout> GroupLayoutOf(
    const MatmulSpec& spec, const std::vector<MatmulSpec>& members);

}  // namespace matmul

#endif  // MATMUL_GPU_GROUPED_LAYOUT_H_
