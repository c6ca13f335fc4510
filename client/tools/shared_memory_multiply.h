// `matmul-cli multiply --shared-memory`: one multiply whose operands and
// product go through a SharedMemorySession (client/lib/
// shared_memory_session.h) instead of the socket. Kept apart from
// cli_main.cc so that it reads on its own.
#ifndef MATMUL_CLIENT_TOOLS_SHARED_MEMORY_MULTIPLY_H_
#define MATMUL_CLIENT_TOOLS_SHARED_MEMORY_MULTIPLY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"

namespace matmul {

struct SharedMultiplyResult {
  // The product, copied out of the region.
  HostTensor c;
  // The Multiply call alone (registration and copies excluded).
  absl::Duration multiply_time;
  // Size of the region the session registered: A, B and C, each aligned.
  int64_t region_bytes = 0;
};

// Registers a region big enough for a, b and their product, copies a and b
// in, multiplies (the server reads A and B from the region and writes C
// into it), and copies C out; the region is unregistered before it returns.
// The session's errors (PERMISSION_DENIED over TCP, ...) or the multiply's.
absl::StatusOr<SharedMultiplyResult> MultiplyThroughSharedMemory(
    MatmulClient& client, const HostTensor& a, const HostTensor& b,
    const MultiplyOptions& options);

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_SHARED_MEMORY_MULTIPLY_H_
