// JobLayout: one job's layout on the CUDA engine: the engine-neutral plan
// (gpu/layout_planner.h: staged and resident operands, kept or returned
// result, staging, transfer offset, device) plus the device memory it
// carves out of the stream-ordered pool, each block aligned. Worked out once
// per job by Submit and carried with the job from then on.
//
// Plain values and pure functions; thread-compatible. No CUDA header.
#ifndef MATMUL_GPU_CUDA_JOB_LAYOUT_H_
#define MATMUL_GPU_CUDA_JOB_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "gpu/engine.h"
#include "gpu/layout_planner.h"
#include "gpu/matmul_spec.h"

namespace matmul {

// Device allocations are carved into A, B and C at this alignment.
inline constexpr int64_t kDeviceAlignment = 256;

inline int64_t AlignUp(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// Whether B lies right after A both in host memory and on the device, so
// that one host-to-device copy of a_bytes + b_bytes uploads both operands
// (when the host side is one allocation, such as a job's staging). It holds
// for a job staging both operands when A's bytes are a multiple of
// kDeviceAlignment (every float32 n=64 or n=256 multiply, for one): staging
// is laid out [A][B][C] and device memory is carved so too. Each copy is a
// runtime call on the host and a transfer the copy engine starts.
inline bool OperandsContiguous(const std::byte* host_a, const std::byte* host_b,
                               const std::byte* device_a,
                               const std::byte* device_b, int64_t a_bytes) {
  return host_b == host_a + a_bytes && device_b == device_a + a_bytes;
}

// Device memory for A, B and C of `spec`, each aligned.
int64_t DeviceBytes(const MatmulSpec& spec);

// The plan's fields (stage_a, keep, return_c, staging_bytes, moved_bytes,
// required_device, byte_offset, ...) and the device memory that follows.
struct JobLayout : LayoutPlan {
  int64_t transient_bytes = 0;  // device memory freed when the job ends
  int64_t kept_bytes = 0;       // device memory that becomes resident
};

// The CUDA layout of a plan.
JobLayout DeviceLayoutOf(const LayoutPlan& plan);

// PlanLayout, then DeviceLayoutOf: INVALID_ARGUMENT when the job's transfer
// is out of bounds or its resident operands live on different GPUs.
absl::StatusOr<JobLayout> LayoutOf(const JobDescription& job);

// Rough seconds of device work, for least-outstanding-work scheduling only.
double EstimatedSeconds(const MatmulSpec& spec, const JobLayout& layout);

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_JOB_LAYOUT_H_
