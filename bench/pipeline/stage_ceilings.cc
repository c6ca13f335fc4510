#include "bench/pipeline/stage_ceilings.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gpu/cuda/cublas_gemm.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/job_layout.h"

namespace matmul {
namespace {

// Times `enqueue` (which enqueues one repetition on `stream`) with events.
template <typename F>
absl::StatusOr<double> TimeOnStream(cudaStream_t stream, int reps, F enqueue) {
  absl::StatusOr<CudaEvent> start = CreateEvent();
  absl::StatusOr<CudaEvent> stop = CreateEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  for (int i = 0; i < 2; ++i) {  // warm-up
    if (absl::Status s = enqueue(); !s.ok()) return s;
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), stream));
  for (int i = 0; i < reps; ++i) {
    if (absl::Status s = enqueue(); !s.ok()) return s;
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), stream));
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop->get()));
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
  return ms * 1e-3 / reps;
}

int RepsFor(double estimate_s) {
  return static_cast<int>(
      std::clamp(0.3 / std::max(estimate_s, 1e-6), 5.0, 2000.0));
}

void CUDART_CB DoNothing(void*) {}

// Holds a stream until `open` is set (a host function on the stream, which
// the driver's callback thread runs).
void CUDART_CB WaitForGate(void* open) {
  auto* flag = static_cast<std::atomic<bool>*>(open);
  while (!flag->load(std::memory_order_acquire)) {
  }
}

}  // namespace

absl::StatusOr<StageCeilings> MeasureStageCeilings(
    const MatmulSpec& spec, int device,
    absl::FunctionRef<void(std::byte* operands)> fill) {
  ScopedDevice scoped(device);
  RETURN_IF_ERROR(scoped.status());
  absl::StatusOr<PinnedBuffer> host =
      PinnedBuffer::Allocate(spec.a_bytes() + spec.b_bytes() + spec.c_bytes());
  if (!host.ok()) return host.status();
  fill(host->data());
  absl::StatusOr<DeviceBuffer> dev =
      DeviceBuffer::Allocate(spec.a_bytes() + spec.b_bytes() + spec.c_bytes());
  if (!dev.ok()) return dev.status();
  absl::StatusOr<CudaStream> stream = CreateStream();
  absl::StatusOr<CublasHandle> cublas = CreateCublasHandle();
  absl::StatusOr<DeviceBuffer> workspace = DeviceBuffer::Allocate(32 << 20);
  if (!stream.ok()) return stream.status();
  if (!cublas.ok()) return cublas.status();
  if (!workspace.ok()) return workspace.status();
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas->get(), stream->get()));
  CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(cublas->get(), workspace->data(), workspace->size()));
  std::byte* h = host->data();
  auto* d = static_cast<std::byte*>(dev->data());
  const int64_t ab = spec.a_bytes() + spec.b_bytes();
  cudaStream_t s = stream->get();

  auto h2d = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, ab, cudaMemcpyHostToDevice, s));
    return absl::OkStatus();
  };
  auto gemm = [&]() -> absl::Status {
    return EnqueueGemm(cublas->get(), spec, d, d + spec.a_bytes(), d + ab);
  };
  auto d2h = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + ab, d + ab, spec.c_bytes(),
                                         cudaMemcpyDeviceToHost, s));
    return absl::OkStatus();
  };
  StageCeilings c;
  absl::StatusOr<double> t = TimeOnStream(s, 3, h2d);
  if (!t.ok()) return t.status();
  t = TimeOnStream(s, RepsFor(*t), h2d);
  if (!t.ok()) return t.status();
  c.h2d = *t;
  t = TimeOnStream(s, 3, gemm);
  if (!t.ok()) return t.status();
  t = TimeOnStream(s, RepsFor(*t), gemm);
  if (!t.ok()) return t.status();
  c.gemm = *t;
  t = TimeOnStream(s, 3, d2h);
  if (!t.ok()) return t.status();
  t = TimeOnStream(s, RepsFor(*t), d2h);
  if (!t.ok()) return t.status();
  c.d2h = *t;
  return c;
}

absl::StatusOr<Pipelined> MeasurePipelined(
    const MatmulSpec& spec, int device, int streams, int jobs_per_stream,
    const PipelinedWork& work,
    absl::FunctionRef<void(std::byte* operands)> fill) {
  if (streams < 1 || jobs_per_stream < 1) {
    return absl::InvalidArgumentError("streams and jobs must be positive");
  }
  if (work.events != 0 && work.events != 1 && work.events != 2 &&
      work.events != 4) {
    return absl::InvalidArgumentError("events per job must be 0, 1, 2 or 4");
  }
  ScopedDevice scoped(device);
  RETURN_IF_ERROR(scoped.status());
  const int64_t ab = spec.a_bytes() + spec.b_bytes();
  const int64_t abc = ab + spec.c_bytes();
  // A and B once (every job reads them); a C per stream.
  absl::StatusOr<PinnedBuffer> host =
      PinnedBuffer::Allocate(ab + streams * spec.c_bytes());
  if (!host.ok()) return host.status();
  fill(host->data());
  struct Lane {
    CudaStream stream;
    CublasHandle cublas;
    DeviceBuffer memory;     // A, B and C
    DeviceBuffer workspace;  // cuBLAS's
    CudaEvent end;
    std::vector<CudaEvent> job_events;  // PipelinedWork::events
  };
  cudaMemPool_t pool = nullptr;
  if (work.stream_ordered_memory) {
    CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = ~uint64_t{0};
    CUDA_RETURN_IF_ERROR(
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  std::vector<Lane> lanes;
  for (int i = 0; i < streams; ++i) {
    absl::StatusOr<CudaStream> stream = CreateStream();
    if (!stream.ok()) return stream.status();
    absl::StatusOr<CublasHandle> cublas = CreateCublasHandle();
    if (!cublas.ok()) return cublas.status();
    absl::StatusOr<DeviceBuffer> memory = DeviceBuffer::Allocate(abc);
    if (!memory.ok()) return memory.status();
    absl::StatusOr<DeviceBuffer> workspace = DeviceBuffer::Allocate(32 << 20);
    if (!workspace.ok()) return workspace.status();
    absl::StatusOr<CudaEvent> end = CreateEvent();
    if (!end.ok()) return end.status();
    CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas->get(), stream->get()));
    CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(cublas->get(), workspace->data(),
                                              workspace->size()));
    lanes.push_back(Lane{std::move(*stream),
                         std::move(*cublas),
                         std::move(*memory),
                         std::move(*workspace),
                         std::move(*end),
                         {}});
    for (int e = 0; e < 4; ++e) {
      absl::StatusOr<CudaEvent> event = CreateEvent(
          work.untimed_events ? cudaEventDisableTiming : cudaEventDefault);
      if (!event.ok()) return event.status();
      lanes.back().job_events.push_back(std::move(*event));
    }
  }
  absl::StatusOr<CudaEvent> start = CreateEvent();
  absl::StatusOr<CudaEvent> stop = CreateEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  cudaStream_t first = lanes[0].stream.get();
  // Stream-ordered memory is carved A, B, C as the engine carves it; the
  // lane's own buffer holds them back to back.
  const int64_t a_span = AlignUp(spec.a_bytes(), kDeviceAlignment);
  const int64_t b_span = AlignUp(spec.b_bytes(), kDeviceAlignment);
  auto job = [&](int i) -> absl::Status {
    Lane& lane = lanes[i];
    cudaStream_t s = lane.stream.get();
    // Event e of the engine's four (start, operands up, GEMM done, end),
    // where work.events has it.
    auto record = [&](int e) -> absl::Status {
      const bool recorded = work.events == 4 ||
                            (work.events == 2 && (e == 0 || e == 3)) ||
                            (work.events == 1 && e == 3);
      if (!recorded) return absl::OkStatus();
      CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.job_events[e].get(), s));
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(record(0));
    auto* d = static_cast<std::byte*>(lane.memory.data());
    std::byte* db = d + spec.a_bytes();
    std::byte* dc = d + ab;
    void* transient = nullptr;
    if (work.stream_ordered_memory) {
      CUDA_RETURN_IF_ERROR(cudaMallocFromPoolAsync(
          &transient, a_span + b_span + spec.c_bytes(), pool, s));
      d = static_cast<std::byte*>(transient);
      db = d + a_span;
      dc = db + b_span;
    }
    std::byte* c = host->data() + ab + i * spec.c_bytes();
    if (work.two_copies ||
        !OperandsContiguous(host->data(), host->data() + spec.a_bytes(), d, db,
                            spec.a_bytes())) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, host->data(), spec.a_bytes(),
                                           cudaMemcpyHostToDevice, s));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(db, host->data() + spec.a_bytes(),
                                           spec.b_bytes(),
                                           cudaMemcpyHostToDevice, s));
    } else {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(d, host->data(), ab, cudaMemcpyHostToDevice, s));
    }
    RETURN_IF_ERROR(record(1));
    RETURN_IF_ERROR(EnqueueGemm(lane.cublas.get(), spec, d, db, dc));
    RETURN_IF_ERROR(record(2));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(c, dc, spec.c_bytes(), cudaMemcpyDeviceToHost, s));
    RETURN_IF_ERROR(record(3));
    if (transient != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaFreeAsync(transient, s));
    }
    if (work.host_function) {
      CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(s, DoNothing, nullptr));
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < streams; ++i) RETURN_IF_ERROR(job(i));  // warm-up
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  Pipelined best;
  for (int run = 0; run < 3; ++run) {
    absl::Time enqueue_start;
    absl::Duration enqueue_time;
    std::atomic<bool> open{false};
    // Everything below waits for the gate, then for the start event.
    absl::Status enqueued = [&]() -> absl::Status {
      CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(first, WaitForGate, &open));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), first));
      for (int i = 1; i < streams; ++i) {
        CUDA_RETURN_IF_ERROR(
            cudaStreamWaitEvent(lanes[i].stream.get(), start->get(), 0));
      }
      enqueue_start = absl::Now();
      for (int j = 0; j < jobs_per_stream; ++j) {
        for (int i = 0; i < streams; ++i) RETURN_IF_ERROR(job(i));
      }
      enqueue_time = absl::Now() - enqueue_start;
      for (int i = 1; i < streams; ++i) {
        CUDA_RETURN_IF_ERROR(
            cudaEventRecord(lanes[i].end.get(), lanes[i].stream.get()));
        CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(first, lanes[i].end.get(), 0));
      }
      CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), first));
      return absl::OkStatus();
    }();
    open.store(true, std::memory_order_release);  // also after a failure
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    RETURN_IF_ERROR(enqueued);
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
    const double jobs = static_cast<double>(streams) * jobs_per_stream;
    const double per_job = ms * 1e-3 / jobs;
    const double enqueue = absl::ToDoubleSeconds(enqueue_time) / jobs;
    if (run == 0 || per_job < best.seconds_per_job) {
      best.seconds_per_job = per_job;
    }
    if (run == 0 || enqueue < best.enqueue_seconds_per_job) {
      best.enqueue_seconds_per_job = enqueue;
    }
  }
  return best;
}

}  // namespace matmul
