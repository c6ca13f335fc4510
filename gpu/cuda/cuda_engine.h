// CudaEngine: the Engine on NVIDIA GPUs. One process drives every visible
// GPU; each has a StreamPool (streams with their own cuBLAS handle and
// workspace), a PinnedPool of staging memory allocated once at start, and a
// stream-ordered device memory pool.
//
// A job's path: Submit picks the stream with the least outstanding work (on
// any device that can hold the job) and queues the job on that stream's lane
// thread. The lane leases device memory and pinned staging (waiting while the
// device is full), has the job write its operands into the pinned slot (one
// copy), and enqueues on its stream: H2D A and B -> GEMM -> D2H C into the
// slot, with CUDA events between the stages, then a host function. The lane
// goes straight on to the next job, so while one stream computes another's
// copy runs (the H200 has three copy engines). A small job whose stream is
// idle, and whose memory and staging are free at once, skips the lane: the
// submitting thread does the same steps itself (one thread hand-off less).
//
// A job is completed (event timestamps read, stream busy time accounted, the
// job finished) exactly once, by whichever sees its end first: one of the
// device's pollers (each watching its share of the lanes), which query the end
// events of jobs in flight for a short while after each enqueue or completion,
// or the completion threads, which the host function wakes. The poller answers
// small jobs without the host function's and the wake-up's latency; the host
// function covers long jobs and a poller that is asleep or off. No thread ever
// waits on the device for a request.
//
// Thread-safe.
//
// The engine is in parts under gpu/cuda/: CudaEngine (this file) opens the
// devices and routes each job to a lane of one of them (Submit, PickLane);
// Device (device.h) is one GPU with its pools, memory budget, clock, lanes,
// completion threads and pollers, which does a job's dispatch
// (dispatch.cc), stream work (enqueue.cc) and completion (completion.cc);
// lane.h, in_flight.h, job_layout.h, timing.h, stream_pool.h,
// pinned_pool.h, cublas_gemm.h are its parts; cuda_engine_options.h the
// options.
#ifndef MATMUL_GPU_CUDA_CUDA_ENGINE_H_
#define MATMUL_GPU_CUDA_CUDA_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/cuda/cuda_engine_options.h"
#include "gpu/cuda/imported_memory.h"
#include "gpu/engine.h"
#include "gpu/span_history.h"

namespace matmul {

class Device;
struct JobLayout;
struct Lane;

class CudaEngine final : public Engine {
 public:
  // FAILED_PRECONDITION when no GPU is visible.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(
      const CudaEngineOptions& options);
  ~CudaEngine() override;

  const EngineInfo& info() const override { return info_; }
  absl::Status CheckFits(const MatmulSpec& spec) const override;
  absl::Duration MinimumDuration(const MatmulSpec& spec) const override;
  void Submit(std::unique_ptr<MatmulJob> job) override;
  EngineStats stats() const override;
  std::vector<StreamSpan> RecentSpans(absl::Duration window) const override {
    return spans_.Recent(window);
  }
  absl::StatusOr<HostBuffer> AllocateHostBuffer(int64_t bytes) override;
  // cudaHostRegister(cudaHostRegisterPortable); unregistered when the
  // registration goes.
  absl::StatusOr<HostMemoryRegistration> RegisterHostMemory(
      void* data, int64_t bytes) override;
  // cudaIpcOpenMemHandle on the device whose UUID is `device_uuid`, once
  // per handle (ImportedMemoryTable).
  absl::StatusOr<std::shared_ptr<ResidentTensor>> ImportDeviceMemory(
      absl::Span<const std::byte> ipc_handle, int64_t bytes,
      absl::Span<const std::byte> device_uuid) override;
  void Shutdown() override;

 private:
  explicit CudaEngine(const CudaEngineOptions& options);
  absl::Status Init();
  // The lane with the least outstanding work on a healthy device that can
  // hold `spec`; null if none.
  Lane* PickLane(const JobLayout& layout) const;

  const CudaEngineOptions options_;
  EngineInfo info_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<Lane*> lanes_;  // every device's lanes, owned by the devices
  SpanHistory spans_;
  ImportedMemoryTable imported_;
  std::atomic<int64_t> next_job_{1};
  // Submit holds it shared while it enqueues; Shutdown exclusively.
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_CUDA_ENGINE_H_
