// `matmul-bench --shared-memory`: the requests of a run when operands and
// products go through shared memory (client/lib/shared_memory_session.h).
// Each in-flight slot of the load generator owns a session: a registered
// region holding its A, B (a copy of one of the workload's requests) and
// its C, so that no two multiplies in flight write the same C. A point of
// concurrency c uses the first c. The requests name places in the regions;
// no payload crosses the socket (request_bytes and response_bytes are 0).
#ifndef MATMUL_CLIENT_TOOLS_BENCH_SHARED_MEMORY_H_
#define MATMUL_CLIENT_TOOLS_BENCH_SHARED_MEMORY_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/service/bench_workload.h"
#include "bench/service/load_generator.h"
#include "client/lib/matmul_client.h"
#include "client/lib/shared_memory_session.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

class SharedMemoryPoint {
 public:
  // `slots` sessions over `client` (which must outlive the point), session
  // i holding the operands of workload request i % distinct. The
  // sessions' errors (PERMISSION_DENIED over TCP, RESOURCE_EXHAUSTED over
  // the client's quota of stored bytes, ...).
  static absl::StatusOr<std::unique_ptr<SharedMemoryPoint>> Create(
      MatmulClient* client, const Workload& workload, int slots);

  // requests()[i] multiplies in session i: one per slot, to be sent with at
  // most one call in flight each (LoadGenerator::Exclusive).
  const std::vector<const v1::MultiplyRequest*>& requests() const {
    return request_ptrs_;
  }
  // Bytes registered, all sessions together.
  int64_t region_bytes() const { return region_bytes_; }

  // A checker for the load generator: reads C of request i out of its
  // region and hands it to `verifier` as the response's data, with the
  // workload index the session copied. Thread-safe; the point and the
  // verifier must outlive it.
  LoadGenerator::ResponseChecker Checker(const ResponseVerifier* verifier);

 private:
  SharedMemoryPoint() = default;

  std::vector<std::unique_ptr<SharedMemorySession>> sessions_;
  std::vector<std::unique_ptr<v1::MultiplyRequest>> requests_;
  std::vector<const v1::MultiplyRequest*> request_ptrs_;
  std::vector<int> workload_index_;
  std::vector<SharedTensor> c_;
  int64_t region_bytes_ = 0;
};

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_BENCH_SHARED_MEMORY_H_
