// What an engine says about itself (EngineInfo, DeviceInfo) and what it
// counts (EngineStats and its parts, StreamSpan for the pipeline timeline):
// plain values, read by the server's metrics and GetServerInfo. Part of the
// Engine seam (gpu/engine.h includes it); thread-compatible.
#ifndef MATMUL_GPU_ENGINE_STATS_H_
#define MATMUL_GPU_ENGINE_STATS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/dtype.h"

namespace matmul {

// One activity of one stream, for the pipeline timeline (wall-clock times;
// on the CUDA engine converted from CUDA event timestamps).
struct StreamSpan {
  enum class Kind { kH2D, kCompute, kD2H };
  int device = -1;
  int stream = 0;
  Kind kind = Kind::kCompute;
  int64_t job = 0;  // sequence number of the job, per engine
  absl::Time start;
  absl::Time end;
};

// A GPU's 16-byte UUID as nvidia-smi spells it:
// GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
inline std::string FormatGpuUuid(const unsigned char (&uuid)[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    out += kHex[uuid[i] >> 4];
    out += kHex[uuid[i] & 0xf];
    if (i == 3 || i == 5 || i == 7 || i == 9) out += '-';
  }
  return out;
}

// A compute device as the engine sees it.
struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string uuid;
  int64_t memory_bytes = 0;
  int multiprocessors = 0;
  int copy_engines = 0;
  std::string compute_capability;
  int64_t staging_bytes = 0;
};

struct EngineInfo {
  std::string name;  // "cuda" or "host"
  std::vector<DeviceInfo> devices;
  int streams_per_device = 0;
  std::vector<DType> dtypes;
};

// Cumulative counters of one stream (host: worker lane).
struct StreamStats {
  int64_t jobs = 0;         // jobs that ran on it
  double busy_seconds = 0;  // time it had work (CUDA: from events)
};

// Cumulative counters and current gauges of one device.
struct DeviceStats {
  std::string label;  // metrics label: device index, or "host"
  // Metrics label `uuid`: the GPU's UUID as nvidia-smi and the DCGM
  // exporter spell it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx); "host" on
  // the host engine.
  std::string uuid;
  // False once the device has failed (CUDA: a sticky error broke its
  // context); the engine sends it no more jobs.
  bool healthy = true;
  std::vector<StreamStats> streams;
  double busy_seconds = 0;                  // union of its streams' busy time
  double compute_busy_seconds = 0;          // union of GEMM time
  double copy_busy_seconds = 0;             // union of H2D and D2H time
  double copy_compute_overlap_seconds = 0;  // copies running during GEMMs
  int64_t h2d_bytes = 0;
  int64_t d2h_bytes = 0;
  std::array<double, kNumDTypes> flops{};  // indexed by DType
  int64_t staging_used_bytes = 0;
  int64_t staging_total_bytes = 0;
  int64_t device_memory_used_bytes = 0;
  int64_t queued_jobs = 0;  // submitted, not yet started
  // CUDA graphs (CudaEngineOptions::job_graphs_per_stream): jobs launched
  // through a recorded graph, graphs recorded, graphs evicted.
  int64_t graph_jobs = 0;
  int64_t graphs_recorded = 0;
  int64_t graphs_evicted = 0;
};

// Launches of the batching engine by size: counts[i] launches of at most
// kBatchSizeBounds[i] requests (and more than the bound before it); the
// last bucket has no bound. Empty without a batching engine.
inline constexpr std::array<int, 7> kBatchSizeBounds = {1, 2, 4, 8, 16, 32, 64};
struct BatchSizeCounts {
  std::array<int64_t, kBatchSizeBounds.size() + 1> counts{};
  int64_t requests = 0;  // the sum of the sizes
  int64_t launches = 0;
};

struct EngineStats {
  std::vector<DeviceStats> devices;
  // Set by the batching engine (gpu/batching_engine.h) when there is one.
  bool batching = false;
  BatchSizeCounts batch_sizes;
};

}  // namespace matmul

#endif  // MATMUL_GPU_ENGINE_STATS_H_
