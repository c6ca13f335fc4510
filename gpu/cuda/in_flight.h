// InFlight: one job between its enqueue on a stream and its completion,
// and the rules for finishing it exactly once. The host function at the end
// of its stream work (Device::OnStreamDone) queues it for the device's
// completion threads; the poller, a completion thread or Device::Fail then
// claims it (Device::Claim, under the device's done_mu_), and whoever does
// completes it. References (Release) keep the record alive for every path
// that may still touch it. Owned by no one but its references; its fields
// are set by the device that dispatches it.
#ifndef MATMUL_GPU_CUDA_IN_FLIGHT_H_
#define MATMUL_GPU_CUDA_IN_FLIGHT_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "gpu/cuda/job_graph.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/pinned_pool.h"
#include "gpu/cuda/timing.h"
#include "gpu/engine.h"
#include "gpu/matmul_spec.h"

namespace matmul {

class Device;
struct Lane;

struct InFlight {
  std::unique_ptr<MatmulJob> job;
  Device* device = nullptr;
  Lane* lane = nullptr;
  int64_t job_id = 0;
  MatmulSpec spec;
  double estimate = 0;  // seconds, as added to the lane's outstanding work
  JobLayout layout;
  int64_t device_bytes = 0;  // reserved against the device budget
  // Resident operands, held until the job's stream work is done.
  std::shared_ptr<ResidentTensor> resident_a;
  std::shared_ptr<ResidentTensor> resident_b;
  std::shared_ptr<ResidentTensor> upload_target;
  void* kept = nullptr;  // device memory that becomes the resident result
  // The job's staging slot, leased from the device's pinned pool; empty for
  // a job replayed from a graph instance, which stages in the instance's.
  PinnedPool::Lease lease;
  // The host operands (staged, or prestaged with
  // PrestagedOperands::one_allocation) lie in one allocation, so one copy
  // may upload both where they adjoin.
  bool operands_one_allocation = true;
  // A job replayed from a CUDA graph (job_graph.h): its hold on the
  // instance (graph_use.graph()). The use goes with the job's JobResult
  // (its release callback frees the instance once the reply is sent), or
  // is broken and released when the job fails. Empty for every other job.
  JobGraph::Use graph_use;
  std::byte* host_c = nullptr;
  // The job's events: its own set from the device's spare list
  // (`own_events`, returned there in Complete), or its graph instance's,
  // which stay with the instance.
  EventSet* events = nullptr;
  std::unique_ptr<EventSet> own_events;
  StageTimings timings;
  absl::Status status;  // an error met while enqueueing
  // Set by whoever completes the job: the poller, a completion thread or
  // Device::Fail (under the device's done_mu_; see Device::Claim).
  bool claimed = false;
  // False for a job that the poller alone completes (no host function
  // follows its stream work; CudaEngineOptions::poll_only_max_bytes). Set
  // before the poller can see the job.
  bool host_function = true;
  // A job without a host function that the poller found finished along
  // with others and queued for the completion threads (under done_mu_).
  bool handed_off = false;
  // One reference for the host function's path (none without one, until a
  // HandOff), one for the completer's, and one more while the poller
  // queries the job's end event; the last to let go frees the record
  // (Release).
  std::atomic<int> refs{2};
};

// Drops one reference; the last frees the record.
void Release(InFlight* flight);

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_IN_FLIGHT_H_
