// MatmulSpec: a validated description of one (batched) matrix product, in the
// terms an engine needs: dims, batch broadcast, transposes, dtype, precision.
#ifndef MATMUL_GPU_MATMUL_SPEC_H_
#define MATMUL_GPU_MATMUL_SPEC_H_

#include <cstdint>

#include "common/dtype.h"

namespace matmul {

// C[b] = op(A[b or 0]) · op(B[b or 0]) for b in [0, batch), row-major.
// Stored operand shapes are [a_batch, ta ? k : m, ta ? m : k] and
// [b_batch, tb ? n : k, tb ? k : n]; an operand with batch 1 is broadcast.
// All counts are validated so that every product below fits in int64.
struct MatmulSpec {
  DType dtype = DType::kFloat32;
  ComputeMode compute = ComputeMode::kStrict;
  int64_t batch = 1;    // batches of C
  int64_t a_batch = 1;  // batches stored in A: 1 (broadcast) or batch
  int64_t b_batch = 1;  // batches stored in B: 1 (broadcast) or batch
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  bool c_is_3d = false;  // whether either operand was 3-D (shape of C)

  int64_t a_elements() const { return a_batch * m * k; }
  int64_t b_elements() const { return b_batch * k * n; }
  int64_t c_elements() const { return batch * m * n; }
  int64_t a_bytes() const { return a_elements() * elem_size(); }
  int64_t b_bytes() const { return b_elements() * elem_size(); }
  int64_t c_bytes() const { return c_elements() * elem_size(); }
  int64_t elem_size() const { return static_cast<int64_t>(DTypeSize(dtype)); }
  // Floating-point operations: 2·batch·m·n·k (multiply and add).
  double flops() const {
    return 2.0 * static_cast<double>(batch) * static_cast<double>(m) *
           static_cast<double>(n) * static_cast<double>(k);
  }
};

}  // namespace matmul

#endif  // MATMUL_GPU_MATMUL_SPEC_H_
