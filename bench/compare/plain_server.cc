// plain_server: MatmulService's unary Multiply the way one would write it in
// an afternoon, as a baseline for matmul-server (see README.md here).
//
// A synchronous gRPC server (the generated MatmulService::Service and the
// default sync thread pool). Every request takes one mutex that guards the
// one CUDA stream and cuBLAS handle, then: cudaMalloc A, B and C; copy A
// and B in from the request's (pageable) bytes; cublasSgemm; copy C out
// into the response's bytes; synchronize; cudaFree. No pools, no pinned
// memory, no batching, no overlap of one request's copies with another's
// compute: parsing and serializing run in parallel on gRPC's threads, the
// GPU part one request at a time.
//
// Float32 2-D operands only, transposes included; stored tensors, shared
// memory, 3-D operands and other dtypes are refused with UNIMPLEMENTED.
// GetServerInfo answers what matmul-bench reads before a run. The other
// methods are left to the generated base class (UNIMPLEMENTED).
//
// Usage: plain_server [--port N] [--device D]   (binds 127.0.0.1:N)

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "matmul/v1/matmul.grpc.pb.h"

namespace {

namespace v1 = matmul::v1;

grpc::Status Unimplemented(const std::string& what) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      what + " is not supported by plain_server");
}

grpc::Status Invalid(const std::string& what) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what);
}

grpc::Status CudaFailed(const char* call, cudaError_t e) {
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      std::string(call) + ": " + cudaGetErrorName(e) + ": " +
                          cudaGetErrorString(e));
}

#define CUDA_OR_RETURN(call)                             \
  do {                                                   \
    const cudaError_t e_ = (call);                       \
    if (e_ != cudaSuccess) return CudaFailed(#call, e_); \
  } while (0)

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, CudaFree>;

grpc::Status Allocate(size_t bytes, DeviceBuffer& out) {
  void* p = nullptr;
  CUDA_OR_RETURN(cudaMalloc(&p, bytes));
  out.reset(p);
  return grpc::Status::OK;
}

// A float32 2-D operand, checked: [rows, cols] as stored.
struct Operand {
  int64_t rows = 0;
  int64_t cols = 0;
};

grpc::Status CheckOperand(const char* name, const v1::Tensor& t, Operand& out) {
  const std::string n(name);
  if (t.has_shared())
    return Unimplemented("operand " + n + " in shared memory");
  if (t.dtype() == v1::DTYPE_UNSPECIFIED) {
    return Invalid("operand " + n + ": dtype is not set");
  }
  if (t.dtype() != v1::DTYPE_FLOAT32) {
    return Unimplemented("operand " + n + " of dtype " +
                         v1::Dtype_Name(t.dtype()) + " (only DTYPE_FLOAT32)");
  }
  if (t.shape_size() == 3) {
    return Unimplemented("3-D operand " + n + " (only 2-D operands)");
  }
  if (t.shape_size() != 2) {
    return Invalid("operand " + n + " has " + std::to_string(t.shape_size()) +
                   " dimensions; it must have 2 or 3");
  }
  for (int64_t d : t.shape()) {
    if (d < 0) return Invalid("operand " + n + " has a negative dimension");
    if (d == 0) return Unimplemented("empty operand " + n);
    if (d > INT_MAX) {
      return Unimplemented("operand " + n + " with a dimension over " +
                           std::to_string(INT_MAX) + " (cuBLAS's int)");
    }
  }
  out.rows = t.shape(0);
  out.cols = t.shape(1);
  const int64_t bytes = out.rows * out.cols * int64_t{sizeof(float)};
  if (static_cast<int64_t>(t.data().size()) != bytes) {
    return Invalid("operand " + n + " of shape [" + std::to_string(out.rows) +
                   ", " + std::to_string(out.cols) + "] needs " +
                   std::to_string(bytes) + " bytes of data, has " +
                   std::to_string(t.data().size()));
  }
  return grpc::Status::OK;
}

class PlainService final : public v1::MatmulService::Service {
 public:
  PlainService(int device, cudaStream_t stream, cublasHandle_t cublas)
      : device_(device), stream_(stream), cublas_(cublas) {}

  grpc::Status Multiply(grpc::ServerContext*, const v1::MultiplyRequest* req,
                        v1::MultiplyResponse* resp) override {
    if (!req->a_handle().empty() || !req->b_handle().empty()) {
      return Unimplemented("a stored operand (a_handle, b_handle)");
    }
    if (req->keep_result()) return Unimplemented("keep_result");
    if (req->has_c_shared()) return Unimplemented("c_shared");
    if (!req->has_a() || !req->has_b()) {
      return Invalid("both operands a and b must be set");
    }
    Operand a, b;
    grpc::Status s = CheckOperand("a", req->a(), a);
    if (!s.ok()) return s;
    s = CheckOperand("b", req->b(), b);
    if (!s.ok()) return s;
    // C = op(A) op(B): op(A) is m x k, op(B) is k x n.
    const int64_t m = req->transpose_a() ? a.cols : a.rows;
    const int64_t k = req->transpose_a() ? a.rows : a.cols;
    const int64_t kb = req->transpose_b() ? b.cols : b.rows;
    const int64_t n = req->transpose_b() ? b.rows : b.cols;
    if (k != kb) {
      return Invalid("inner dimensions differ: op(a) is [" + std::to_string(m) +
                     ", " + std::to_string(k) + "], op(b) is [" +
                     std::to_string(kb) + ", " + std::to_string(n) + "]");
    }
    const size_t a_bytes = req->a().data().size();
    const size_t b_bytes = req->b().data().size();
    const int64_t c_bytes = m * n * int64_t{sizeof(float)};
    if (c_bytes > INT_MAX) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "the product's " + std::to_string(c_bytes) +
                              " bytes do not fit in one message");
    }
    v1::Tensor* c = resp->mutable_c();
    c->add_shape(m);
    c->add_shape(n);
    c->set_dtype(v1::DTYPE_FLOAT32);
    std::string* c_data = c->mutable_data();
    c_data->resize(static_cast<size_t>(c_bytes));

    {
      std::lock_guard<std::mutex> lock(mu_);
      CUDA_OR_RETURN(cudaSetDevice(device_));
      DeviceBuffer da, db, dc;
      if (!(s = Allocate(a_bytes, da)).ok()) return s;
      if (!(s = Allocate(b_bytes, db)).ok()) return s;
      if (!(s = Allocate(static_cast<size_t>(c_bytes), dc)).ok()) return s;
      CUDA_OR_RETURN(cudaMemcpyAsync(da.get(), req->a().data().data(), a_bytes,
                                     cudaMemcpyHostToDevice, stream_));
      CUDA_OR_RETURN(cudaMemcpyAsync(db.get(), req->b().data().data(), b_bytes,
                                     cudaMemcpyHostToDevice, stream_));
      // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
      // and a row-major buffer read as column-major is the transpose: so
      // swap the operands and keep each one's own transpose flag. Each
      // leading dimension is the stored operand's column count.
      const cublasMath_t math = req->compute_mode() == v1::COMPUTE_MODE_TF32
                                    ? CUBLAS_TF32_TENSOR_OP_MATH
                                    : CUBLAS_DEFAULT_MATH;
      const float one = 1.0f, zero = 0.0f;
      cublasStatus_t st = cublasSetMathMode(cublas_, math);
      if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasSgemm(
            cublas_, req->transpose_b() ? CUBLAS_OP_T : CUBLAS_OP_N,
            req->transpose_a() ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
            static_cast<int>(m), static_cast<int>(k), &one,
            static_cast<const float*>(db.get()), static_cast<int>(b.cols),
            static_cast<const float*>(da.get()), static_cast<int>(a.cols),
            &zero, static_cast<float*>(dc.get()), static_cast<int>(n));
      }
      if (st != CUBLAS_STATUS_SUCCESS) {
        cudaStreamSynchronize(stream_);  // before the buffers are freed
        return grpc::Status(grpc::StatusCode::INTERNAL,
                            std::string("cublasSgemm: ") +
                                cublasGetStatusName(st) + ": " +
                                cublasGetStatusString(st));
      }
      CUDA_OR_RETURN(cudaMemcpyAsync(c_data->data(), dc.get(),
                                     static_cast<size_t>(c_bytes),
                                     cudaMemcpyDeviceToHost, stream_));
      CUDA_OR_RETURN(cudaStreamSynchronize(stream_));
    }
    resp->mutable_placement()->set_device(device_);
    resp->mutable_placement()->set_stream(0);
    return grpc::Status::OK;
  }

  grpc::Status GetServerInfo(grpc::ServerContext*,
                             const v1::GetServerInfoRequest*,
                             v1::GetServerInfoResponse* resp) override {
    cudaDeviceProp p;
    CUDA_OR_RETURN(cudaGetDeviceProperties(&p, device_));
    resp->set_engine("cuda");
    resp->set_version("plain_server (bench/compare)");
    v1::Device* d = resp->add_devices();
    d->set_index(device_);
    d->set_name(p.name);
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-");
    for (int i = 0; i < 16; ++i) {
      std::snprintf(uuid + std::strlen(uuid), sizeof uuid - std::strlen(uuid),
                    "%02x%s", static_cast<unsigned char>(p.uuid.bytes[i]),
                    (i == 3 || i == 5 || i == 7 || i == 9) ? "-" : "");
    }
    d->set_uuid(uuid);
    d->set_memory_bytes(static_cast<int64_t>(p.totalGlobalMem));
    d->set_multiprocessors(p.multiProcessorCount);
    d->set_copy_engines(p.asyncEngineCount);
    d->set_compute_capability(std::to_string(p.major) + "." +
                              std::to_string(p.minor));
    resp->set_streams_per_device(1);
    resp->add_dtypes(v1::DTYPE_FLOAT32);
    resp->mutable_limits()->set_max_message_bytes(INT_MAX);
    resp->mutable_limits()->set_max_dimension(INT_MAX);
    return grpc::Status::OK;
  }

 private:
  const int device_;
  std::mutex mu_;              // one request on the GPU at a time
  cudaStream_t const stream_;  // used under mu_
  cublasHandle_t const cublas_;
};

int Usage() {
  std::fprintf(stderr, "usage: plain_server [--port N] [--device D]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 50071;
  int device = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    std::string name = arg;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Usage();
    }
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || v < 0 || v > 65535) return Usage();
    if (name == "--port") {
      port = static_cast<int>(v);
    } else if (name == "--device") {
      device = static_cast<int>(v);
    } else {
      return Usage();
    }
  }

  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreate(&stream);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "plain_server: device %d: %s\n", device,
                 cudaGetErrorString(e));
    return 1;
  }
  cublasStatus_t st = cublasCreate(&cublas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(cublas, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "plain_server: cuBLAS: %s\n",
                 cublasGetStatusString(st));
    return 1;
  }

  PlainService service(device, stream, cublas);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           &bound_port);
  // gRPC's default is 4 MiB; an n=1024 float32 request is 8 MiB.
  builder.SetMaxReceiveMessageSize(INT_MAX);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    std::fprintf(stderr, "plain_server: cannot listen on %s\n",
                 address.c_str());
    return 1;
  }
  std::printf("plain_server: listening on 127.0.0.1:%d, device %d\n",
              bound_port, device);
  std::fflush(stdout);
  server->Wait();
  return 0;
}
