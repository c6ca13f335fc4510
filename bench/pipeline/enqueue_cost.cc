// matmul-enqueue-cost: what one small job's CUDA calls cost the host thread
// that makes them, call by call, on one stream of device 0 (issue 20 item 3:
// where a c=1 request's time goes).
//
// A job here issues the calls Device::Enqueue (gpu/cuda/enqueue.cc)
// makes for an n x n x n float32 multiply staged from pinned memory: the
// start event, a stream-ordered allocation, the H2D copies of A and B, the
// h2d event, cublasGemmEx, the gemm event, the D2H copy of C, the end event,
// the stream-ordered free and the host function. Each call is timed on the
// host clock (steady_clock, ns). Two patterns:
//   - idle:  one job at a time, the stream synchronized between jobs (the
//            c=1 case: every call finds an idle stream);
//   - queued: jobs back to back, 8 in flight (throughput).
// Then the device time of one idle job from its own events (start -> end),
// and the wall time from the first call to the host function's run.
// Then the GEMM call alone, idle, in three forms: cublasGemmEx (as the
// engine calls it), cublasSgemm, and cublasLtMatmul with descriptors and an
// algorithm chosen once (cublasLtMatmulAlgoGetHeuristic) and reused.
// Prints mean and p50 per call, microseconds.
// Then two probes of what could lower a job's host cost:
//   - threads: the same queued jobs from T host threads at once, each with
//     its own stream, cuBLAS handle and buffers (T = 1, 2, 4, 8): whether
//     the calls of different streams' jobs run in parallel on the host (then
//     more dispatch threads help) or serialize in the driver;
//   - graph: the job's copies and GEMM captured once into a CUDA graph (fixed
//     buffers) and replayed with one cudaGraphLaunch per job, idle and
//     queued: what a job costs the host when its work is prerecorded.
//
//   matmul-enqueue-cost [--n 256] [--jobs 2000]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/pipeline/raw_bench.h"

namespace {

using Clock = std::chrono::steady_clock;

enum Call {
  kStartEvent,
  kAlloc,
  kH2dA,
  kH2dB,
  kH2dEvent,
  kGemm,
  kGemmEvent,
  kD2h,
  kEndEvent,
  kFree,
  kHostFunc,
  kCalls
};
const char* const kNames[kCalls] = {
    "cudaEventRecord(start)", "cudaMallocFromPoolAsync", "cudaMemcpyAsync(A)",
    "cudaMemcpyAsync(B)",     "cudaEventRecord(h2d)",    "cublasGemmEx",
    "cudaEventRecord(gemm)",  "cudaMemcpyAsync(C)",      "cudaEventRecord(end)",
    "cudaFreeAsync",          "cudaLaunchHostFunc"};

struct Samples {
  std::vector<double> us[kCalls];
  std::vector<double> total;
};

std::atomic<int64_t> host_func_ns{0};
void CUDART_CB OnDone(void*) {
  host_func_ns.store(Clock::now().time_since_epoch().count(),
                     std::memory_order_release);
}

using matmul::raw_bench::Mean;
double P50(const std::vector<double>& v) {
  return matmul::raw_bench::Percentile(v, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 256;
  int jobs = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--n") == 0) n = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--jobs") == 0) jobs = std::atoi(argv[i + 1]);
  }
  const size_t bytes = static_cast<size_t>(n) * n * sizeof(float);
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  CHECK_CUBLAS(cublasCreate(&handle));
  CHECK_CUBLAS(cublasSetStream(handle, stream));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep = UINT64_MAX;
  CHECK_CUDA(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  std::byte* host = nullptr;
  CHECK_CUDA(cudaMallocHost(&host, 3 * bytes));
  for (size_t i = 0; i < 3 * bytes / sizeof(float); ++i) {
    reinterpret_cast<float*>(host)[i] = static_cast<float>(i % 7) * 0.25f;
  }
  constexpr int kEventSets = 16;
  cudaEvent_t events[kEventSets][4];
  for (auto& set : events) {
    for (cudaEvent_t& e : set) CHECK_CUDA(cudaEventCreate(&e));
  }
  const float alpha = 1, beta = 0;

  auto job = [&](int i, Samples* s) {
    cudaEvent_t* ev = events[i % kEventSets];
    Clock::time_point t[kCalls + 1];
    void* mem = nullptr;
    t[0] = Clock::now();
    CHECK_CUDA(cudaEventRecord(ev[0], stream));
    t[1] = Clock::now();
    CHECK_CUDA(cudaMallocFromPoolAsync(&mem, 3 * bytes, pool, stream));
    t[2] = Clock::now();
    auto* d = static_cast<std::byte*>(mem);
    CHECK_CUDA(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream));
    t[3] = Clock::now();
    CHECK_CUDA(cudaMemcpyAsync(d + bytes, host + bytes, bytes,
                               cudaMemcpyHostToDevice, stream));
    t[4] = Clock::now();
    CHECK_CUDA(cudaEventRecord(ev[1], stream));
    t[5] = Clock::now();
    CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                              d + bytes, CUDA_R_32F, n, d, CUDA_R_32F, n, &beta,
                              d + 2 * bytes, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    t[6] = Clock::now();
    CHECK_CUDA(cudaEventRecord(ev[2], stream));
    t[7] = Clock::now();
    CHECK_CUDA(cudaMemcpyAsync(host + 2 * bytes, d + 2 * bytes, bytes,
                               cudaMemcpyDeviceToHost, stream));
    t[8] = Clock::now();
    CHECK_CUDA(cudaEventRecord(ev[3], stream));
    t[9] = Clock::now();
    CHECK_CUDA(cudaFreeAsync(mem, stream));
    t[10] = Clock::now();
    CHECK_CUDA(cudaLaunchHostFunc(stream, OnDone, nullptr));
    t[11] = Clock::now();
    if (s != nullptr) {
      for (int c = 0; c < kCalls; ++c) {
        s->us[c].push_back(
            std::chrono::duration<double, std::micro>(t[c + 1] - t[c]).count());
      }
      s->total.push_back(
          std::chrono::duration<double, std::micro>(t[kCalls] - t[0]).count());
    }
    return t[0];
  };

  for (int i = 0; i < 200; ++i) job(i, nullptr);  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));

  Samples idle, queued;
  std::vector<double> device_us, to_host_func_us;
  for (int i = 0; i < jobs; ++i) {
    const Clock::time_point start = job(i, &idle);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    while (host_func_ns.load(std::memory_order_acquire) <
           start.time_since_epoch().count()) {
    }
    to_host_func_us.push_back(
        (host_func_ns.load() - start.time_since_epoch().count()) / 1e3);
    float ms = 0;
    cudaEvent_t* ev = events[i % kEventSets];
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[3]));
    device_us.push_back(ms * 1e3);
  }
  const Clock::time_point q0 = Clock::now();
  for (int i = 0; i < jobs; ++i) {
    if (i >= 8) {
      // At most 8 jobs in flight: wait for the end event of job i - 8.
      CHECK_CUDA(cudaEventSynchronize(events[(i - 8) % kEventSets][3]));
    }
    job(i, &queued);
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const double queued_s =
      std::chrono::duration<double>(Clock::now() - q0).count();

  // The GEMM call alone, idle, in three forms.
  std::vector<std::byte*> dev(3);
  for (auto& p : dev) CHECK_CUDA(cudaMalloc(&p, bytes));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op_desc;
  CHECK_CUBLAS(
      cublasLtMatmulDescCreate(&op_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t layout;
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, n, n, n));
  cublasLtMatmulPreference_t pref;
  CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const size_t workspace_bytes = 32 << 20;
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
      sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op_desc, layout, layout,
                                              layout, layout, pref, 1,
                                              &heuristic, &found));
  if (found == 0) {
    std::fprintf(stderr, "no cublasLt algorithm\n");
    return 1;
  }
  std::vector<double> gemm_ex, sgemm, lt_matmul;
  auto time_call = [&](std::vector<double>* out, auto&& call) {
    for (int i = 0; i < jobs + 100; ++i) {
      const Clock::time_point t0 = Clock::now();
      call();
      const Clock::time_point t1 = Clock::now();
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (i >= 100) {
        out->push_back(
            std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
  };
  time_call(&gemm_ex, [&] {
    CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                              dev[1], CUDA_R_32F, n, dev[0], CUDA_R_32F, n,
                              &beta, dev[2], CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  });
  time_call(&sgemm, [&] {
    CHECK_CUBLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                             reinterpret_cast<const float*>(dev[1]), n,
                             reinterpret_cast<const float*>(dev[0]), n, &beta,
                             reinterpret_cast<float*>(dev[2]), n));
  });
  time_call(&lt_matmul, [&] {
    CHECK_CUBLAS(cublasLtMatmul(lt, op_desc, &alpha, dev[1], layout, dev[0],
                                layout, &beta, dev[2], layout, dev[2], layout,
                                &heuristic.algo, workspace, workspace_bytes,
                                stream));
  });

  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("matmul-enqueue-cost: %s, n=%d float32, %d jobs per pattern\n",
              prop.name, n, jobs);
  std::printf("%-26s %12s %12s %12s %12s\n", "call (host us)", "idle mean",
              "idle p50", "queued mean", "queued p50");
  for (int c = 0; c < kCalls; ++c) {
    std::printf("%-26s %12.2f %12.2f %12.2f %12.2f\n", kNames[c],
                Mean(idle.us[c]), P50(idle.us[c]), Mean(queued.us[c]),
                P50(queued.us[c]));
  }
  std::printf("%-26s %12.2f %12.2f %12.2f %12.2f\n", "all calls of a job",
              Mean(idle.total), P50(idle.total), Mean(queued.total),
              P50(queued.total));
  std::printf(
      "idle job: device start->end events p50 %.2f us; first call -> "
      "host function ran p50 %.2f us\n",
      P50(device_us), P50(to_host_func_us));
  std::printf("queued: %.0f jobs/s (%.2f us per job)\n", jobs / queued_s,
              queued_s * 1e6 / jobs);
  std::printf(
      "GEMM call alone, idle (host us): cublasGemmEx mean %.2f p50 "
      "%.2f; cublasSgemm mean %.2f p50 %.2f; cublasLtMatmul (cached "
      "algorithm) mean %.2f p50 %.2f\n",
      Mean(gemm_ex), P50(gemm_ex), Mean(sgemm), P50(sgemm), Mean(lt_matmul),
      P50(lt_matmul));

  // Threads: T threads, each its own stream, handle, buffers and events,
  // each running `jobs` queued jobs (8 in flight) of the calls above.
  auto threaded_rate = [&](int threads) {
    struct Lane {
      cudaStream_t stream;
      cublasHandle_t handle;
      std::byte* host;
      cudaEvent_t end[kEventSets];
    };
    std::vector<Lane> lanes(threads);
    for (Lane& l : lanes) {
      CHECK_CUDA(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
      CHECK_CUBLAS(cublasCreate(&l.handle));
      CHECK_CUBLAS(cublasSetStream(l.handle, l.stream));
      CHECK_CUDA(cudaMallocHost(&l.host, 3 * bytes));
      std::memset(l.host, 0, 3 * bytes);
      for (cudaEvent_t& e : l.end) {
        CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      }
    }
    auto run = [&](Lane& l, int count) {
      CHECK_CUDA(cudaSetDevice(0));
      for (int i = 0; i < count; ++i) {
        if (i >= 8)
          CHECK_CUDA(cudaEventSynchronize(l.end[(i - 8) % kEventSets]));
        void* mem = nullptr;
        CHECK_CUDA(cudaMallocFromPoolAsync(&mem, 3 * bytes, pool, l.stream));
        auto* d = static_cast<std::byte*>(mem);
        CHECK_CUDA(cudaMemcpyAsync(d, l.host, 2 * bytes, cudaMemcpyHostToDevice,
                                   l.stream));
        CHECK_CUBLAS(cublasGemmEx(
            l.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, d + bytes,
            CUDA_R_32F, n, d, CUDA_R_32F, n, &beta, d + 2 * bytes, CUDA_R_32F,
            n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CHECK_CUDA(cudaMemcpyAsync(l.host + 2 * bytes, d + 2 * bytes, bytes,
                                   cudaMemcpyDeviceToHost, l.stream));
        CHECK_CUDA(cudaEventRecord(l.end[i % kEventSets], l.stream));
        CHECK_CUDA(cudaFreeAsync(mem, l.stream));
        CHECK_CUDA(cudaLaunchHostFunc(l.stream, OnDone, nullptr));
      }
      CHECK_CUDA(cudaStreamSynchronize(l.stream));
    };
    for (Lane& l : lanes) run(l, 100);  // warm-up
    const Clock::time_point t0 = Clock::now();
    std::vector<std::thread> pool_threads;
    for (Lane& l : lanes) pool_threads.emplace_back(run, std::ref(l), jobs);
    for (std::thread& t : pool_threads) t.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (Lane& l : lanes) {
      for (cudaEvent_t& e : l.end) CHECK_CUDA(cudaEventDestroy(e));
      CHECK_CUDA(cudaFreeHost(l.host));
      CHECK_CUBLAS(cublasDestroy(l.handle));
      CHECK_CUDA(cudaStreamDestroy(l.stream));
    }
    return static_cast<double>(jobs) * threads / s;
  };
  std::printf(
      "threads (each its own stream; jobs of H2D A+B, cublasGemmEx, "
      "D2H C, event, alloc/free, host function; 8 in flight each):\n");
  const double one = threaded_rate(1);
  std::printf("  1 thread : %8.0f jobs/s\n", one);
  for (int threads : {2, 4, 8}) {
    const double rate = threaded_rate(threads);
    std::printf("  %d threads: %8.0f jobs/s (%.2fx one thread)\n", threads,
                rate, rate / one);
  }

  // Graph: the copies and the GEMM captured once (fixed device buffers
  // dev[], pinned `host`), replayed per job.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHECK_CUDA(
      cudaMemcpyAsync(dev[0], host, bytes, cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaMemcpyAsync(dev[1], host + bytes, bytes,
                             cudaMemcpyHostToDevice, stream));
  CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                            dev[1], CUDA_R_32F, n, dev[0], CUDA_R_32F, n, &beta,
                            dev[2], CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  CHECK_CUDA(cudaMemcpyAsync(host + 2 * bytes, dev[2], bytes,
                             cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<double> graph_idle, graph_queued;
  for (int i = 0; i < jobs + 100; ++i) {
    const Clock::time_point t0 = Clock::now();
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaLaunchHostFunc(stream, OnDone, nullptr));
    const Clock::time_point t1 = Clock::now();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (i >= 100) {
      graph_idle.push_back(
          std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
  const Clock::time_point g0 = Clock::now();
  for (int i = 0; i < jobs; ++i) {
    if (i >= 8)
      CHECK_CUDA(cudaEventSynchronize(events[(i - 8) % kEventSets][3]));
    const Clock::time_point t0 = Clock::now();
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(events[i % kEventSets][3], stream));
    CHECK_CUDA(cudaLaunchHostFunc(stream, OnDone, nullptr));
    graph_queued.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const double graph_s =
      std::chrono::duration<double>(Clock::now() - g0).count();
  std::printf(
      "graph (H2D A, H2D B, cublasGemmEx, D2H C captured once; "
      "cudaGraphLaunch + cudaLaunchHostFunc per job, host us): idle mean "
      "%.2f p50 %.2f; queued mean %.2f p50 %.2f, %.0f jobs/s\n",
      Mean(graph_idle), P50(graph_idle), Mean(graph_queued), P50(graph_queued),
      jobs / graph_s);
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));

  for (auto& set : events) {
    for (cudaEvent_t& e : set) CHECK_CUDA(cudaEventDestroy(e));
  }
  CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
  CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(layout));
  CHECK_CUBLAS(cublasLtMatmulDescDestroy(op_desc));
  CHECK_CUBLAS(cublasLtDestroy(lt));
  CHECK_CUDA(cudaFree(workspace));
  for (auto& p : dev) CHECK_CUDA(cudaFree(p));
  CHECK_CUBLAS(cublasDestroy(handle));
  CHECK_CUDA(cudaFreeHost(host));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
