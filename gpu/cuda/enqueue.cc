// Device::Enqueue: one job's work on its stream, in order: the start
// event, stream-ordered device allocations, H2D copies of the staged operands
// (one copy when they lie back to back), the h2d_done event, the GEMM (or
// nothing, for transfers), the gemm_done event, the D2H copy of the result
// into staging, the end event, then the host function that completes the
// job; an untimed job (timed_job_every) records only the end event. A small
// multiply instead replays the CUDA graph instance it took in Dispatch
// (job_graph.h), which does the same work in one launch, then the end event
// and host function as above. Nothing here waits on the device.
//
// By kind: ReplayGraph (a small multiply's graph instance), StreamWork (every
// other job: staged or prestaged operands, a gathered multiply's members,
// transfers with no GEMM), then HandToCompletion (poller or host function).
#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <utility>
#include <variant>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gpu/cuda/cublas_gemm.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/in_flight.h"
#include "gpu/cuda/job_layout.h"
#include "gpu/cuda/lane.h"
#include "gpu/cuda/timing.h"

namespace matmul {
namespace {

// A small multiply replays the graph instance it took in Dispatch
// (job_graph.h): its operands are in the instance's staging already, and
// the graph records the instance's events, so one launch does it all.
// The injected faults stand for the allocation and GEMM the graph does.
absl::Status ReplayGraph(InFlight* flight, const CudaEngineOptions& options) {
  RETURN_IF_ERROR(
      InjectFault(options, FaultInjector::Point::kDeviceAlloc, flight->job_id));
  RETURN_IF_ERROR(
      InjectFault(options, FaultInjector::Point::kGemm, flight->job_id));
  return flight->lane->graphs->Launch(*flight->graph_use.graph());
}

// The stream work of a job that replays no graph, in stream order. Its
// transient device memory (staged operands, returned C) is the caller's to
// free in stream order once Enqueue has run, whatever it returned.
class StreamWork {
 public:
  StreamWork(InFlight* flight, const CudaEngineOptions& options,
             const CudaSite& site, cudaMemPool_t memory_pool)
      : flight_(*flight),
        options_(options),
        site_(site),
        memory_pool_(memory_pool),
        l_(flight->layout),
        spec_(flight->spec),
        ev_(*flight->events),
        stream_(flight->lane->stream->stream.get()) {}

  absl::Status Enqueue(const std::byte* host_a, const std::byte* host_b);
  void* transient() const { return memory_; }

 private:
  absl::Status Allocate();
  // The next block of the transient memory.
  std::byte* Carve(int64_t bytes) {
    std::byte* p = next_;
    next_ += AlignUp(bytes, kDeviceAlignment);
    return p;
  }
  // Where A and B are on the device (carving A's block, then B's).
  void PlaceOperands();
  absl::Status UploadOperands(const std::byte* host_a, const std::byte* host_b);
  absl::Status UploadGathered();
  // The GEMM into C; sets device_c_.
  absl::Status Multiply();
  absl::Status ReturnProduct();
  absl::Status Record(const CudaEvent& event) {
    CUDA_RETURN_IF_ERROR_AT(site_, cudaEventRecord(event.get(), stream_));
    return absl::OkStatus();
  }

  InFlight& flight_;
  const CudaEngineOptions& options_;
  const CudaSite site_;
  cudaMemPool_t memory_pool_;
  const JobLayout& l_;
  const MatmulSpec& spec_;
  EventSet& ev_;
  cudaStream_t stream_;
  void* memory_ = nullptr;  // transient: staged operands, returned C
  std::byte* next_ = nullptr;
  const std::byte* device_a_ = nullptr;
  const std::byte* device_b_ = nullptr;
  const std::byte* device_c_ = nullptr;
  // A gathered multiply's strides over interleaved operands (UploadGathered).
  std::optional<GemmStrides> interleaved_;
};

absl::Status StreamWork::Enqueue(const std::byte* host_a,
                                 const std::byte* host_b) {
  // An untimed job's set has only `end` (timing.h).
  if (ev_.timed) RETURN_IF_ERROR(Record(ev_.start));
  RETURN_IF_ERROR(Allocate());
  PlaceOperands();
  if (l_.gathered > 0) {
    RETURN_IF_ERROR(UploadGathered());
  } else {
    RETURN_IF_ERROR(UploadOperands(host_a, host_b));
  }
  if (l_.allocate && options_.poison_outputs) {
    CUDA_RETURN_IF_ERROR_AT(
        site_, cudaMemsetAsync(flight_.kept, 0xff, spec_.a_bytes(), stream_));
  }
  if (ev_.timed) RETURN_IF_ERROR(Record(ev_.h2d_done));
  device_c_ = device_a_;  // download: C is A itself
  if (l_.gemm) RETURN_IF_ERROR(Multiply());
  if (ev_.timed) RETURN_IF_ERROR(Record(ev_.gemm_done));
  RETURN_IF_ERROR(ReturnProduct());
  return Record(ev_.end);
}

absl::Status StreamWork::Allocate() {
  RETURN_IF_ERROR(InjectFault(options_, FaultInjector::Point::kDeviceAlloc,
                              flight_.job_id));
  cudaMemPool_t pool = memory_pool_;
  if (l_.transient_bytes > 0) {
    CUDA_RETURN_IF_ERROR_AT(
        site_,
        cudaMallocFromPoolAsync(
            &memory_, static_cast<size_t>(l_.transient_bytes), pool, stream_));
  }
  if (l_.kept_bytes > 0) {
    CUDA_RETURN_IF_ERROR_AT(
        site_,
        cudaMallocFromPoolAsync(
            &flight_.kept, static_cast<size_t>(l_.kept_bytes), pool, stream_));
  }
  next_ = static_cast<std::byte*>(memory_);
  return absl::OkStatus();
}

void StreamWork::PlaceOperands() {
  // The plan's byte_offset is 0 except for a download's source and an
  // upload's target.
  device_a_ =
      flight_.resident_a
          ? static_cast<const std::byte*>(flight_.resident_a->data()) +
                l_.byte_offset
      : flight_.upload_target
          ? static_cast<const std::byte*>(flight_.upload_target->data()) +
                l_.byte_offset
      : l_.keeps_a ? static_cast<std::byte*>(flight_.kept)
                   : Carve(l_.a_bytes);
  device_b_ = flight_.resident_b
                  ? static_cast<const std::byte*>(flight_.resident_b->data())
              : l_.stage_b ? Carve(l_.b_bytes)
                           : nullptr;
}

// Both operands in one copy where they lie back to back in one allocation
// (the job's staging, or prestaged operands that say so): a prestaged A and
// B that merely adjoin may be two allocations, which one copy must not span.
absl::Status StreamWork::UploadOperands(const std::byte* host_a,
                                        const std::byte* host_b) {
  if (l_.stage_a && l_.stage_b && flight_.operands_one_allocation &&
      OperandsContiguous(host_a, host_b, device_a_, device_b_, l_.a_bytes)) {
    CUDA_RETURN_IF_ERROR_AT(
        site_, cudaMemcpyAsync(const_cast<std::byte*>(device_a_), host_a,
                               l_.a_bytes + l_.b_bytes, cudaMemcpyHostToDevice,
                               stream_));
    return absl::OkStatus();
  }
  if (l_.stage_a) {
    CUDA_RETURN_IF_ERROR_AT(
        site_, cudaMemcpyAsync(const_cast<std::byte*>(device_a_), host_a,
                               l_.a_bytes, cudaMemcpyHostToDevice, stream_));
  }
  if (l_.stage_b) {
    CUDA_RETURN_IF_ERROR_AT(
        site_, cudaMemcpyAsync(const_cast<std::byte*>(device_b_), host_b,
                               l_.b_bytes, cudaMemcpyHostToDevice, stream_));
  }
  return absl::OkStatus();
}

// Each member's A and B, from where the member keeps them, to its place
// among the batch's operands. A gathered multiply whose every member keeps B
// right after A in one allocation (as a job's staging does): member i's A
// and B go up in one copy to the i-th place of [A_0 B_0][A_1 B_1]..., and
// the GEMM steps over them with that stride.
absl::Status StreamWork::UploadGathered() {
  const auto& members = std::get<MultiplyOp>(flight_.job->op()).gathered;
  const int64_t a_one = l_.a_bytes / l_.gathered;
  const int64_t b_one = l_.b_bytes / l_.gathered;
  bool adjoining = true;
  for (const GatheredMember& member : members) {
    adjoining &= member.operands.one_allocation &&
                 member.operands.b == member.operands.a + a_one;
  }
  auto* device_ops = const_cast<std::byte*>(device_a_);
  for (int64_t i = 0; i < l_.gathered; ++i) {
    const PrestagedOperands& member = members[static_cast<size_t>(i)].operands;
    if (adjoining) {
      CUDA_RETURN_IF_ERROR_AT(
          site_,
          cudaMemcpyAsync(device_ops + i * (a_one + b_one), member.a,
                          a_one + b_one, cudaMemcpyHostToDevice, stream_));
      continue;
    }
    CUDA_RETURN_IF_ERROR_AT(
        site_, cudaMemcpyAsync(device_ops + i * a_one, member.a, a_one,
                               cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR_AT(
        site_,
        cudaMemcpyAsync(const_cast<std::byte*>(device_b_) + i * b_one, member.b,
                        b_one, cudaMemcpyHostToDevice, stream_));
  }
  if (adjoining) {
    // The pair fits where A's and B's blocks were carved: B's block starts
    // at or after A's end.
    device_b_ = device_a_ + a_one;
    interleaved_ = l_.strides;
    const int64_t pair = (a_one + b_one) / DTypeSize(spec_.dtype);
    interleaved_->stride_a = pair;
    interleaved_->stride_b = pair;
  }
  return absl::OkStatus();
}

absl::Status StreamWork::Multiply() {
  // A product in place (MultiplyOp::c_target: a client's imported GPU
  // memory) is written there by the GEMM itself, with no copy.
  std::byte* c =
      l_.keep ? static_cast<std::byte*>(flight_.kept)
      : l_.c_in_place
          ? static_cast<std::byte*>(const_cast<void*>(
                std::get<MultiplyOp>(flight_.job->op()).c_target->data()))
          : Carve(l_.c_bytes);
  device_c_ = c;
  if (options_.poison_outputs) {
    CUDA_RETURN_IF_ERROR_AT(site_,
                            cudaMemsetAsync(c, 0xff, l_.c_bytes, stream_));
  }
  RETURN_IF_ERROR(
      InjectFault(options_, FaultInjector::Point::kGemm, flight_.job_id));
  cublasHandle_t cublas = flight_.lane->stream->cublas.get();
  return EnqueueGemm(cublas, spec_, device_a_, device_b_, c, site_,
                     interleaved_.has_value() ? &*interleaved_ : nullptr);
}

absl::Status StreamWork::ReturnProduct() {
  if (!l_.return_c) return absl::OkStatus();
  if (l_.gathered > 0 && l_.c_to_destination) {
    // A gathered multiply's products, each into its member's memory.
    const auto& members = std::get<MultiplyOp>(flight_.job->op()).gathered;
    const int64_t c_one = l_.c_bytes / l_.gathered;
    for (int64_t i = 0; i < l_.gathered; ++i) {
      CUDA_RETURN_IF_ERROR_AT(
          site_, cudaMemcpyAsync(members[static_cast<size_t>(i)].c_destination,
                                 device_c_ + i * c_one, c_one,
                                 cudaMemcpyDeviceToHost, stream_));
    }
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR_AT(site_,
                          cudaMemcpyAsync(flight_.host_c, device_c_, l_.c_bytes,
                                          cudaMemcpyDeviceToHost, stream_));
  return absl::OkStatus();
}

}  // namespace

void Device::Enqueue(InFlight* flight, const std::byte* host_a,
                     const std::byte* host_b) {
  const absl::Time enqueue_start = absl::Now();
  cudaStream_t stream = flight->lane->stream->stream.get();
  // Every check below names the device and the stream.
  const CudaSite site{index_, flight->lane->index};
  {
    absl::MutexLock lock(&done_mu_);
    in_flight_.insert(flight);
  }
  void* memory = nullptr;  // transient: staged operands, returned C
  if (flight->graph_use) {
    flight->status = ReplayGraph(flight, options_);
  } else {
    StreamWork work(flight, options_, site, memory_pool_);
    flight->status = work.Enqueue(host_a, host_b);
    memory = work.transient();
  }
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
  HandToCompletion(flight, site);
}

void Device::HandToCompletion(InFlight* flight, const CudaSite& site) {
  cudaStream_t stream = flight->lane->stream->stream.get();
  // Only a job whose every event was recorded may be polled: an event that
  // was not recorded (or still holds an earlier job's record) reads as done.
  // A small one is left to the poller alone: no host function, so the
  // stream does not wait for the driver's callback thread before its next
  // job. It may be completed and freed as soon as the lock below is let go.
  if (flight->status.ok() && options_.completion_poll > absl::ZeroDuration()) {
    const bool poll_only =
        options_.poll_only_max_bytes > 0 &&
        flight->layout.moved_bytes <= options_.poll_only_max_bytes;
    absl::MutexLock lock(&done_mu_);
    if (poll_only) {
      flight->host_function = false;
      flight->refs.store(1, std::memory_order_relaxed);  // the completer's
      ++poll_only_unclaimed_;
    }
    flight->lane->unclaimed.push_back(flight);
    ++enqueued_;
    poll_cv_.SignalAll();  // the pollers; one watches this lane
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
      absl::MutexLock lock(&done_mu_);
      if (!flight->claimed && flight->status.ok()) {
        flight->status = std::move(launched);
      }
    }
    OnStreamDone(flight);
  }
}

void CUDART_CB Device::OnStreamDone(void* user_data) {
  auto* flight = static_cast<InFlight*>(user_data);
  Device* device = flight->device;
  absl::MutexLock lock(&device->done_mu_);
  device->done_.push_back(flight);
  device->done_cv_.Signal();
}

}  // namespace matmul
