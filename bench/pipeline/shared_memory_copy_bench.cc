// shm_copy_bench: host-to-device copy rate from a registered POSIX
// shared-memory region (what the server does for RegisterSharedMemory:
// shm_open, mmap MAP_SHARED, CudaEngine::RegisterHostMemory, i.e.
// cudaHostRegister) against cudaMallocHost memory and pageable memory, in
// the same run on the same device. Issue 21's target: the region at >= 80%
// of the pinned rate.
//
//   shm_copy_bench [--bytes N] [--reps R] [--device D]
//
// Prints one line per source (GB/s, best and median of R copies) and the
// ratio of the region's to pinned's; exits 1 if the ratio is under 0.8, 2
// without a GPU or on a CUDA error.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/cuda/cuda_engine.h"

namespace {

#define CHECK_CUDA(call)                                              \
  do {                                                                \
    const cudaError_t e = (call);                                     \
    if (e != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e)); \
      std::exit(2);                                                   \
    }                                                                 \
  } while (0)

struct Rate {
  double best = 0;
  double median = 0;
};

// GB/s of `reps` cudaMemcpyAsync host-to-device copies of `bytes` from
// `src`, timed with events.
Rate Measure(const void* src, void* dst, size_t bytes, int reps,
             cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  // One warm-up copy (first touch, TLB).
  CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    rates.push_back(static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(rates.begin(), rates.end());
  return Rate{rates.back(), rates[rates.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{1} << 30;
  int reps = 10;
  int device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--bytes") {
      bytes = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--reps") {
      reps = std::max(1, std::atoi(argv[i + 1]));
    } else if (flag == "--device") {
      device = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--bytes N] [--reps R] [--device D]\n",
                   argv[0]);
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "no GPU visible\n");
    return 2;
  }
  matmul::CudaEngineOptions options;
  options.devices = {device};
  options.streams_per_device = 1;
  options.pinned_pool_bytes = int64_t{16} << 20;
  absl::StatusOr<std::unique_ptr<matmul::CudaEngine>> engine =
      matmul::CudaEngine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 2;
  }
  CHECK_CUDA(cudaSetDevice(device));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* dst = nullptr;
  CHECK_CUDA(cudaMalloc(&dst, bytes));

  // The region, as the server maps it.
  const std::string name = "/matmul-shm-copy-bench-" + std::to_string(getpid());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::perror("shm_open/ftruncate");
    return 2;
  }
  void* region =
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  shm_unlink(name.c_str());
  if (region == MAP_FAILED) {
    std::perror("mmap");
    return 2;
  }
  std::memset(region, 1, bytes);  // the client fills it
  absl::StatusOr<matmul::HostMemoryRegistration> registration =
      (*engine)->RegisterHostMemory(region, static_cast<int64_t>(bytes));
  if (!registration.ok()) {
    std::fprintf(stderr, "RegisterHostMemory: %s\n",
                 registration.status().ToString().c_str());
    return 2;
  }

  void* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned, bytes));
  std::memset(pinned, 1, bytes);
  std::unique_ptr<char[]> pageable(new char[bytes]);
  std::memset(pageable.get(), 1, bytes);

  const Rate from_pinned = Measure(pinned, dst, bytes, reps, stream);
  const Rate from_region = Measure(region, dst, bytes, reps, stream);
  const Rate from_pageable = Measure(pageable.get(), dst, bytes, reps, stream);
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("device %d (%s), %zu bytes, %d copies each\n", device, prop.name,
              bytes, reps);
  std::printf("%-28s best %6.2f GB/s  median %6.2f GB/s\n",
              "cudaMallocHost (pinned)", from_pinned.best, from_pinned.median);
  std::printf("%-28s best %6.2f GB/s  median %6.2f GB/s\n",
              "shm region, registered", from_region.best, from_region.median);
  std::printf("%-28s best %6.2f GB/s  median %6.2f GB/s\n", "pageable (new[])",
              from_pageable.best, from_pageable.median);
  const double ratio = from_region.median / from_pinned.median;
  std::printf("registered region / pinned (median): %.3f (target >= 0.80)\n",
              ratio);
  std::printf("pageable / pinned (median): %.3f\n",
              from_pageable.median / from_pinned.median);

  *registration = matmul::HostMemoryRegistration();  // unpins
  munmap(region, bytes);
  CHECK_CUDA(cudaFreeHost(pinned));
  CHECK_CUDA(cudaFree(dst));
  CHECK_CUDA(cudaStreamDestroy(stream));
  (*engine)->Shutdown();
  return ratio >= 0.8 ? 0 : 1;
}
