#include "gpu/batching_engine.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <variant>

#include "absl/time/clock.h"

namespace matmul {
namespace {

// Several requests run as one strided-batched multiply.
class BatchJob final : public MatmulJob {
 public:
  BatchJob(BatchingEngine* engine,
           std::vector<std::unique_ptr<MatmulJob>> members)
      : MatmulJob(Describe(members)),
        engine_(engine),
        members_(std::move(members)),
        failed_(members_.size()),
        to_destinations_(
            std::get<MultiplyOp>(members_.front()->op()).c_destination !=
            nullptr) {}

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
    // The next batch goes out before this one's members are answered.
    engine_->JobFinished();
    if (!result.ok()) {
      for (auto& member : members_) member->Done(result.status());
      return;
    }
    const MatmulSpec& one = members_.front()->spec();
    const Placement placement = result->placement();
    StageTimings timings = result->timings();
    timings.share /= static_cast<double>(members_.size());
    const absl::Span<const std::byte> c = result->c();
    // Products written into the members' own memory come back empty.
    const size_t c_one = to_destinations_ ? 0 : one.c_bytes();
    // Members share the batch's staging; it goes when the last lets go.
    auto shared = std::make_shared<JobResult>(std::move(*result));
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!failed_[i].ok()) {
        members_[i]->Done(failed_[i]);
        continue;
      }
      members_[i]->Done(JobResult(c.subspan(i * c_one, c_one), placement,
                                  timings,
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
  // A plain multiply of every member's operands back to back, its product
  // returned: staged, or, for members whose operands are prestaged,
  // gathered by the engine from where each member keeps them, and each
  // member's product written into its own memory where it names some
  // (members of one batch all do or all do not: the batch key says so).
  static JobDescription Describe(
      const std::vector<std::unique_ptr<MatmulJob>>& members) {
    JobDescription d;
    d.spec = members.front()->spec();
    const int64_t n = static_cast<int64_t>(members.size());
    d.spec.batch = d.spec.a_batch = d.spec.b_batch = n;
    d.spec.c_is_3d = true;
    MultiplyOp multiply;
    for (const auto& member : members) {
      const MultiplyOp& op = std::get<MultiplyOp>(member->op());
      if (op.prestaged.has_value()) {
        multiply.gathered.push_back(
            GatheredMember{*op.prestaged, op.c_destination});
      }
    }
    d.op = std::move(multiply);
    d.shape_recurs = false;
    return d;
  }

  BatchingEngine* const engine_;
  std::vector<std::unique_ptr<MatmulJob>> members_;
  std::vector<absl::Status> failed_;
  const bool to_destinations_;
};

int SlotsOf(const Engine& engine, int slots) {
  if (slots > 0) return slots;
  const EngineInfo& info = engine.info();
  return std::max(1,
                  info.streams_per_device *
                      std::max<int>(1, static_cast<int>(info.devices.size())));
}

}  // namespace

// A request that goes out alone: itself, with the slot it holds given back
// when it is done.
class BatchingEngine::SoloJob final : public MatmulJob {
 public:
  SoloJob(BatchingEngine* engine, std::unique_ptr<MatmulJob> job)
      : MatmulJob(job->description()), engine_(engine), job_(std::move(job)) {}

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    return job_->WriteOperands(a, b);
  }
  void Done(absl::StatusOr<JobResult> result) override {
    engine_->JobFinished();
    job_->Done(std::move(result));
  }
  absl::Status Abandoned() const override { return job_->Abandoned(); }

 private:
  BatchingEngine* const engine_;
  const std::unique_ptr<MatmulJob> job_;
};

BatchingEngine::BatchingEngine(std::unique_ptr<Engine> inner,
                               const BatchingOptions& options)
    : inner_(std::move(inner)),
      options_(options),
      slots_(SlotsOf(*inner_, options.slots)) {
  flusher_ = std::thread([this] { FlushLoop(); });
}

BatchingEngine::~BatchingEngine() { Shutdown(); }

BatchingEngine::Key BatchingEngine::KeyOf(const MatmulJob& job) {
  const MatmulSpec& s = job.spec();
  const MultiplyOp& op = std::get<MultiplyOp>(job.op());
  const OperandKind kind = !op.prestaged.has_value() ? OperandKind::kStaged
                           : op.c_destination == nullptr
                               ? OperandKind::kPrestaged
                               : OperandKind::kPrestagedToDestination;
  return Key(static_cast<int>(s.dtype), static_cast<int>(s.compute), s.m, s.n,
             s.k, s.transpose_a, s.transpose_b, kind);
}

bool BatchingEngine::Eligible(const MatmulJob& job) const {
  const MatmulSpec& s = job.spec();
  const auto* mul = std::get_if<MultiplyOp>(&job.op());
  return mul != nullptr && mul->resident_a == nullptr &&
         mul->resident_b == nullptr && !mul->keep_result &&
         mul->c_target == nullptr && mul->gathered.empty() &&
         job.description().device < 0 && s.batch == 1 && s.a_batch == 1 &&
         s.b_batch == 1 && s.flops() <= options_.max_flops &&
         // A product destination only where the batch is gathered (a staged
         // batch returns its products from its staging).
         (mul->c_destination == nullptr ||
          (options_.gather_destinations && mul->prestaged.has_value())) &&
         // A prestaged request missing an operand fails alone, never a
         // gathered batch.
         (!mul->prestaged.has_value() ||
          (mul->prestaged->a != nullptr && mul->prestaged->b != nullptr));
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
      Group& group = groups_[KeyOf(*job)];
      if (options_.adaptive && group.jobs.empty() && in_flight_ < slots_) {
        // A free slot and nobody of its kind waiting: at once, alone.
        StartLaunch(1);
        full.push_back(std::move(job));
      } else {
        if (group.jobs.empty()) {
          group.deadline = absl::Now() + options_.window;
          wake_.Signal();
        }
        group.jobs.push_back(std::move(job));
        if (static_cast<int>(group.jobs.size()) >= options_.max_batch ||
            (options_.adaptive && in_flight_ < slots_)) {
          full.swap(group.jobs);
          StartLaunch(full.size());
        }
      }
    }
  }
  if (job != nullptr) {  // shutting down: the wrapped engine answers
    inner_->Submit(std::move(job));
    return;
  }
  if (!full.empty()) Launch(std::move(full));
}

void BatchingEngine::StartLaunch(size_t size) {
  ++in_flight_;
  size_t bucket = 0;
  while (bucket < kBatchSizeBounds.size() &&
         static_cast<int>(size) > kBatchSizeBounds[bucket]) {
    ++bucket;
  }
  ++launches_.counts[bucket];
  launches_.requests += static_cast<int64_t>(size);
  ++launches_.launches;
}

std::vector<std::unique_ptr<MatmulJob>> BatchingEngine::TakeOldestGroup() {
  std::vector<std::unique_ptr<MatmulJob>> jobs;
  if (in_flight_ >= slots_) return jobs;
  Group* oldest = nullptr;
  for (auto& [key, group] : groups_) {
    if (!group.jobs.empty() &&
        (oldest == nullptr || group.deadline < oldest->deadline)) {
      oldest = &group;
    }
  }
  if (oldest == nullptr) return jobs;
  return TakeGroup(KeyOf(*oldest->jobs.front()));
}

std::vector<std::unique_ptr<MatmulJob>> BatchingEngine::TakeGroup(
    const Key& key) {
  std::vector<std::unique_ptr<MatmulJob>> jobs;
  Group& group = groups_[key];
  const size_t n = std::min(
      group.jobs.size(), static_cast<size_t>(std::max(1, options_.max_batch)));
  jobs.reserve(n);
  for (size_t i = 0; i < n; ++i) jobs.push_back(std::move(group.jobs[i]));
  group.jobs.erase(group.jobs.begin(),
                   group.jobs.begin() + static_cast<std::ptrdiff_t>(n));
  if (!jobs.empty()) StartLaunch(jobs.size());
  return jobs;
}

void BatchingEngine::JobFinished() {
  std::vector<std::unique_ptr<MatmulJob>> next;
  {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    if (options_.adaptive && !stopping_) next = TakeOldestGroup();
  }
  if (!next.empty()) Launch(std::move(next));
}

EngineStats BatchingEngine::stats() const {
  EngineStats stats = inner_->stats();
  stats.batching = true;
  absl::MutexLock lock(&mu_);
  stats.batch_sizes = launches_;
  return stats;
}

void BatchingEngine::Launch(std::vector<std::unique_ptr<MatmulJob>> jobs) {
  if (jobs.size() == 1) {
    inner_->Submit(std::make_unique<SoloJob>(this, std::move(jobs.front())));
    return;
  }
  inner_->Submit(std::make_unique<BatchJob>(this, std::move(jobs)));
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
      std::vector<Key> expired;
      for (const auto& [key, group] : groups_) {
        if (!group.jobs.empty() && (stopping_ || group.deadline <= now)) {
          expired.push_back(key);
        }
      }
      for (const Key& key : expired) {
        // Past its window (or shutting down): out, slot or not, until
        // none is left (at most max_batch a launch).
        while (!groups_[key].jobs.empty()) {
          due.push_back(TakeGroup(key));
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
  // Requests that went out in launches of more than one.
  return launches_.requests - launches_.counts[0];
}

int64_t BatchingEngine::batches() const {
  absl::MutexLock lock(&mu_);
  return launches_.launches - launches_.counts[0];
}

}  // namespace matmul
