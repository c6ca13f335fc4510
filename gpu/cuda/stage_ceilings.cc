#include "gpu/cuda/stage_ceilings.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "common/status_macros.h"
#include "gpu/cuda/cublas_gemm.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/cuda_status.h"

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

}  // namespace matmul
