// cuda_memory_child: the client process of CudaMemoryGpuTest (a process of
// its own: a CUDA IPC handle cannot be opened by the process that made it,
// and the test never forks after CUDA is initialized). Over the Unix
// socket SOCKET:
//
//   cuda_memory_child SOCKET exact
//     for every dtype: cudaMallocs one allocation, writes A and B (small
//     integers, so every dtype's product is exact) into it, registers it
//     (RegisterCudaMemory), multiplies A and B into C in it, copies C back
//     and compares it bit for bit with a host reference; then a multiply
//     with the product past the region's end (INVALID_ARGUMENT expected)
//     and a region on a made-up GPU UUID (FAILED_PRECONDITION). Prints one
//     line per check; exits 0 when all pass, 1 otherwise.
//   cuda_memory_child SOCKET loop
//     registers an allocation, prints "READY", then multiplies n=2048
//     float32 from and into it until killed (at most 120 s).
#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/float16.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "proto/dtype_mapping.h"

namespace {

using matmul::DType;
namespace v1 = matmul::v1;

bool Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  std::printf("FAIL %s: %s\n", what, cudaGetErrorString(error));
  return false;
}

// An open registration of `bytes` at `base`.
struct Registration {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::RegisterCudaMemoryResponse>> reader;
  v1::RegisterCudaMemoryResponse response;
  grpc::Status status;
  bool open = false;
};

std::unique_ptr<Registration> Register(v1::MatmulService::Stub& stub,
                                       void* base, int64_t bytes,
                                       const std::string* uuid_override) {
  auto r = std::make_unique<Registration>();
  cudaIpcMemHandle_t handle;
  if (!Check(cudaIpcGetMemHandle(&handle, base), "cudaIpcGetMemHandle")) {
    return r;
  }
  int device = 0;
  cudaGetDevice(&device);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, device);
  v1::RegisterCudaMemoryRequest request;
  request.set_ipc_handle(
      std::string(reinterpret_cast<const char*>(&handle), sizeof handle));
  request.set_bytes(bytes);
  request.set_device_uuid(uuid_override != nullptr
                              ? *uuid_override
                              : std::string(prop.uuid.bytes, 16));
  r->reader = stub.RegisterCudaMemory(&r->context, request);
  r->open = r->reader->Read(&r->response);
  if (!r->open) r->status = r->reader->Finish();
  return r;
}

// `value` (a small integer) as `t`'s bytes at `out`.
void Put(DType t, double value, std::byte* out) {
  switch (t) {
    case DType::kFloat32: {
      const auto v = static_cast<float>(value);
      std::memcpy(out, &v, 4);
      break;
    }
    case DType::kFloat64:
      std::memcpy(out, &value, 8);
      break;
    case DType::kFloat16: {
      const uint16_t v = matmul::FloatToHalf(static_cast<float>(value));
      std::memcpy(out, &v, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t v = matmul::FloatToBFloat16(static_cast<float>(value));
      std::memcpy(out, &v, 2);
      break;
    }
  }
}

void SetShape(v1::Tensor* t, int64_t rows, int64_t cols, DType dtype) {
  t->add_shape(rows);
  t->add_shape(cols);
  t->set_dtype(DTypeToProto(dtype));
}

grpc::Status Multiply(v1::MatmulService::Stub& stub,
                      const v1::MultiplyRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  v1::MultiplyResponse response;
  return stub.Multiply(&context, request, &response);
}

v1::MultiplyRequest InRegion(const std::string& id, int64_t m, int64_t k,
                             int64_t n, DType dtype, int64_t b_offset,
                             int64_t c_offset) {
  v1::MultiplyRequest request;
  SetShape(request.mutable_a(), m, k, dtype);
  request.mutable_a()->mutable_shared()->set_region_id(id);
  request.mutable_a()->mutable_shared()->set_offset(0);
  SetShape(request.mutable_b(), k, n, dtype);
  request.mutable_b()->mutable_shared()->set_region_id(id);
  request.mutable_b()->mutable_shared()->set_offset(b_offset);
  request.mutable_c_shared()->set_region_id(id);
  request.mutable_c_shared()->set_offset(c_offset);
  return request;
}

// One dtype: A (m x k) and B (k x n) of integers in [-2, 2], C compared bit
// for bit (|C| <= 4k = 256 is exact in every dtype, bfloat16 included).
bool ExactProduct(v1::MatmulService::Stub& stub, DType dtype) {
  const int64_t m = 96, k = 64, n = 80;
  const int64_t size = static_cast<int64_t>(matmul::DTypeSize(dtype));
  const int64_t a_bytes = m * k * size, b_bytes = k * n * size;
  const int64_t b_offset = (a_bytes + 255) / 256 * 256;
  const int64_t c_offset = (b_offset + b_bytes + 255) / 256 * 256;
  const int64_t bytes = c_offset + m * n * size;
  std::vector<double> a(m * k), b(k * n);
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<double>(i * 7 % 5) - 2;
  for (int64_t i = 0; i < k * n; ++i) b[i] = static_cast<double>(i * 3 % 5) - 2;
  std::vector<std::byte> host(bytes, std::byte{0xff});
  std::vector<std::byte> want(m * n * size);
  for (int64_t i = 0; i < m * k; ++i) Put(dtype, a[i], &host[i * size]);
  for (int64_t i = 0; i < k * n; ++i) {
    Put(dtype, b[i], &host[b_offset + i * size]);
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += a[i * k + p] * b[p * n + j];
      Put(dtype, sum, &want[(i * n + j) * size]);
    }
  }
  void* device = nullptr;
  if (!Check(cudaMalloc(&device, bytes), "cudaMalloc")) return false;
  bool ok =
      Check(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy up");
  // The contract: the writes are complete before the multiply is sent.
  ok = ok && Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  auto reg = Register(stub, device, bytes, nullptr);
  if (ok && !reg->open) {
    std::printf("FAIL register %d: code %d: %s\n", static_cast<int>(dtype),
                static_cast<int>(reg->status.error_code()),
                reg->status.error_message().c_str());
    ok = false;
  }
  if (ok) {
    const grpc::Status s =
        Multiply(stub, InRegion(reg->response.region().id(), m, k, n, dtype,
                                b_offset, c_offset));
    if (!s.ok()) {
      std::printf("FAIL multiply %d: %s\n", static_cast<int>(dtype),
                  s.error_message().c_str());
      ok = false;
    }
  }
  std::vector<std::byte> got(m * n * size);
  ok = ok &&
       Check(cudaMemcpy(got.data(), static_cast<std::byte*>(device) + c_offset,
                        got.size(), cudaMemcpyDeviceToHost),
             "cudaMemcpy down");
  if (ok && std::memcmp(got.data(), want.data(), got.size()) != 0) {
    std::printf("FAIL product of dtype %d differs from the reference\n",
                static_cast<int>(dtype));
    ok = false;
  }
  if (ok) std::printf("ok dtype %d exact\n", static_cast<int>(dtype));
  if (reg->open) {
    reg->context.TryCancel();
    reg->reader->Finish();
  }
  cudaFree(device);
  return ok;
}

bool Refusals(v1::MatmulService::Stub& stub) {
  const int64_t bytes = 1 << 20;
  void* device = nullptr;
  if (!Check(cudaMalloc(&device, bytes), "cudaMalloc")) return false;
  bool ok = true;
  const std::string elsewhere(16, '\x5a');
  auto other = Register(stub, device, bytes, &elsewhere);
  if (other->open ||
      other->status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
    std::printf("FAIL a made-up GPU: code %d\n",
                static_cast<int>(other->status.error_code()));
    ok = false;
  }
  // 64 MiB: past the 1 MiB allocation (whatever its granularity), within
  // the stored-bytes quota (checked first, RESOURCE_EXHAUSTED).
  auto past = Register(stub, device, int64_t{64} << 20, nullptr);
  if (past->open ||
      past->status.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
    std::printf("FAIL bytes past the allocation: code %d\n",
                static_cast<int>(past->status.error_code()));
    ok = false;
  }
  auto reg = Register(stub, device, bytes, nullptr);
  if (!reg->open) {
    std::printf("FAIL register: %s\n", reg->status.error_message().c_str());
    cudaFree(device);
    return false;
  }
  // 256 x 256 float32: the product (256 KiB) at 1 MiB - 128 KiB runs past.
  const grpc::Status s =
      Multiply(stub, InRegion(reg->response.region().id(), 256, 256, 256,
                              DType::kFloat32, 256 * 1024, bytes - 128 * 1024));
  if (s.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
    std::printf("FAIL product past the region: code %d\n",
                static_cast<int>(s.error_code()));
    ok = false;
  }
  if (ok) std::printf("ok refusals\n");
  reg->context.TryCancel();
  reg->reader->Finish();
  cudaFree(device);
  return ok;
}

int Loop(v1::MatmulService::Stub& stub) {
  const int64_t n = 2048, size = n * n * 4, bytes = 3 * size;
  void* device = nullptr;
  if (!Check(cudaMalloc(&device, bytes), "cudaMalloc")) return 1;
  cudaMemset(device, 0, bytes);
  cudaDeviceSynchronize();
  auto reg = Register(stub, device, bytes, nullptr);
  if (!reg->open) {
    std::printf("FAIL register: %s\n", reg->status.error_message().c_str());
    return 1;
  }
  std::printf("READY %s\n", reg->response.region().id().c_str());
  std::fflush(stdout);
  const absl::Time end = absl::Now() + absl::Seconds(120);
  while (absl::Now() < end) {
    Multiply(stub, InRegion(reg->response.region().id(), n, n, n,
                            DType::kFloat32, size, 2 * size));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SOCKET exact|loop\n", argv[0]);
    return 2;
  }
  auto stub = v1::MatmulService::NewStub(grpc::CreateChannel(
      absl::StrCat("unix:", argv[1]), grpc::InsecureChannelCredentials()));
  if (std::string(argv[2]) == "loop") return Loop(*stub);
  bool ok = true;
  for (DType t :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    ok = ExactProduct(*stub, t) && ok;
  }
  ok = Refusals(*stub) && ok;
  std::fflush(stdout);
  return ok ? 0 : 1;
}
