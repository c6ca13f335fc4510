#include "client/python/native/async_call.h"

#include <Python.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"

namespace matmul::native {

void ReleaseHeld(const Held* held) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // leak at exit
  PyGILState_STATE state = PyGILState_Ensure();
  delete held;
  PyGILState_Release(state);
}

void Complete(std::shared_ptr<const Held> held, Outcome&& out) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  py::gil_scoped_acquire gil;
  // `held` (the callback, the dtype) goes with the GIL held.
  absl::Cleanup release = [&held] { held.reset(); };
  try {
    py::object value;
    bool ok = true;
    try {
      value = ToPython(std::move(out), held->dtype);
    } catch (const StatusException& e) {
      ok = false;
      value = py::make_tuple(static_cast<int>(e.status().code()),
                             std::string(e.status().message()));
    }
    held->done(ok, value);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("matmul_client._native: completion callback");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    PyErr_WriteUnraisable(nullptr);
  }
}

void PyCall::Cancel() {
  if (canceller_ == nullptr) return;
  py::gil_scoped_release release;
  canceller_->Cancel();
}

}  // namespace matmul::native
