// SharedMemorySession: operands and products in shared memory, for a client
// on the matmul server's host (MatmulService.RegisterSharedMemory).
//
// A session creates a SharedMemoryObject and registers it with the server,
// which maps it (and, on the CUDA engine, pins it so that the GPU's copy
// engines read and write it directly). The caller fills A and B in place,
// through spans into the region, and Multiply sends only their places
// (SharedMemoryRef: region id, offset, shape, dtype); the server writes C
// into the region too, and the response carries only C's shape. No operand
// or product byte crosses the socket.
//
//   auto client = MatmulClient::Create("unix:/run/matmul.sock");
//   auto session = SharedMemorySession::Create(client->get(), 64 << 20);
//   auto a = (*session)->Allocate({m, k}, DType::kFloat32);
//   auto b = (*session)->Allocate({k, n}, DType::kFloat32);
//   auto c = (*session)->Allocate({m, n}, DType::kFloat32);
//   absl::Span<float> av = *(*session)->Span<float>(*a);   // fill A, B
//   auto product = (*session)->Multiply(*a, *b, c->offset);
//   absl::Span<float> cv = *(*session)->Span<float>(*product);  // read C
//
// Only over the server's Unix socket ("unix:PATH" targets): over TCP the
// server refuses the registration with PERMISSION_DENIED, which Create
// returns. The region's bytes count against the client's stored-bytes quota
// (RESOURCE_EXHAUSTED beyond it), charged to the client id the session
// registers under; multiplies on the region must use the same id (the
// session's Multiply does). The object is created with mode 0600, so the
// server must run as the same user unless SharedMemoryOptions::object.mode
// says otherwise.
//
// The registration is one RegisterSharedMemory call that the session keeps
// open: the server keeps the region while the call lives. The destructor
// cancels it (the server then drops the region once no multiply uses it),
// and so does the end of the client process, however it ends; Unregister()
// ends it with UnregisterSharedMemory instead. By default the object's name
// is unlinked as soon as the server has mapped it, so nothing is left in
// /dev/shm even when the client is killed.
//
// Thread-safe: Multiply, Span, Bytes, Put, Get and the accessors may be
// called from any number of threads; Allocate and Reset too, though the
// bytes themselves are the caller's to synchronize (two multiplies writing
// C to the same place race). The MatmulClient must outlive the session.
#ifndef MATMUL_CLIENT_LIB_SHARED_MEMORY_SESSION_H_
#define MATMUL_CLIENT_LIB_SHARED_MEMORY_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "client/lib/shared_memory_object.h"
#include "common/dtype.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

// Where SharedMemorySession::Allocate places tensors: offsets are multiples
// of this (a cache line, and enough for any dtype and for the GPU's copies).
inline constexpr int64_t kSharedTensorAlignment = 256;

// A tensor in a registered region: its shape and dtype, and where its
// bytes start (row-major, little-endian, NumBytes(shape, dtype) of them).
struct SharedTensor {
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  int64_t offset = 0;
};

struct SharedMemoryOptions {
  // How the object is created (mode, name prefix).
  SharedMemoryObjectOptions object;
  // Unlink the object's name once the server has mapped it (see the file
  // comment). false keeps it until the session ends, e.g. to look at it.
  bool unlink_when_registered = true;
  // How long Create waits for the server's answer to the registration.
  absl::Duration register_timeout = absl::Seconds(30);
  // "x-matmul-client" of the registration and of every call of the session;
  // empty: the client's (ClientOptions::client_id).
  std::string client_id;
};

class SharedMemorySession {
 public:
  // Creates a region of `bytes` bytes and registers it over `client` (which
  // must outlive the session). The region's errors (SharedMemoryObject::
  // Create), then the server's: PERMISSION_DENIED over TCP,
  // RESOURCE_EXHAUSTED over the quota, UNIMPLEMENTED for a server without
  // shared memory, DEADLINE_EXCEEDED after options.register_timeout.
  static absl::StatusOr<std::unique_ptr<SharedMemorySession>> Create(
      MatmulClient* client, int64_t bytes,
      const SharedMemoryOptions& options = {});

  SharedMemorySession(const SharedMemorySession&) = delete;
  SharedMemorySession& operator=(const SharedMemorySession&) = delete;
  // Cancels the registration (unless it has ended), waits for the call to
  // end, then unmaps and unlinks the region.
  ~SharedMemorySession();

  // The server's id of the region (SharedMemoryRef.region_id).
  const std::string& region_id() const { return info_.id(); }
  // The region as the server described it when it registered it.
  const v1::SharedMemoryRegion& info() const { return info_; }
  // The mapping on this side.
  SharedMemoryObject& object() { return object_; }
  const SharedMemoryObject& object() const { return object_; }
  // The "x-matmul-client" the session's calls carry (empty: none).
  const std::string& client_id() const { return client_id_; }

  // Places a tensor of `shape` and `dtype` after the ones placed before,
  // at the next multiple of kSharedTensorAlignment. INVALID_ARGUMENT for a
  // bad shape; RESOURCE_EXHAUSTED when it does not fit in the region.
  absl::StatusOr<SharedTensor> Allocate(std::vector<int64_t> shape,
                                        DType dtype);
  // Forgets every placement: the next Allocate starts at offset 0.
  void Reset();

  // The bytes of `t` in the region. INVALID_ARGUMENT for a bad shape, a
  // negative offset or bytes past the region's end.
  absl::StatusOr<absl::Span<char>> Bytes(const SharedTensor& t);
  // The same as elements of T, whose size must be the dtype's (float for
  // kFloat32, double for kFloat64, uint16_t for kFloat16 and kBFloat16).
  template <typename T>
  absl::StatusOr<absl::Span<T>> Span(const SharedTensor& t);

  // Allocate, then copy `tensor`'s data in.
  absl::StatusOr<SharedTensor> Put(const HostTensor& tensor);
  // A copy of `t` out of the region.
  absl::StatusOr<HostTensor> Get(const SharedTensor& t);

  // C = op(a) . op(b), both read from the region, written into the region
  // at `c_offset`; returns C's place. Blocks until the server answers;
  // C's bytes are there when it returns. options.keep_result must be
  // false. Client-side INVALID_ARGUMENT when a or b does not lie in the
  // region or the product would not fit at c_offset; the server's errors
  // otherwise (INVALID_ARGUMENT for mismatched shapes, NOT_FOUND once the
  // region is unregistered).
  absl::StatusOr<SharedTensor> Multiply(const SharedTensor& a,
                                        const SharedTensor& b, int64_t c_offset,
                                        const MultiplyOptions& options = {});

  // Ends the registration with UnregisterSharedMemory and waits for the
  // registration call to end. The mapping stays on this side until the
  // session is destroyed; multiplies on the region fail (NOT_FOUND).
  absl::Status Unregister(absl::Duration timeout = absl::Seconds(30));

  // OK while the server keeps the region; once the registration call has
  // ended (Unregister, the server stopping or dropping it): FAILED_PRECONDITION
  // with the call's status in the message.
  absl::Status registration_status() const;

  // The caller's regions (ListSharedMemory), oldest first; `client_id`
  // empty: the client's.
  static absl::StatusOr<std::vector<v1::SharedMemoryRegion>> List(
      MatmulClient* client, absl::Duration timeout = absl::Seconds(30),
      const std::string& client_id = "");
  // UnregisterSharedMemory of a region by id (NOT_FOUND if it is not one of
  // the caller's).
  static absl::Status UnregisterById(MatmulClient* client,
                                     const std::string& region_id,
                                     absl::Duration timeout = absl::Seconds(30),
                                     const std::string& client_id = "");

 private:
  class RegistrationCall;
  struct CallState;

  SharedMemorySession(MatmulClient* client, SharedMemoryObject region,
                      std::string client_id);

  MatmulClient* const client_;
  SharedMemoryObject object_;
  const std::string client_id_;
  v1::SharedMemoryRegion info_;
  std::shared_ptr<CallState> state_;
  std::unique_ptr<RegistrationCall> call_;

  absl::Mutex mu_;
  int64_t next_offset_ ABSL_GUARDED_BY(mu_) = 0;
};

// The shape of op(a) . op(b) for 2-D or 3-D shapes (numpy.matmul's
// broadcasting of the batch); INVALID_ARGUMENT if the inner dimensions or
// the batches do not match.
absl::StatusOr<std::vector<int64_t>> ProductShape(absl::Span<const int64_t> a,
                                                  absl::Span<const int64_t> b,
                                                  bool transpose_a = false,
                                                  bool transpose_b = false);

// The MultiplyRequest SharedMemorySession::Multiply sends: a and b as
// SharedMemoryRefs into `region_id`, c_shared at `c_offset`, the options'
// transposes and compute mode. INVALID_ARGUMENT for an empty region id, a
// negative offset, a bad shape, keep_result set, or operands of different
// dtypes.
absl::StatusOr<v1::MultiplyRequest> MakeSharedMultiplyRequest(
    absl::string_view region_id, const SharedTensor& a, const SharedTensor& b,
    int64_t c_offset, const MultiplyOptions& options = {});

// C's place out of the response to such a request: INTERNAL if the
// response is not what was asked for (data instead of a place, another
// region or offset, a bad shape or dtype, bytes past `region_bytes`).
absl::StatusOr<SharedTensor> SharedProductFromResponse(
    const v1::MultiplyResponse& response, absl::string_view region_id,
    int64_t c_offset, int64_t region_bytes);

template <typename T>
absl::StatusOr<absl::Span<T>> SharedMemorySession::Span(const SharedTensor& t) {
  if (sizeof(T) != DTypeSize(t.dtype)) {
    return absl::InvalidArgumentError(
        "shared memory: the span's element size is not the tensor's dtype's");
  }
  absl::StatusOr<absl::Span<char>> bytes = Bytes(t);
  if (!bytes.ok()) return bytes.status();
  if (reinterpret_cast<uintptr_t>(bytes->data()) % alignof(T) != 0) {
    return absl::InvalidArgumentError(
        "shared memory: the tensor's offset is not aligned for its dtype");
  }
  return absl::Span<T>(reinterpret_cast<T*>(bytes->data()),
                       bytes->size() / sizeof(T));
}

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_SHARED_MEMORY_SESSION_H_
