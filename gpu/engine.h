// Engine: the compute back end the server talks to. Asynchronous: a job is
// submitted, the engine stages its operands, computes, and reports the result
// through a callback on one of its own threads; no caller ever waits on the
// device. Two implementations: CudaEngine (gpu/cuda/cuda_engine.h) and
// HostEngine (gpu/host/host_engine.h, OpenBLAS), chosen by the server's
// --engine flag.
#ifndef MATMUL_GPU_ENGINE_H_
#define MATMUL_GPU_ENGINE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "gpu/engine_stats.h"
#include "gpu/matmul_spec.h"

namespace matmul {

// Where a job ran: device index (-1 for the host engine) and the stream (or
// host worker lane) within that device's pool.
struct Placement {
  int device = -1;
  int stream = -1;
};

// Seconds each stage of one job took. Device stages (h2d, compute, d2h) come
// from CUDA events on the CUDA engine and from host clocks on the host engine.
struct StageTimings {
  double queue = 0;     // submitted -> staging leased and work started
  double stage_in = 0;  // operands copied into staging memory
  double h2d = 0;
  double compute = 0;
  double d2h = 0;
  // Host time the engine's thread spent making the job's device calls
  // (CUDA engine: its events, allocations, copies and GEMM, or its graph's
  // launch, up to the end event and the free; not the completion's
  // hand-off). It overlaps h2d and compute: the device runs each step as
  // soon as its call is made, and waits for calls still to come. 0 on the
  // host engine.
  double enqueue = 0;
  // The job's share of the device work these times are of: 1, or 1/n for a
  // request that ran as one of n in a batch (gpu/batching_engine.h), whose
  // times are the batch's. For charging device time to clients.
  double share = 1;
};

// A tensor kept in engine memory between requests (device memory on the
// CUDA engine), so that later jobs use it without moving it over the wire or
// the bus. Created by an upload job or kept from a job's result; the memory
// is freed when the last reference goes, which must happen before the
// engine is destroyed. Immutable; thread-safe.
class ResidentTensor {
 public:
  virtual ~ResidentTensor() = default;

  int device() const { return device_; }
  DType dtype() const { return dtype_; }
  int64_t batch() const { return batch_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t bytes() const { return bytes_; }
  // Engine memory holding the row-major data (device pointer on CUDA).
  const void* data() const { return data_; }

 protected:
  ResidentTensor(int device, DType dtype, int64_t batch, int64_t rows,
                 int64_t cols, void* data)
      : device_(device),
        dtype_(dtype),
        batch_(batch),
        rows_(rows),
        cols_(cols),
        bytes_(batch * rows * cols * static_cast<int64_t>(DTypeSize(dtype))),
        data_(data) {}
  // Raw engine memory of `bytes` bytes with no element type of its own (a
  // client's imported GPU memory): seen through ResidentViews only.
  ResidentTensor(int device, int64_t bytes, void* data)
      : device_(device),
        dtype_(DType::kFloat32),
        batch_(1),
        rows_(1),
        cols_(bytes / static_cast<int64_t>(DTypeSize(DType::kFloat32))),
        bytes_(bytes),
        data_(data) {}

 private:
  const int device_;
  const DType dtype_;
  const int64_t batch_;
  const int64_t rows_;
  const int64_t cols_;
  const int64_t bytes_;
  void* const data_;
};

// A part of another resident tensor, seen as a tensor of its own: the
// `dtype` elements batch x rows x cols starting `byte_offset` bytes into
// `base`'s data. Keeps `base` alive. INVALID_ARGUMENT if it does not fit.
class ResidentView final : public ResidentTensor {
 public:
  static absl::StatusOr<std::shared_ptr<ResidentTensor>> Create(
      std::shared_ptr<ResidentTensor> base, int64_t byte_offset, DType dtype,
      int64_t batch, int64_t rows, int64_t cols) {
    const int64_t bytes =
        batch * rows * cols * static_cast<int64_t>(DTypeSize(dtype));
    if (base == nullptr || byte_offset < 0 || bytes < 0 ||
        byte_offset > base->bytes() || bytes > base->bytes() - byte_offset) {
      return absl::InvalidArgumentError("view outside its base tensor");
    }
    return std::shared_ptr<ResidentTensor>(new ResidentView(
        std::move(base), byte_offset, dtype, batch, rows, cols));
  }

 private:
  ResidentView(std::shared_ptr<ResidentTensor> base, int64_t byte_offset,
               DType dtype, int64_t batch, int64_t rows, int64_t cols)
      : ResidentTensor(
            base->device(), dtype, batch, rows, cols,
            static_cast<std::byte*>(const_cast<void*>(base->data())) +
                byte_offset),
        base_(std::move(base)) {}

  const std::shared_ptr<ResidentTensor> base_;
};

// A finished job's product. Its bytes live in the engine's staging memory,
// which stays leased until this object is destroyed; so a reply can be sent
// straight from staging and released when the transport is done with it.
// Move-only. Not thread-safe; destroy it on any thread.
class JobResult {
 public:
  JobResult(absl::Span<const std::byte> c, Placement placement,
            StageTimings timings, absl::AnyInvocable<void() &&> release)
      : c_(c),
        placement_(placement),
        timings_(timings),
        release_(std::move(release)) {}
  JobResult(JobResult&& other) noexcept
      : c_(other.c_),
        placement_(other.placement_),
        timings_(other.timings_),
        release_(std::move(other.release_)),
        resident_(std::move(other.resident_)) {
    other.release_ = nullptr;
  }
  JobResult& operator=(JobResult&& other) noexcept {
    if (this != &other) {
      Release();
      c_ = other.c_;
      placement_ = other.placement_;
      timings_ = other.timings_;
      release_ = std::move(other.release_);
      other.release_ = nullptr;
      resident_ = std::move(other.resident_);
    }
    return *this;
  }
  JobResult(const JobResult&) = delete;
  JobResult& operator=(const JobResult&) = delete;
  ~JobResult() { Release(); }

  // C, row-major, spec.c_bytes() long (empty when the job kept its result
  // in engine memory: see resident()).
  absl::Span<const std::byte> c() const { return c_; }
  // The result kept in engine memory (a multiply that keeps its result, an
  // upload of a new tensor, an allocation).
  const std::shared_ptr<ResidentTensor>& resident() const { return resident_; }
  void set_resident(std::shared_ptr<ResidentTensor> t) {
    resident_ = std::move(t);
  }
  Placement placement() const { return placement_; }
  const StageTimings& timings() const { return timings_; }

 private:
  void Release() {
    if (release_) std::move(release_)();
    release_ = nullptr;
  }

  absl::Span<const std::byte> c_;
  Placement placement_;
  StageTimings timings_;
  absl::AnyInvocable<void() &&> release_;
  std::shared_ptr<ResidentTensor> resident_;
};

// Host memory the engine can copy to and from the device directly (pinned on
// the CUDA engine). Move-only; frees itself. Thread-compatible.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(std::byte* data, int64_t size, absl::AnyInvocable<void() &&> free)
      : data_(data), size_(size), free_(std::move(free)) {}
  HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      free_ = std::move(other.free_);
      other.free_ = nullptr;
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { Reset(); }

  std::byte* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void Reset() {
    if (free_) std::move(free_)();
    free_ = nullptr;
    data_ = nullptr;
    size_ = 0;
  }

  std::byte* data_ = nullptr;
  int64_t size_ = 0;
  absl::AnyInvocable<void() &&> free_;
};

// Host memory the caller owns, registered with the engine by
// Engine::RegisterHostMemory so that the engine copies to and from it
// directly (cudaHostRegister on the CUDA engine). The registration ends
// (the memory is unpinned) when this object is destroyed, which must happen
// before the memory is unmapped and after every job using it is Done.
// Move-only. Thread-compatible.
class HostMemoryRegistration {
 public:
  HostMemoryRegistration() = default;
  HostMemoryRegistration(bool pinned, absl::AnyInvocable<void() &&> unregister)
      : pinned_(pinned), unregister_(std::move(unregister)) {}
  HostMemoryRegistration(HostMemoryRegistration&& other) noexcept {
    *this = std::move(other);
  }
  HostMemoryRegistration& operator=(HostMemoryRegistration&& other) noexcept {
    if (this != &other) {
      Reset();
      pinned_ = std::exchange(other.pinned_, false);
      unregister_ = std::move(other.unregister_);
      other.unregister_ = nullptr;
    }
    return *this;
  }
  HostMemoryRegistration(const HostMemoryRegistration&) = delete;
  HostMemoryRegistration& operator=(const HostMemoryRegistration&) = delete;
  ~HostMemoryRegistration() { Reset(); }

  // True if the engine's copy engines reach the memory directly (pinned);
  // false on engines that read host memory themselves (the host engine).
  bool pinned() const { return pinned_; }

 private:
  void Reset() {
    if (unregister_) std::move(unregister_)();
    unregister_ = nullptr;
    pinned_ = false;
  }

  bool pinned_ = false;
  absl::AnyInvocable<void() &&> unregister_;
};

// Operands a caller already holds in host memory the engine can copy from
// directly: from Engine::AllocateHostBuffer, or memory registered with
// Engine::RegisterHostMemory. The engine copies them to the device from
// there, with no staging copy. They must stay untouched until the job is
// Done. A pointer may be null for an operand that is resident (MultiplyOp).
struct PrestagedOperands {
  const std::byte* a = nullptr;
  const std::byte* b = nullptr;
  // A and B lie in one allocation (one HostBuffer, one registered region).
  // The CUDA engine then uploads them in one copy where B follows A
  // directly (a job's staging gets that always); a copy must not span two
  // allocations, so without the flag each operand has its own.
  bool one_allocation = false;
};

// One member of a gathered multiply (MultiplyOp::gathered): its operands
// where it keeps them, and where its product goes.
struct GatheredMember {
  PrestagedOperands operands;
  // Host memory the engine copies this member's C into directly (as
  // MultiplyOp::c_destination), or null: C comes back in the batch's
  // staging. Every member of a batch has one, or none does.
  std::byte* c_destination = nullptr;
};

// Typed operations: what a job asks the engine to do. A job carries one of
// them in its JobDescription; each holds only what its operation needs.
//
// Multiply: C = op(A)·op(B) as the spec describes. Operands come staged
// (WriteOperands), prestaged, or resident.
struct MultiplyOp {
  // Operands already in engine memory, used in place of staged ones (the
  // job then runs on their device; both must be on the same one). A staged
  // operand's span in WriteOperands is empty when the other is resident.
  std::shared_ptr<ResidentTensor> resident_a;
  std::shared_ptr<ResidentTensor> resident_b;
  // Keep C in engine memory (JobResult::resident()) instead of returning it.
  bool keep_result = false;
  // If set, the operands are already in engine-allocated host memory and
  // WriteOperands is not called.
  std::optional<PrestagedOperands> prestaged;
  // A batch of prestaged multiplies run as one strided-batched job (the
  // batching engine makes these): member i's operands, one m x k A and one
  // k x n B, where that member keeps them, as `prestaged` holds one job's.
  // The engine copies each member's A and B up to the i-th place of the
  // batch's device operands, with no staging copy, and each member's C
  // down into its c_destination, or, where the members have none, every
  // C back to back into staging. Needs spec.batch == a_batch == b_batch ==
  // its size, and every member with a destination or none; excludes
  // `prestaged`, resident operands, keep_result and c_destination
  // (INVALID_ARGUMENT otherwise). Each member's memory must stay
  // untouched until the job is Done.
  std::vector<GatheredMember> gathered = {};
  // If set (and keep_result is not), C is copied from the device straight
  // into this host memory (spec.c_bytes() long: from AllocateHostBuffer or
  // RegisterHostMemory on the CUDA engine) instead of into staging, and
  // JobResult::c() is empty. It must stay valid until the job is Done.
  std::byte* c_destination = nullptr;
  // If set (and neither keep_result nor c_destination is), the GEMM writes
  // C straight into this engine memory (its data(), at least
  // spec.c_bytes() long: a view of a client's imported GPU memory, see
  // Engine::ImportDeviceMemory), with no copy back; JobResult::c() is empty
  // and the job runs on its device. It must stay alive until the job is
  // Done (the job holds it).
  std::shared_ptr<ResidentTensor> c_target = nullptr;
};

// Upload: one tensor, described by the spec as A (a_batch x m x k), staged
// through WriteOperands (`b` empty) into engine memory. Without a target the
// result's resident() is a new tensor holding it.
struct UploadOp {
  // If set, A is written into this existing tensor, byte_offset bytes into
  // its data, instead of a new one (the result then has no resident()). The
  // tensor comes from an allocate job; the caller orders the writes before
  // any job that reads it (by waiting for their Done).
  std::shared_ptr<ResidentTensor> target;
  int64_t byte_offset = 0;
};

// Download: the spec's C (batch x m x n) read from `source`, starting
// byte_offset bytes into its data, and returned in JobResult::c().
struct DownloadOp {
  std::shared_ptr<ResidentTensor> source;
  int64_t byte_offset = 0;
};

// Allocate: a new resident tensor of A's size whose contents are undefined
// until uploads into it fill it. With UploadOp::target this lets a large
// operand reach the device in pieces while the rest of it is still arriving.
struct AllocateOp {};

// An upload's target offset or a download's source offset that leaves its
// bytes outside the tensor fails the job with INVALID_ARGUMENT.
using EngineOp = std::variant<MultiplyOp, UploadOp, DownloadOp, AllocateOp>;

// One job's description: a value the engine reads and never changes. Both
// engines work out from it where the job's operands and result live with
// PlanLayout (gpu/layout_planner.h).
struct JobDescription {
  MatmulSpec spec;
  EngineOp op;
  // Device to run on (-1: any). Jobs with resident operands (or an upload
  // target) run on theirs.
  int device = -1;
  // False: if the device memory this job needs is not free now, fail at
  // once with RESOURCE_EXHAUSTED instead of waiting for it. For jobs that
  // belong to a chain whose waiting could hold up the very work that would
  // free the memory (a streamed multiply's steps).
  bool wait_for_memory = true;
  // False for work whose shape is unlikely to come again: a batch that
  // BatchingEngine gathered, whose count varies from one dispatch to the
  // next. The CUDA engine records no graph for such a job
  // (gpu/cuda/job_graph.h): one graph per batch count would fill its
  // per-stream cache with shapes that are seldom replayed, evicting and
  // re-recording.
  bool shape_recurs = true;
};

// One piece of engine work, implemented by the caller (the server wraps an
// RPC in it): its description, given at construction, and the callbacks
// below. The engine owns a submitted job until it has called Done, then
// destroys it.
class MatmulJob {
 public:
  explicit MatmulJob(JobDescription description)
      : description_(std::move(description)) {}
  virtual ~MatmulJob() = default;

  const JobDescription& description() const { return description_; }
  const MatmulSpec& spec() const { return description_.spec; }
  const EngineOp& op() const { return description_.op; }

  // Multiply and upload: copies the operands into staging memory: `a` is
  // spec().a_bytes() long, `b` spec().b_bytes() (empty when not staged).
  // Called at most once, before any device work, on whichever thread
  // leased the staging; must not block on other jobs. Never called for
  // download and allocate jobs, nor prestaged multiplies; the default
  // fails with INTERNAL.
  virtual absl::Status WriteOperands(absl::Span<std::byte> a,
                                     absl::Span<std::byte> b);

  // Called exactly once, on an engine thread (or inside Submit for jobs that
  // fail at once), with the result or the reason there is none.
  virtual void Done(absl::StatusOr<JobResult> result) = 0;

  // A non-OK status once the caller no longer wants the result (CANCELLED,
  // DEADLINE_EXCEEDED); the engine then drops the job if it has not started.
  // Must be cheap and thread-safe.
  virtual absl::Status Abandoned() const { return absl::OkStatus(); }

 private:
  const JobDescription description_;
};

inline absl::Status MatmulJob::WriteOperands(absl::Span<std::byte>,
                                             absl::Span<std::byte>) {
  return absl::InternalError("this job has no operands to stage");
}

// Thread-safe: every method may be called from any thread.
class Engine {
 public:
  virtual ~Engine() = default;

  virtual const EngineInfo& info() const = 0;

  // OK if a job of this spec can run here at all; RESOURCE_EXHAUSTED, with
  // the numbers, if it never could (e.g. more than any device's memory).
  virtual absl::Status CheckFits(const MatmulSpec& spec) const = 0;

  // A lower bound on how long a job of this spec takes on an idle engine
  // (transfers at the bus's peak rate, GEMM at the arithmetic peak). A
  // request whose deadline is nearer than this cannot be met.
  virtual absl::Duration MinimumDuration(const MatmulSpec& spec) const {
    (void)spec;
    return absl::ZeroDuration();
  }

  // Queues a job. Its Done is called exactly once, possibly before Submit
  // returns (e.g. UNAVAILABLE after Shutdown).
  virtual void Submit(std::unique_ptr<MatmulJob> job) = 0;

  // A snapshot of the counters, for metrics.
  virtual EngineStats stats() const = 0;

  // Stream activity that ended within the last `window`, oldest first (the
  // engine keeps a bounded history).
  virtual std::vector<StreamSpan> RecentSpans(absl::Duration window) const = 0;

  // Host memory that jobs can use as PrestagedOperands (pinned on the CUDA
  // engine; that is slow to allocate, so allocate once and reuse).
  virtual absl::StatusOr<HostBuffer> AllocateHostBuffer(int64_t bytes) = 0;

  // Registers `bytes` of caller-owned host memory at `data` (page-aligned,
  // e.g. a mapping of a shared-memory object) so that jobs can use it as
  // PrestagedOperands and MultiplyOp::c_destination with no staging copy.
  // The CUDA engine pins it (cudaHostRegister); an error is returned, never
  // a crash, when that fails. The default (host engine) registers nothing
  // and answers an unpinned registration: it reads host memory itself.
  virtual absl::StatusOr<HostMemoryRegistration> RegisterHostMemory(
      void* data, int64_t bytes) {
    (void)data;
    (void)bytes;
    return HostMemoryRegistration();
  }

  // Opens a range of another process's GPU memory: `ipc_handle` (the
  // 64-byte CUDA IPC handle of an allocation's base), its first `bytes`,
  // on the GPU whose UUID is `device_uuid` (16 bytes). The answer is raw
  // engine memory (ResidentTensor(device, bytes, data)) on that device that
  // jobs read operands from (MultiplyOp::resident_a/b, through views) and
  // write products into (MultiplyOp::c_target); the handle is closed when
  // the last reference goes, which must be after every job using it is
  // Done and before the engine is destroyed. FAILED_PRECONDITION for a
  // device the engine does not drive, or a handle that does not open (the
  // CUDA error named); INVALID_ARGUMENT for bytes past the allocation's
  // end or malformed arguments. The default (host engine) answers
  // FAILED_PRECONDITION: it has no GPU memory.
  virtual absl::StatusOr<std::shared_ptr<ResidentTensor>> ImportDeviceMemory(
      absl::Span<const std::byte> ipc_handle, int64_t bytes,
      absl::Span<const std::byte> device_uuid) {
    (void)ipc_handle;
    (void)bytes;
    (void)device_uuid;
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", info().name,
        " engine has no GPU memory: CUDA memory regions need the server to "
        "run the CUDA engine (--engine=cuda); use shared memory "
        "(RegisterSharedMemory) instead"));
  }

  // Runs every job already submitted to completion, then stops the engine's
  // threads. Jobs submitted afterwards fail with UNAVAILABLE. Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace matmul

#endif  // MATMUL_GPU_ENGINE_H_
