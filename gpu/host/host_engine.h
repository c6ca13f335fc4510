// HostEngine: the Engine for machines without a GPU. OpenBLAS GEMM on a fixed
// number of worker lanes that play the role of CUDA streams: each lane has its
// own queue and thread, and jobs go to the lane with the least outstanding
// work. float16/bfloat16 are computed in float32 and rounded back (to nearest,
// ties to even); COMPUTE_MODE_TF32 is computed as strict float32.
#ifndef MATMUL_GPU_HOST_HOST_ENGINE_H_
#define MATMUL_GPU_HOST_HOST_ENGINE_H_

#include <atomic>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/engine.h"
// HostGemm, which the host engine's users (tests) call directly too.
#include "gpu/host/host_gemm.h"
#include "gpu/span_history.h"

namespace matmul {

struct HostEngineOptions {
  int lanes = 4;  // worker lanes ("streams")
};

// Thread-safe (see Engine).
class HostEngine final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<HostEngine>> Create(
      const HostEngineOptions& options);
  ~HostEngine() override;

  const EngineInfo& info() const override { return info_; }
  absl::Status CheckFits(const MatmulSpec& spec) const override;
  absl::Duration MinimumDuration(const MatmulSpec& spec) const override;
  void Submit(std::unique_ptr<MatmulJob> job) override;
  EngineStats stats() const override;
  std::vector<StreamSpan> RecentSpans(absl::Duration window) const override {
    return spans_.Recent(window);
  }
  absl::StatusOr<HostBuffer> AllocateHostBuffer(int64_t bytes) override;
  void Shutdown() override;

 private:
  class HostResidentTensor;
  struct Queued {
    std::unique_ptr<MatmulJob> job;
    absl::Time submitted;
  };
  struct Lane {
    absl::Mutex mu;
    absl::CondVar cv;
    std::deque<Queued> queue ABSL_GUARDED_BY(mu);
    double outstanding_flops ABSL_GUARDED_BY(mu) = 0;
    bool stopping ABSL_GUARDED_BY(mu) = false;
    std::thread thread;
    std::atomic<int64_t> jobs{0};
    std::atomic<int64_t> busy_ns{0};
  };

  explicit HostEngine(const HostEngineOptions& options);
  void Enqueue(std::unique_ptr<MatmulJob> job)
      ABSL_SHARED_LOCKS_REQUIRED(shutdown_mu_);
  void LaneLoop(int index);
  void Run(int lane, Queued queued);
  // A job done on lane `lane_index` from `start` to `end`: its span and
  // the lane's and engine's counters.
  void Account(int lane_index, DType dtype, double flops, absl::Time start,
               absl::Time end);
  void BeginBusy();
  void EndBusy();

  EngineInfo info_;
  std::vector<std::unique_ptr<Lane>> lanes_;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  // Device-level counters: the union of the lanes' busy intervals.
  mutable absl::Mutex busy_mu_;
  int active_lanes_ ABSL_GUARDED_BY(busy_mu_) = 0;
  absl::Time busy_since_ ABSL_GUARDED_BY(busy_mu_);
  absl::Duration busy_total_ ABSL_GUARDED_BY(busy_mu_);

  std::atomic<int64_t> queued_{0};
  std::atomic<int64_t> staging_used_{0};
  std::atomic<int64_t> resident_bytes_{0};
  std::array<std::atomic<double>, kNumDTypes> flops_{};
  std::atomic<int64_t> next_job_{1};
  SpanHistory spans_;
};

}  // namespace matmul

#endif  // MATMUL_GPU_HOST_HOST_ENGINE_H_
