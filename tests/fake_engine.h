// Test support: an Engine whose jobs wait until the test lets them go, so
// tests can hold requests in flight, fail them on purpose, or observe
// cancellation. Released jobs are computed for real with HostGemm.
#ifndef MATMUL_TESTS_FAKE_ENGINE_H_
#define MATMUL_TESTS_FAKE_ENGINE_H_

#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <variant>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gpu/engine.h"
#include "gpu/host/host_engine.h"
#include "gpu/host/host_gemm.h"
#include "gpu/layout_planner.h"

namespace matmul::testing {

// Thread-safe.
class FakeEngine final : public Engine {
 public:
  FakeEngine() {
    info_.name = "fake";
    info_.streams_per_device = 1;
    info_.dtypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                    DType::kBFloat16};
    info_.devices.push_back(DeviceInfo{});
  }
  ~FakeEngine() override { Shutdown(); }

  const EngineInfo& info() const override { return info_; }
  absl::Status CheckFits(const MatmulSpec&) const override {
    return fits_status_;
  }
  absl::Duration MinimumDuration(const MatmulSpec&) const override {
    return minimum_duration_;
  }

  void Submit(std::unique_ptr<MatmulJob> job) override {
    {
      absl::MutexLock lock(&mu_);
      if (!shut_down_) {
        held_.push_back(std::move(job));
        return;
      }
    }
    job->Done(absl::UnavailableError("fake engine shut down"));
  }

  EngineStats stats() const override { return EngineStats{}; }
  std::vector<StreamSpan> RecentSpans(absl::Duration) const override {
    return {};
  }
  absl::StatusOr<HostBuffer> AllocateHostBuffer(int64_t bytes) override {
    auto* data = new std::byte[bytes];
    return HostBuffer(data, bytes, [data] { delete[] data; });
  }
  // Counts registrations, like an engine that pins (pinned stays false:
  // the fake reads host memory itself).
  absl::StatusOr<HostMemoryRegistration> RegisterHostMemory(void*,
                                                            int64_t) override {
    registered_.fetch_add(1, std::memory_order_relaxed);
    return HostMemoryRegistration(/*pinned=*/false, [this] {
      registered_.fetch_sub(1, std::memory_order_relaxed);
    });
  }
  // Registrations not yet released.
  int registered() const { return registered_.load(std::memory_order_relaxed); }

  void Shutdown() override {
    std::deque<std::unique_ptr<MatmulJob>> jobs;
    {
      absl::MutexLock lock(&mu_);
      shut_down_ = true;
      jobs.swap(held_);
    }
    for (auto& job : jobs) Run(std::move(job), absl::OkStatus());
  }

  // Blocks until `n` jobs are held.
  void WaitForHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return held_.size() >= n;
    };
    mu_.Await(absl::Condition(&enough));
  }

  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }

  // The description of the held job at `index` (0: the oldest).
  JobDescription held_description(size_t index) {
    absl::MutexLock lock(&mu_);
    return held_.at(index)->description();
  }

  // Runs (status OK) or fails (status not OK) the oldest held job.
  void ReleaseOne(absl::Status status = absl::OkStatus()) {
    std::unique_ptr<MatmulJob> job;
    {
      absl::MutexLock lock(&mu_);
      if (held_.empty()) return;
      job = std::move(held_.front());
      held_.pop_front();
    }
    Run(std::move(job), status);
  }

  absl::Status fits_status_ = absl::OkStatus();
  absl::Duration minimum_duration_ = absl::ZeroDuration();

 private:
  static void Run(std::unique_ptr<MatmulJob> job, absl::Status status) {
    if (absl::Status abandoned = job->Abandoned(); !abandoned.ok()) {
      job->Done(abandoned);
      return;
    }
    if (!status.ok()) {
      job->Done(status);
      return;
    }
    // Sizes from the plan.
    absl::StatusOr<LayoutPlan> plan = PlanLayout(job->description());
    if (!plan.ok()) {
      job->Done(plan.status());
      return;
    }
    auto staging = std::make_shared<std::vector<std::byte>>(
        plan->a_bytes + plan->b_bytes + plan->c_bytes);
    const std::byte* a = staging->data();
    const std::byte* b = a + plan->a_bytes;
    std::byte* c = staging->data() + plan->a_bytes + plan->b_bytes;
    const auto* mul = std::get_if<MultiplyOp>(&job->op());
    if (mul != nullptr && mul->prestaged.has_value()) {
      // Operands in the caller's host memory.
      a = mul->prestaged->a;
      b = mul->prestaged->b;
    } else if (mul != nullptr && !mul->gathered.empty()) {
      // A gathered batch: each member's operands into their place.
      const size_t members = mul->gathered.size();
      const size_t a_one = static_cast<size_t>(plan->a_bytes) / members;
      const size_t b_one = static_cast<size_t>(plan->b_bytes) / members;
      for (size_t i = 0; i < members; ++i) {
        std::memcpy(staging->data() + i * a_one, mul->gathered[i].operands.a,
                    a_one);
        std::memcpy(staging->data() + plan->a_bytes + i * b_one,
                    mul->gathered[i].operands.b, b_one);
      }
    } else {
      absl::Status written = job->WriteOperands(
          absl::MakeSpan(staging->data(), plan->a_bytes),
          absl::MakeSpan(staging->data() + plan->a_bytes, plan->b_bytes));
      if (!written.ok()) {
        job->Done(written);
        return;
      }
    }
    size_t c_returned = static_cast<size_t>(plan->c_bytes);
    if (mul != nullptr && mul->c_destination != nullptr) {
      c = mul->c_destination;
      c_returned = 0;
    }
    HostGemm(job->spec(), a, b, c);
    if (mul != nullptr && plan->c_to_destination && plan->gathered > 0) {
      // A gathered batch's products, each into its member's memory.
      const size_t c_one = static_cast<size_t>(plan->c_bytes / plan->gathered);
      for (size_t i = 0; i < mul->gathered.size(); ++i) {
        std::memcpy(mul->gathered[i].c_destination, c + i * c_one, c_one);
      }
      c_returned = 0;
    }
    job->Done(JobResult(absl::MakeConstSpan(c, c_returned), Placement{0, 0},
                        StageTimings{},
                        [staging]() mutable { staging.reset(); }));
  }

  EngineInfo info_;
  std::atomic<int> registered_{0};
  absl::Mutex mu_;
  std::deque<std::unique_ptr<MatmulJob>> held_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_FAKE_ENGINE_H_
