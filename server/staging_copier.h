// StagingCopier: copies a request's operand bytes (gRPC's receive slices)
// into engine staging, with idle helper threads taking part in a large
// copy. A single thread copies about 10 GB/s (512 KiB, an n=256 float32
// request's A and B: 0.055 ms, the largest host stage of such a request at
// concurrency 1 on an H100), while at low concurrency the other cores sit
// idle.
//
// A copy of at least `split_bytes` is cut into chunks of `chunk_bytes`; the
// caller starts on them at once and helpers that wake in time take chunks
// beside it, so a copy never waits for a helper to wake: at worst the
// caller copies every chunk itself. One copy at a time is shared: a copy
// that starts while another has the helpers is made by its caller alone
// (under load every request's copy already has a core of its own).
#ifndef MATMUL_SERVER_STAGING_COPIER_H_
#define MATMUL_SERVER_STAGING_COPIER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace matmul {

struct StagingCopyOptions {
  // Helper threads (0: every copy is its caller's alone).
  int helpers = 0;
  // Copies shorter than this are their caller's alone.
  int64_t split_bytes = int64_t{256} << 10;
  // The unit a helper or the caller takes at a time.
  int64_t chunk_bytes = int64_t{64} << 10;
  // Copy with streaming stores (common/streaming_copy.h), so that staging
  // is not left dirty in the caches for the GPU's upload to read from
  // there. Every copy, shared or not. matmul-server sets it with the CUDA
  // engine, never with
  // the host engine, whose CPU reads the operands next.
  bool streaming_stores = false;
};

// The cores this process may use: those its affinity mask allows (a
// Kubernetes pod with whole CPUs gets only those) and, under a cgroup v2
// CPU limit (cpu.max), that limit rounded up; at least 1.
int UsableCores();

// Helpers for this process: a quarter of its usable cores, at most 3 (0
// below 4, where they would take cores from gRPC's own threads).
int DefaultStagingCopyHelpers();

// Thread-safe.
class StagingCopier {
 public:
  // The bytes of a received message, in order.
  using Piece = absl::Span<const uint8_t>;

  explicit StagingCopier(const StagingCopyOptions& options);
  // Joins the helpers. No Copy may be running.
  ~StagingCopier();
  StagingCopier(const StagingCopier&) = delete;
  StagingCopier& operator=(const StagingCopier&) = delete;

  // Pieces and where they go: one after another from `out`, which holds
  // their total.
  struct Part {
    absl::Span<const Piece> pieces;
    std::byte* out;
  };
  // Copies every part (e.g. a request's A and B, as one copy). Returns
  // when every byte is there.
  void Copy(absl::Span<const Part> parts);
  void Copy(absl::Span<const Piece> pieces, std::byte* out) {
    const Part part{pieces, out};
    Copy(absl::MakeConstSpan(&part, 1));
  }

  // Copies shared with the helpers, and bytes the helpers copied in them.
  int64_t shared_copies() const {
    return shared_copies_.load(std::memory_order_relaxed);
  }
  int64_t helper_bytes() const {
    return helper_bytes_.load(std::memory_order_relaxed);
  }
  int helpers() const { return static_cast<int>(threads_.size()); }

 private:
  struct Chunk {
    const uint8_t* from;
    std::byte* to;
    size_t bytes;
  };
  // One shared copy: its chunks, taken in turn by whoever comes.
  struct Task {
    const Chunk* chunks = nullptr;
    size_t count = 0;
    std::atomic<size_t> next{0};
    // Helpers at work on it: each joins under the copier's mu_ while the
    // task is posted, and leaves (touching the task no more) when no
    // chunk is left.
    std::atomic<int> joined{0};
  };

  void HelperLoop();
  // Copies chunks of `task` until none is left; returns the bytes copied.
  size_t TakeChunks(Task& task) const;
  void CopyBytes(void* to, const void* from, size_t bytes) const;

  const StagingCopyOptions options_;
  absl::Mutex mu_;
  absl::CondVar work_;                         // a task was posted, or stopping
  Task* task_ ABSL_GUARDED_BY(mu_) = nullptr;  // the shared copy, if on
  uint64_t task_number_ ABSL_GUARDED_BY(mu_) = 0;  // counts tasks posted
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
  std::atomic<int64_t> shared_copies_{0};
  std::atomic<int64_t> helper_bytes_{0};
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STAGING_COPIER_H_
