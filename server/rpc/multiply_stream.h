// MultiplyStreamReactor: one MultiplyStream call (a bidirectional stream of
// chunked multiplies; see the rpc's comment in matmul/v1/matmul.proto) as
// gRPC sees it. The protocol is the call's MultiplyStreamSession
// (server/stream/multiply_stream_session.h), which has no gRPC in it; the
// reactor only moves bytes: it reads a message and decodes it, hands the
// session what happened (a message, the input closed, a write done,
// cancel, drain, a step's job done, a post from another call) under its
// lock, and once the lock is released carries out the session's actions:
// calls into other calls, jobs submitted to the engine, the next read, the
// next write (the answer as gRPC's buffer, a result chunk's data sent from
// staging without a copy) and the end of the call.
//
// The reactor lives until gRPC is done with it (OnDone) and every job it
// submitted, and every post to it from another call, has finished: a
// reference count.
#ifndef MATMUL_SERVER_RPC_MULTIPLY_STREAM_H_
#define MATMUL_SERVER_RPC_MULTIPLY_STREAM_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/rpc/call_registry.h"
#include "server/rpc/service_state.h"
#include "server/rpc/stripe_registry.h"
#include "server/stream/multiply_stream_session.h"
#include "server/stream/stream_answer.h"

namespace matmul {

class MultiplyStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public DrainableCall,
      public StreamCall {
 public:
  MultiplyStreamReactor(ServiceState& state,
                        grpc::CallbackServerContext* context);

  // Begins reading; call once, right after construction.
  void Start();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // DrainableCall and StripeCall.
  void Ref() override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() override;
  // Once the server drains, a stream with no multiply open ends at once,
  // UNAVAILABLE, and one with multiplies open after their last answer; at
  // the drain's deadline, whatever is open is cut.
  void Draining() override;
  void CutForDrain() override;

  // StripeCall: a join that waited for its start is decided.
  void JoinResolved(uint64_t join_id,
                    absl::StatusOr<StripeMatch> match) override;

  // StreamCall.
  void Run(const Visit& visit) override;
  absl::Status Abandoned() override;

 private:
  ~MultiplyStreamReactor() override = default;

  // The answer as gRPC's buffer: its head copied, a result chunk's data
  // sent from staging (released when gRPC is done with it).
  static grpc::ByteBuffer ToByteBuffer(StreamAnswer answer);

  // Carries out `actions` (without the lock).
  void Perform(StreamActions& actions);

  ServiceState& state_;
  grpc::CallbackServerContext* const context_;
  std::atomic<int> refs_{1};  // gRPC's, one per job in the engine and post

  mutable absl::Mutex mu_;
  MultiplyStreamSession session_ ABSL_GUARDED_BY(mu_);
  // One read and one write at a time (the session's StreamFlow sees to
  // it): the message being read, and the one being written.
  grpc::ByteBuffer read_buffer_;
  grpc::ByteBuffer write_buffer_;
};

// Starts one MultiplyStream call; gRPC owns the returned reactor.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
StartMultiplyStream(ServiceState& state, grpc::CallbackServerContext* context);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_MULTIPLY_STREAM_H_
