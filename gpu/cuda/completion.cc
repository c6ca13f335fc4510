// CudaEngine's completion: the completion threads (woken by the host
// function at the end of a job's stream work, and watching for a device
// whose context has failed), the poller (which answers small jobs sooner by
// querying their end events), Complete (event times into stage timings,
// stream busy time, spans and stats, then the job's result) and FailDevice.
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/lane.h"
#include "gpu/cuda/resident_tensor.h"
#include "gpu/cuda/timing.h"

namespace matmul {

void CudaEngine::CompletionLoop(Device* d) {
  if (absl::Status set =
          CudaStatus(cudaSetDevice(d->index), "cudaSetDevice", {d->index});
      !set.ok()) {
    FailDevice(d, set);  // its jobs fail now; this thread still drains
  }
  absl::Time last_progress = absl::Now();
  while (true) {
    InFlight* flight = nullptr;
    bool mine = false;  // this thread completes it (the poller has not)
    {
      absl::MutexLock lock(&d->done_mu);
      while (d->done.empty() && !(d->stopping && d->in_flight.empty())) {
        if (d->done_cv.WaitWithTimeout(&d->done_mu, absl::Seconds(1)) &&
            d->done.empty() && !d->in_flight.empty()) {
          break;  // timed out with work in flight: look at the device below
        }
      }
      if (!d->done.empty()) {
        flight = d->done.front();
        d->done.pop_front();
        d->in_flight.erase(flight);
        mine = Claim(flight);
      } else if (d->stopping && d->in_flight.empty()) {
        return;
      }
    }
    const absl::Time now = absl::Now();
    if (flight != nullptr) {
      last_progress = now;
      if (mine) {
        Complete(flight);
        Release(flight);  // the completer's reference
      }
      Release(flight);  // the host function's (or HandOff's)
    } else if (now - last_progress > absl::Seconds(1)) {
      // Nothing completed for a while: a broken context never runs host
      // functions, so ask the streams directly.
      for (auto& lane : d->lanes) {
        const cudaError_t error = cudaStreamQuery(lane->stream->stream.get());
        if (error != cudaSuccess && error != cudaErrorNotReady) {
          FailDevice(
              d, CudaStatus(error, "cudaStreamQuery", {d->index, lane->index}));
          break;
        }
      }
    }
    d->clock->MaybeRefresh(now);
  }
}

namespace {

// What a poller carries from one round to the next.
struct PollState {
  int64_t seen = 0;  // the device's `enqueued` when last looked at
  absl::Time poll_until = absl::InfinitePast();
};

// True while one of `lanes` has a job without a host function unclaimed:
// only a poller completes such a job, so its poller stops only once there
// is none. The caller holds the device's done_mu.
bool PollOnlyLeft(const std::vector<Lane*>& lanes) {
  for (Lane* lane : lanes) {
    for (InFlight* flight : lane->unclaimed) {
      if (!flight->host_function) return true;
    }
  }
  return false;
}

// Waits until there is something to poll on `lanes`: fills `fronts` with
// the oldest unclaimed job of each stream, referenced so that it stays
// allocated while its event is queried outside the lock. False once the
// engine stops and no job without a host function is left to the poller.
bool WaitForFronts(Device* d, const std::vector<Lane*>& lanes,
                   absl::Duration window, PollState& state,
                   std::vector<std::pair<InFlight*, cudaEvent_t>>& fronts) {
  absl::MutexLock lock(&d->done_mu);
  while (true) {
    // Jobs without a host function are the poller's to finish, even while
    // the engine stops.
    if (d->stopping && !PollOnlyLeft(lanes)) return false;
    if (d->enqueued != state.seen) {
      state.seen = d->enqueued;
      state.poll_until = absl::Now() + window;
    }
    for (Lane* lane : lanes) {
      if (lane->unclaimed.empty()) continue;
      InFlight* front = lane->unclaimed.front();
      front->refs.fetch_add(1, std::memory_order_relaxed);
      fronts.emplace_back(front, front->events->end.get());
    }
    if (!fronts.empty() &&
        (absl::Now() < state.poll_until || d->poll_only_unclaimed > 0)) {
      return true;
    }
    for (auto& [flight, event] : fronts) Release(flight);
    fronts.clear();
    // Nothing to poll, or polling found nothing for a whole window: the
    // host functions complete what is in flight; wake at the next job.
    while (!d->stopping && d->enqueued == state.seen) {
      d->poll_cv.Wait(&d->done_mu);
    }
  }
}

// The jobs of `fronts` whose end event reads done. An event that reads done
// belongs to its job as long as the job is unclaimed: events go back to the
// spare list only in Complete.
void QueryFronts(Device* d,
                 const std::vector<std::pair<InFlight*, cudaEvent_t>>& fronts,
                 std::vector<InFlight*>& finished) {
  static std::atomic<int> query_failures_logged{0};
  for (const auto& [flight, event] : fronts) {
    const cudaError_t queried = cudaEventQuery(event);
    if (queried == cudaSuccess) {
      finished.push_back(flight);
    } else if (queried != cudaErrorNotReady) {
      // Not the poller's to act on: the host function, or the completion
      // threads' watch on the streams, completes or fails the job.
      LogCudaFailure(CudaStatus(queried, "cudaEventQuery(end event)",
                                {d->index, flight->lane->index}),
                     query_failures_logged);
    }
  }
}

// Claims the first of `finished` that nobody has for the caller to complete
// (the others become null): other jobs without a host function go to the
// completion threads (HandOff), so that many small jobs finishing at once
// are completed in parallel. The caller holds the device's done_mu.
void ClaimOne(Device* d, std::vector<InFlight*>& finished) {
  bool completing_one = false;
  for (InFlight*& flight : finished) {
    if (completing_one && !flight->host_function) {
      if (!flight->claimed) HandOff(flight);
      flight = nullptr;
    } else if (!Claim(flight)) {
      flight = nullptr;
    } else {
      completing_one = true;
      // No completion thread takes a job without a host function out.
      if (!flight->host_function) d->in_flight.erase(flight);
    }
  }
}

}  // namespace

void CudaEngine::PollLoop(Device* d, int poller, int pollers) {
  if (absl::Status set =
          CudaStatus(cudaSetDevice(d->index), "cudaSetDevice", {d->index});
      !set.ok()) {
    FailDevice(d, set);
  }
  const absl::Duration window = options_.completion_poll;
  PollState state;
  std::vector<std::pair<InFlight*, cudaEvent_t>> fronts;
  std::vector<InFlight*> finished;
  std::vector<Lane*> lanes;  // this poller's share
  for (size_t i = poller; i < d->lanes.size(); i += pollers) {
    lanes.push_back(d->lanes[i].get());
  }
  while (true) {
    fronts.clear();
    if (!WaitForFronts(d, lanes, window, state, fronts)) return;
    finished.clear();
    QueryFronts(d, fronts, finished);
    if (!finished.empty()) {
      absl::MutexLock lock(&d->done_mu);
      ClaimOne(d, finished);
      state.poll_until = absl::Now() + window;
    }
    for (InFlight* flight : finished) {
      if (flight == nullptr) continue;
      Complete(flight);
      Release(flight);  // the completer's reference
    }
    for (auto& [flight, event] : fronts) Release(flight);  // the query's
    if (finished.empty()) {
      // A pause between rounds of queries, without CUDA calls: the driver
      // serializes them with the enqueues of the lanes and submitters.
      const absl::Time resume = absl::Now() + options_.poll_pause;
      while (absl::Now() < resume) {
      }
    }
  }
}

void CudaEngine::Complete(InFlight* flight) {
  // The job goes with this call; the record stays until Release.
  std::unique_ptr<MatmulJob> job = std::move(flight->job);
  EventTimes ms{};  // start, h2d_done, gemm_done, end
  const absl::Status status = CompletionStatus(flight, ms);
  // Read before the job's own events go back to the spare list.
  const bool timed = flight->events->timed;
  ReleaseJobResources(flight, status);
  if (!status.ok()) {
    // The failed job's graph instance is never replayed again: it goes
    // once free, which it is from here (its stream work is done).
    flight->graph_use.Break();
    flight->graph_use.Release();
    job->Done(status);
    return;
  }
  Account(flight, ms, timed);
  job->Done(ResultOf(flight));
}

absl::Status CudaEngine::CompletionStatus(InFlight* flight, EventTimes& ms) {
  Device* d = flight->device;
  absl::Status status = flight->status;
  if (status.ok()) {
    status = Inject(FaultInjector::Point::kCompletion, flight->job_id);
  }
  if (status.ok()) {
    if (absl::Status lost =
            Inject(FaultInjector::Point::kContext, flight->job_id);
        !lost.ok()) {
      // This job is claimed (it is no longer in flight), so FailDevice
      // fails the others and this one fails here with the same status.
      FailDevice(d, lost);
      status = d->Failure();
    }
  }
  // An untimed job (CudaEngineOptions::timed_job_every) has no times.
  if (status.ok() && flight->events->timed) {
    const EventSet& ev = *flight->events;
    const cudaEvent_t events[4] = {ev.start.get(), ev.h2d_done.get(),
                                   ev.gemm_done.get(), ev.end.get()};
    for (int i = 0; i < 4 && status.ok(); ++i) {
      absl::StatusOr<double> t = d->clock->DeviceMs(events[i]);
      if (t.ok()) {
        ms[i] = *t;
      } else {
        status = t.status();
      }
    }
  }
  return status;
}

void CudaEngine::ReleaseJobResources(InFlight* flight,
                                     const absl::Status& status) {
  Device* d = flight->device;
  if (!status.ok() && flight->kept != nullptr) {
    // The job fails with `status`; a failed free can only be logged.
    CUDA_LOG_IF_ERROR_AT(CudaSite{d->index},
                         cudaFreeAsync(flight->kept, d->idle_stream.get()));
    flight->kept = nullptr;
  }
  // Kept memory stays reserved: the resident tensor releases it.
  d->memory->Release(flight->device_bytes -
                     (flight->kept != nullptr ? flight->layout.kept_bytes : 0));
  // A graph instance's events stay with the instance.
  if (flight->own_events != nullptr) {
    d->events.Return(std::move(flight->own_events));
  }
  AtomicAddDouble(flight->lane->outstanding, -flight->estimate);
  flight->resident_a.reset();
  flight->resident_b.reset();
  flight->upload_target.reset();
}

void CudaEngine::Account(InFlight* flight, const EventTimes& ms, bool timed) {
  Device* d = flight->device;
  Lane* lane = flight->lane;
  const JobLayout& l = flight->layout;
  lane->jobs.fetch_add(1, std::memory_order_relaxed);
  d->h2d_bytes.fetch_add(l.moved_bytes - l.c_out_bytes,
                         std::memory_order_relaxed);
  d->d2h_bytes.fetch_add(l.c_out_bytes, std::memory_order_relaxed);
  if (l.gemm) {
    AtomicAddDouble(d->flops[static_cast<int>(flight->spec.dtype)], l.flops);
  }
  if (!timed) return;
  SetDeviceStages(ms, flight->timings);
  AtomicAddDouble(lane->busy_seconds, (ms[3] - ms[0]) * 1e-3);
  d->busy.Add(ms);
  const StreamSpan::Kind kinds[3] = {StreamSpan::Kind::kH2D,
                                     StreamSpan::Kind::kCompute,
                                     StreamSpan::Kind::kD2H};
  for (int i = 0; i < 3; ++i) {
    StreamSpan span;
    span.device = d->index;
    span.stream = lane->index;
    span.kind = kinds[i];
    span.job = flight->job_id;
    span.start = d->clock->WallTime(ms[i]);
    span.end = d->clock->WallTime(ms[i + 1]);
    spans_.Add(span);
  }
}

JobResult CudaEngine::ResultOf(InFlight* flight) {
  Device* d = flight->device;
  const JobLayout& l = flight->layout;
  // The reply is sent from the staging (the job's lease, or its graph
  // instance's); letting go of the result gives it back (frees the
  // instance for the next job of its shape).
  absl::AnyInvocable<void() &&> release;
  if (flight->graph_use) {
    release = [use = std::move(flight->graph_use)]() mutable { use.Release(); };
  } else {
    release = [lease = std::move(flight->lease)]() mutable { lease.Release(); };
  }
  JobResult result(absl::MakeConstSpan(flight->host_c,
                                       static_cast<size_t>(l.returned_c_bytes)),
                   Placement{d->index, flight->lane->index}, flight->timings,
                   std::move(release));
  if (flight->kept != nullptr) {
    result.set_resident(std::make_shared<CudaResidentTensor>(
        d, flight->spec.dtype, l.kept.batch, l.kept.rows, l.kept.cols,
        flight->kept, l.kept_bytes));
  }
  return result;
}

void CudaEngine::FailDevice(Device* d, const absl::Status& cause) {
  const absl::Status status = absl::InternalError(
      absl::StrCat("GPU ", d->index, " failed: ", cause.message()));
  std::set<InFlight*> victims;
  {
    absl::MutexLock lock(&d->done_mu);
    if (!d->healthy.load()) return;
    d->healthy.store(false);
    d->failure = status;
    // Jobs the poller has already claimed are its to finish.
    for (InFlight* flight : d->in_flight) {
      if (Claim(flight)) victims.insert(flight);
    }
    d->in_flight.clear();
  }
  LogLine(absl::StrCat("error: ", status.message(), "; failing ",
                       victims.size(), " requests in flight on it"));
  // A failed context never runs the jobs' host functions, so each job is
  // finished here. The InFlight records are left allocated on purpose: the
  // stream could in principle still reference them.
  for (InFlight* flight : victims) {
    flight->job->Done(status);
    d->memory->Release(flight->device_bytes);
    AtomicAddDouble(flight->lane->outstanding, -flight->estimate);
    flight->lease.Release();
    // The device is broken: nothing is dispatched on it again, so the
    // instance is never replayed; it goes with the engine.
    flight->graph_use.Break();
    flight->graph_use.Release();
  }
}

}  // namespace matmul
