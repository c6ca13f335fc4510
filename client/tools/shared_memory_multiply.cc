#include "client/tools/shared_memory_multiply.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "client/lib/shared_memory_session.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

int64_t Aligned(int64_t bytes) {
  return (bytes + kSharedTensorAlignment - 1) / kSharedTensorAlignment *
         kSharedTensorAlignment;
}

}  // namespace

absl::StatusOr<SharedMultiplyResult> MultiplyThroughSharedMemory(
    MatmulClient& client, const HostTensor& a, const HostTensor& b,
    const MultiplyOptions& options) {
  RETURN_IF_ERROR(CheckHostTensor(a));
  RETURN_IF_ERROR(CheckHostTensor(b));
  ASSIGN_OR_RETURN(
      const std::vector<int64_t> c_shape,
      ProductShape(a.shape, b.shape, options.transpose_a, options.transpose_b));
  ASSIGN_OR_RETURN(const int64_t c_bytes, NumBytes(c_shape, a.dtype));
  SharedMultiplyResult result;
  result.region_bytes = Aligned(static_cast<int64_t>(a.data.size())) +
                        Aligned(static_cast<int64_t>(b.data.size())) +
                        std::max<int64_t>(c_bytes, 1);
  SharedMemoryOptions session_options;
  session_options.client_id = options.client_id;
  ASSIGN_OR_RETURN(std::unique_ptr<SharedMemorySession> session,
                   SharedMemorySession::Create(&client, result.region_bytes,
                                               session_options));
  ASSIGN_OR_RETURN(const SharedTensor a_at, session->Put(a));
  ASSIGN_OR_RETURN(const SharedTensor b_at, session->Put(b));
  ASSIGN_OR_RETURN(const SharedTensor c_place,
                   session->Allocate(c_shape, a.dtype));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const SharedTensor c_at,
                   session->Multiply(a_at, b_at, c_place.offset, options));
  result.multiply_time = absl::Now() - start;
  ASSIGN_OR_RETURN(result.c, session->Get(c_at));
  return result;
}

}  // namespace matmul
