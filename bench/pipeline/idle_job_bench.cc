// matmul-idle-job-bench: one small multiply at a time, as an n=256 c=1
// request meets the device (issue 20 item 3: where a c=1 request's time
// goes), and whether enqueuing the job before its staging copy would help.
//
// Each job copies A and B (one request's bytes) from an ordinary host
// buffer into pinned staging, uploads them in one copy, runs cublasGemmEx
// (float32, as the engine does) and copies C back, with a timed event
// before the upload and after each step; the host then polls the last
// event (as a poll-only job's completion does). Between jobs the host waits
// GAP microseconds with the device idle (a c=1 client's round trip). The
// orders, for each gap:
//   serial:  copy into staging, then enqueue the job, then poll: what the
//            engine does today;
//   splitK:  for each of K equal pieces of A and B (K from --splits, 2 =
//            A then B), copy it into staging and enqueue its upload, then
//            the rest: each piece goes up while the next is copied, for
//            K - 1 more upload calls;
//   nt:      as serial, the copy made with non-temporal (streaming)
//            stores (common/streaming_copy.h, the server's
//            --staging-copy-streaming-stores), which leave no dirty lines
//            in the CPU's caches for the upload to read;
//   clean:   no copy: staging holds one source's operands, written and
//            flushed from the CPU's caches before the point; the upload
//            reads memory the CPU has not just written (what the copies'
//            dirty lines cost the upload);
//   pageable: no staging copy: one upload straight from the (ordinary,
//            pageable) source, the driver staging it through its own
//            pinned buffers;
//   overlap: enqueue the job behind a gate (cuStreamWaitValue32 on a word
//            of mapped pinned memory), copy into staging, open the gate,
//            poll: the job's CUDA calls made while the host copies;
//   device:  enqueue behind the gate and copy, then open the gate and time
//            from there: the device's own time for the job (and the
//            completion poll) with no host call in its way.
// Prints per order the host's time from the job's start to the poll seeing
// it done (p50, mean, p90) and the device's upload / GEMM / download spans
// from the events (p50), microseconds. With the gate, the events' spans are
// the device's; without it they include the host's enqueue calls (the
// device waits for them), and in splitK, the later pieces' copies. The warm-up
// runs serial jobs first: a first job behind a closed gate can wait forever, if
// a call made while it waits blocks until the stream is done
// (bench/LOG.md section 22).
//
// With --sleep the host sleeps through each gap instead of spinning, as a
// server's threads do between one client's requests; "enq us" is the
// host's time in the job's CUDA calls.
//
//   matmul-idle-job-bench [--n 256] [--jobs 1000] [--gaps-us 0,100,500]
//                         [--splits 2,4,8] [--sleep] [--orders serial,nt]
#include <cublas_v2.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <emmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/pipeline/raw_bench.h"
#include "common/streaming_copy.h"

namespace {

using Clock = std::chrono::steady_clock;

#define CHECK_CU(x)                                 \
  do {                                              \
    CUresult cu_result_ = (x);                      \
    if (cu_result_ != CUDA_SUCCESS) {               \
      std::fprintf(stderr, "%s: CUresult %d\n", #x, \
                   static_cast<int>(cu_result_));   \
      std::exit(1);                                 \
    }                                               \
  } while (0)

enum class Order { kSerial, kNt, kClean, kSplit, kPageable, kOverlap, kDevice };
std::string OrderName(Order order, int splits) {
  switch (order) {
    case Order::kSerial:
      return "serial";
    case Order::kSplit:
      return "split" + std::to_string(splits);
    case Order::kNt:
      return "nt";
    case Order::kClean:
      return "clean";
    case Order::kPageable:
      return "pageable";
    case Order::kOverlap:
      return "overlap";
    case Order::kDevice:
      return "device";
  }
  return "?";
}

using matmul::raw_bench::Mean;
using matmul::raw_bench::Percentile;

void SpinFor(double us) {
  const Clock::time_point until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double, std::micro>(us));
  while (Clock::now() < until) {
  }
}

struct Bench {
  int n = 256;
  size_t bytes = 0;  // one operand
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  std::vector<std::vector<std::byte>> sources;  // the "received" requests
  std::byte* staging = nullptr;                 // pinned A then B
  std::byte* product = nullptr;                 // pinned C
  std::byte* device = nullptr;                  // A, B, C on the device
  uint32_t* gate = nullptr;                     // mapped pinned word
  CUdeviceptr gate_on_device = 0;
  uint32_t gate_value = 0;
  // The driver's cuStreamWaitValue32, found through the runtime so that the
  // program needs no link to libcuda.
  PFN_cuStreamWaitValue32_v11070 wait_value = nullptr;
  cudaEvent_t events[4] = {};

  const std::byte* Source(int job) const {
    return sources[static_cast<size_t>(job) % sources.size()].data();
  }

  // The job's calls. With `splits` > 0, job `job`'s A and B are copied into
  // staging in `splits` pieces, each uploaded as soon as it is there; with
  // `pageable`, uploaded straight from the job's source.
  void Enqueue(bool gated, int job = 0, int splits = 0, bool pageable = false) {
    if (gated) {
      CHECK_CU(wait_value(reinterpret_cast<CUstream>(stream), gate_on_device,
                          gate_value, CU_STREAM_WAIT_VALUE_GEQ));
    }
    const float alpha = 1, beta = 0;
    if (splits > 0) {
      const std::byte* source = Source(job);
      const size_t total = 2 * bytes;
      // Pieces of whole 4 KiB pages (the last may be shorter).
      const size_t piece =
          std::max<size_t>(4096, (total / static_cast<size_t>(splits)) &
                                     ~static_cast<size_t>(4095));
      for (size_t at = 0; at < total; at += piece) {
        const size_t len = std::min(piece, total - at);
        std::memcpy(staging + at, source + at, len);
        if (at == 0) CHECK_CUDA(cudaEventRecord(events[0], stream));
        CHECK_CUDA(cudaMemcpyAsync(device + at, staging + at, len,
                                   cudaMemcpyHostToDevice, stream));
      }
    } else if (pageable) {
      CHECK_CUDA(cudaEventRecord(events[0], stream));
      CHECK_CUDA(cudaMemcpyAsync(device, Source(job), 2 * bytes,
                                 cudaMemcpyHostToDevice, stream));
    } else {
      CHECK_CUDA(cudaEventRecord(events[0], stream));
      CHECK_CUDA(cudaMemcpyAsync(device, staging, 2 * bytes,
                                 cudaMemcpyHostToDevice, stream));
    }
    CHECK_CUDA(cudaEventRecord(events[1], stream));
    CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                              device + bytes, CUDA_R_32F, n, device, CUDA_R_32F,
                              n, &beta, device + 2 * bytes, CUDA_R_32F, n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CHECK_CUDA(cudaEventRecord(events[2], stream));
    CHECK_CUDA(cudaMemcpyAsync(product, device + 2 * bytes, bytes,
                               cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaEventRecord(events[3], stream));
  }

  void Stage(int job) { std::memcpy(staging, Source(job), 2 * bytes); }

  void OpenGate() {
    // The staging's bytes before the word that lets the device read them.
    std::atomic_thread_fence(std::memory_order_release);
    *static_cast<volatile uint32_t*>(gate) = gate_value;
  }

  void Poll() {
    cudaError_t e;
    while ((e = cudaEventQuery(events[3])) == cudaErrorNotReady) {
    }
    CHECK_CUDA(e);
  }

  // The host's microseconds in the last job's CUDA calls (serial, nt and
  // clean; with the copies in splitK; with the whole upload in pageable).
  double enqueue_us = 0;
  void TimedEnqueue(int job = 0, int splits = 0, bool pageable = false) {
    const Clock::time_point at = Clock::now();
    Enqueue(false, job, splits, pageable);
    enqueue_us =
        std::chrono::duration<double, std::micro>(Clock::now() - at).count();
  }

  // One job in `order`; returns the host's microseconds.
  double Job(Order order, int job, int splits = 0) {
    ++gate_value;
    enqueue_us = 0;
    Clock::time_point start;
    switch (order) {
      case Order::kSerial:
        start = Clock::now();
        Stage(job);
        TimedEnqueue();
        break;
      case Order::kNt:
        start = Clock::now();
        matmul::StreamingCopy(staging, Source(job), 2 * bytes);
        TimedEnqueue();
        break;
      case Order::kClean:
        start = Clock::now();
        TimedEnqueue();
        break;
      case Order::kSplit:
        start = Clock::now();
        TimedEnqueue(job, splits);
        break;
      case Order::kPageable:
        start = Clock::now();
        TimedEnqueue(job, 0, true);
        break;
      case Order::kOverlap:
        start = Clock::now();
        Enqueue(true);
        Stage(job);
        OpenGate();
        break;
      case Order::kDevice:
        Enqueue(true);
        Stage(job);
        start = Clock::now();
        OpenGate();
        break;
    }
    Poll();
    return std::chrono::duration<double, std::micro>(Clock::now() - start)
        .count();
  }

  // Whether the product of `job` (the last one run) matches a float64
  // reference at a few places: a job that read staging before its copy
  // finished would not.
  bool ProductIsRight(int job) const {
    const auto* a = reinterpret_cast<const float*>(Source(job));
    const float* bm = a + static_cast<size_t>(n) * n;
    const auto* c = reinterpret_cast<const float*>(product);
    for (int probe = 0; probe < 16; ++probe) {
      const int i = (probe * 37) % n, j = (probe * 101 + 3) % n;
      double want = 0;
      for (int k = 0; k < n; ++k) {
        want += static_cast<double>(a[static_cast<size_t>(i) * n + k]) *
                bm[static_cast<size_t>(k) * n + j];
      }
      const double got = c[static_cast<size_t>(i) * n + j];
      if (got < want - 1e-3 * (1 + want) || got > want + 1e-3 * (1 + want)) {
        return false;
      }
    }
    return true;
  }

  float Span(int from, int to) {
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, events[from], events[to]));
    return ms * 1e3f;
  }
};

// A comma-separated list of numbers from `lo` to `hi` ("0,100,500");
// exits with status 2, naming `what`, otherwise.
template <typename T>
std::vector<T> ParseList(const char* text, T lo, T hi, const char* what) {
  std::vector<T> out;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    T v{};
    bool parsed = false;
    if constexpr (std::is_floating_point_v<T>) {
      parsed = absl::SimpleAtod(piece, &v);
    } else {
      parsed = absl::SimpleAtoi(piece, &v);
    }
    if (!parsed || v < lo || v > hi) {
      std::fprintf(stderr, "not a list of %s: %s\n", what, text);
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Bench b;
  int jobs = 1000;
  std::vector<double> gaps = {0, 100, 500};
  std::vector<int> splits = {2, 4, 8};
  bool sleep = false;
  std::string only;  // --orders: names to run, e.g. "serial,nt"; all if empty
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--n") == 0 && has_value) {
      b.n = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--jobs") == 0 && has_value) {
      jobs = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--gaps-us") == 0 && has_value) {
      gaps = ParseList<double>(argv[++i], 0, 1e9, "microseconds");
    } else if (std::strcmp(argv[i], "--sleep") == 0) {
      sleep = true;
    } else if (std::strcmp(argv[i], "--orders") == 0 && has_value) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--splits") == 0 && has_value) {
      splits = ParseList<int>(argv[++i], 2, 64, "piece counts (2-64)");
    } else {
      std::fprintf(stderr,
                   "usage: matmul-idle-job-bench [--n 256] [--jobs 1000] "
                   "[--gaps-us 0,100,500] [--splits 2,4,8] [--sleep] "
                   "[--orders serial,nt,...]\n");
      return 2;
    }
  }
  if (b.n <= 0 || jobs <= 0) {
    std::fprintf(stderr, "--n and --jobs must be positive\n");
    return 2;
  }
  b.bytes = static_cast<size_t>(b.n) * b.n * sizeof(float);
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  CHECK_CUBLAS(cublasCreate(&b.handle));
  CHECK_CUBLAS(cublasSetStream(b.handle, b.stream));
  b.sources.resize(4);
  for (size_t s = 0; s < b.sources.size(); ++s) {
    b.sources[s].resize(2 * b.bytes);
    auto* f = reinterpret_cast<float*>(b.sources[s].data());
    for (size_t i = 0; i < 2 * b.bytes / sizeof(float); ++i) {
      f[i] = static_cast<float>((i + s) % 7) * 0.25f;
    }
  }
  CHECK_CUDA(cudaMallocHost(&b.staging, 2 * b.bytes));
  CHECK_CUDA(cudaMallocHost(&b.product, b.bytes));
  CHECK_CUDA(cudaMalloc(&b.device, 3 * b.bytes));
  CHECK_CUDA(cudaHostAlloc(&b.gate, sizeof(uint32_t), cudaHostAllocMapped));
  *b.gate = 0;
  void* gate_device = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(&gate_device, b.gate, 0));
  b.gate_on_device = reinterpret_cast<CUdeviceptr>(gate_device);
  for (cudaEvent_t& e : b.events) CHECK_CUDA(cudaEventCreate(&e));
  cudaDriverEntryPointQueryResult found;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion(
      "cuStreamWaitValue32", reinterpret_cast<void**>(&b.wait_value), 11070,
      cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || b.wait_value == nullptr) {
    std::fprintf(stderr, "the driver has no cuStreamWaitValue32\n");
    return 1;
  }

  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "matmul-idle-job-bench: %s, n=%d float32, %zu bytes staged a job, %d "
      "jobs a point\n",
      prop.name, b.n, 2 * b.bytes, jobs);
  std::printf("%8s %8s %9s %9s %9s %9s %9s %9s %9s\n", "gap us", "order",
              "p50 us", "mean us", "p90 us", "enq us", "h2d us", "gemm us",
              "d2h us");
  for (int i = 0; i < 200; ++i) b.Job(Order::kSerial, i);  // warm-up
  // Each point: an order, and for splitK its piece count.
  std::vector<std::pair<Order, int>> points = {
      {Order::kSerial, 0}, {Order::kNt, 0}, {Order::kClean, 0}};
  for (int k : splits) points.emplace_back(Order::kSplit, k);
  points.insert(
      points.end(),
      {{Order::kPageable, 0}, {Order::kOverlap, 0}, {Order::kDevice, 0}});
  if (!only.empty()) {
    const std::vector<std::string> wanted = absl::StrSplit(only, ',');
    points.erase(std::remove_if(points.begin(), points.end(),
                                [&](const std::pair<Order, int>& point) {
                                  return std::find(wanted.begin(), wanted.end(),
                                                   OrderName(point.first,
                                                             point.second)) ==
                                         wanted.end();
                                }),
                 points.end());
  }
  for (double gap : gaps) {
    for (const auto& [order, k] : points) {
      std::vector<double> host, enq, h2d, gemm, d2h;
      // clean: every job multiplies source 0, staged once here.
      // Its lines are then flushed from the caches (written back).
      if (order == Order::kClean) {
        b.Stage(0);
        for (size_t at = 0; at < 2 * b.bytes; at += 64) {
          _mm_clflush(b.staging + at);
        }
        _mm_mfence();
      }
      const int stride = order == Order::kClean ? 0 : 1;
      for (int i = 0; i < jobs; ++i) {
        if (sleep) {
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::micro>(gap));
        } else {
          SpinFor(gap);
        }
        host.push_back(b.Job(order, i * stride, k));
        enq.push_back(b.enqueue_us);
        h2d.push_back(b.Span(0, 1));
        gemm.push_back(b.Span(1, 2));
        d2h.push_back(b.Span(2, 3));
      }
      const std::string name = OrderName(order, k);
      if (!b.ProductIsRight((jobs - 1) * stride)) {
        std::fprintf(stderr, "gap %.0f us, %s: a wrong product\n", gap,
                     name.c_str());
        return 1;
      }
      std::printf("%8.0f %8s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", gap,
                  name.c_str(), Percentile(host, 0.5), Mean(host),
                  Percentile(host, 0.9), Percentile(enq, 0.5),
                  Percentile(h2d, 0.5), Percentile(gemm, 0.5),
                  Percentile(d2h, 0.5));
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(b.stream));
  return 0;
}
