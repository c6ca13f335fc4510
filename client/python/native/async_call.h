// The asynchronous calls of the native core (the *_async methods): what a
// call holds of Python while it runs (Held: its completion callback, result
// dtype and Client), the completion that hands its outcome to
// done(ok, value) on a gRPC thread, taking the GIL only for that, and the
// Call object Python gets back, whose cancel() cancels the RPC. Part of
// matmul_client._native (native_module.cc).
#ifndef MATMUL_CLIENT_PYTHON_NATIVE_ASYNC_CALL_H_
#define MATMUL_CLIENT_PYTHON_NATIVE_ASYNC_CALL_H_

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <utility>

#include "client/lib/matmul_client.h"
#include "client/python/native/call_outcome.h"

namespace matmul::native {

namespace py = pybind11;

// Python objects an asynchronous call holds: its completion callback, the
// dtype of its result and the Client that started it (the library's client
// must outlive its calls, whatever Python drops meanwhile). Released with
// the GIL (ReleaseHeld), from whichever thread drops the last reference.
struct Held {
  py::object done;
  py::object dtype;
  py::object client;
};

void ReleaseHeld(const Held* held);

// Hands `out` to the call's Python callback as done(ok, value): value is
// the result, or (code, message) for an error. Runs on a gRPC thread (or
// the caller's, for a call that fails before it starts), taking the GIL
// only for this.
void Complete(std::shared_ptr<const Held> held, Outcome&& out);

// What Python holds of an asynchronous call: cancel() cancels it.
class PyCall {
 public:
  explicit PyCall(std::shared_ptr<CallCanceller> canceller)
      : canceller_(std::move(canceller)) {}
  // Cancels the call (CANCELLED unless it finished first), without the
  // GIL.
  void Cancel();
  bool cancellable() const { return canceller_ != nullptr; }

 private:
  std::shared_ptr<CallCanceller> canceller_;
};

}  // namespace matmul::native

#endif  // MATMUL_CLIENT_PYTHON_NATIVE_ASYNC_CALL_H_
