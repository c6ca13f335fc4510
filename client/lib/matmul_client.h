// MatmulClient: the C++ client of matmul.v1.MatmulService. It owns one or
// more gRPC channels to a server (or to a load-balanced set of servers) and
// offers the RPCs synchronously, asynchronously (gRPC callback API), on
// HostTensors, or on prebuilt protobuf requests for callers, such as a load
// generator, that send the same payload many times.
//
// Stored tensors. Upload keeps a tensor in the server's device memory (the
// server's RAM on the host engine) and returns a StoredTensor whose `id` is a
// handle; a Multiply operand may be a handle instead of data (Operand), and
// MultiplyAndKeep leaves the product on the server and returns its handle,
// so that products can be chained without crossing the wire. Download
// fetches a stored tensor, Delete frees it; unless deleted, a stored tensor
// expires after its TTL (the server's default when none is given). A handle
// is a capability: whoever holds the id may use or delete it. The server
// charges stored bytes and handles to a client, named by
// ClientOptions::client_id (sent as "x-matmul-client" metadata on every
// call) or, without one, by the peer's address; over its quota Upload and
// MultiplyAndKeep fail with RESOURCE_EXHAUSTED. An unknown, deleted or
// expired handle is NOT_FOUND. Operands of one multiply that live on
// different GPUs are INVALID_ARGUMENT: upload them to the same device.
//
// Handles name their server. A server that advertises an address
// (matmul-server --advertise-address, or its listening IP) issues handles
// that carry it (common/handle_id.h); a client that spreads its calls
// (round_robin over an IP target) sends every call naming such a handle
// (Multiply with handle operands, MultiplyAndKeep, MultiplyRaw,
// MultiplyEncoded, MultiplyStreamed, Download, Delete) to that server, on a
// channel of its own opened on first use and kept, and every other call over
// the spread. Handles that name no server (an older server's, or one with
// nothing to advertise) go over the spread as before. When the handle's
// server cannot be reached (it is gone, and its tensors with it) the call
// fails NOT_FOUND, saying so; operands stored on two different servers are
// INVALID_ARGUMENT.
//
//   auto a = client->Upload(a_tensor);             // StatusOr<StoredTensor>
//   auto ab = client->MultiplyAndKeep(*a, b_tensor);   // A.B stays there
//   auto abc = client->Multiply(*ab, c_tensor);    // (A.B).C comes back
//   client->Delete(a->id); client->Delete(ab->id);
//
// Errors are absl::Status with the gRPC status's code and message, so
// callers can tell INVALID_ARGUMENT (a bad request) from RESOURCE_EXHAUSTED
// (the server is full: retry later) from UNAVAILABLE (no server) and so on.
// Arguments that could never be sent (a tensor whose data does not match its
// shape, an empty handle id, a negative TTL, a client id that is not
// printable ASCII) fail with INVALID_ARGUMENT before anything goes on the
// wire.
//
// Thread-safe: every method may be called from any number of threads at
// once. Calls rotate over the channels round-robin. The client must outlive
// its asynchronous calls (until their `done` has returned).
#ifndef MATMUL_CLIENT_LIB_MATMUL_CLIENT_H_
#define MATMUL_CLIENT_LIB_MATMUL_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/lib/grpc_status.h"
#include "client/lib/host_tensor.h"
#include "common/dtype.h"
#include "common/grpc_args.h"
#include "matmul/v1/matmul.grpc.pb.h"

namespace matmul {

class SharedMemorySession;  // client/lib/shared_memory_session.h

// The metadata key that names the client the server charges stored tensors
// to.
inline constexpr char kClientIdMetadataKey[] = "x-matmul-client";

struct ClientOptions {
  // Largest message sent or received (set on the channel both ways); gRPC
  // caps it at 2^31 - 1. Must be positive.
  int64_t max_message_bytes = 2147483647;
  // gRPC load-balancing policy of every channel (those striped calls open
  // too), set through the default service config: "round_robin" spreads
  // calls over every address the target resolves to (dns:/// names, or
  // "ipv4:10.0.0.1:50051,10.0.0.2:50051"), and sends the calls naming a
  // stored tensor's handle to the server the handle names (see Stored
  // tensors above); "pick_first" keeps them on one. Empty: the client sets
  // none (gRPC's default, pick_first,
  // unless the resolver or a grpc.service_config channel argument names one).
  // Whatever the policy, the default service config retries a call refused
  // with UNAVAILABLE (a draining server's answer) up to three times: under
  // round_robin on the next server.
  std::string load_balancing_policy = "round_robin";
  // Separate channels (HTTP/2 connections) to open; calls rotate among them.
  // More than one helps throughput when large messages would otherwise queue
  // on one connection's flow control. Under round_robin each channel has a
  // connection to every address and spreads its own calls over them.
  int channels = 1;
  // Extra gRPC channel arguments, for transport tuning (common/grpc_args.h).
  // They override the client's own settings of the same key (e.g.
  // grpc.max_receive_message_length over max_message_bytes).
  GrpcArgs channel_args;
  // Extra string-valued channel arguments, likewise (e.g.
  // grpc.ssl_target_name_override for a TLS server whose certificate names
  // another host).
  std::vector<std::pair<std::string, std::string>> channel_string_args;
  // Channel credentials; null means insecure (plaintext).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Sent as "x-matmul-client" metadata on every call: the name the server
  // charges stored tensors (Upload, kept products) to. Empty: none is sent
  // and the server charges the peer's address. Printable ASCII only, at most
  // 256 characters.
  std::string client_id;
};

// Cancels one call from any thread, at any time: an asynchronous Multiply
// (MultiplyOptions::canceller), MultiplyStreamed (the same option; the
// blocked caller returns CANCELLED), UploadAsync (UploadOptions::canceller),
// DownloadAsync or DeleteAsync (their `canceller` argument). Before the call
// starts it then fails CANCELLED at once; while it runs, gRPC's TryCancel
// (CANCELLED unless it finished first); after it finished nothing happens.
// An asynchronous call's `done` still runs exactly once, possibly on the
// thread that calls Cancel. One canceller per call.
class CallCanceller {
 public:
  void Cancel();

 private:
  friend class MatmulClient;
  // For a blocking call whose context is on its caller's stack: attached
  // for the object's life, whose end waits for a Cancel using the context.
  class Borrowed;
  // The call's context, kept alive while Cancel uses it.
  void Attach(std::shared_ptr<grpc::ClientContext> context);

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::weak_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
};

struct MultiplyOptions {
  bool transpose_a = false;
  bool transpose_b = false;
  ComputeMode compute = ComputeMode::kStrict;
  // Becomes the call's deadline; InfiniteDuration() for none.
  absl::Duration timeout = absl::InfiniteDuration();
  // Keep the product on the server and answer with its handle. Requests
  // built by MakeMultiplyRequest carry it (MultiplyRaw then gets c_handle);
  // MultiplyAndKeep keeps the product whatever this says, and Multiply,
  // which returns data, refuses it (INVALID_ARGUMENT).
  bool keep_result = false;
  // How long a kept product lives unless deleted; zero: the server's
  // default. Rounded up to whole seconds; the server refuses more than its
  // maximum (GetServerInfo: limits.max_handle_ttl_seconds).
  absl::Duration result_ttl = absl::ZeroDuration();
  // When not empty: this call's "x-matmul-client" instead of
  // ClientOptions::client_id.
  std::string client_id;
  // Asynchronous calls (MultiplyAsync, MultiplyAndKeepAsync,
  // MultiplyEncodedAsync) and MultiplyStreamed: cancels the call when
  // cancelled.
  std::shared_ptr<CallCanceller> canceller;
};

// Most MultiplyStream calls one streamed multiply may be striped over
// (matmul.v1 MultiplyStreamStart.stripes).
inline constexpr int kMaxStreamStripes = 16;

// How MultiplyStreamed moves a multiply. Zero (the default) in either field
// means: chosen from the multiply's size (StreamOptionsFor).
struct StreamOptions {
  // Operand chunks, and the product's, of about this many bytes (whole
  // elements). 0: from the size; else positive.
  int64_t chunk_bytes = 0;
  // MultiplyStream calls the multiply travels on, each on its own HTTP/2
  // connection, so that it is not bound by one connection's rate: 1 to
  // kMaxStreamStripes. The client's channels (ClientOptions::channels)
  // carry them; where there are fewer, the client opens the missing
  // connections on first use (same target and settings) and keeps them for
  // later striped calls. Under round_robin (for dns:, ipv4:, ipv6: and
  // host:port targets) they all go to one server instead, so that the
  // joins find the start: the one a GetServerInfo over the spread reached
  // just before, on connections to it opened on first use and kept. The server
  // must support striping (a server without it fails the call). The calls after
  // the first wait for their connection (gRPC's wait_for_ready, bounded by
  // MultiplyOptions::timeout) rather than fail at once when a freshly opened
  // one fails to connect. 0: from the size.
  int stripes = 0;
};

// The stripes and chunk size MultiplyStreamed uses, where the caller leaves
// them at 0, for a multiply that moves `wire_bytes` (operands sent plus the
// product received): one call and 4 MiB chunks up to 96 MiB; above that one
// more connection per 96 MiB, at most 8 (one connection carries about 2 GB/s
// on loopback, eight about 10), and 16 MiB chunks from 512 MiB on. Fields
// the caller set are kept.
StreamOptions StreamOptionsFor(int64_t wire_bytes, StreamOptions given = {});

// An operand of MultiplyStreamedView: a stored tensor's handle, or a tensor
// in the caller's memory, sent from there (not copied).
struct StreamedOperand {
  // A stored tensor's id; when set, shape, dtype and data are not used.
  std::string handle;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  // product(shape) * DTypeSize(dtype) row-major bytes; must stay alive and
  // unchanged until the call returns.
  absl::string_view data;
};

// Upload sends a tensor larger than this in chunks (UploadStream), so that
// no message bounds its size; a smaller one in one message (Upload), which
// servers without UploadStream take too.
inline constexpr int64_t kUploadChunkedAboveBytes = int64_t{64} << 20;
// The chunks' size then, unless UploadOptions::chunk_bytes says otherwise.
inline constexpr int64_t kUploadDefaultChunkBytes = int64_t{16} << 20;
// The chunks Download asks for.
inline constexpr int64_t kDownloadChunkBytes = int64_t{16} << 20;

struct UploadOptions {
  // Device to store the tensor on (GetServerInfo's device index); unset:
  // the server picks the least loaded. Operands of one multiply must live on
  // the same device.
  std::optional<int> device;
  // Lifetime unless deleted; zero: the server's default. Rounded up to
  // whole seconds.
  absl::Duration ttl = absl::ZeroDuration();
  // When not empty: this call's "x-matmul-client" instead of
  // ClientOptions::client_id (the quota the tensor is charged to).
  std::string client_id;
  // Becomes the call's deadline; InfiniteDuration() for none.
  absl::Duration timeout = absl::InfiniteDuration();
  // UploadAsync: cancels the call when cancelled.
  std::shared_ptr<CallCanceller> canceller;
  // 0: chosen by size (one message up to kUploadChunkedAboveBytes, chunks of
  // kUploadDefaultChunkBytes above). Positive: chunks of about this many
  // bytes (whole elements, at most 64 MiB), whatever the tensor's size.
  int64_t chunk_bytes = 0;
  // A stored tensor's handle: store this one on the server that holds it
  // (and on its device, unless `device` says otherwise), so that the two
  // can be operands of one multiply. Empty: over the spread, like any call
  // that names no handle. A handle that names no server (from a server
  // with no address to advertise) places nothing.
  std::string near;
};

// A tensor stored on the server (matmul.v1.TensorHandle).
struct StoredTensor {
  // The handle: pass it as an Operand, to Download or to Delete.
  std::string id;
  // As the tensor would have in a Tensor message: 2-D or 3-D.
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  // Device it lives on; -1 on the host engine.
  int device = -1;
  // Bytes it occupies (and is charged to the client's quota).
  int64_t bytes = 0;
  // When the server frees it unless deleted first.
  absl::Time expire_time = absl::InfinitePast();
};

// The StoredTensor a TensorHandle describes; INTERNAL for a malformed one
// (no id, an unknown dtype, a negative dimension).
absl::StatusOr<StoredTensor> StoredTensorFromProto(
    const v1::TensorHandle& handle);

// One operand of a multiply: tensor data, sent with the request, or the
// handle of a stored tensor. Converts implicitly from a HostTensor and from
// a StoredTensor; Operand::Handle(id) names a stored tensor by id alone.
//
// A view: an Operand made from a HostTensor refers to it, which must stay
// alive until the call it is passed to has returned (asynchronous calls
// copy the data into their request before they return). Use it as an
// argument, not as a long-lived value.
class Operand {
 public:
  Operand(const HostTensor& tensor) : tensor_(&tensor) {}      // NOLINT
  Operand(const StoredTensor& stored) : handle_(stored.id) {}  // NOLINT
  static Operand Handle(std::string id) {
    Operand operand;
    operand.handle_ = std::move(id);
    return operand;
  }

  bool is_handle() const { return tensor_ == nullptr; }
  // The data; null for a handle.
  const HostTensor* tensor() const { return tensor_; }
  // The handle id; empty for data.
  const std::string& handle() const { return handle_; }

 private:
  Operand() = default;

  const HostTensor* tensor_ = nullptr;
  std::string handle_;
};

class MatmulClient {
 public:
  // Called once per asynchronous call, on a gRPC thread (or, when the call
  // fails before it starts, on the caller's thread before the call returns).
  // It must not block for long: it holds one of gRPC's callback threads.
  using MultiplyDone = absl::AnyInvocable<void(absl::StatusOr<HostTensor>) &&>;
  using TensorDone = MultiplyDone;
  using StoredDone = absl::AnyInvocable<void(absl::StatusOr<StoredTensor>) &&>;
  using StatusDone = absl::AnyInvocable<void(absl::Status) &&>;
  using MultiplyRawDone =
      absl::AnyInvocable<void(absl::StatusOr<v1::MultiplyResponse>) &&>;

  // Opens the channels to `target`: any gRPC target ("127.0.0.1:50051",
  // "dns:///matmul.svc:50051", "unix:/run/matmul.sock"). Does not connect
  // yet (the first call does). INVALID_ARGUMENT for bad options, e.g. an
  // unknown load-balancing policy or a client id that is not printable
  // ASCII.
  static absl::StatusOr<std::unique_ptr<MatmulClient>> Create(
      const std::string& target, const ClientOptions& options = {});

  MatmulClient(const MatmulClient&) = delete;
  MatmulClient& operator=(const MatmulClient&) = delete;

  // Connects every channel the client has opened (ClientOptions::channels,
  // and those a striped MultiplyStreamed opened) and waits until all are
  // ready, riding out failed connects by gRPC's reconnect backoff. OK once
  // they are; DEADLINE_EXCEEDED, naming the channels that are not, when
  // `timeout` passes first. Calls need not wait for it: a call connects its
  // channel itself, and fails UNAVAILABLE if that first connect fails.
  absl::Status WaitForConnected(absl::Duration timeout);

  // C = op(a) . op(b), in the operands' dtype; either operand may be data
  // or a stored tensor's handle. Blocks until the reply. INVALID_ARGUMENT if
  // options.keep_result is set (use MultiplyAndKeep); NOT_FOUND for an
  // unknown, deleted or expired handle.
  absl::StatusOr<HostTensor> Multiply(const Operand& a, const Operand& b,
                                      const MultiplyOptions& options = {});

  // The same without blocking; `done` gets the product or the error.
  void MultiplyAsync(const Operand& a, const Operand& b,
                     const MultiplyOptions& options, MultiplyDone done);

  // C = op(a) . op(b), kept on the server: returns its handle (whatever
  // options.keep_result says). The product counts against the client's
  // quota (RESOURCE_EXHAUSTED beyond it) until deleted or expired
  // (options.result_ttl).
  absl::StatusOr<StoredTensor> MultiplyAndKeep(
      const Operand& a, const Operand& b, const MultiplyOptions& options = {});
  void MultiplyAndKeepAsync(const Operand& a, const Operand& b,
                            const MultiplyOptions& options, StoredDone done);

  // C = op(a) . op(b) over a MultiplyStream call: the operands go out in
  // chunks of about `chunk_bytes` (whole elements) and the product comes
  // back in chunks of that size, so neither is bounded by the message size
  // (a 16384 x 16384 float32 multiply moves 3 GiB), and the server copies
  // each chunk to the GPU while the next one is on the wire. Blocks until
  // the product is complete. Same errors as Multiply; DATA_LOSS if the
  // server's chunks do not cover the product.
  // chunk_bytes 0: stripes and chunks from the multiply's size
  // (StreamOptionsFor); a positive chunk_bytes keeps to one call.
  absl::StatusOr<HostTensor> MultiplyStreamed(
      const Operand& a, const Operand& b, const MultiplyOptions& options = {},
      int64_t chunk_bytes = 0);

  // The same with stream.stripes MultiplyStream calls on as many
  // connections (StreamOptions): the first opens the multiply with a random
  // 16-byte stripe key, the others join it; the operands' chunks go out
  // round-robin over them, one thread per call sending its chunks in offset
  // order, and the product's chunks come back on all of them, each written
  // where it belongs. The first error of any call cancels the others and is
  // returned. INVALID_ARGUMENT for stripes outside [0, kMaxStreamStripes] or
  // a negative chunk size. The operands' bytes go to the socket
  // from the tensors' own memory (not copied); this returns once gRPC has
  // let go of them.
  absl::StatusOr<HostTensor> MultiplyStreamed(const Operand& a,
                                              const Operand& b,
                                              const MultiplyOptions& options,
                                              const StreamOptions& stream);

  // The same on operands in the caller's memory (a NumPy array's buffer):
  // no copy of them is made on the client.
  absl::StatusOr<HostTensor> MultiplyStreamedView(
      const StreamedOperand& a, const StreamedOperand& b,
      const MultiplyOptions& options, const StreamOptions& stream);

  // Multiply on a prebuilt request, sent as it is (operands as data or
  // handles, keep_result, result_ttl_seconds: the request's own). Only
  // options.timeout and options.client_id are used.
  absl::StatusOr<v1::MultiplyResponse> MultiplyRaw(
      const v1::MultiplyRequest& request, const MultiplyOptions& options = {});

  // The same without blocking. `request` is not copied: it must stay alive
  // and unchanged until `done` has been called. One request may be in
  // flight on any number of calls at once.
  void MultiplyRawAsync(const v1::MultiplyRequest& request,
                        const MultiplyOptions& options, MultiplyRawDone done);

  // Multiply on a request encoded by EncodeMultiplyRequest
  // (client/lib/multiply_encoding.h): its operands go to the socket from their
  // own memory, without the copy that protobuf's serializer makes. One
  // encoding may be sent by any number of calls. Only options.timeout and
  // options.client_id are used. Multiply and MultiplyAsync send this way.
  absl::StatusOr<v1::MultiplyResponse> MultiplyEncoded(
      const grpc::ByteBuffer& request, const MultiplyOptions& options = {});
  void MultiplyEncodedAsync(const grpc::ByteBuffer& request,
                            const MultiplyOptions& options,
                            MultiplyRawDone done);

  // Stores `tensor` (2-D or 3-D) on the server and returns its handle. A
  // tensor of any size: past kUploadChunkedAboveBytes it travels in chunks
  // (UploadStream; a server without it answers UNIMPLEMENTED). Where the
  // server's messages are smaller than the one message or the chunks, the
  // blocking Upload asks it for its limit (GetServerInfo) and sends chunks
  // under it (with UploadOptions::chunk_bytes 0 only). If the call
  // fails or is cancelled midway, nothing is stored and nothing charged.
  // RESOURCE_EXHAUSTED over the client's quota; INVALID_ARGUMENT for an
  // unknown device or a TTL over the server's maximum. UploadAsync copies
  // the tensor before it returns.
  absl::StatusOr<StoredTensor> Upload(const HostTensor& tensor,
                                      const UploadOptions& options = {});
  void UploadAsync(const HostTensor& tensor, const UploadOptions& options,
                   StoredDone done);

  // A stored tensor's data, of any size: it comes in chunks (DownloadStream;
  // from a server without it, in one message). NOT_FOUND for an unknown,
  // deleted or expired handle. The asynchronous call is cancelled by
  // `canceller`, if any.
  absl::StatusOr<HostTensor> Download(
      const std::string& id, absl::Duration timeout = absl::InfiniteDuration());
  void DownloadAsync(const std::string& id, absl::Duration timeout,
                     TensorDone done,
                     std::shared_ptr<CallCanceller> canceller = nullptr);

  // Frees a stored tensor. NOT_FOUND if it does not exist (any more).
  absl::Status Delete(const std::string& id,
                      absl::Duration timeout = absl::InfiniteDuration());
  void DeleteAsync(const std::string& id, absl::Duration timeout,
                   StatusDone done,
                   std::shared_ptr<CallCanceller> canceller = nullptr);

  // The server's engine, devices and limits.
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo(
      absl::Duration timeout = absl::InfiniteDuration());

  // Channels the calls rotate over.
  int channel_count() const { return static_cast<int>(stubs_.size()); }
  // ClientOptions::client_id.
  const std::string& client_id() const { return client_id_; }

 private:
  // Registers regions and sends their calls through NextStub and
  // PrepareContext.
  friend class SharedMemorySession;
  friend class CudaMemorySession;

  // Makes channel `index` of the client (Create's target and settings, its
  // own connection); with an `address` (a peer as gRPC names it,
  // "ipv4:10.0.0.1:50051"), a channel to that one server instead, with the
  // target's authority.
  using ChannelMaker = std::function<std::shared_ptr<grpc::Channel>(
      int index, const std::string& address)>;

  MatmulClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
               std::string client_id, ChannelMaker make_channel,
               bool pin_stripes, std::string target_authority);

  // `k` channels on distinct connections for a striped call. Where the
  // client spreads (round_robin), all to one server, so that the joins
  // reach the server the start reached: the one a GetServerInfo over the
  // spread answered from (bounded by `timeout`, at most 10 s), with
  // channels to it opened on first use and kept. Otherwise, or where that
  // call fails or names no IP address: the client's own channels, starting
  // at the round-robin position, then as many extra ones as it takes
  // (opened on first use, kept).
  // With a `server` (a stored operand's, as its handle names it), all to
  // that server, without asking.
  std::vector<std::shared_ptr<grpc::Channel>> StripeChannels(
      int k, absl::Duration timeout, const std::string& server = "")
      ABSL_LOCKS_EXCLUDED(stripe_mu_);

  // Sends an encoded request for Multiply, with a protobuf response.
  using MultiplyStub =
      grpc::TemplatedGenericStub<grpc::ByteBuffer, v1::MultiplyResponse>;

  // Channel and stubs to the server a stored tensor lives on.
  struct HomeChannel {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::MatmulService::Stub> stub;
    std::unique_ptr<MultiplyStub> multiply_stub;
  };

  // Where a call that names stored tensors goes: to their server, or over
  // the spread (the next channel, round-robin). Keeps the server's channel
  // alive while held.
  class HandleRoute {
   public:
    v1::MatmulService::Stub& stub() const { return *stub_; }
    MultiplyStub& multiply_stub() const { return *multiply_stub_; }
    const std::shared_ptr<grpc::Channel>& channel() const { return *channel_; }
    // The server's address; empty over the spread.
    const std::string& home() const;
    // A call's status: UNAVAILABLE from the handle's server (it is gone, or
    // going) becomes NOT_FOUND, naming it; anything else as it is.
    absl::Status Finish(absl::Status status) const;
    template <typename T>
    absl::StatusOr<T> Finish(absl::StatusOr<T> result) const {
      if (!result.ok()) return Finish(result.status());
      return result;
    }

   private:
    friend class MatmulClient;
    std::shared_ptr<const HomeChannel> home_;  // null: over the spread
    v1::MatmulService::Stub* stub_ = nullptr;
    MultiplyStub* multiply_stub_ = nullptr;
    const std::shared_ptr<grpc::Channel>* channel_ = nullptr;
  };

  // The route of a call naming handles `a` and `b` (either may be empty):
  // the server they name, or the spread. INVALID_ARGUMENT if they name two
  // different servers.
  absl::StatusOr<HandleRoute> RouteHandles(absl::string_view a,
                                           absl::string_view b = "")
      ABSL_LOCKS_EXCLUDED(homes_mu_);

  // Sends an encoded Multiply the way `route` says.
  absl::StatusOr<v1::MultiplyResponse> MultiplyEncodedOn(
      const HandleRoute& route, const grpc::ByteBuffer& request,
      const MultiplyOptions& options);
  void MultiplyEncodedAsyncOn(HandleRoute route,
                              const grpc::ByteBuffer& request,
                              const MultiplyOptions& options,
                              MultiplyRawDone done);

  // The next channel's stub, round-robin.
  v1::MatmulService::Stub& NextStub();

  // The chunked stored-tensor calls (client/lib/stored_tensor_calls.cc);
  // `tensor` stays alive until `done` has run. A download that finds the
  // server without DownloadStream falls back to the unary one.
  void UploadChunkedAsync(std::shared_ptr<const HostTensor> tensor,
                          const UploadOptions& options, StoredDone done);
  void DownloadChunkedAsync(const std::string& id, absl::Duration timeout,
                            TensorDone done,
                            std::shared_ptr<CallCanceller> canceller);
  void DownloadUnaryAsync(const std::string& id, absl::Duration timeout,
                          TensorDone done,
                          std::shared_ptr<CallCanceller> canceller);

  // Sets the deadline and the client id (`client_id`, or else the
  // client's) on a call's context.
  void PrepareContext(grpc::ClientContext& context, absl::Duration timeout,
                      const std::string& client_id) const;

  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::MatmulService::Stub>> stubs_;
  std::vector<std::unique_ptr<MultiplyStub>> multiply_stubs_;
  std::atomic<uint64_t> next_stub_{0};
  const std::string client_id_;
  const ChannelMaker make_channel_;
  // Striped calls go to one server at a time (StripeChannels), and calls
  // naming a handle to the server it names (RouteHandles): the client
  // spreads.
  const bool pin_stripes_;
  // The target's host:port (IpTargetAuthority): a handle naming it needs no
  // channel of its own.
  const std::string target_authority_;
  absl::Mutex homes_mu_;
  // Channels to the servers handles named, by address; past kMaxHomes one
  // is dropped (calls using it keep it until they end).
  absl::flat_hash_map<std::string, std::shared_ptr<const HomeChannel>> homes_
      ABSL_GUARDED_BY(homes_mu_);
  absl::Mutex stripe_mu_;
  // Channels past ClientOptions::channels that striped calls opened.
  std::vector<std::shared_ptr<grpc::Channel>> extra_channels_
      ABSL_GUARDED_BY(stripe_mu_);
  // Channels to one server each that striped calls opened (pin_stripes_),
  // by the server's address; the servers least recently added go first
  // past kMaxPinnedServers.
  std::vector<
      std::pair<std::string, std::vector<std::shared_ptr<grpc::Channel>>>>
      pinned_channels_ ABSL_GUARDED_BY(stripe_mu_);
};

// Builds the request MatmulClient::Multiply sends: each operand's data
// copied in, or its handle set (a_handle, b_handle); keep_result and
// result_ttl_seconds from the options. INVALID_ARGUMENT for a malformed
// tensor, an empty handle id or a negative result TTL.
absl::StatusOr<v1::MultiplyRequest> MakeMultiplyRequest(
    const Operand& a, const Operand& b, const MultiplyOptions& options);

// The UploadRequest MatmulClient::Upload sends (the data copied in).
absl::StatusOr<v1::UploadRequest> MakeUploadRequest(
    const HostTensor& tensor, const UploadOptions& options);

// A TTL in whole seconds for the API (0 for a zero duration, which means
// the server's default), rounded up; INVALID_ARGUMENT, naming `what`, for a
// negative or infinite one.
absl::StatusOr<int64_t> TtlSeconds(absl::Duration ttl, absl::string_view what);

// OK if `id` may be sent as "x-matmul-client" (empty, or at most 256
// printable ASCII characters); INVALID_ARGUMENT otherwise.
absl::Status CheckClientId(absl::string_view id);

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_MATMUL_CLIENT_H_
