// MeasureStageCeilings: each stage of a multiply alone, with raw CUDA and
// cuBLAS on one stream of one device: the H2D copy of A and B from pinned
// memory, the GEMM, the D2H copy of C. The pipeline can at best finish
// 1/max(h2d, gemm, d2h) jobs a second, and one stream serializes to
// 1/(h2d + gemm + d2h). For matmul-pipeline-bench (bench/pipeline/),
// which so needs no CUDA header of its own.
//
// MeasurePipelined: the three stages together, as the engine runs them:
// several streams, each job one copy of A and B up, the GEMM and the copy of
// C down, all enqueued before any runs, so that the host's enqueueing is
// out of the figure. What the device does with every stage in flight, which
// 1/max(h2d, gemm, d2h) assumes it can overlap perfectly.
//
// Blocks the calling thread while it measures (about a second per stage).
#ifndef MATMUL_GPU_CUDA_STAGE_CEILINGS_H_
#define MATMUL_GPU_CUDA_STAGE_CEILINGS_H_

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "gpu/matmul_spec.h"

namespace matmul {

struct StageCeilings {
  double h2d = 0;   // seconds for A and B
  double gemm = 0;  // seconds
  double d2h = 0;   // seconds for C
};

// `fill` writes A then B (a_bytes() + b_bytes()) into the pinned buffer the
// copies read.
absl::StatusOr<StageCeilings> MeasureStageCeilings(
    const MatmulSpec& spec, int device,
    absl::FunctionRef<void(std::byte* operands)> fill);

// What a raw pipelined job does besides its copies and GEMM: each a part of
// the engine's per-job stream work (gpu/cuda/enqueue.cc), so that adding
// them one at a time shows which of them the device pays for.
struct PipelinedWork {
  // Event records per job: 0; 4 (start, operands up, GEMM done, end, as
  // the engine records them); 2 (start and end); 1 (end only, what a
  // poller needs to see the job done).
  int events = 0;
  // The events made with cudaEventDisableTiming (no timestamp).
  bool untimed_events = false;
  // A and B (and C) from cudaMallocFromPoolAsync on the device's default
  // pool (freed memory kept), freed with cudaFreeAsync at the job's end.
  bool stream_ordered_memory = false;
  // A and B in two copies instead of one.
  bool two_copies = false;
  // A host function (doing nothing) after the job's work.
  bool host_function = false;
};

struct Pipelined {
  // The device's time from the first job's start to the last one's end over
  // the number of jobs (the best of three runs).
  double seconds_per_job = 0;
  // The host's time to enqueue the jobs, one thread, over their number (the
  // best of three): what the job's CUDA calls cost the host, without the
  // contention of the engine's other threads.
  double enqueue_seconds_per_job = 0;
};

// `streams` streams of `jobs_per_stream` jobs each, held back by a host
// function on the first until every job is enqueued. `fill` as above.
absl::StatusOr<Pipelined> MeasurePipelined(
    const MatmulSpec& spec, int device, int streams, int jobs_per_stream,
    const PipelinedWork& work,
    absl::FunctionRef<void(std::byte* operands)> fill);

}  // namespace matmul

#endif  // MATMUL_GPU_CUDA_STAGE_CEILINGS_H_
