#include "gpu/host/host_engine.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/mapped_copy.h"
#include "common/status_macros.h"
#include "gpu/layout_planner.h"

namespace matmul {
namespace {

void AtomicAdd(std::atomic<double>& target, double delta) {
  double old = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(old, old + delta,
                                       std::memory_order_relaxed)) {
  }
}

std::string CpuName() {
  // The host "device" is named after the processor, as /proc/cpuinfo has it.
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return "host CPU";
  char line[512];
  std::string name = "host CPU";
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "model name", 10) == 0) {
      const char* colon = std::strchr(line, ':');
      if (colon != nullptr) {
        name = colon + 1;
        name.erase(0, name.find_first_not_of(" \t"));
        name.erase(name.find_last_not_of(" \t\n") + 1);
      }
      break;
    }
  }
  std::fclose(f);
  return name;
}

// A host job's memory and where its operands and result are: staged
// (copied in by the job, or prestaged by the caller), resident (engine
// memory kept between requests), or, for the result, returned in staging.
struct HostJobMemory {
  // Host memory is the engine's memory: an upload's A is written straight
  // into its final place, so its staging holds nothing.
  int64_t staging_bytes = 0;
  std::unique_ptr<std::byte[]> staging;
  std::unique_ptr<std::byte[]> kept;
  std::byte* a_slot = nullptr;
  std::byte* b_slot = nullptr;
  const std::byte* a = nullptr;
  const std::byte* b = nullptr;
  std::byte* c = nullptr;
  // Private copies of prestaged operands and of a product that goes to a
  // destination (TakePrivateOperands, TakePrivateProduct).
  std::unique_ptr<std::byte[]> private_a, private_b, private_c;
};

// Allocates the job's staging and kept memory and places its operands and
// result; RESOURCE_EXHAUSTED when the memory is not there.
absl::Status PlaceHostJob(const LayoutPlan& plan, const MatmulJob& job,
                          const ResidentOperands& resident,
                          HostJobMemory& mem) {
  const bool upload = plan.upload;
  const std::optional<PrestagedOperands> prestaged =
      PrestagedOf(job.description());
  const int64_t bytes = upload ? 0 : plan.staging_bytes;
  const int64_t kept_bytes = plan.kept_tensor_bytes;
  mem.staging_bytes = bytes;
  mem.staging.reset(new (std::nothrow) std::byte[bytes]);
  if (kept_bytes > 0) mem.kept.reset(new (std::nothrow) std::byte[kept_bytes]);
  if (mem.staging == nullptr || (kept_bytes > 0 && mem.kept == nullptr)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host engine: cannot allocate ", bytes + kept_bytes,
                     " bytes of memory"));
  }
  std::byte* staging = mem.staging.get();
  mem.a_slot = resident.target != nullptr
                   ? static_cast<std::byte*>(
                         const_cast<void*>(resident.target->data())) +
                         plan.byte_offset
               : upload ? mem.kept.get()
                        : staging;
  mem.b_slot = staging + (upload ? 0 : plan.b_staging_offset());
  // The plan's byte_offset is 0 except for a download's source (and an
  // upload's target, above).
  mem.a = resident.a ? static_cast<const std::byte*>(resident.a->data()) +
                           plan.byte_offset
          : prestaged ? prestaged->a
                      : mem.a_slot;
  mem.b = resident.b  ? static_cast<const std::byte*>(resident.b->data())
          : prestaged ? prestaged->b
                      : mem.b_slot;
  mem.c = plan.keep ? mem.kept.get()
          : plan.c_in_place
              ? static_cast<std::byte*>(const_cast<void*>(resident.c->data()))
          : plan.c_to_destination
              ? std::get<MultiplyOp>(job.op()).c_destination
              : staging + (upload ? 0 : plan.c_staging_offset());
  return absl::OkStatus();
}

// Copies one prestaged operand into memory of the job's own.
absl::Status TakeOperand(const std::byte*& operand, int64_t size,
                         std::unique_ptr<std::byte[]>& copy, const char* name) {
  copy.reset(new (std::nothrow) std::byte[static_cast<size_t>(size)]);
  if (copy == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host engine: cannot allocate ", size, " bytes for ", name));
  }
  absl::Status s =
      CopyMappedMemory(copy.get(), operand, static_cast<size_t>(size), name);
  operand = copy.get();
  return s;
}

// Prestaged operands and a product's destination may be a client's
// shared-memory object, which its client can truncate under us: they are
// copied in and out with CopyMappedMemory (a fault there fails this job,
// not the process), never read by the GEMM's threads in place.
absl::Status TakePrivateOperands(const LayoutPlan& plan, const MatmulJob& job,
                                 const ResidentOperands& resident,
                                 HostJobMemory& mem) {
  if (!plan.prestaged || !plan.gemm) return absl::OkStatus();
  const MatmulSpec& spec = job.spec();
  if (plan.gathered == 0) {
    absl::Status taken;
    if (!resident.a) {
      taken = TakeOperand(mem.a, spec.a_bytes(), mem.private_a, "operand a");
    }
    if (!resident.b && taken.ok()) {
      taken = TakeOperand(mem.b, spec.b_bytes(), mem.private_b, "operand b");
    }
    return taken;
  }
  // A gathered multiply: each member's operands, from where it keeps them,
  // into their place in one A and one B of this job's own.
  const auto& members = std::get<MultiplyOp>(job.op()).gathered;
  const int64_t a_one = spec.a_bytes() / plan.gathered;
  const int64_t b_one = spec.b_bytes() / plan.gathered;
  mem.private_a.reset(new (std::nothrow)
                          std::byte[static_cast<size_t>(spec.a_bytes())]);
  mem.private_b.reset(new (std::nothrow)
                          std::byte[static_cast<size_t>(spec.b_bytes())]);
  absl::Status written;
  if (mem.private_a == nullptr || mem.private_b == nullptr) {
    written = absl::ResourceExhaustedError(
        "host engine: cannot allocate memory for the batch's operands");
  }
  for (int64_t i = 0; i < plan.gathered && written.ok(); ++i) {
    const PrestagedOperands& member = members[static_cast<size_t>(i)].operands;
    written = CopyMappedMemory(mem.private_a.get() + i * a_one, member.a,
                               static_cast<size_t>(a_one), "operand a");
    if (written.ok()) {
      written = CopyMappedMemory(mem.private_b.get() + i * b_one, member.b,
                                 static_cast<size_t>(b_one), "operand b");
    }
  }
  mem.a = mem.private_a.get();
  mem.b = mem.private_b.get();
  return written;
}

// A product that goes to a destination (each gathered member's, or the
// job's) is made in memory of the job's own and copied out
// (CopyProductOut). Returns where it goes, null for the job's own.
absl::StatusOr<std::byte*> TakePrivateProduct(const LayoutPlan& plan,
                                              const MatmulSpec& spec,
                                              HostJobMemory& mem) {
  const bool gathered_out = plan.c_to_destination && plan.gathered > 0;
  std::byte* const destination =
      plan.c_to_destination && !gathered_out ? mem.c : nullptr;
  if (destination == nullptr && !gathered_out) return nullptr;
  mem.private_c.reset(new (std::nothrow)
                          std::byte[static_cast<size_t>(spec.c_bytes())]);
  if (mem.private_c == nullptr) {
    return absl::ResourceExhaustedError(
        "host engine: cannot allocate memory for the product");
  }
  mem.c = mem.private_c.get();
  return destination;
}

// The product out to `destination`, or a gathered multiply's products each
// into its member's memory; then `mem.c` is where the product lies.
absl::Status CopyProductOut(const LayoutPlan& plan, const MatmulJob& job,
                            std::byte* destination, HostJobMemory& mem) {
  const MatmulSpec& spec = job.spec();
  if (destination != nullptr) {
    RETURN_IF_ERROR(CopyMappedMemory(
        destination, mem.c, static_cast<size_t>(spec.c_bytes()), "product c"));
    mem.c = destination;
    return absl::OkStatus();
  }
  if (!plan.c_to_destination || plan.gathered == 0) return absl::OkStatus();
  const auto& members = std::get<MultiplyOp>(job.op()).gathered;
  const int64_t c_one = spec.c_bytes() / plan.gathered;
  absl::Status out;
  for (int64_t i = 0; i < plan.gathered && out.ok(); ++i) {
    out = CopyMappedMemory(members[static_cast<size_t>(i)].c_destination,
                           mem.c + i * c_one, static_cast<size_t>(c_one),
                           "product c");
  }
  return out;
}

}  // namespace

// Host memory kept between requests; counted as the host's "device" memory.
class HostEngine::HostResidentTensor final : public ResidentTensor {
 public:
  HostResidentTensor(HostEngine* engine, DType dtype, int64_t batch,
                     int64_t rows, int64_t cols,
                     std::unique_ptr<std::byte[]> data)
      : ResidentTensor(-1, dtype, batch, rows, cols, data.get()),
        engine_(engine),
        data_(std::move(data)) {
    engine_->resident_bytes_.fetch_add(bytes(), std::memory_order_relaxed);
  }
  ~HostResidentTensor() override {
    engine_->resident_bytes_.fetch_sub(bytes(), std::memory_order_relaxed);
  }

 private:
  HostEngine* const engine_;
  std::unique_ptr<std::byte[]> data_;
};

absl::StatusOr<std::unique_ptr<HostEngine>> HostEngine::Create(
    const HostEngineOptions& options) {
  if (options.lanes < 1 || options.lanes > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host engine: lanes must be in [1, 256], got ", options.lanes));
  }
  return std::unique_ptr<HostEngine>(new HostEngine(options));
}

HostEngine::HostEngine(const HostEngineOptions& options) {
  info_.name = "host";
  info_.streams_per_device = options.lanes;
  info_.dtypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                  DType::kBFloat16};
  DeviceInfo device;
  device.index = -1;
  device.name = CpuName();
  device.uuid = "host";
  device.multiprocessors =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  info_.devices.push_back(device);

  for (int i = 0; i < options.lanes; ++i) {
    lanes_.push_back(std::make_unique<Lane>());
  }
  for (int i = 0; i < options.lanes; ++i) {
    lanes_[i]->thread = std::thread([this, i] { LaneLoop(i); });
  }
}

HostEngine::~HostEngine() { Shutdown(); }

absl::Status HostEngine::CheckFits(const MatmulSpec& spec) const {
  // OpenBLAS takes 32-bit dimensions and leading dimensions.
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (spec.m > kMax || spec.n > kMax || spec.k > kMax) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host engine: dimensions are limited to ", kMax,
                     ", got m=", spec.m, " n=", spec.n, " k=", spec.k));
  }
  return absl::OkStatus();
}

absl::Duration HostEngine::MinimumDuration(const MatmulSpec& spec) const {
  // A generous bound for any x86 core: 100 GFLOP/s each (AVX-512 FMA at
  // about 3 GHz, float32), every core busy.
  const double cores = info_.devices[0].multiprocessors;
  return absl::Seconds(spec.flops() / (100e9 * cores));
}

void HostEngine::Submit(std::unique_ptr<MatmulJob> job) {
  // Readers hold shutdown_mu_ while they enqueue, so once Shutdown has set
  // shut_down_ no job can land in a queue whose thread is gone.
  {
    absl::ReaderMutexLock shutdown_lock(&shutdown_mu_);
    if (!shut_down_) {
      Enqueue(std::move(job));
      return;
    }
  }
  job->Done(absl::UnavailableError("host engine is shut down"));
}

void HostEngine::Enqueue(std::unique_ptr<MatmulJob> job) {
  // Least outstanding work first; ties go to the lowest index.
  int best = 0;
  double best_work = std::numeric_limits<double>::infinity();
  for (int i = 0; i < static_cast<int>(lanes_.size()); ++i) {
    absl::MutexLock lock(&lanes_[i]->mu);
    if (lanes_[i]->outstanding_flops < best_work) {
      best_work = lanes_[i]->outstanding_flops;
      best = i;
    }
  }
  Lane& lane = *lanes_[best];
  const double work = FlopsOf(job->description());
  queued_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&lane.mu);
  lane.outstanding_flops += work;
  lane.queue.push_back({std::move(job), absl::Now()});
  lane.cv.Signal();
}

void HostEngine::LaneLoop(int index) {
  Lane& lane = *lanes_[index];
  while (true) {
    Queued next;
    {
      absl::MutexLock lock(&lane.mu);
      while (lane.queue.empty() && !lane.stopping) lane.cv.Wait(&lane.mu);
      if (lane.queue.empty()) return;  // stopping, and drained
      next = std::move(lane.queue.front());
      lane.queue.pop_front();
    }
    queued_.fetch_sub(1, std::memory_order_relaxed);
    const double work = FlopsOf(next.job->description());
    Run(index, std::move(next));
    absl::MutexLock lock(&lane.mu);
    lane.outstanding_flops -= work;
  }
}

void HostEngine::Run(int lane_index, Queued queued) {
  MatmulJob& job = *queued.job;
  const MatmulSpec& spec = job.spec();
  StageTimings timings;
  const absl::Time started = absl::Now();
  timings.queue = absl::ToDoubleSeconds(started - queued.submitted);

  if (absl::Status abandoned = job.Abandoned(); !abandoned.ok()) {
    job.Done(abandoned);
    return;
  }
  absl::StatusOr<LayoutPlan> planned = PlanLayout(job.description());
  if (!planned.ok()) {
    job.Done(planned.status());
    return;
  }
  const LayoutPlan& plan = *planned;
  const ResidentOperands resident = ResidentOperandsOf(job.description());
  HostJobMemory mem;
  if (absl::Status placed = PlaceHostJob(plan, job, resident, mem);
      !placed.ok()) {
    job.Done(placed);
    return;
  }
  const int64_t bytes = mem.staging_bytes;
  staging_used_.fetch_add(bytes, std::memory_order_relaxed);
  auto fail = [&](const absl::Status& status) {
    staging_used_.fetch_sub(bytes, std::memory_order_relaxed);
    job.Done(status);
  };

  absl::Status written = absl::OkStatus();
  if ((plan.stage_a || plan.stage_b) && !plan.prestaged) {
    written = job.WriteOperands(
        absl::MakeSpan(mem.a_slot, static_cast<size_t>(plan.staged_a_bytes)),
        absl::MakeSpan(mem.b_slot, static_cast<size_t>(plan.staged_b_bytes)));
  }
  const absl::Time staged = absl::Now();
  timings.stage_in = absl::ToDoubleSeconds(staged - started);
  if (!written.ok()) {
    fail(written);
    return;
  }
  written = TakePrivateOperands(plan, job, resident, mem);
  std::byte* destination = nullptr;
  if (written.ok()) {
    absl::StatusOr<std::byte*> product = TakePrivateProduct(plan, spec, mem);
    if (product.ok()) {
      destination = *product;
    } else {
      written = product.status();
    }
  }
  if (!written.ok()) {
    fail(written);
    return;
  }

  BeginBusy();
  if (plan.gemm) {
    HostGemm(spec, mem.a, mem.b, mem.c);
  } else if (plan.download) {
    std::memcpy(mem.c, mem.a, static_cast<size_t>(spec.c_bytes()));
  }
  EndBusy();
  if (absl::Status out = CopyProductOut(plan, job, destination, mem);
      !out.ok()) {
    fail(out);
    return;
  }
  const absl::Time computed = absl::Now();
  timings.compute = absl::ToDoubleSeconds(computed - staged);
  Account(lane_index, spec.dtype, plan.flops, staged, computed);

  JobResult result(
      absl::MakeConstSpan(mem.c, static_cast<size_t>(plan.returned_c_bytes)),
      Placement{-1, lane_index}, timings,
      [this, bytes, staging = std::move(mem.staging)]() mutable {
        staging.reset();
        staging_used_.fetch_sub(bytes, std::memory_order_relaxed);
      });
  if (plan.keep) {
    result.set_resident(std::make_shared<HostResidentTensor>(
        this, spec.dtype, plan.kept.batch, plan.kept.rows, plan.kept.cols,
        std::move(mem.kept)));
  }
  job.Done(std::move(result));
}

void HostEngine::Account(int lane_index, DType dtype, double flops,
                         absl::Time start, absl::Time end) {
  Lane& lane = *lanes_[lane_index];
  StreamSpan span;
  span.device = -1;
  span.stream = lane_index;
  span.kind = StreamSpan::Kind::kCompute;
  span.job = next_job_.fetch_add(1, std::memory_order_relaxed);
  span.start = start;
  span.end = end;
  spans_.Add(span);
  lane.jobs.fetch_add(1, std::memory_order_relaxed);
  lane.busy_ns.fetch_add(absl::ToInt64Nanoseconds(end - start),
                         std::memory_order_relaxed);
  AtomicAdd(flops_[static_cast<int>(dtype)], flops);
}

void HostEngine::BeginBusy() {
  absl::MutexLock lock(&busy_mu_);
  if (active_lanes_++ == 0) busy_since_ = absl::Now();
}

void HostEngine::EndBusy() {
  absl::MutexLock lock(&busy_mu_);
  if (--active_lanes_ == 0) busy_total_ += absl::Now() - busy_since_;
}

EngineStats HostEngine::stats() const {
  DeviceStats device;
  device.label = "host";
  device.uuid = "host";
  for (const auto& lane : lanes_) {
    StreamStats s;
    s.jobs = lane->jobs.load(std::memory_order_relaxed);
    s.busy_seconds =
        static_cast<double>(lane->busy_ns.load(std::memory_order_relaxed)) *
        1e-9;
    device.streams.push_back(s);
  }
  {
    absl::MutexLock lock(&busy_mu_);
    absl::Duration total = busy_total_;
    if (active_lanes_ > 0) total += absl::Now() - busy_since_;
    device.busy_seconds = absl::ToDoubleSeconds(total);
  }
  device.compute_busy_seconds = device.busy_seconds;
  for (int i = 0; i < kNumDTypes; ++i) {
    device.flops[i] = flops_[i].load(std::memory_order_relaxed);
  }
  device.staging_used_bytes = staging_used_.load(std::memory_order_relaxed);
  device.device_memory_used_bytes =
      resident_bytes_.load(std::memory_order_relaxed);
  device.queued_jobs = queued_.load(std::memory_order_relaxed);
  EngineStats stats;
  stats.devices.push_back(std::move(device));
  return stats;
}

absl::StatusOr<HostBuffer> HostEngine::AllocateHostBuffer(int64_t bytes) {
  std::byte* data = new (std::nothrow) std::byte[bytes];
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  }
  return HostBuffer(data, bytes, [data] { delete[] data; });
}

void HostEngine::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  for (auto& lane : lanes_) {
    absl::MutexLock lock(&lane->mu);
    lane->stopping = true;
    lane->cv.Signal();
  }
  for (auto& lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
}

}  // namespace matmul
