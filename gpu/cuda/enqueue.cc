// CudaEngine::Enqueue: one job's work on its stream, in order: the start
// event, stream-ordered device allocations, H2D copies of the staged operands
// (one copy when they lie back to back), the h2d_done event, the GEMM (or
// nothing, for transfers), the gemm_done event, the D2H copy of the result
// into staging, the end event, then the host function that completes the
// job; an untimed job (timed_job_every) records only the end event. A small
// multiply instead replays the CUDA graph instance it took in Dispatch
// (job_graph.h), which does the same work in one launch, then the end event
// and host function as above. Nothing here waits on the device.
#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <utility>
#include <variant>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gpu/cuda/cublas_gemm.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/lane.h"

namespace matmul {

void CudaEngine::Enqueue(InFlight* flight, const std::byte* host_a,
                         const std::byte* host_b) {
  const absl::Time enqueue_start = absl::Now();
  Device* d = flight->device;
  const MatmulSpec& spec = flight->spec;
  cudaStream_t stream = flight->lane->stream->stream.get();
  EventSet& ev = *flight->events;
  // Every check below names the device and the stream.
  const CudaSite site{d->index, flight->lane->index};
  {
    absl::MutexLock lock(&d->done_mu);
    d->in_flight.insert(flight);
  }
  const JobLayout& l = flight->layout;
  void* memory = nullptr;  // transient: staged operands, returned C
  // A small multiply replays the graph instance it took in Dispatch
  // (job_graph.h): its operands are in the instance's staging already, and
  // the graph records the instance's events, so one launch does it all.
  // The injected faults stand for the allocation and GEMM the graph does.
  const bool replayed = static_cast<bool>(flight->graph_use);
  if (replayed) {
    flight->status = [&]() -> absl::Status {
      RETURN_IF_ERROR(
          Inject(FaultInjector::Point::kDeviceAlloc, flight->job_id));
      RETURN_IF_ERROR(Inject(FaultInjector::Point::kGemm, flight->job_id));
      return flight->lane->graphs->Launch(*flight->graph_use.graph());
    }();
  }
  if (!replayed)
    flight->status = [&]() -> absl::Status {
      // An untimed job's set has only `end` (timing.h).
      if (ev.timed) {
        CUDA_RETURN_IF_ERROR_AT(site, cudaEventRecord(ev.start.get(), stream));
      }
      RETURN_IF_ERROR(
          Inject(FaultInjector::Point::kDeviceAlloc, flight->job_id));
      if (l.transient_bytes > 0) {
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMallocFromPoolAsync(
                      &memory, static_cast<size_t>(l.transient_bytes),
                      d->memory_pool, stream));
      }
      if (l.kept_bytes > 0) {
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMallocFromPoolAsync(&flight->kept,
                                          static_cast<size_t>(l.kept_bytes),
                                          d->memory_pool, stream));
      }
      auto* next = static_cast<std::byte*>(memory);
      auto carve = [&next](int64_t bytes) {
        std::byte* p = next;
        next += AlignUp(bytes, kDeviceAlignment);
        return p;
      };
      // The plan's byte_offset is 0 except for a download's source and an
      // upload's target.
      const std::byte* device_a =
          flight->resident_a
              ? static_cast<const std::byte*>(flight->resident_a->data()) +
                    l.byte_offset
          : flight->upload_target
              ? static_cast<const std::byte*>(flight->upload_target->data()) +
                    l.byte_offset
          : l.keeps_a ? static_cast<std::byte*>(flight->kept)
                      : carve(l.a_bytes);
      const std::byte* device_b =
          flight->resident_b
              ? static_cast<const std::byte*>(flight->resident_b->data())
          : l.stage_b ? carve(l.b_bytes)
                      : nullptr;
      // Both operands in one copy where they lie back to back in one
      // allocation (the job's staging, or prestaged operands that say so):
      // a prestaged A and B that merely adjoin may be two allocations,
      // which one copy must not span.
      // A gathered multiply whose every member keeps B right after A in one
      // allocation (as a job's staging does): member i's A and B go up in
      // one copy to the i-th place of [A_0 B_0][A_1 B_1]..., and the GEMM
      // steps over them with that stride.
      std::optional<GemmStrides> interleaved;
      if (l.gathered > 0) {
        // Each member's A and B, from where the member keeps them, to its
        // place among the batch's operands.
        const auto& members = std::get<MultiplyOp>(flight->job->op()).gathered;
        const int64_t a_one = l.a_bytes / l.gathered;
        const int64_t b_one = l.b_bytes / l.gathered;
        bool adjoining = true;
        for (const GatheredMember& member : members) {
          adjoining &= member.operands.one_allocation &&
                       member.operands.b == member.operands.a + a_one;
        }
        auto* device_ops = const_cast<std::byte*>(device_a);
        for (int64_t i = 0; i < l.gathered; ++i) {
          const PrestagedOperands& member =
              members[static_cast<size_t>(i)].operands;
          if (adjoining) {
            CUDA_RETURN_IF_ERROR_AT(
                site,
                cudaMemcpyAsync(device_ops + i * (a_one + b_one), member.a,
                                a_one + b_one, cudaMemcpyHostToDevice, stream));
            continue;
          }
          CUDA_RETURN_IF_ERROR_AT(
              site, cudaMemcpyAsync(device_ops + i * a_one, member.a, a_one,
                                    cudaMemcpyHostToDevice, stream));
          CUDA_RETURN_IF_ERROR_AT(
              site,
              cudaMemcpyAsync(const_cast<std::byte*>(device_b) + i * b_one,
                              member.b, b_one, cudaMemcpyHostToDevice, stream));
        }
        if (adjoining) {
          // The pair fits where A's and B's blocks were carved: B's block
          // starts at or after A's end.
          device_b = device_a + a_one;
          interleaved = l.strides;
          const int64_t pair = (a_one + b_one) / DTypeSize(spec.dtype);
          interleaved->stride_a = pair;
          interleaved->stride_b = pair;
        }
      } else if (l.stage_a && l.stage_b && flight->operands_one_allocation &&
                 OperandsContiguous(host_a, host_b, device_a, device_b,
                                    l.a_bytes)) {
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMemcpyAsync(const_cast<std::byte*>(device_a), host_a,
                                  l.a_bytes + l.b_bytes, cudaMemcpyHostToDevice,
                                  stream));
      } else {
        if (l.stage_a) {
          CUDA_RETURN_IF_ERROR_AT(
              site, cudaMemcpyAsync(const_cast<std::byte*>(device_a), host_a,
                                    l.a_bytes, cudaMemcpyHostToDevice, stream));
        }
        if (l.stage_b) {
          CUDA_RETURN_IF_ERROR_AT(
              site, cudaMemcpyAsync(const_cast<std::byte*>(device_b), host_b,
                                    l.b_bytes, cudaMemcpyHostToDevice, stream));
        }
      }
      if (l.allocate && options_.poison_outputs) {
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMemsetAsync(flight->kept, 0xff, spec.a_bytes(), stream));
      }
      if (ev.timed) {
        CUDA_RETURN_IF_ERROR_AT(site,
                                cudaEventRecord(ev.h2d_done.get(), stream));
      }
      const std::byte* device_c = device_a;  // download: C is A itself
      if (l.gemm) {
        std::byte* c =
            l.keep ? static_cast<std::byte*>(flight->kept) : carve(l.c_bytes);
        device_c = c;
        if (options_.poison_outputs) {
          CUDA_RETURN_IF_ERROR_AT(site,
                                  cudaMemsetAsync(c, 0xff, l.c_bytes, stream));
        }
        RETURN_IF_ERROR(Inject(FaultInjector::Point::kGemm, flight->job_id));
        if (l.group != nullptr) {
          // One launch for every member; its pointer table goes up first.
          auto* table = reinterpret_cast<void**>(carve(l.table_bytes));
          auto* host_table = reinterpret_cast<void**>(flight->lease.data() +
                                                      l.table_staging_offset);
          RETURN_IF_ERROR(EnqueueGroupedGemm(
              flight->lane->stream->cublas.get(), stream, *l.group, device_a,
              device_b, c, host_table, table, site));
        } else {
          RETURN_IF_ERROR(EnqueueGemm(
              flight->lane->stream->cublas.get(), spec, device_a, device_b, c,
              site, interleaved.has_value() ? &*interleaved : nullptr));
        }
      }
      if (ev.timed) {
        CUDA_RETURN_IF_ERROR_AT(site,
                                cudaEventRecord(ev.gemm_done.get(), stream));
      }
      if (l.return_c && l.gathered > 0 && l.c_to_destination) {
        // A gathered multiply's products, each into its member's memory.
        const auto& members = std::get<MultiplyOp>(flight->job->op()).gathered;
        const int64_t c_one = l.c_bytes / l.gathered;
        for (int64_t i = 0; i < l.gathered; ++i) {
          CUDA_RETURN_IF_ERROR_AT(
              site,
              cudaMemcpyAsync(members[static_cast<size_t>(i)].c_destination,
                              device_c + i * c_one, c_one,
                              cudaMemcpyDeviceToHost, stream));
        }
      } else if (l.return_c) {
        CUDA_RETURN_IF_ERROR_AT(
            site, cudaMemcpyAsync(flight->host_c, device_c, l.c_bytes,
                                  cudaMemcpyDeviceToHost, stream));
      }
      CUDA_RETURN_IF_ERROR_AT(site, cudaEventRecord(ev.end.get(), stream));
      return absl::OkStatus();
    }();
  // Freed in stream order: later work on any stream can reuse it. A free
  // that fails fails the job (its memory is then lost to the budget's
  // accounting, which only a broken context or a bug can cause).
  if (memory != nullptr) {
    absl::Status freed = CudaStatus(cudaFreeAsync(memory, stream),
                                    "cudaFreeAsync(memory, stream)", site);
    if (flight->status.ok()) flight->status = std::move(freed);
  }
  if (!flight->status.ok() && flight->kept != nullptr) {
    // The job has failed already; a second failure can only be logged.
    CUDA_LOG_IF_ERROR_AT(site, cudaFreeAsync(flight->kept, stream));
    flight->kept = nullptr;
  }
  // Set before the hand-off below, after which the job may be completed.
  flight->timings.enqueue = absl::ToDoubleSeconds(absl::Now() - enqueue_start);
  // Only a job whose every event was recorded may be polled: an event that
  // was not recorded (or still holds an earlier job's record) reads as done.
  // A small one is left to the poller alone: no host function, so the
  // stream does not wait for the driver's callback thread before its next
  // job. It may be completed and freed as soon as the lock below is let go.
  if (flight->status.ok() && options_.completion_poll > absl::ZeroDuration()) {
    const bool poll_only = options_.poll_only_max_bytes > 0 &&
                           l.moved_bytes <= options_.poll_only_max_bytes;
    absl::MutexLock lock(&d->done_mu);
    if (poll_only) {
      flight->host_function = false;
      flight->refs.store(1, std::memory_order_relaxed);  // the completer's
      ++d->poll_only_unclaimed;
    }
    flight->lane->unclaimed.push_back(flight);
    ++d->enqueued;
    d->poll_cv.SignalAll();  // the pollers; one watches this lane
    if (poll_only) return;
  }
  absl::Status launched =
      CudaStatus(cudaLaunchHostFunc(stream, OnStreamDone, flight),
                 "cudaLaunchHostFunc(stream, OnStreamDone, flight)", site);
  if (!launched.ok()) {
    // Error path only: wait for what was enqueued before handing back the
    // memory it reads, then complete here (unless the poller already has).
    // The job fails with the launch's error; a failed wait can only be
    // logged.
    CUDA_LOG_IF_ERROR_AT(site, cudaStreamSynchronize(stream));
    {
      absl::MutexLock lock(&d->done_mu);
      if (!flight->claimed && flight->status.ok()) {
        flight->status = std::move(launched);
      }
    }
    OnStreamDone(flight);
  }
}

}  // namespace matmul
