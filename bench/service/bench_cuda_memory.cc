#include "bench/service/bench_cuda_memory.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#ifdef MATMUL_BENCH_CUDA
#include <cuda_runtime.h>
#endif

namespace matmul {

#ifdef MATMUL_BENCH_CUDA
namespace {

int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

absl::Status Cuda(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  const std::string message =
      absl::StrCat("cuda memory: ", call, ": ", cudaGetErrorString(error));
  return error == cudaErrorMemoryAllocation
             ? absl::ResourceExhaustedError(message)
             : absl::InternalError(message);
}

// What RegisterCudaMemory needs of the allocation at `base`.
absl::StatusOr<CudaMemoryRange> RangeOf(void* base, int64_t bytes) {
  cudaIpcMemHandle_t handle;
  RETURN_IF_ERROR(
      Cuda(cudaIpcGetMemHandle(&handle, base), "cudaIpcGetMemHandle"));
  int device = 0;
  RETURN_IF_ERROR(Cuda(cudaGetDevice(&device), "cudaGetDevice"));
  cudaDeviceProp prop;
  RETURN_IF_ERROR(
      Cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  CudaMemoryRange range;
  range.ipc_handle.assign(reinterpret_cast<const char*>(&handle),
                          sizeof handle);
  range.bytes = bytes;
  range.device_uuid.assign(prop.uuid.bytes, sizeof prop.uuid.bytes);
  return range;
}

}  // namespace

bool BenchHasCuda() { return true; }

absl::StatusOr<std::unique_ptr<CudaMemoryPoint>> CudaMemoryPoint::Create(
    MatmulClient* client, const Workload& workload, int slots) {
  if (slots < 1 || workload.requests.empty()) {
    return absl::InvalidArgumentError(
        "cuda memory: a point needs a slot and a request");
  }
  std::unique_ptr<CudaMemoryPoint> point(new CudaMemoryPoint);
  for (int i = 0; i < slots; ++i) {
    const int w = i % static_cast<int>(workload.requests.size());
    const v1::MultiplyRequest& source = *workload.requests[w];
    const std::string& a_data = source.a().data();
    const std::string& b_data = source.b().data();
    SharedTensor a{{source.a().shape().begin(), source.a().shape().end()},
                   workload.dtype,
                   0};
    SharedTensor b{{source.b().shape().begin(), source.b().shape().end()},
                   workload.dtype,
                   Aligned(static_cast<int64_t>(a_data.size()))};
    ASSIGN_OR_RETURN(const std::vector<int64_t> c_shape,
                     ProductShape(a.shape, b.shape, source.transpose_a(),
                                  source.transpose_b()));
    ASSIGN_OR_RETURN(const int64_t c_bytes, NumBytes(c_shape, workload.dtype));
    SharedTensor c{c_shape, workload.dtype,
                   b.offset + Aligned(static_cast<int64_t>(b_data.size()))};
    const int64_t bytes = c.offset + std::max<int64_t>(c_bytes, 1);
    void* memory = nullptr;
    RETURN_IF_ERROR(Cuda(cudaMalloc(&memory, bytes), "cudaMalloc"));
    point->memory_.push_back(memory);
    auto* base = static_cast<char*>(memory);
    RETURN_IF_ERROR(Cuda(
        cudaMemcpy(base, a_data.data(), a_data.size(), cudaMemcpyHostToDevice),
        "cudaMemcpy"));
    RETURN_IF_ERROR(Cuda(cudaMemcpy(base + b.offset, b_data.data(),
                                    b_data.size(), cudaMemcpyHostToDevice),
                         "cudaMemcpy"));
    // The contract: the operands are written before any multiply is sent.
    RETURN_IF_ERROR(Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    ASSIGN_OR_RETURN(const CudaMemoryRange range, RangeOf(memory, bytes));
    absl::StatusOr<std::unique_ptr<CudaMemorySession>> session =
        CudaMemorySession::Create(client, range);
    if (!session.ok()) {
      return absl::Status(
          session.status().code(),
          absl::StrCat("cuda memory: registering allocation ", i + 1, " of ",
                       slots, " (", bytes, " bytes): ",
                       absl::StatusCodeToString(session.status().code()), ": ",
                       session.status().message()));
    }
    MultiplyOptions options;
    options.transpose_a = source.transpose_a();
    options.transpose_b = source.transpose_b();
    options.compute = source.compute_mode() == v1::COMPUTE_MODE_TF32
                          ? ComputeMode::kTf32
                          : ComputeMode::kStrict;
    ASSIGN_OR_RETURN(v1::MultiplyRequest request,
                     MakeSharedMultiplyRequest((*session)->region_id(), a, b,
                                               c.offset, options));
    point->requests_.push_back(
        std::make_unique<v1::MultiplyRequest>(std::move(request)));
    point->request_ptrs_.push_back(point->requests_.back().get());
    point->workload_index_.push_back(w);
    point->c_.push_back(std::move(c));
    point->region_bytes_ += bytes;
    point->sessions_.push_back(*std::move(session));
  }
  return point;
}

CudaMemoryPoint::~CudaMemoryPoint() {
  sessions_.clear();  // the registrations end before the memory goes
  for (void* memory : memory_) cudaFree(memory);
}

LoadGenerator::ResponseChecker CudaMemoryPoint::Checker(
    const ResponseVerifier* verifier) {
  return [this, verifier](int index, const v1::MultiplyResponse& response) {
    if (index < 0 || index >= static_cast<int>(sessions_.size())) {
      return absl::InternalError(
          absl::StrCat("no allocation for request ", index));
    }
    const SharedTensor& c = c_[index];
    if (!response.c().data().empty() || !response.c().has_shared() ||
        response.c().shared().offset() != c.offset ||
        response.c().shared().region_id() != sessions_[index]->region_id()) {
      return absl::DataLossError(
          "the response does not place the product where it was asked for");
    }
    absl::StatusOr<int64_t> bytes = NumBytes(c.shape, c.dtype);
    if (!bytes.ok()) return bytes.status();
    std::string data(static_cast<size_t>(*bytes), '\0');
    RETURN_IF_ERROR(Cuda(
        cudaMemcpy(data.data(), static_cast<char*>(memory_[index]) + c.offset,
                   data.size(), cudaMemcpyDeviceToHost),
        "cudaMemcpy"));
    v1::MultiplyResponse with_data = response;
    with_data.mutable_c()->clear_shared();
    with_data.mutable_c()->set_data(std::move(data));
    return verifier->Check(workload_index_[index], with_data);
  };
}

#else  // !MATMUL_BENCH_CUDA

bool BenchHasCuda() { return false; }

absl::StatusOr<std::unique_ptr<CudaMemoryPoint>> CudaMemoryPoint::Create(
    MatmulClient*, const Workload&, int) {
  return absl::FailedPreconditionError(
      "--cuda-memory: this matmul-bench was built without CUDA (no CUDA "
      "toolkit at configure time), so it cannot allocate GPU memory; build "
      "it where the toolkit is, or use --shared-memory");
}

CudaMemoryPoint::~CudaMemoryPoint() = default;

LoadGenerator::ResponseChecker CudaMemoryPoint::Checker(
    const ResponseVerifier*) {
  return [](int, const v1::MultiplyResponse&) {
    return absl::FailedPreconditionError("built without CUDA");
  };
}

#endif  // MATMUL_BENCH_CUDA

}  // namespace matmul
