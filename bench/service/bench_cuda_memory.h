// `matmul-bench --cuda-memory`: the requests of a run when operands and
// products live in the bench process's own GPU memory, registered with the
// server (client/lib/cuda_memory_session.h). As --shared-memory, each
// in-flight slot owns one device allocation (cudaMalloc) holding its A and
// B (a copy of one of the workload's requests) and its C, registered as one
// region; a point of concurrency c uses the first c. No payload crosses the
// socket or host memory. Needs a bench built with CUDA and a server on the
// same node, on the CUDA engine, driving the bench's GPU (device 0 of the
// bench's CUDA_VISIBLE_DEVICES); a bench built without CUDA refuses it
// (FAILED_PRECONDITION).
#ifndef MATMUL_BENCH_SERVICE_BENCH_CUDA_MEMORY_H_
#define MATMUL_BENCH_SERVICE_BENCH_CUDA_MEMORY_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/service/bench_workload.h"
#include "bench/service/load_generator.h"
#include "client/lib/cuda_memory_session.h"
#include "client/lib/matmul_client.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

// Whether this bench was built with CUDA (--cuda-memory works).
bool BenchHasCuda();

class CudaMemoryPoint {
 public:
  // `slots` allocations and sessions over `client` (which must outlive the
  // point). FAILED_PRECONDITION without CUDA; CUDA's errors (as INTERNAL or
  // RESOURCE_EXHAUSTED); the sessions' errors.
  static absl::StatusOr<std::unique_ptr<CudaMemoryPoint>> Create(
      MatmulClient* client, const Workload& workload, int slots);
  ~CudaMemoryPoint();

  // requests()[i] multiplies in allocation i; at most one call in flight
  // each (LoadGenerator::Exclusive).
  const std::vector<const v1::MultiplyRequest*>& requests() const {
    return request_ptrs_;
  }
  int64_t region_bytes() const { return region_bytes_; }

  // A checker for the load generator: copies C of request i to the host
  // and hands it to `verifier` as the response's data.
  LoadGenerator::ResponseChecker Checker(const ResponseVerifier* verifier);

 private:
  CudaMemoryPoint() = default;

  std::vector<void*> memory_;  // device allocations, one per slot
  std::vector<std::unique_ptr<CudaMemorySession>> sessions_;
  std::vector<std::unique_ptr<v1::MultiplyRequest>> requests_;
  std::vector<const v1::MultiplyRequest*> request_ptrs_;
  std::vector<int> workload_index_;
  std::vector<SharedTensor> c_;
  int64_t region_bytes_ = 0;
};

}  // namespace matmul

#endif  // MATMUL_BENCH_SERVICE_BENCH_CUDA_MEMORY_H_
