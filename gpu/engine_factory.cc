#include "gpu/engine_factory.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/batching_engine.h"
#include "gpu/host/host_engine.h"
#ifdef MATMUL_HAVE_CUDA
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/device_registry.h"
#endif

namespace matmul {

absl::StatusOr<EngineKind> ParseEngineKind(const std::string& text) {
  if (text == "auto") return EngineKind::kAuto;
  if (text == "cuda") return EngineKind::kCuda;
  if (text == "host") return EngineKind::kHost;
  return absl::InvalidArgumentError(
      absl::StrCat("engine must be auto, cuda or host; got \"", text, "\""));
}

bool CudaEngineBuilt() {
#ifdef MATMUL_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool ChoosesCudaEngine(EngineKind kind) {
#ifdef MATMUL_HAVE_CUDA
  return kind == EngineKind::kCuda ||
         (kind == EngineKind::kAuto && VisibleCudaDevices() > 0);
#else
  (void)kind;
  return false;
#endif
}

namespace {

absl::StatusOr<std::unique_ptr<Engine>> CreateBareEngine(
    const EngineOptions& options);

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(
    const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, CreateBareEngine(options));
  if (options.batch_window <= absl::ZeroDuration()) return engine;
  BatchingOptions batching;
  batching.window = options.batch_window;
  batching.adaptive = options.adaptive_batching;
  batching.max_batch = options.max_batch;
  batching.gather_destinations = options.batch_c_shared;
  return std::unique_ptr<Engine>(
      std::make_unique<BatchingEngine>(std::move(engine), batching));
}

namespace {

absl::StatusOr<std::unique_ptr<Engine>> CreateBareEngine(
    const EngineOptions& options) {
#ifdef MATMUL_HAVE_CUDA
  if (ChoosesCudaEngine(options.kind)) {
    CudaEngineOptions cuda;
    cuda.streams_per_device = options.streams_per_device;
    cuda.pinned_pool_bytes = options.pinned_pool_bytes;
    cuda.inline_dispatch_max_bytes = options.inline_dispatch_max_bytes;
    cuda.completion_poll = options.completion_poll;
    cuda.job_graphs_per_stream = options.job_graphs_per_stream;
    cuda.job_graph_max_device_bytes = options.job_graph_max_device_bytes;
    ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> engine,
                     CudaEngine::Create(cuda));
    return std::unique_ptr<Engine>(std::move(engine));
  }
  if (options.kind == EngineKind::kAuto) {
    LogLine("no CUDA device is visible; using the host engine");
  }
#else
  if (options.kind == EngineKind::kCuda) {
    return absl::FailedPreconditionError(
        "--engine=cuda: this build has no CUDA engine");
  }
#endif
  HostEngineOptions host;
  host.lanes = options.streams_per_device;
  ASSIGN_OR_RETURN(std::unique_ptr<HostEngine> engine,
                   HostEngine::Create(host));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace

}  // namespace matmul
