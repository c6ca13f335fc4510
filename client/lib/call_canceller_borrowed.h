// CallCanceller::Borrowed (client/lib/matmul_client.h): a blocking call's
// hold on its caller's canceller. For the call's duration the canceller may
// cancel the call's context; the destructor waits until no Cancel is using
// it. Internal to the client library (matmul_client.cc and
// streamed_multiply.cc); not installed.
#ifndef MATMUL_CLIENT_LIB_CALL_CANCELLER_BORROWED_H_
#define MATMUL_CLIENT_LIB_CALL_CANCELLER_BORROWED_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/synchronization/notification.h"
#include "client/lib/matmul_client.h"

namespace matmul {

class CallCanceller::Borrowed {
 public:
  Borrowed(CallCanceller* canceller, grpc::ClientContext* context) {
    if (canceller == nullptr) return;
    context_ = std::shared_ptr<grpc::ClientContext>(
        context, [this](grpc::ClientContext*) { released_.Notify(); });
    canceller->Attach(context_);
  }
  ~Borrowed() {
    if (context_ == nullptr) return;
    context_.reset();
    released_.WaitForNotification();  // no Cancel uses the context now
  }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;

 private:
  absl::Notification released_;
  std::shared_ptr<grpc::ClientContext> context_;
};
}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_CALL_CANCELLER_BORROWED_H_
