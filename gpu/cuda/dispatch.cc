// Device's lanes: LaneLoop is each lane's thread; Dispatch (there, or on a
// submitting thread that CudaEngine::Submit lets dispatch a small job
// itself) takes a CUDA graph instance for a small multiply (job_graph.h) or
// else leases the job's device memory and pinned staging, has the job
// write its operands into the slot (the instance's or its own) and hands it
// to Enqueue (enqueue.cc).
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <variant>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/job_graph.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/lane.h"

namespace matmul {

JobGraph::Use Device::TakeGraph(Lane* lane, const MatmulJob& job,
                                const JobLayout& layout) {
  // A small multiply takes a free CUDA graph instance of its shape on this
  // lane (job_graph.h), recorded now if need be, before anything else is
  // leased: the instance has its own device memory (reserved against the
  // budget while it exists), staging and events, so such a job reserves no
  // device memory and leases no staging or events of its own. A job whose
  // shape does not recur (a gathered batch) never takes one.
  if (lane->graphs != nullptr && job.description().shape_recurs &&
      JobGraphCache::Replayable(layout, options_.job_graph_max_device_bytes)) {
    return lane->graphs->Take(job.spec(), layout);
  }
  return JobGraph::Use();
}

absl::StatusOr<PinnedPool::Lease> Device::LeaseWaiting(Lane* lane,
                                                       MatmulJob& job,
                                                       const JobLayout& layout,
                                                       int64_t device_bytes) {
  // Idle graph instances of this lane hold device memory and staging: a
  // job that cannot have its own at once lets them go before it waits (or
  // is refused for want of memory).
  bool reserved_now = false;
  if (lane->graphs != nullptr) {
    reserved_now = memory_->TryReserve(device_bytes);
    if (!reserved_now) lane->graphs->DropFree();
  }
  if (!reserved_now) {
    RETURN_IF_ERROR(memory_->Reserve(device_bytes, job));
  }
  if (lane->graphs != nullptr) {
    std::optional<PinnedPool::Lease> lease =
        pinned_->TryAcquire(layout.staging_bytes);
    if (lease.has_value()) return std::move(*lease);
    lane->graphs->DropFree();
  }
  absl::StatusOr<PinnedPool::Lease> acquired = pinned_->Acquire(
      layout.staging_bytes, [&job] { return job.Abandoned(); });
  if (!acquired.ok()) memory_->Release(device_bytes);
  return acquired;
}

std::optional<PinnedPool::Lease> Device::TryLease(const JobLayout& layout,
                                                  int64_t device_bytes) {
  if (!memory_->TryReserve(device_bytes)) return std::nullopt;
  std::optional<PinnedPool::Lease> lease =
      pinned_->TryAcquire(layout.staging_bytes);
  if (!lease.has_value()) memory_->Release(device_bytes);
  return lease;
}

absl::Status Device::StageOperands(InFlight& flight, MatmulJob& job,
                                   std::byte* slot, absl::Time start) {
  const JobLayout& layout = flight.layout;
  const int64_t a_staged = layout.staged_a_bytes;
  const int64_t b_staged = layout.staged_b_bytes;
  if (a_staged + b_staged > 0) {
    absl::Status written =
        job.WriteOperands(absl::MakeSpan(slot, static_cast<size_t>(a_staged)),
                          absl::MakeSpan(slot + layout.b_staging_offset(),
                                         static_cast<size_t>(b_staged)));
    flight.timings.stage_in = absl::ToDoubleSeconds(absl::Now() - start);
    RETURN_IF_ERROR(written);
  }
  if (options_.poison_outputs && flight.host_c != nullptr) {
    std::memset(flight.host_c, 0xff, static_cast<size_t>(layout.c_out_bytes));
  }
  return absl::OkStatus();
}

absl::Status Device::TakeEvents(InFlight& flight) {
  const int every = options_.timed_job_every;
  bool timed = every <= 1;
  if (!timed) {
    timed = flight.lane->events_taken.fetch_add(1, std::memory_order_relaxed) %
                every ==
            0;
  }
  ASSIGN_OR_RETURN(flight.own_events, events_.Take(timed));
  flight.events = flight.own_events.get();
  return absl::OkStatus();
}

void Device::LaneLoop(Lane* lane) {
  if (absl::Status set = CudaStatus(cudaSetDevice(index_), "cudaSetDevice",
                                    {index_, lane->index});
      !set.ok()) {
    // A lane that cannot reach its device fails it: Dispatch then fails the
    // lane's jobs with the cause instead of running them elsewhere.
    Fail(set);
  }
  while (true) {
    Lane::Queued next;
    {
      absl::MutexLock lock(&lane->mu);
      while (lane->busy || (lane->queue.empty() && !lane->stopping)) {
        lane->cv.Wait(&lane->mu);
      }
      if (lane->queue.empty()) return;  // stopping, and nothing is left
      next = std::move(lane->queue.front());
      lane->queue.pop_front();
      lane->busy = true;
    }
    Dispatch(lane, std::move(next.job), next.layout, next.submitted,
             next.estimate, /*may_wait=*/true);
    absl::MutexLock lock(&lane->mu);
    lane->busy = false;
  }
}

std::unique_ptr<MatmulJob> Device::Dispatch(Lane* lane,
                                            std::unique_ptr<MatmulJob> job,
                                            const JobLayout& layout,
                                            absl::Time submitted,
                                            double estimate, bool may_wait) {
  bool started = false;
  auto fail = [&](const absl::Status& status) {
    if (!started) queued_.fetch_sub(1, std::memory_order_relaxed);
    AtomicAddDouble(lane->outstanding, -estimate);
    job->Done(status);
  };
  if (absl::Status abandoned = job->Abandoned(); !abandoned.ok()) {
    fail(abandoned);
    return nullptr;
  }
  if (!healthy_.load(std::memory_order_relaxed)) {
    fail(Failure());
    return nullptr;
  }
  JobGraph::Use graph = TakeGraph(lane, *job, layout);
  const int64_t device_bytes =
      graph ? 0 : layout.transient_bytes + layout.kept_bytes;
  std::optional<PinnedPool::Lease> lease;
  if (graph) {
    // Nothing to wait for.
  } else if (may_wait) {
    absl::StatusOr<PinnedPool::Lease> leased =
        LeaseWaiting(lane, *job, layout, device_bytes);
    if (!leased.ok()) {
      fail(leased.status());
      return nullptr;
    }
    lease = std::move(*leased);
  } else {
    // Not free at once: the lane's thread takes the job (and may let this
    // lane's idle graph instances go for it).
    lease = TryLease(layout, device_bytes);
    if (!lease.has_value()) return job;
  }
  const std::optional<PrestagedOperands> prestaged =
      PrestagedOf(job->description());
  queued_.fetch_sub(1, std::memory_order_relaxed);
  started = true;

  auto flight = std::make_unique<InFlight>();
  flight->device = this;
  flight->lane = lane;
  flight->job_id = next_job_->fetch_add(1, std::memory_order_relaxed);
  flight->spec = job->spec();
  flight->layout = layout;
  flight->estimate = estimate;
  flight->device_bytes = device_bytes;
  ResidentOperands resident = ResidentOperandsOf(job->description());
  flight->resident_a = std::move(resident.a);
  flight->resident_b = std::move(resident.b);
  flight->upload_target = std::move(resident.target);
  const absl::Time start = absl::Now();
  flight->timings.queue = absl::ToDoubleSeconds(start - submitted);

  // Staging slot: [staged A][staged B][returned C], each part present only
  // when the layout needs it; a graph instance's staging is laid out so
  // (JobGraphCache::Replayable checks that the layout is exactly that).
  std::byte* slot = graph ? graph.graph()->staging() : lease->data();
  const std::byte* host_a = prestaged ? prestaged->a : slot;
  const std::byte* host_b =
      prestaged ? prestaged->b : slot + layout.b_staging_offset();
  flight->operands_one_allocation = !prestaged || prestaged->one_allocation;
  flight->host_c = !layout.return_c ? nullptr
                   : layout.c_to_destination
                       ? std::get<MultiplyOp>(job->op()).c_destination
                       : slot + layout.c_staging_offset();
  if (graph) {
    flight->events = &graph.graph()->events();
    flight->graph_use = std::move(graph);
  } else {
    flight->lease = std::move(*lease);
  }
  absl::Status prepared = StageOperands(*flight, *job, slot, start);
  if (prepared.ok() && flight->events == nullptr) {
    prepared = TakeEvents(*flight);
  }
  if (!prepared.ok()) {
    memory_->Release(device_bytes);
    // Returns the lease, or frees the graph instance (nothing ran on it).
    flight.reset();
    fail(prepared);
    return nullptr;
  }
  flight->job = std::move(job);
  Enqueue(flight.release(), host_a, host_b);
  return nullptr;
}

}  // namespace matmul
