// CudaMemorySession: operands and products in the caller's own GPU memory,
// for a client on the matmul server's node
// (MatmulService.RegisterCudaMemory).
//
// The caller holds a device allocation and hands the session its CUDA IPC
// handle (the 64 bytes of cudaIpcGetMemHandle of the allocation's base), the
// bytes to use from that base, and its GPU's 16-byte UUID
// (cudaDeviceProp::uuid). The library itself includes no CUDA header: the
// caller (built with CUDA) gets those three; see bench/service's
// --cuda-memory for an example. The server opens the handle on that GPU,
// reads A and B from the allocation and writes C into it with no copy
// through host memory; the response carries only C's shape.
//
//   CudaMemoryRange range{handle_bytes, allocation_bytes, uuid_bytes};
//   auto session = CudaMemorySession::Create(client.get(), range);
//   SharedTensor a{{m, k}, DType::kFloat32, 0}, b{{k, n}, ..., b_offset};
//   cudaStreamSynchronize(stream);  // A and B written: the contract
//   auto c = (*session)->Multiply(a, b, c_offset);  // C is complete on return
//
// Ordering contract (the proto's): the caller's writes to A and B must be
// complete (its stream synchronized) before Multiply; C is complete on the
// device when Multiply returns.
//
// Only over the server's Unix socket, the server on the CUDA engine and
// driving that GPU: PERMISSION_DENIED over TCP, FAILED_PRECONDITION on the
// host engine or for another GPU, which Create returns. Lifetime as
// SharedMemorySession's: the destructor cancels the registration; the
// caller must keep the allocation alive until then.
//
// Thread-safe. The MatmulClient must outlive the session.
#ifndef MATMUL_CLIENT_LIB_CUDA_MEMORY_SESSION_H_
#define MATMUL_CLIENT_LIB_CUDA_MEMORY_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/lib/matmul_client.h"
#include "client/lib/shared_memory_session.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

// A range of the caller's GPU memory: what RegisterCudaMemory carries.
struct CudaMemoryRange {
  // The 64-byte cudaIpcMemHandle_t of the allocation's base.
  std::string ipc_handle;
  // Bytes from the base to use (at most the allocation's size).
  int64_t bytes = 0;
  // The 16 bytes of the GPU's UUID.
  std::string device_uuid;
};

struct CudaMemoryOptions {
  // How long Create waits for the server's answer.
  absl::Duration register_timeout = absl::Seconds(30);
  // "x-matmul-client" of the registration and of every call; empty: the
  // client's.
  std::string client_id;
};

class CudaMemorySession {
 public:
  // Registers `range`. Client-side INVALID_ARGUMENT for a handle that is
  // not 64 bytes, a UUID that is not 16 or bytes <= 0; then the server's
  // errors (see the proto's RegisterCudaMemory), DEADLINE_EXCEEDED after
  // options.register_timeout.
  static absl::StatusOr<std::unique_ptr<CudaMemorySession>> Create(
      MatmulClient* client, const CudaMemoryRange& range,
      const CudaMemoryOptions& options = {});

  CudaMemorySession(const CudaMemorySession&) = delete;
  CudaMemorySession& operator=(const CudaMemorySession&) = delete;
  // Cancels the registration and waits for the call to end.
  ~CudaMemorySession();

  const std::string& region_id() const { return info_.id(); }
  const v1::SharedMemoryRegion& info() const { return info_; }
  int64_t bytes() const { return bytes_; }

  // C = op(a) . op(b), a and b at their offsets in the range, C written at
  // c_offset; returns C's place. Client-side INVALID_ARGUMENT for tensors
  // outside the range; the server's errors otherwise.
  absl::StatusOr<SharedTensor> Multiply(const SharedTensor& a,
                                        const SharedTensor& b, int64_t c_offset,
                                        const MultiplyOptions& options = {});

  // OK while the server keeps the region; FAILED_PRECONDITION once the
  // registration call has ended.
  absl::Status registration_status() const;

 private:
  class RegistrationCall;
  struct CallState;

  CudaMemorySession(MatmulClient* client, int64_t bytes, std::string client_id);

  MatmulClient* const client_;
  const int64_t bytes_;
  const std::string client_id_;
  v1::SharedMemoryRegion info_;
  std::shared_ptr<CallState> state_;
  std::unique_ptr<RegistrationCall> call_;
};

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_CUDA_MEMORY_SESSION_H_
