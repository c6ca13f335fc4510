#include "server/staging_copier.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/container/inlined_vector.h"
#include "common/streaming_copy.h"
#include "common/thread_name.h"

namespace matmul {

int UsableCores() {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    cores = CPU_COUNT(&set);
  }
  // cgroup v2: "max 100000" (no limit) or "QUOTA PERIOD" in microseconds.
  std::ifstream cpu_max("/sys/fs/cgroup/cpu.max");
  std::string quota;
  int64_t period = 0;
  if (cpu_max >> quota >> period && quota != "max" && period > 0) {
    const int64_t q = std::strtoll(quota.c_str(), nullptr, 10);
    if (q > 0) {
      cores = std::min<int64_t>(cores, (q + period - 1) / period);
    }
  }
  return std::max(1, cores);
}

int DefaultStagingCopyHelpers() { return std::clamp(UsableCores() / 4, 0, 3); }

StagingCopier::StagingCopier(const StagingCopyOptions& options)
    : options_(options) {
  threads_.reserve(static_cast<size_t>(std::max(0, options_.helpers)));
  for (int i = 0; i < options_.helpers; ++i) {
    threads_.emplace_back([this] { HelperLoop(); });
    NameThread(threads_.back(), "stage-copy-" + std::to_string(i));
  }
}

StagingCopier::~StagingCopier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

void StagingCopier::CopyBytes(void* to, const void* from, size_t bytes) const {
  if (options_.streaming_stores) {
    StreamingCopy(to, from, bytes);
  } else {
    std::memcpy(to, from, bytes);
  }
}

size_t StagingCopier::TakeChunks(Task& task) const {
  size_t copied = 0;
  for (;;) {
    const size_t i = task.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= task.count) return copied;
    const Chunk& c = task.chunks[i];
    CopyBytes(c.to, c.from, c.bytes);
    copied += c.bytes;
  }
}

void StagingCopier::HelperLoop() {
  uint64_t seen = 0;  // the last task this helper took part in
  absl::MutexLock lock(&mu_);
  for (;;) {
    while (!stopping_ && (task_ == nullptr || task_number_ == seen)) {
      work_.Wait(&mu_);
    }
    if (stopping_) return;
    Task* task = task_;
    seen = task_number_;
    task->joined.fetch_add(1, std::memory_order_relaxed);
    mu_.Unlock();
    const size_t copied = TakeChunks(*task);
    if (copied > 0) {
      helper_bytes_.fetch_add(static_cast<int64_t>(copied),
                              std::memory_order_relaxed);
    }
    // The last touch of the task: its caller may return once it reads 0.
    task->joined.fetch_sub(1, std::memory_order_release);
    mu_.Lock();
  }
}

void StagingCopier::Copy(absl::Span<const Part> parts) {
  size_t total = 0;
  size_t pieces = 0;
  for (const Part& part : parts) {
    for (const Piece& p : part.pieces) total += p.size();
    pieces += part.pieces.size();
  }
  // Below the split (or with no helpers) the caller copies alone; above,
  // it posts its chunks for the helpers unless another copy has them.
  const bool share =
      !threads_.empty() &&
      total >= static_cast<size_t>(std::max<int64_t>(1, options_.split_bytes));
  if (!share) {
    for (const Part& part : parts) {
      std::byte* out = part.out;
      for (const Piece& p : part.pieces) {
        if (p.empty()) continue;  // its data() may be null
        CopyBytes(out, p.data(), p.size());
        out += p.size();
      }
    }
    return;
  }
  // Chunks in order, none across two pieces.
  const size_t unit =
      static_cast<size_t>(std::max<int64_t>(4096, options_.chunk_bytes));
  absl::InlinedVector<Chunk, 16> chunks;
  chunks.reserve(total / unit + pieces);
  for (const Part& part : parts) {
    std::byte* out = part.out;
    for (const Piece& p : part.pieces) {
      for (size_t at = 0; at < p.size(); at += unit) {
        const size_t bytes = std::min(unit, p.size() - at);
        chunks.push_back(Chunk{p.data() + at, out, bytes});
        out += bytes;
      }
    }
  }
  Task task;
  task.chunks = chunks.data();
  task.count = chunks.size();
  bool posted = false;
  {
    absl::MutexLock lock(&mu_);
    if (task_ == nullptr) {  // else another copy has them: this one is ours
      task_ = &task;
      ++task_number_;
      work_.SignalAll();
      posted = true;
    }
  }
  if (posted) shared_copies_.fetch_add(1, std::memory_order_relaxed);
  TakeChunks(task);
  if (!posted) return;
  // Every chunk is taken; no helper joins from now on, and those that did
  // are done when they leave: each holds one chunk at most (a few
  // microseconds), so the caller spins rather than sleeps.
  {
    absl::MutexLock lock(&mu_);
    task_ = nullptr;
  }
  while (task.joined.load(std::memory_order_acquire) > 0) {
    std::this_thread::yield();
  }
}

}  // namespace matmul
