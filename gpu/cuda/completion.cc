// Device's completion: the completion threads (woken by the host
// function at the end of a job's stream work, and watching for a device
// whose context has failed), the poller (which answers small jobs sooner by
// querying their end events), Complete (event times into stage timings,
// stream busy time, spans and stats, then the job's result) and Fail.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/lane.h"
#include "gpu/cuda/resident_tensor.h"
#include "gpu/cuda/timing.h"

namespace matmul {

namespace {

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

// The jobs of `fronts` whose end event reads done. An event that reads done
// belongs to its job as long as the job is unclaimed: events go back to the
// spare list only in Complete.
void QueryFronts(int device,
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
                                {device, flight->lane->index}),
                     query_failures_logged);
    }
  }
}

}  // namespace

void Device::CompletionLoop() {
  if (absl::Status set =
          CudaStatus(cudaSetDevice(index_), "cudaSetDevice", {index_});
      !set.ok()) {
    Fail(set);  // its jobs fail now; this thread still drains
  }
  absl::Time last_progress = absl::Now();
  while (true) {
    InFlight* flight = nullptr;
    bool mine = false;  // this thread completes it (the poller has not)
    {
      absl::MutexLock lock(&done_mu_);
      while (done_.empty() && !(stopping_ && in_flight_.empty())) {
        if (done_cv_.WaitWithTimeout(&done_mu_, absl::Seconds(1)) &&
            done_.empty() && !in_flight_.empty()) {
          break;  // timed out with work in flight: look at the device below
        }
      }
      if (!done_.empty()) {
        flight = done_.front();
        done_.pop_front();
        in_flight_.erase(flight);
        mine = Claim(flight);
      } else if (stopping_ && in_flight_.empty()) {
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
      for (auto& lane : lanes_) {
        const cudaError_t error = cudaStreamQuery(lane->stream->stream.get());
        if (error != cudaSuccess && error != cudaErrorNotReady) {
          Fail(CudaStatus(error, "cudaStreamQuery", {index_, lane->index}));
          break;
        }
      }
    }
    clock_->MaybeRefresh(now);
  }
}

bool Device::WaitForFronts(
    const std::vector<Lane*>& lanes, PollState& state,
    std::vector<std::pair<InFlight*, cudaEvent_t>>& fronts) {
  absl::MutexLock lock(&done_mu_);
  while (true) {
    // Jobs without a host function are the poller's to finish, even while
    // the engine stops.
    if (stopping_ && !PollOnlyLeft(lanes)) return false;
    if (enqueued_ != state.seen) {
      state.seen = enqueued_;
      state.poll_until = absl::Now() + options_.completion_poll;
    }
    for (Lane* lane : lanes) {
      if (lane->unclaimed.empty()) continue;
      InFlight* front = lane->unclaimed.front();
      front->refs.fetch_add(1, std::memory_order_relaxed);
      fronts.emplace_back(front, front->events->end.get());
    }
    if (!fronts.empty() &&
        (absl::Now() < state.poll_until || poll_only_unclaimed_ > 0)) {
      return true;
    }
    for (auto& [flight, event] : fronts) Release(flight);
    fronts.clear();
    // Nothing to poll, or polling found nothing for a whole window: the
    // host functions complete what is in flight; wake at the next job.
    while (!stopping_ && enqueued_ == state.seen) {
      poll_cv_.Wait(&done_mu_);
    }
  }
}

void Device::ClaimOne(std::vector<InFlight*>& finished) {
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
      if (!flight->host_function) in_flight_.erase(flight);
    }
  }
}

void Device::PollLoop(int poller, int pollers) {
  if (absl::Status set =
          CudaStatus(cudaSetDevice(index_), "cudaSetDevice", {index_});
      !set.ok()) {
    Fail(set);
  }
  PollState state;
  std::vector<std::pair<InFlight*, cudaEvent_t>> fronts;
  std::vector<InFlight*> finished;
  std::vector<Lane*> lanes;  // this poller's share
  for (size_t i = poller; i < lanes_.size(); i += pollers) {
    lanes.push_back(lanes_[i].get());
  }
  while (true) {
    fronts.clear();
    if (!WaitForFronts(lanes, state, fronts)) return;
    finished.clear();
    QueryFronts(index_, fronts, finished);
    if (!finished.empty()) {
      absl::MutexLock lock(&done_mu_);
      ClaimOne(finished);
      state.poll_until = absl::Now() + options_.completion_poll;
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

void Device::Complete(InFlight* flight) {
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

absl::Status Device::CompletionStatus(InFlight* flight, EventTimes& ms) {
  absl::Status status = flight->status;
  if (status.ok()) {
    status = InjectFault(options_, FaultInjector::Point::kCompletion,
                         flight->job_id);
  }
  if (status.ok()) {
    if (absl::Status lost = InjectFault(
            options_, FaultInjector::Point::kContext, flight->job_id);
        !lost.ok()) {
      // This job is claimed (it is no longer in flight), so Fail
      // fails the others and this one fails here with the same status.
      Fail(lost);
      status = Failure();
    }
  }
  // An untimed job (CudaEngineOptions::timed_job_every) has no times.
  if (status.ok() && flight->events->timed) {
    const EventSet& ev = *flight->events;
    const cudaEvent_t events[4] = {ev.start.get(), ev.h2d_done.get(),
                                   ev.gemm_done.get(), ev.end.get()};
    for (int i = 0; i < 4 && status.ok(); ++i) {
      absl::StatusOr<double> t = clock_->DeviceMs(events[i]);
      if (t.ok()) {
        ms[i] = *t;
      } else {
        status = t.status();
      }
    }
  }
  return status;
}

void Device::ReleaseJobResources(InFlight* flight, const absl::Status& status) {
  if (!status.ok() && flight->kept != nullptr) {
    // The job fails with `status`; a failed free can only be logged.
    CUDA_LOG_IF_ERROR_AT(CudaSite{index_},
                         cudaFreeAsync(flight->kept, idle_stream_.get()));
    flight->kept = nullptr;
  }
  // Kept memory stays reserved: the resident tensor releases it.
  memory_->Release(flight->device_bytes -
                   (flight->kept != nullptr ? flight->layout.kept_bytes : 0));
  // A graph instance's events stay with the instance.
  if (flight->own_events != nullptr) {
    events_.Return(std::move(flight->own_events));
  }
  AtomicAddDouble(flight->lane->outstanding, -flight->estimate);
  flight->resident_a.reset();
  flight->resident_b.reset();
  flight->upload_target.reset();
}

void Device::Account(InFlight* flight, const EventTimes& ms, bool timed) {
  Lane* lane = flight->lane;
  const JobLayout& l = flight->layout;
  lane->jobs.fetch_add(1, std::memory_order_relaxed);
  h2d_bytes_.fetch_add(l.moved_bytes - l.c_out_bytes,
                       std::memory_order_relaxed);
  d2h_bytes_.fetch_add(l.c_out_bytes, std::memory_order_relaxed);
  if (l.gemm) {
    AtomicAddDouble(flops_[static_cast<int>(flight->spec.dtype)], l.flops);
  }
  if (!timed) return;
  SetDeviceStages(ms, flight->timings);
  AtomicAddDouble(lane->busy_seconds, (ms[3] - ms[0]) * 1e-3);
  busy_.Add(ms);
  const StreamSpan::Kind kinds[3] = {StreamSpan::Kind::kH2D,
                                     StreamSpan::Kind::kCompute,
                                     StreamSpan::Kind::kD2H};
  for (int i = 0; i < 3; ++i) {
    StreamSpan span;
    span.device = index_;
    span.stream = lane->index;
    span.kind = kinds[i];
    span.job = flight->job_id;
    span.start = clock_->WallTime(ms[i]);
    span.end = clock_->WallTime(ms[i + 1]);
    spans_->Add(span);
  }
}

JobResult Device::ResultOf(InFlight* flight) {
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
                   Placement{index_, flight->lane->index}, flight->timings,
                   std::move(release));
  if (flight->kept != nullptr) {
    result.set_resident(std::make_shared<CudaResidentTensor>(
        this, flight->spec.dtype, l.kept.batch, l.kept.rows, l.kept.cols,
        flight->kept, l.kept_bytes));
  }
  return result;
}

void Device::Fail(const absl::Status& cause) {
  const absl::Status status = absl::InternalError(
      absl::StrCat("GPU ", index_, " failed: ", cause.message()));
  std::set<InFlight*> victims;
  {
    absl::MutexLock lock(&done_mu_);
    if (!healthy_.load()) return;
    healthy_.store(false);
    failure_ = status;
    // Jobs the poller has already claimed are its to finish.
    for (InFlight* flight : in_flight_) {
      if (Claim(flight)) victims.insert(flight);
    }
    in_flight_.clear();
  }
  LogLine(absl::StrCat("error: ", status.message(), "; failing ",
                       victims.size(), " requests in flight on it"));
  // A failed context never runs the jobs' host functions, so each job is
  // finished here. The InFlight records are left allocated on purpose: the
  // stream could in principle still reference them.
  for (InFlight* flight : victims) {
    flight->job->Done(status);
    memory_->Release(flight->device_bytes);
    AtomicAddDouble(flight->lane->outstanding, -flight->estimate);
    flight->lease.Release();
    // The device is broken: nothing is dispatched on it again, so the
    // instance is never replayed; it goes with the engine.
    flight->graph_use.Break();
    flight->graph_use.Release();
  }
}

void Device::HandOff(InFlight* flight) {
  done_mu_.AssertHeld();
  flight->handed_off = true;
  --poll_only_unclaimed_;  // no longer the poller's to find
  std::deque<InFlight*>& unclaimed = flight->lane->unclaimed;
  auto it = std::find(unclaimed.begin(), unclaimed.end(), flight);
  if (it != unclaimed.end()) unclaimed.erase(it);
  // The reference a host function's path would hold; the completion
  // thread lets go of it.
  flight->refs.fetch_add(1, std::memory_order_relaxed);
  done_.push_back(flight);
  done_cv_.Signal();
}

bool Device::Claim(InFlight* flight) {
  if (flight->claimed) return false;
  flight->claimed = true;
  if (!flight->host_function && !flight->handed_off) {
    done_mu_.AssertHeld();
    --poll_only_unclaimed_;
  }
  std::deque<InFlight*>& unclaimed = flight->lane->unclaimed;
  auto it = std::find(unclaimed.begin(), unclaimed.end(), flight);
  if (it != unclaimed.end()) unclaimed.erase(it);
  return true;
}

}  // namespace matmul
