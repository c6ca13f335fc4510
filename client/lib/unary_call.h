// Internal to the client library (not installed): what its unary calls
// share. SetTimeout turns a timeout into the call's deadline; AsyncCall and
// StartAsync run one asynchronous unary call through a stub's callback API
// and hand its outcome to a `done`.
#ifndef MATMUL_CLIENT_LIB_UNARY_CALL_H_
#define MATMUL_CLIENT_LIB_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/lib/grpc_status.h"

namespace matmul {
namespace client_internal {

inline void SetTimeout(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  // A finite timeout far in the future saturates to time_point::max(),
  // which gRPC reads as no deadline.
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// An asynchronous unary call: owns what gRPC needs until the reaction (and,
// with a canceller, until a Cancel that is using its context returns).
template <typename Request, typename Response>
struct AsyncCall {
  grpc::ClientContext context;
  Request request;
  Response response;
  absl::AnyInvocable<void(absl::StatusOr<Response>) &&> done;
  std::shared_ptr<AsyncCall> self;  // released by the reaction
};

// Starts `call` with `start(context, request, response, reaction)` (a stub's
// async method) and hands the outcome to call->done; releases the call
// before done runs.
template <typename Request, typename Response, typename Start>
void StartAsync(std::shared_ptr<AsyncCall<Request, Response>> shared,
                Start start) {
  AsyncCall<Request, Response>* call = shared.get();
  call->self = std::move(shared);
  start(&call->context, &call->request, &call->response,
        [call](grpc::Status status) {
          std::shared_ptr<AsyncCall<Request, Response>> owned =
              std::move(call->self);
          auto done = std::move(owned->done);
          absl::StatusOr<Response> result =
              status.ok() ? absl::StatusOr<Response>(std::move(owned->response))
                          : absl::StatusOr<Response>(FromGrpcStatus(status));
          owned.reset();
          std::move(done)(std::move(result));
        });
}

}  // namespace client_internal
}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_UNARY_CALL_H_
