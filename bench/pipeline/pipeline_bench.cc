// matmul-pipeline-bench: the CUDA engine's pipeline in process (no gRPC).
//
// For each size and mode it measures, on device 0:
//   - the ceilings, each stage alone with raw CUDA/cuBLAS on one stream:
//     t_h2d (A and B from pinned memory), t_gemm (cublasGemmEx), t_d2h (C);
//     the pipeline can at best finish 1/max(t_h2d, t_gemm, t_d2h) jobs/s, and
//     a single stream serializes to 1/(t_h2d + t_gemm + t_d2h); and the
//     same three stages raw on the pool's streams, all enqueued before any
//     runs (pipe/s, MeasurePipelined): what the device does with them
//     overlapped; --pipe-with adds parts of the engine's per-job stream work
//     to it (the engine's four timed events, or only start and end, or only
//     end, optionally untimed; stream-ordered memory; two copies; a host
//     function), to find which of them the device pays for;
//   - the engine's throughput with one stream and with the pool, fed
//     operands already in pinned host memory (PrestagedOperands), with
//     --jobs-per-stream jobs (default 2) kept in flight per stream;
//   - the GEMM time inside the engine (from its CUDA events) against raw.
//   - with --batched, the pool again on the server's path: each job copies
//     its operands from ordinary memory into staging and goes through a
//     BatchingEngine with the server's default batching, so that jobs
//     waiting while every stream is busy share one strided-batched GEMM.
//   - with --gathered, the pool through a BatchingEngine with the server's
//     default batching, operands still prestaged: jobs that wait while
//     every stream is busy go out as one gathered multiply
//     (MultiplyOp::gathered: each member's operands copied up from where it
//     keeps them, one strided-batched GEMM, one copy down), with no host
//     copy of any operand. --batch-slots N: the batching engine's slots
//     (jobs of its own in flight; default one a stream) for both.
//   - with --graphs N (CUDA graphs per stream, gpu/cuda/job_graph.h), every
//     run's jobs copy their operands into staging instead (prestaged jobs
//     are never replayed) and are replayed from graph instances; --graphs 0
//     is the same copying without graphs, the baseline to compare with.
//   - prestaged A and B lie back to back in one buffer, which the engine
//     uploads in one copy (PrestagedOperands::one_allocation); with
//     --operands-apart they are two buffers and two copies;
//   - with --timed-job-every N, one job in N on each stream records timed
//     events and the others untimed ones (CudaEngineOptions::
//     timed_job_every): what the engine gains from fewer timestamps;
//   - with --submit-threads T, a finished job's successor is submitted by
//     one of T bench threads, as a server's next request comes on a gRPC
//     thread, instead of from inside Done, on the engine's completion
//     thread (or poller), which completes no other job meanwhile; with
//     --submit-gap-us G (one submitting thread unless T is given) each
//     successor goes in G µs after its predecessor's Done, the submitting
//     thread asleep meanwhile, as a server's threads sleep through a c=1
//     client's round trip;
//   - with --coalesce K, the raw pipeline again with K jobs a launch: their
//     operands in one copy up, one strided-batched GEMM, one copy down, as a
//     gathered batch runs: what coalescing jobs on the device could reach;
//   - after each row, the engine's mean StageTimings::enqueue (the host's
//     time making a job's device calls) with one stream and with the pool.
// Prints a table and optionally writes JSON. The ceilings are measured by
// bench/pipeline/stage_ceilings.h, so that this tool includes no CUDA header.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/pipeline/stage_ceilings.h"
#include "common/float16.h"
#include "common/mutex_mode.h"
#include "common/status_macros.h"
#include "gpu/batching_engine.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/device_registry.h"

namespace matmul {
namespace {

struct Mode {
  std::string name;
  DType dtype;
  ComputeMode compute;
};

absl::StatusOr<Mode> ParseMode(absl::string_view name) {
  if (name == "float32")
    return Mode{"float32", DType::kFloat32, ComputeMode::kStrict};
  if (name == "tf32") return Mode{"tf32", DType::kFloat32, ComputeMode::kTf32};
  if (name == "bfloat16")
    return Mode{"bfloat16", DType::kBFloat16, ComputeMode::kStrict};
  if (name == "float16")
    return Mode{"float16", DType::kFloat16, ComputeMode::kStrict};
  if (name == "float64")
    return Mode{"float64", DType::kFloat64, ComputeMode::kStrict};
  return absl::InvalidArgumentError(absl::StrCat("unknown mode ", name));
}

void FillRandom(std::byte* data, DType dtype, int64_t count) {
  absl::BitGen gen;
  for (int64_t i = 0; i < count; ++i) {
    const float v = absl::Uniform(gen, -1.0f, 1.0f);
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(data + 4 * i, &v, 4);
        break;
      case DType::kFloat64: {
        const double d = v;
        std::memcpy(data + 8 * i, &d, 8);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = FloatToHalf(v);
        std::memcpy(data + 2 * i, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t h = FloatToBFloat16(v);
        std::memcpy(data + 2 * i, &h, 2);
        break;
      }
    }
  }
}

// Keeps `depth` jobs in flight on an engine, all reading the same
// operands, and counts completions. The operands are prestaged (in pinned
// memory, read in place), or, with `copy_operands`, copied by each job into
// its staging slot as the server's requests do (then `ops` may be ordinary
// memory and the jobs may be batched).
class ClosedLoop {
 public:
  // `submit_threads` > 0: successors are submitted by that many threads of
  // the loop's own, each sleeping `submit_gap` first (a client's round
  // trip, through which a server's threads sleep); 0: from inside Done.
  ClosedLoop(Engine& engine, const MatmulSpec& spec, PrestagedOperands ops,
             bool copy_operands = false, int submit_threads = 0,
             absl::Duration submit_gap = absl::ZeroDuration())
      : engine_(engine),
        spec_(spec),
        ops_(ops),
        copy_operands_(copy_operands),
        submit_threads_(submit_threads),
        submit_gap_(submit_gap) {}
  ~ClosedLoop() { Stop(); }

  void Start(int depth) {
    for (int i = 0; i < submit_threads_; ++i) {
      submitters_.emplace_back([this] { SubmitLoop(); });
    }
    for (int i = 0; i < depth; ++i) SubmitOne();
  }
  // Waits for every job in flight, then for the submitting threads.
  void Stop() {
    stopping_.store(true);
    {
      absl::MutexLock lock(&mu_);
      auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return outstanding_ == 0;
      };
      mu_.Await(absl::Condition(&drained));
      quit_ = true;
    }
    for (std::thread& t : submitters_) t.join();
    submitters_.clear();
  }
  int64_t completed() const { return completed_.load(); }
  int64_t failed() const { return failed_.load(); }
  absl::Status first_error() {
    absl::MutexLock lock(&mu_);
    return first_error_;
  }
  // Mean engine GEMM seconds over jobs completed since the last Reset.
  double MeanCompute() {
    absl::MutexLock lock(&mu_);
    return samples_ == 0 ? 0 : compute_sum_ / samples_;
  }
  // Mean host seconds the engine spent making a job's device calls
  // (StageTimings::enqueue), over every job completed since the last Reset.
  double MeanEnqueue() {
    absl::MutexLock lock(&mu_);
    return completed_since_reset_ == 0 ? 0
                                       : enqueue_sum_ / completed_since_reset_;
  }
  void ResetSamples() {
    absl::MutexLock lock(&mu_);
    compute_sum_ = 0;
    samples_ = 0;
    enqueue_sum_ = 0;
    completed_since_reset_ = 0;
  }

 private:
  class Job final : public MatmulJob {
   public:
    explicit Job(ClosedLoop* loop)
        : MatmulJob(JobDescription{
              loop->spec_,
              loop->copy_operands_
                  ? MultiplyOp{}
                  : MultiplyOp{nullptr, nullptr, false, loop->ops_}}),
          loop_(loop) {}
    absl::Status WriteOperands(absl::Span<std::byte> a,
                               absl::Span<std::byte> b) override {
      if (!loop_->copy_operands_) {
        return absl::InternalError("prestaged job asked to write operands");
      }
      if (a.size() != static_cast<size_t>(loop_->spec_.a_bytes()) ||
          b.size() != static_cast<size_t>(loop_->spec_.b_bytes())) {
        return absl::InternalError("staging size mismatch");
      }
      std::memcpy(a.data(), loop_->ops_.a, a.size());
      std::memcpy(b.data(), loop_->ops_.b, b.size());
      return absl::OkStatus();
    }
    void Done(absl::StatusOr<JobResult> result) override {
      loop_->OnDone(std::move(result));
    }

   private:
    ClosedLoop* loop_;
  };

  void SubmitOne() {
    {
      absl::MutexLock lock(&mu_);
      ++outstanding_;
    }
    engine_.Submit(std::make_unique<Job>(this));
  }

  // A submitting thread: one successor per job that asked for one.
  void SubmitLoop() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return pending_ > 0 || quit_;
        };
        mu_.Await(absl::Condition(&woken));
        if (pending_ == 0) return;
        --pending_;
      }
      if (submit_gap_ > absl::ZeroDuration()) absl::SleepFor(submit_gap_);
      engine_.Submit(std::make_unique<Job>(this));
    }
  }

  // Lets go of the result (its staging, or its CUDA graph instance) before
  // the next job goes in, as a server's reply is sent before the client's
  // next request comes.
  // A job with a successor stays outstanding until the successor is
  // submitted, so that Stop cannot return in between.
  void OnDone(absl::StatusOr<JobResult> result) {
    if (result.ok()) {
      completed_.fetch_add(1);
    } else {
      failed_.fetch_add(1);
    }
    bool again = false;
    {
      absl::MutexLock lock(&mu_);
      if (result.ok()) {
        enqueue_sum_ += result->timings().enqueue;
        ++completed_since_reset_;
        // An untimed job (--timed-job-every) has no compute time.
        if (result->timings().compute > 0) {
          compute_sum_ += result->timings().compute;
          ++samples_;
        }
      } else if (first_error_.ok()) {
        first_error_ = result.status();
      }
      again = result.ok() && !stopping_.load();
      if (!again) {
        --outstanding_;
      } else if (submit_threads_ > 0) {
        ++pending_;
      }
    }
    { absl::StatusOr<JobResult> release = std::move(result); }
    if (again && submit_threads_ == 0) {
      engine_.Submit(std::make_unique<Job>(this));
    }
  }

  Engine& engine_;
  const MatmulSpec spec_;
  const PrestagedOperands ops_;
  const bool copy_operands_;
  const int submit_threads_;
  const absl::Duration submit_gap_;
  std::vector<std::thread> submitters_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> failed_{0};
  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // submitted or pending
  int pending_ ABSL_GUARDED_BY(mu_) = 0;      // successors to submit
  bool quit_ ABSL_GUARDED_BY(mu_) = false;    // submitting threads return
  double compute_sum_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t samples_ ABSL_GUARDED_BY(mu_) = 0;
  double enqueue_sum_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_since_reset_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

struct EngineRun {
  double rate = 0;          // jobs/s
  double mean_compute = 0;  // seconds, engine GEMM from events
  double mean_enqueue = 0;  // seconds, StageTimings::enqueue
  double device_busy = 0;   // fraction of the window
  double overlap = 0;       // copy-compute overlap / copy busy
  double mean_batch = 0;    // requests a launch (batching engine only)
};

struct RunOptions {
  int streams = 4;
  int jobs_per_stream = 2;
  int64_t poll_only_max_bytes = 0;
  // CudaEngineOptions::poll_pause.
  absl::Duration poll_pause = CudaEngineOptions().poll_pause;
  int pollers = 1;          // CudaEngineOptions::pollers_per_device
  int timed_job_every = 1;  // CudaEngineOptions::timed_job_every
  // CUDA graphs per stream (CudaEngineOptions::job_graphs_per_stream). Set
  // (0 or more), the jobs copy their operands into staging (a graph
  // instance's or their own), as the server's requests do, since prestaged
  // jobs are never replayed; -1: prestaged, no graphs.
  int graphs = -1;
  // The server's path: each job copies its operands (from ordinary memory)
  // into staging, and goes through a BatchingEngine with the server's
  // default batching (adaptive, 1 ms window, at most 64 per batch), which
  // merges same-shape jobs waiting while every stream is busy into one
  // strided-batched GEMM. Otherwise the jobs go to the CUDA engine itself
  // with operands prestaged in pinned memory, one GEMM each.
  bool batched = false;
  // The same batching over prestaged operands: gathered multiplies.
  bool gathered = false;
  // BatchingOptions::slots for both (0: one a stream, the server's).
  int batch_slots = 0;
  // Threads that submit finished jobs' successors (ClosedLoop); 0: Done.
  int submit_threads = 0;
  // With submit_threads: each successor submitted this long after its
  // predecessor's Done (the submitting thread sleeps).
  absl::Duration submit_gap = absl::ZeroDuration();
  // Prestaged A and B in two host buffers (two copies up) instead of back
  // to back in one (PrestagedOperands::one_allocation: one copy).
  bool operands_apart = false;
};

absl::StatusOr<EngineRun> RunEngine(const MatmulSpec& spec,
                                    const RunOptions& run_options,
                                    absl::Duration window) {
  const int streams = run_options.streams;
  CudaEngineOptions options;
  options.streams_per_device = streams;
  options.devices = {0};
  // Prestaged, only C is staged: 1 GiB holds 16 results of n=4096 float32,
  // more than the jobs kept in flight. Batched, A, B and C are: 1 GiB holds
  // 21 full batches of 64 at n=256 float32.
  options.pinned_pool_bytes = int64_t{1} << 30;
  options.poll_only_max_bytes = run_options.poll_only_max_bytes;
  options.poll_pause = run_options.poll_pause;
  options.pollers_per_device = run_options.pollers;
  options.timed_job_every = run_options.timed_job_every;
  options.job_graphs_per_stream = std::max(0, run_options.graphs);
  ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> cuda,
                   CudaEngine::Create(options));
  // A and B back to back in one buffer (one copy up), or in two.
  const bool apart = run_options.operands_apart;
  ASSIGN_OR_RETURN(
      HostBuffer a,
      cuda->AllocateHostBuffer(spec.a_bytes() + (apart ? 0 : spec.b_bytes())));
  HostBuffer b_apart;
  if (apart) {
    ASSIGN_OR_RETURN(b_apart, cuda->AllocateHostBuffer(spec.b_bytes()));
  }
  std::byte* host_b = apart ? b_apart.data() : a.data() + spec.a_bytes();
  FillRandom(a.data(), spec.dtype, spec.a_elements());
  FillRandom(host_b, spec.dtype, spec.b_elements());
  // Batched jobs copy from ordinary memory, as the server's requests do
  // from their messages.
  std::vector<std::byte> plain_a, plain_b;
  PrestagedOperands ops{a.data(), host_b, /*one_allocation=*/!apart};
  std::unique_ptr<Engine> engine = std::move(cuda);
  const bool copy_operands = run_options.batched || run_options.graphs >= 0;
  if (copy_operands) {
    plain_a.assign(a.data(), a.data() + spec.a_bytes());
    plain_b.assign(host_b, host_b + spec.b_bytes());
    ops = PrestagedOperands{plain_a.data(), plain_b.data()};
  }
  if (run_options.batched || run_options.gathered) {
    BatchingOptions batching;
    batching.adaptive = true;
    batching.window = absl::Milliseconds(1);
    batching.max_batch = 64;
    batching.slots = run_options.batch_slots;
    engine = std::make_unique<BatchingEngine>(std::move(engine), batching);
  }
  ClosedLoop loop(*engine, spec, ops, copy_operands, run_options.submit_threads,
                  run_options.submit_gap);
  // By default two jobs per stream: one computing, one copying. More keep
  // the lanes' queues from running dry while a finished job's completion
  // and resubmission cross threads (--jobs-per-stream).
  loop.Start(std::max(4, run_options.jobs_per_stream * streams));
  absl::SleepFor(std::min(absl::Milliseconds(500), window / 2));  // warm-up
  const int64_t c0 = loop.completed();
  const EngineStats s0 = engine->stats();
  loop.ResetSamples();
  const absl::Time t0 = absl::Now();
  absl::SleepFor(window);
  const int64_t c1 = loop.completed();
  const absl::Time t1 = absl::Now();
  const EngineStats s1 = engine->stats();
  EngineRun run;
  if (s1.batching) {
    const int64_t launches = s1.batch_sizes.launches - s0.batch_sizes.launches;
    run.mean_batch = launches > 0
                         ? static_cast<double>(s1.batch_sizes.requests -
                                               s0.batch_sizes.requests) /
                               launches
                         : 0;
  }
  run.mean_compute = loop.MeanCompute();
  run.mean_enqueue = loop.MeanEnqueue();
  loop.Stop();
  if (loop.failed() > 0) {
    return absl::InternalError(absl::StrCat(
        loop.failed(), " jobs failed: ", loop.first_error().ToString()));
  }
  const double seconds = absl::ToDoubleSeconds(t1 - t0);
  run.rate = static_cast<double>(c1 - c0) / seconds;
  const DeviceStats& d0 = s0.devices[0];
  const DeviceStats& d1 = s1.devices[0];
  run.device_busy = (d1.busy_seconds - d0.busy_seconds) / seconds;
  const double copy = d1.copy_busy_seconds - d0.copy_busy_seconds;
  run.overlap = copy > 0 ? (d1.copy_compute_overlap_seconds -
                            d0.copy_compute_overlap_seconds) /
                               copy
                         : 0;
  return run;
}

int Main(int argc, char** argv) {
  SkipMutexDeadlockDetection();  // common/mutex_mode.h
  std::vector<int64_t> sizes = {256, 1024, 4096};
  std::vector<std::string> modes = {"float32", "tf32", "bfloat16"};
  int streams = 4;
  int jobs_per_stream = 2;
  int64_t poll_only_max_bytes = 0;
  int64_t poll_pause_us =
      absl::ToInt64Microseconds(CudaEngineOptions().poll_pause);
  int pollers = 1;
  PipelinedWork pipe_work;  // --pipe-with: none of the engine's extras
  std::string pipe_with = "nothing more";
  int graphs = -1;  // not given: prestaged operands, no graphs
  bool batched = false;
  bool gathered = false;
  int batch_slots = 0;
  int submit_threads = 0;
  int64_t submit_gap_us = 0;
  bool operands_apart = false;
  int timed_job_every = 1;
  // --coalesce K: the raw pipeline again with K jobs per launch.
  int coalesce = 0;
  double seconds = 2;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) return arg.substr(eq + 1);
      return i + 1 < argc ? argv[++i] : "";
    };
    if (arg.rfind("--sizes", 0) == 0) {
      sizes.clear();
      for (absl::string_view s : absl::StrSplit(value(), ',')) {
        int64_t n;
        if (!absl::SimpleAtoi(s, &n) || n <= 0) {
          std::fprintf(stderr, "bad size %s\n", std::string(s).c_str());
          return 2;
        }
        sizes.push_back(n);
      }
    } else if (arg.rfind("--modes", 0) == 0) {
      modes = absl::StrSplit(value(), ',');
    } else if (arg.rfind("--streams", 0) == 0) {
      streams = std::atoi(value().c_str());
    } else if (arg.rfind("--jobs-per-stream", 0) == 0) {
      jobs_per_stream = std::atoi(value().c_str());
      if (jobs_per_stream < 1 || jobs_per_stream > 64) {
        std::fprintf(stderr, "--jobs-per-stream takes 1..64\n");
        return 2;
      }
    } else if (arg.rfind("--poll-only-max-bytes", 0) == 0) {
      if (!absl::SimpleAtoi(value(), &poll_only_max_bytes) ||
          poll_only_max_bytes < 0) {
        std::fprintf(stderr, "--poll-only-max-bytes takes bytes >= 0\n");
        return 2;
      }
    } else if (arg.rfind("--poll-pause-us", 0) == 0) {
      if (!absl::SimpleAtoi(value(), &poll_pause_us) || poll_pause_us < 0 ||
          poll_pause_us > 10000) {
        std::fprintf(stderr, "--poll-pause-us takes 0..10000\n");
        return 2;
      }
    } else if (arg.rfind("--pipe-with", 0) == 0) {
      pipe_with = value();
      for (absl::string_view part : absl::StrSplit(pipe_with, ',')) {
        if (part == "events") {
          pipe_work.events = 4;
        } else if (part == "start-end-events") {
          pipe_work.events = 2;
        } else if (part == "end-event") {
          pipe_work.events = 1;
        } else if (part == "untimed") {
          pipe_work.untimed_events = true;
        } else if (part == "memory") {
          pipe_work.stream_ordered_memory = true;
        } else if (part == "two-copies") {
          pipe_work.two_copies = true;
        } else if (part == "host-function") {
          pipe_work.host_function = true;
        } else {
          std::fprintf(stderr,
                       "--pipe-with takes events|start-end-events|end-event,"
                       "untimed,memory,two-copies,host-function\n");
          return 2;
        }
      }
    } else if (arg.rfind("--pollers", 0) == 0) {
      if (!absl::SimpleAtoi(value(), &pollers) || pollers < 1 || pollers > 64) {
        std::fprintf(stderr, "--pollers takes 1..64\n");
        return 2;
      }
    } else if (arg.rfind("--graphs", 0) == 0) {
      graphs = std::atoi(value().c_str());
      if (graphs < 0 || graphs > 64) {
        std::fprintf(stderr, "--graphs takes 0..64\n");
        return 2;
      }
    } else if (arg.rfind("--submit-threads", 0) == 0) {
      if (!absl::SimpleAtoi(value(), &submit_threads) || submit_threads < 0 ||
          submit_threads > 64) {
        std::fprintf(stderr, "--submit-threads takes 0..64\n");
        return 2;
      }
    } else if (arg.rfind("--submit-gap-us", 0) == 0) {
      if (!absl::SimpleAtoi(value(), &submit_gap_us) || submit_gap_us < 0 ||
          submit_gap_us > 1000000) {
        std::fprintf(stderr, "--submit-gap-us takes 0..1000000\n");
        return 2;
      }
    } else if (arg == "--batched") {
      batched = true;
    } else if (arg == "--gathered") {
      gathered = true;
    } else if (arg.rfind("--batch-slots", 0) == 0) {
      if (!absl::SimpleAtoi(value(), &batch_slots) || batch_slots < 0 ||
          batch_slots > 256) {
        std::fprintf(stderr, "--batch-slots takes 0..256\n");
        return 2;
      }
    } else if (arg == "--operands-apart") {
      operands_apart = true;
    } else if (arg.rfind("--timed-job-every", 0) == 0) {
      if (!absl::SimpleAtoi(value(), &timed_job_every) || timed_job_every < 1) {
        std::fprintf(stderr, "--timed-job-every takes 1 or more\n");
        return 2;
      }
    } else if (arg.rfind("--seconds", 0) == 0) {
      seconds = std::atof(value().c_str());
    } else if (arg.rfind("--coalesce", 0) == 0) {
      if (!absl::SimpleAtoi(value(), &coalesce) || coalesce < 2 ||
          coalesce > 64) {
        std::fprintf(stderr, "--coalesce takes 2 to 64\n");
        return 2;
      }
    } else if (arg.rfind("--json", 0) == 0) {
      json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: matmul-pipeline-bench [--sizes 256,1024,4096] "
                   "[--modes float32,tf32,bfloat16] [--streams 4] "
                   "[--jobs-per-stream 2] [--poll-only-max-bytes 0] "
                   "[--poll-pause-us 5] [--pollers 1] "
                   "[--pipe-with events|start-end-events|end-event,untimed,"
                   "memory,two-copies,host-function] "
                   "[--graphs N] [--submit-threads 0] [--submit-gap-us 0] "
                   "[--batched] [--gathered] [--batch-slots 0] "
                   "[--operands-apart] [--timed-job-every 1] [--coalesce K] "
                   "[--seconds 2] [--json FILE]\n");
      return 2;
    }
  }
  if (submit_gap_us > 0 && submit_threads == 0) submit_threads = 1;
  absl::StatusOr<std::vector<DeviceInfo>> devices = DiscoverCudaDevices();
  if (!devices.ok()) {
    std::fprintf(stderr, "no CUDA device: %s\n",
                 std::string(devices.status().message()).c_str());
    return 1;
  }
  const DeviceInfo& device = devices->front();
  std::printf(
      "device 0: %s, %d SMs, %d copy engines; pool of %d streams; "
      "%d jobs in flight per stream; poll-only up to %lld bytes; %d "
      "poller(s), pause %lld us; one job in %d timed; %s; "
      "successors submitted %s; raw pipeline with %s; %.1f s per point\n\n",
      device.name.c_str(), device.multiprocessors, device.copy_engines, streams,
      jobs_per_stream, static_cast<long long>(poll_only_max_bytes), pollers,
      static_cast<long long>(poll_pause_us), timed_job_every,
      graphs < 0
          ? (operands_apart ? "operands prestaged in two buffers"
                            : "operands prestaged in one buffer")
          : absl::StrCat("operands copied, ", graphs, " CUDA graphs per stream")
                .c_str(),
      submit_threads == 0 ? "inside Done"
                          : absl::StrCat("by ", submit_threads, " threads, ",
                                         submit_gap_us, " us after Done")
                                .c_str(),
      pipe_with.c_str(), seconds);
  std::printf(
      "%6s %-9s | %8s %8s %8s | %9s %9s %9s %6s | %9s %9s %7s %7s %6s | %8s "
      "%6s | %7s %5s %5s | %9s %7s %5s\n",
      "n", "mode", "h2d ms", "gemm ms", "d2h ms", "ceil/s", "serial/s",
      "pipe/s", "enq us", "1strm/s", "pool/s", "%ceil", "%pipe", "xser",
      "eng gemm", "%raw", "TFLOP/s", "busy", "ovlp", "batch/s", "%ceil",
      "busy");
  std::vector<std::string> rows;
  for (int64_t n : sizes) {
    for (const std::string& mode_name : modes) {
      absl::StatusOr<Mode> mode = ParseMode(mode_name);
      if (!mode.ok()) {
        std::fprintf(stderr, "%s\n", mode.status().ToString().c_str());
        return 2;
      }
      MatmulSpec spec;
      spec.dtype = mode->dtype;
      spec.compute = mode->compute;
      spec.m = spec.n = spec.k = n;
      auto fill = [&spec](std::byte* operands) {
        FillRandom(operands, spec.dtype, spec.a_elements() + spec.b_elements());
      };
      auto report = [&](const absl::Status& status) {
        std::fprintf(stderr, "n=%lld %s: %s\n", static_cast<long long>(n),
                     mode_name.c_str(), status.ToString().c_str());
      };
      absl::StatusOr<StageCeilings> c = MeasureStageCeilings(spec, 0, fill);
      if (!c.ok()) {
        report(c.status());
        return 1;
      }
      // The raw pipeline with the pool's streams, 32 jobs each.
      absl::StatusOr<Pipelined> pipelined =
          MeasurePipelined(spec, 0, streams, 32, pipe_work, fill);
      if (!pipelined.ok()) {
        report(pipelined.status());
        return 1;
      }
      const double pipe = 1.0 / pipelined->seconds_per_job;
      // --coalesce: K jobs' operands in one copy up, one strided-batched
      // GEMM, one copy down (as a gathered batch runs), 8 launches a
      // stream; jobs/s counts the K jobs of each.
      double coalesced = 0;
      if (coalesce > 1) {
        MatmulSpec batch_spec = spec;
        batch_spec.batch = batch_spec.a_batch = batch_spec.b_batch = coalesce;
        auto fill_batch = [&batch_spec](std::byte* operands) {
          FillRandom(operands, batch_spec.dtype,
                     batch_spec.a_elements() + batch_spec.b_elements());
        };
        absl::StatusOr<Pipelined> launches =
            MeasurePipelined(batch_spec, 0, streams, 8, pipe_work, fill_batch);
        if (!launches.ok()) {
          report(launches.status());
          return 1;
        }
        coalesced = coalesce / launches->seconds_per_job;
      }
      const double enqueue_us = pipelined->enqueue_seconds_per_job * 1e6;
      const absl::Duration window = absl::Seconds(seconds);
      RunOptions run_options;
      run_options.streams = 1;
      run_options.jobs_per_stream = jobs_per_stream;
      run_options.poll_only_max_bytes = poll_only_max_bytes;
      run_options.graphs = graphs;
      run_options.submit_threads = submit_threads;
      run_options.submit_gap = absl::Microseconds(submit_gap_us);
      run_options.operands_apart = operands_apart;
      run_options.poll_pause = absl::Microseconds(poll_pause_us);
      run_options.pollers = pollers;
      run_options.timed_job_every = timed_job_every;
      run_options.batch_slots = batch_slots;
      absl::StatusOr<EngineRun> one = RunEngine(spec, run_options, window);
      run_options.streams = streams;
      absl::StatusOr<EngineRun> pool = RunEngine(spec, run_options, window);
      absl::StatusOr<EngineRun> batch = EngineRun{};
      if (batched) {
        run_options.batched = true;
        batch = RunEngine(spec, run_options, window);
        run_options.batched = false;
      }
      absl::StatusOr<EngineRun> gather = EngineRun{};
      if (gathered) {
        run_options.gathered = true;
        gather = RunEngine(spec, run_options, window);
        run_options.gathered = false;
      }
      for (const absl::StatusOr<EngineRun>* run :
           {&one, &pool, &batch, &gather}) {
        if (!run->ok()) {
          std::fprintf(stderr, "engine run failed: %s\n",
                       run->status().ToString().c_str());
          return 1;
        }
      }
      const std::string batch_columns =
          batched ? absl::StrFormat(
                        "%9.1f %6.1f%% %4.0f%%", batch->rate,
                        100 * batch->rate * std::max({c->h2d, c->gemm, c->d2h}),
                        100 * batch->device_busy)
                  : absl::StrFormat("%9s %7s %5s", "-", "-", "-");
      const double ceiling = 1.0 / std::max({c->h2d, c->gemm, c->d2h});
      const double serial = 1.0 / (c->h2d + c->gemm + c->d2h);
      std::printf(
          "%6lld %-9s | %8.3f %8.3f %8.3f | %9.1f %9.1f %9.1f %6.1f | %9.1f "
          "%9.1f %6.1f%% %6.1f%% %5.2fx | %8.3f %5.1f%% | %7.1f %4.0f%% "
          "%4.0f%% | %s\n",
          static_cast<long long>(n), mode_name.c_str(), c->h2d * 1e3,
          c->gemm * 1e3, c->d2h * 1e3, ceiling, serial, pipe, enqueue_us,
          one->rate, pool->rate, 100 * pool->rate / ceiling,
          100 * pool->rate / pipe, pool->rate / serial, one->mean_compute * 1e3,
          100 * one->mean_compute / c->gemm, spec.flops() * pool->rate / 1e12,
          100 * pool->device_busy, 100 * pool->overlap, batch_columns.c_str());
      std::printf(
          "%6s engine enqueue (host) mean: one stream %.1f us, pool "
          "%.1f us\n",
          "", one->mean_enqueue * 1e6, pool->mean_enqueue * 1e6);
      if (gathered) {
        std::printf(
            "%6s gathered (prestaged, batched): %.1f jobs/s, %.1f%% of "
            "ceil/s, %.2fx pipe/s, %.2fx pool/s; %.1f jobs a launch; busy "
            "%.0f%%\n",
            "", gather->rate, 100 * gather->rate / ceiling, gather->rate / pipe,
            gather->rate / pool->rate, gather->mean_batch,
            100 * gather->device_busy);
      }
      if (coalesce > 1) {
        const double per_job = std::max({c->h2d, c->gemm, c->d2h});
        std::printf(
            "%6s raw pipeline, %d jobs a launch: %.1f jobs/s, %.1f%% of "
            "ceil/s, %.2fx pipe/s\n",
            "", coalesce, coalesced, 100 * coalesced * per_job,
            coalesced / pipe);
      }
      std::fflush(stdout);
      rows.push_back(absl::StrCat(
          "{\"n\":", n, ",\"mode\":\"", mode_name, "\",\"t_h2d_s\":", c->h2d,
          ",\"t_gemm_s\":", c->gemm, ",\"t_d2h_s\":", c->d2h,
          ",\"ceiling_per_s\":", ceiling, ",\"serialized_per_s\":", serial,
          ",\"raw_pipelined_per_s\":", pipe, ",\"raw_pipelined_enqueue_us\":",
          enqueue_us, ",\"raw_pipelined_with\":\"", pipe_with, "\"",
          ",\"one_stream_per_s\":", one->rate, ",\"pool_per_s\":", pool->rate,
          ",\"pool_streams\":", streams, ",\"jobs_per_stream\":",
          jobs_per_stream, ",\"poll_only_max_bytes\":", poll_only_max_bytes,
          ",\"submit_threads\":", submit_threads, ",\"pollers\":", pollers,
          ",\"poll_pause_us\":", poll_pause_us, ",\"engine_gemm_s\":",
          one->mean_compute, ",\"pool_engine_gemm_s\":", pool->mean_compute,
          ",\"one_stream_enqueue_s\":", one->mean_enqueue,
          ",\"pool_enqueue_s\":", pool->mean_enqueue,
          ",\"raw_gemm_tflops\":", spec.flops() / c->gemm / 1e12,
          ",\"pool_tflops\":", spec.flops() * pool->rate / 1e12,
          ",\"pool_device_busy\":", pool->device_busy,
          ",\"pool_copy_compute_overlap\":", pool->overlap,
          batched
              ? absl::StrCat(",\"batched_per_s\":", batch->rate,
                             ",\"batched_device_busy\":", batch->device_busy)
              : "",
          gathered
              ? absl::StrCat(",\"gathered_per_s\":", gather->rate,
                             ",\"gathered_mean_batch\":", gather->mean_batch,
                             ",\"gathered_device_busy\":", gather->device_busy)
              : "",
          coalesce > 1 ? absl::StrCat(",\"coalesce\":", coalesce,
                                      ",\"raw_coalesced_per_s\":", coalesced)
                       : "",
          "}"));
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"device\":\"" << device.name << "\",\"points\":[\n"
        << absl::StrJoin(rows, ",\n") << "\n]}\n";
  }
  std::printf(
      "\nceil/s = 1/max(h2d, gemm, d2h), each measured alone; serial/s = "
      "1/(h2d+gemm+d2h); pipe/s = raw CUDA and cuBLAS with the pool's "
      "streams, 32 jobs each enqueued before any runs (each one copy up, the "
      "GEMM, one copy down, and what --pipe-with adds of the engine's per-job "
      "work), enq us its host time to enqueue a job (one thread), %%pipe the "
      "pool against it; eng gemm = engine "
      "GEMM time (1 stream, CUDA events) "
      "vs raw cuBLAS; busy = device busy (union over streams; of the timed "
      "jobs only, with --timed-job-every); ovlp = "
      "copy time overlapped with GEMMs; batch/s (--batched) = the pool "
      "through the server's path: operands copied into staging, adaptive "
      "batching into strided-batched GEMMs; --gathered: the pool through the "
      "same batching "
      "with operands prestaged (gathered multiplies); --coalesce K: the raw "
      "pipeline "
      "with K jobs a launch (one copy up, one strided-batched GEMM, one copy "
      "down), in jobs/s\n");
  return 0;
}

}  // namespace
}  // namespace matmul

int main(int argc, char** argv) { return matmul::Main(argc, argv); }
