// CreateEngine: picks and builds the engine the server runs on. The only
// place that knows which engines this binary was built with.
#ifndef MATMUL_GPU_ENGINE_FACTORY_H_
#define MATMUL_GPU_ENGINE_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/engine.h"

namespace matmul {

enum class EngineKind { kAuto, kCuda, kHost };

struct EngineOptions {
  EngineKind kind = EngineKind::kAuto;
  // CUDA streams per device (host engine: worker lanes).
  int streams_per_device = 4;
  // Pinned staging memory per device, bytes (CUDA engine).
  int64_t pinned_pool_bytes = int64_t{4} << 30;
  // Merge small same-shape multiplies into one batched job
  // (BatchingEngine): adaptive, they gather only while every stream is
  // busy, waiting at most `batch_window`; not adaptive, each group waits
  // `batch_window` for company. Zero disables batching.
  absl::Duration batch_window = absl::ZeroDuration();
  bool adaptive_batching = true;
  int max_batch = 64;
  // Requests with both operands and the product in shared-memory regions
  // batch too (BatchingOptions::gather_destinations): on an H200, n=64 at
  // 64 in flight through shared memory went from 12,400-16,600 to
  // 34,500-39,800 requests/s with it.
  bool batch_c_shared = true;
  // CUDA engine: small jobs dispatched by the submitting thread when their
  // stream is idle, and how long the completion poller polls
  // (CudaEngineOptions).
  int64_t inline_dispatch_max_bytes = int64_t{1} << 20;
  absl::Duration completion_poll = absl::Milliseconds(1);
  // CUDA engine: small multiplies replayed from CUDA graphs recorded per
  // stream and shape, at most this many per stream (0: off).
  int job_graphs_per_stream = 8;
  // CUDA engine: the most device memory (A, B and C) of a job replayed from
  // a graph (CudaEngineOptions::job_graph_max_device_bytes).
  int64_t job_graph_max_device_bytes = int64_t{4} << 20;
};

// "auto", "cuda" or "host".
absl::StatusOr<EngineKind> ParseEngineKind(const std::string& text);

// Whether this binary includes the CUDA engine.
bool CudaEngineBuilt();

// Whether CreateEngine with this kind makes the CUDA engine: kCuda in a
// build that has it, or kAuto there with a GPU visible.
bool ChoosesCudaEngine(EngineKind kind);

// kAuto: the CUDA engine when it was built and a GPU is visible, otherwise
// the host engine. kCuda fails (FAILED_PRECONDITION) without a usable GPU.
absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(
    const EngineOptions& options);

}  // namespace matmul

#endif  // MATMUL_GPU_ENGINE_FACTORY_H_
