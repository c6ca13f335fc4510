// JobLayout: where one job's operands and result live on the CUDA engine
// (staged through pinned memory, resident on a device, or kept there), and
// the device memory, staging and bus traffic that follow from it. Worked out
// once per job by Submit and carried with the job from then on.
//
// Plain values and pure functions; thread-compatible. No CUDA header.
#ifndef MATMUL_GPU_CUDA_JOB_LAYOUT_H_
#define MATMUL_GPU_CUDA_JOB_LAYOUT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "gpu/engine.h"
#include "gpu/matmul_spec.h"

namespace matmul {

// Device allocations are carved into A, B and C at this alignment.
inline constexpr int64_t kDeviceAlignment = 256;

inline int64_t AlignUp(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// Device memory for A, B and C of `spec`, each aligned.
int64_t DeviceBytes(const MatmulSpec& spec);

struct JobLayout {
  JobKind kind = JobKind::kMultiply;
  bool stage_a = false;  // A is copied to the device by this job
  bool stage_b = false;
  bool keep = false;            // the result stays on the device
  bool return_c = false;        // the result is copied back into staging
  int64_t transient_bytes = 0;  // device memory freed when the job ends
  int64_t kept_bytes = 0;       // device memory that becomes resident
  int64_t pinned_bytes = 0;     // staging: staged operands, returned C
  int64_t moved_bytes = 0;      // over the bus, both directions
  int required_device = -1;     // where resident operands are, or asked
  int64_t byte_offset = 0;      // into the upload target or download source
};

// INVALID_ARGUMENT when the job's transfer is out of bounds or its resident
// operands live on different GPUs.
absl::StatusOr<JobLayout> LayoutOf(const MatmulJob& job);

// Rough seconds of device work, for least-outstanding-work scheduling only.
double EstimatedSeconds(const MatmulSpec& spec, const JobLayout& layout);

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_JOB_LAYOUT_H_
