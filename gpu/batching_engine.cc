#include "gpu/batching_engine.h"

#include <cstring>
#include <utility>
#include <variant>

#include "absl/time/clock.h"

namespace matmul {
namespace {

// Several requests run as one strided-batched multiply.
class BatchJob final : public MatmulJob {
 public:
  explicit BatchJob(std::vector<std::unique_ptr<MatmulJob>> members)
      : MatmulJob(Describe(members)),
        members_(std::move(members)),
        failed_(members_.size()) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    const MatmulSpec& one = members_.front()->spec();
    for (size_t i = 0; i < members_.size(); ++i) {
      absl::Span<std::byte> a_i = a.subspan(i * one.a_bytes(), one.a_bytes());
      absl::Span<std::byte> b_i = b.subspan(i * one.b_bytes(), one.b_bytes());
      failed_[i] = members_[i]->WriteOperands(a_i, b_i);
      if (!failed_[i].ok()) {
        // A member that went away leaves zeros; its product is discarded.
        std::memset(a_i.data(), 0, a_i.size());
        std::memset(b_i.data(), 0, b_i.size());
      }
    }
    return absl::OkStatus();
  }

  void Done(absl::StatusOr<JobResult> result) override {
    if (!result.ok()) {
      for (auto& member : members_) member->Done(result.status());
      return;
    }
    const MatmulSpec& one = members_.front()->spec();
    const Placement placement = result->placement();
    const StageTimings timings = result->timings();
    const absl::Span<const std::byte> c = result->c();
    // Members share the batch's staging; it goes when the last lets go.
    auto shared = std::make_shared<JobResult>(std::move(*result));
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!failed_[i].ok()) {
        members_[i]->Done(failed_[i]);
        continue;
      }
      members_[i]->Done(JobResult(c.subspan(i * one.c_bytes(), one.c_bytes()),
                                  placement, timings,
                                  [shared]() mutable { shared.reset(); }));
    }
  }

  // The batch is abandoned only when every member is.
  absl::Status Abandoned() const override {
    absl::Status last;
    for (const auto& member : members_) {
      last = member->Abandoned();
      if (last.ok()) return last;
    }
    return last;
  }

 private:
  // A plain multiply (staged operands, result returned) of every member's
  // operands back to back.
  static JobDescription Describe(
      const std::vector<std::unique_ptr<MatmulJob>>& members) {
    JobDescription d;
    d.spec = members.front()->spec();
    const int64_t n = static_cast<int64_t>(members.size());
    d.spec.batch = d.spec.a_batch = d.spec.b_batch = n;
    d.spec.c_is_3d = true;
    d.op = MultiplyOp{};
    return d;
  }

  std::vector<std::unique_ptr<MatmulJob>> members_;
  std::vector<absl::Status> failed_;
};

}  // namespace

BatchingEngine::BatchingEngine(std::unique_ptr<Engine> inner,
                               const BatchingOptions& options)
    : inner_(std::move(inner)), options_(options) {
  flusher_ = std::thread([this] { FlushLoop(); });
}

BatchingEngine::~BatchingEngine() { Shutdown(); }

BatchingEngine::Key BatchingEngine::KeyOf(const MatmulSpec& s) {
  return Key(static_cast<int>(s.dtype), static_cast<int>(s.compute), s.m, s.n,
             s.k, s.transpose_a, s.transpose_b);
}

bool BatchingEngine::Eligible(const MatmulJob& job) const {
  const MatmulSpec& s = job.spec();
  const auto* mul = std::get_if<MultiplyOp>(&job.op());
  return mul != nullptr && mul->resident_a == nullptr &&
         mul->resident_b == nullptr && !mul->keep_result &&
         !mul->prestaged.has_value() && job.description().device < 0 &&
         s.batch == 1 && s.a_batch == 1 && s.b_batch == 1 &&
         s.flops() <= options_.max_flops;
}

void BatchingEngine::Submit(std::unique_ptr<MatmulJob> job) {
  if (!Eligible(*job)) {
    inner_->Submit(std::move(job));
    return;
  }
  std::vector<std::unique_ptr<MatmulJob>> full;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      Group& group = groups_[KeyOf(job->spec())];
      if (group.jobs.empty()) {
        group.deadline = absl::Now() + options_.window;
        wake_.Signal();
      }
      group.jobs.push_back(std::move(job));
      if (static_cast<int>(group.jobs.size()) >= options_.max_batch) {
        full.swap(group.jobs);
      }
    }
  }
  if (job != nullptr) {  // shutting down: the wrapped engine answers
    inner_->Submit(std::move(job));
    return;
  }
  if (!full.empty()) Launch(std::move(full));
}

void BatchingEngine::Launch(std::vector<std::unique_ptr<MatmulJob>> jobs) {
  if (jobs.size() == 1) {
    inner_->Submit(std::move(jobs.front()));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    batched_requests_ += static_cast<int64_t>(jobs.size());
    ++batches_;
  }
  inner_->Submit(std::make_unique<BatchJob>(std::move(jobs)));
}

void BatchingEngine::FlushLoop() {
  while (true) {
    std::vector<std::vector<std::unique_ptr<MatmulJob>>> due;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      absl::Time next = absl::InfiniteFuture();
      for (const auto& [key, group] : groups_) {
        if (!group.jobs.empty()) next = std::min(next, group.deadline);
      }
      if (!stopping_ && next > absl::Now()) {
        wake_.WaitWithDeadline(&mu_, next);
      }
      const absl::Time now = absl::Now();
      for (auto& [key, group] : groups_) {
        if (!group.jobs.empty() && (stopping_ || group.deadline <= now)) {
          due.push_back(std::move(group.jobs));
          group.jobs.clear();
        }
      }
      stop = stopping_;
    }
    for (auto& jobs : due) Launch(std::move(jobs));
    if (stop) return;
  }
}

void BatchingEngine::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    wake_.Signal();
  }
  if (flusher_.joinable()) flusher_.join();
  inner_->Shutdown();
}

int64_t BatchingEngine::batched_requests() const {
  absl::MutexLock lock(&mu_);
  return batched_requests_;
}

int64_t BatchingEngine::batches() const {
  absl::MutexLock lock(&mu_);
  return batches_;
}

}  // namespace matmul
