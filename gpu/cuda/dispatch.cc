// CudaEngine's dispatch: Submit picks a lane (PickLane: least outstanding
// work on a healthy device that can hold the job) and queues the job there,
// or dispatches a small one itself; LaneLoop is each lane's thread; Dispatch
// takes a CUDA graph instance for a small multiply (job_graph.h) or else
// leases the job's device memory and pinned staging, has the job write its
// operands into the slot (the instance's or its own) and hands it to
// Enqueue (enqueue.cc).
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/job_graph.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/lane.h"
#include "gpu/layout_planner.h"

namespace matmul {
namespace {

// A free graph instance for a small multiply; an empty Use if none.
JobGraph::Use TakeGraph(Lane* lane, const MatmulJob& job,
                        const JobLayout& layout,
                        const CudaEngineOptions& options) {
  // A small multiply takes a free CUDA graph instance of its shape on this
  // lane (job_graph.h), recorded now if need be, before anything else is
  // leased: the instance has its own device memory (reserved against the
  // budget while it exists), staging and events, so such a job reserves no
  // device memory and leases no staging or events of its own. A job whose
  // shape does not recur (a gathered batch) never takes one.
  if (lane->graphs != nullptr && job.description().shape_recurs &&
      JobGraphCache::Replayable(layout, options.job_graph_max_device_bytes)) {
    return lane->graphs->Take(job.spec(), layout);
  }
  return JobGraph::Use();
}

// The job's device memory and staging, waiting for them while the device
// is full.
absl::StatusOr<PinnedPool::Lease> LeaseWaiting(Lane* lane, MatmulJob& job,
                                               const JobLayout& layout,
                                               int64_t device_bytes) {
  Device* d = lane->device;
  // Idle graph instances of this lane hold device memory and staging: a
  // job that cannot have its own at once lets them go before it waits (or
  // is refused for want of memory).
  bool reserved_now = false;
  if (lane->graphs != nullptr) {
    reserved_now = d->memory->TryReserve(device_bytes);
    if (!reserved_now) lane->graphs->DropFree();
  }
  if (!reserved_now) {
    RETURN_IF_ERROR(d->memory->Reserve(device_bytes, job));
  }
  if (lane->graphs != nullptr) {
    std::optional<PinnedPool::Lease> lease =
        d->pinned->TryAcquire(layout.staging_bytes);
    if (lease.has_value()) return std::move(*lease);
    lane->graphs->DropFree();
  }
  absl::StatusOr<PinnedPool::Lease> acquired = d->pinned->Acquire(
      layout.staging_bytes, [&job] { return job.Abandoned(); });
  if (!acquired.ok()) d->memory->Release(device_bytes);
  return acquired;
}

// The job's device memory and staging if both are free at once.
std::optional<PinnedPool::Lease> TryLease(Lane* lane, const JobLayout& layout,
                                          int64_t device_bytes) {
  Device* d = lane->device;
  if (!d->memory->TryReserve(device_bytes)) return std::nullopt;
  std::optional<PinnedPool::Lease> lease =
      d->pinned->TryAcquire(layout.staging_bytes);
  if (!lease.has_value()) d->memory->Release(device_bytes);
  return lease;
}

// Has the job write its operands into its staging slot.
absl::Status StageOperands(InFlight& flight, MatmulJob& job, std::byte* slot,
                           absl::Time start, const CudaEngineOptions& options) {
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
  if (options.poison_outputs && flight.host_c != nullptr) {
    std::memset(flight.host_c, 0xff, static_cast<size_t>(layout.c_out_bytes));
  }
  return absl::OkStatus();
}

// The job's own events from the device's spare list, timed or not
// (CudaEngineOptions::timed_job_every).
absl::Status TakeEvents(InFlight& flight, const CudaEngineOptions& options) {
  const int every = options.timed_job_every;
  bool timed = every <= 1;
  if (!timed) {
    timed = flight.lane->events_taken.fetch_add(1, std::memory_order_relaxed) %
                every ==
            0;
  }
  ASSIGN_OR_RETURN(flight.own_events, flight.device->events.Take(timed));
  flight.events = flight.own_events.get();
  return absl::OkStatus();
}

}  // namespace

Lane* CudaEngine::PickLane(const JobLayout& layout) const {
  const int64_t device_bytes = layout.transient_bytes + layout.kept_bytes;
  Lane* best = nullptr;
  double best_work = std::numeric_limits<double>::infinity();
  for (Lane* lane : lanes_) {
    Device* d = lane->device;
    if (!d->healthy.load(std::memory_order_relaxed) ||
        (layout.required_device >= 0 && d->index != layout.required_device) ||
        device_bytes > d->memory->budget() ||
        layout.staging_bytes > d->pinned->capacity()) {
      continue;
    }
    const double work = lane->outstanding.load(std::memory_order_relaxed);
    if (work < best_work) {
      best_work = work;
      best = lane;
    }
  }
  return best;
}

void CudaEngine::Submit(std::unique_ptr<MatmulJob> job) {
  absl::Status refused;
  Lane* inline_lane = nullptr;  // dispatch here, on the submitting thread
  JobLayout inline_layout;
  absl::Time submitted;
  double estimate = 0;
  {
    absl::ReaderMutexLock shutdown_lock(&shutdown_mu_);
    absl::StatusOr<JobLayout> layout = LayoutOf(job->description());
    Lane* lane = layout.ok() ? PickLane(*layout) : nullptr;
    if (shut_down_) {
      refused = absl::UnavailableError("the CUDA engine is shut down");
    } else if (!layout.ok()) {
      refused = layout.status();
    } else if (lane == nullptr) {
      refused = absl::UnavailableError(
          layout->required_device >= 0
              ? absl::StrCat("GPU ", layout->required_device,
                             " cannot take the request (unhealthy, or not "
                             "enough memory; see the server log)")
              : "no healthy GPU can take the request (see the server log)");
    } else {
      estimate = EstimatedSeconds(job->spec(), *layout);
      AtomicAddDouble(lane->outstanding, estimate);
      lane->device->queued.fetch_add(1, std::memory_order_relaxed);
      submitted = absl::Now();
      absl::MutexLock lock(&lane->mu);
      // 0 turns this off even for jobs that stage nothing.
      if (options_.inline_dispatch_max_bytes > 0 && lane->queue.empty() &&
          !lane->busy &&
          layout->staging_bytes <= options_.inline_dispatch_max_bytes) {
        lane->busy = true;
        inline_lane = lane;
        inline_layout = *layout;
      } else {
        lane->queue.push_back({std::move(job), *layout, submitted, estimate});
        lane->cv.Signal();
        return;
      }
    }
  }
  if (inline_lane == nullptr) {
    job->Done(refused);
    return;
  }
  // The lane thread waits while `busy`, and Shutdown joins it, so the
  // engine stays up until this dispatch ends.
  std::unique_ptr<MatmulJob> left;
  {
    ScopedDevice scoped(inline_lane->device->index);
    if (scoped.status().ok()) {
      left = Dispatch(inline_lane, std::move(job), inline_layout, submitted,
                      estimate, /*may_wait=*/false);
    } else {
      // This thread cannot make the device current: the lane's thread,
      // which has it current, takes the job.
      CUDA_LOG_IF_ERROR_STATUS(scoped.status());
      left = std::move(job);
    }
  }
  absl::MutexLock lock(&inline_lane->mu);
  inline_lane->busy = false;
  if (left != nullptr) {
    // Memory or staging was not free at once: the lane thread waits for it.
    inline_lane->queue.push_front(
        {std::move(left), inline_layout, submitted, estimate});
  }
  inline_lane->cv.Signal();
}

void CudaEngine::LaneLoop(Lane* lane) {
  const int index = lane->device->index;
  if (absl::Status set = CudaStatus(cudaSetDevice(index), "cudaSetDevice",
                                    {index, lane->index});
      !set.ok()) {
    // A lane that cannot reach its device fails it: Dispatch then fails the
    // lane's jobs with the cause instead of running them elsewhere.
    FailDevice(lane->device, set);
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

std::unique_ptr<MatmulJob> CudaEngine::Dispatch(
    Lane* lane, std::unique_ptr<MatmulJob> job, const JobLayout& layout,
    absl::Time submitted, double estimate, bool may_wait) {
  Device* d = lane->device;
  bool started = false;
  auto fail = [&](const absl::Status& status) {
    if (!started) d->queued.fetch_sub(1, std::memory_order_relaxed);
    AtomicAddDouble(lane->outstanding, -estimate);
    job->Done(status);
  };
  if (absl::Status abandoned = job->Abandoned(); !abandoned.ok()) {
    fail(abandoned);
    return nullptr;
  }
  if (!d->healthy.load(std::memory_order_relaxed)) {
    fail(d->Failure());
    return nullptr;
  }
  JobGraph::Use graph = TakeGraph(lane, *job, layout, options_);
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
    lease = TryLease(lane, layout, device_bytes);
    if (!lease.has_value()) return job;
  }
  const std::optional<PrestagedOperands> prestaged =
      PrestagedOf(job->description());
  d->queued.fetch_sub(1, std::memory_order_relaxed);
  started = true;

  auto flight = std::make_unique<InFlight>();
  flight->device = d;
  flight->lane = lane;
  flight->job_id = next_job_.fetch_add(1, std::memory_order_relaxed);
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
  absl::Status prepared = StageOperands(*flight, *job, slot, start, options_);
  if (prepared.ok() && flight->events == nullptr) {
    prepared = TakeEvents(*flight, options_);
  }
  if (!prepared.ok()) {
    d->memory->Release(device_bytes);
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
