// MatmulClient: the C++ client of matmul.v1.MatmulService. It owns one or
// more gRPC channels to a server (or to a load-balanced set of servers) and
// offers the RPCs synchronously, asynchronously (gRPC callback API), on
// HostTensors, or on prebuilt protobuf requests for callers, such as a load
// generator, that send the same payload many times.
//
// Errors are absl::Status with the gRPC status's code and message, so
// callers can tell INVALID_ARGUMENT (a bad request) from RESOURCE_EXHAUSTED
// (the server is full: retry later) from UNAVAILABLE (no server) and so on.
// Arguments that could never be sent (a tensor whose data does not match its
// shape) fail with INVALID_ARGUMENT before anything goes on the wire.
//
// Thread-safe: every method may be called from any number of threads at
// once. Calls rotate over the channels round-robin. The client must outlive
// its asynchronous calls (until their `done` has returned).
#ifndef MATMUL_CLIENT_MATMUL_CLIENT_H_
#define MATMUL_CLIENT_MATMUL_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/host_tensor.h"
#include "common/dtype.h"
#include "matmul/v1/matmul.grpc.pb.h"

namespace matmul {

struct ClientOptions {
  // Largest message sent or received (set on the channel both ways); gRPC
  // caps it at 2^31 - 1. Must be positive.
  int64_t max_message_bytes = 2147483647;
  // gRPC load-balancing policy, set through the default service config:
  // empty for gRPC's default (pick_first), "round_robin" to spread calls over
  // every address a dns:/// target resolves to.
  std::string load_balancing_policy;
  // Separate channels (HTTP/2 connections) to open; calls rotate among them.
  // More than one helps throughput when large messages would otherwise queue
  // on one connection's flow control.
  int channels = 1;
  // Channel credentials; null means insecure (plaintext).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

struct MultiplyOptions {
  bool transpose_a = false;
  bool transpose_b = false;
  ComputeMode compute = ComputeMode::kStrict;
  // Becomes the call's deadline; InfiniteDuration() for none.
  absl::Duration timeout = absl::InfiniteDuration();
};

class MatmulClient {
 public:
  // Called once per asynchronous call, on a gRPC thread (or, when the call
  // fails before it starts, on the caller's thread before the call returns).
  // It must not block for long: it holds one of gRPC's callback threads.
  using MultiplyDone = absl::AnyInvocable<void(absl::StatusOr<HostTensor>) &&>;
  using MultiplyRawDone =
      absl::AnyInvocable<void(absl::StatusOr<v1::MultiplyResponse>) &&>;

  // Opens the channels to `target`: any gRPC target ("127.0.0.1:50051",
  // "dns:///matmul.svc:50051", "unix:/run/matmul.sock"). Does not connect
  // yet (the first call does). INVALID_ARGUMENT for bad options, e.g. an
  // unknown load-balancing policy.
  static absl::StatusOr<std::unique_ptr<MatmulClient>> Create(
      const std::string& target, const ClientOptions& options = {});

  MatmulClient(const MatmulClient&) = delete;
  MatmulClient& operator=(const MatmulClient&) = delete;

  // C = op(a) . op(b), in the operands' dtype. Blocks until the reply.
  absl::StatusOr<HostTensor> Multiply(const HostTensor& a, const HostTensor& b,
                                      const MultiplyOptions& options = {});

  // The same without blocking; `done` gets the product or the error.
  void MultiplyAsync(const HostTensor& a, const HostTensor& b,
                     const MultiplyOptions& options, MultiplyDone done);

  // Multiply on a prebuilt request, sent as it is. Only options.timeout is
  // used: the transposes and compute mode are the request's own.
  absl::StatusOr<v1::MultiplyResponse> MultiplyRaw(
      const v1::MultiplyRequest& request, const MultiplyOptions& options = {});

  // The same without blocking. `request` is not copied: it must stay alive
  // and unchanged until `done` has been called. One request may be in
  // flight on any number of calls at once.
  void MultiplyRawAsync(const v1::MultiplyRequest& request,
                        const MultiplyOptions& options, MultiplyRawDone done);

  // The server's engine, devices and limits.
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo(
      absl::Duration timeout = absl::InfiniteDuration());

  // Channels the calls rotate over.
  int channel_count() const { return static_cast<int>(stubs_.size()); }

 private:
  explicit MatmulClient(std::vector<std::shared_ptr<grpc::Channel>> channels);

  // The next channel's stub, round-robin.
  v1::MatmulService::Stub& NextStub();

  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::MatmulService::Stub>> stubs_;
  std::atomic<uint64_t> next_stub_{0};
};

// Builds the request MatmulClient::Multiply sends (tensors copied in).
absl::StatusOr<v1::MultiplyRequest> MakeMultiplyRequest(
    const HostTensor& a, const HostTensor& b, const MultiplyOptions& options);

// The absl::Status for a gRPC status: same code, same message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace matmul

#endif  // MATMUL_CLIENT_MATMUL_CLIENT_H_
