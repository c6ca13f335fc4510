// What a call of the native core gives Python: its outcome, made without the
// GIL (an error, a tensor or a stored tensor's handle), and that outcome as
// a Python value (the product as an array over the reply's own bytes, a
// stored tensor as a tuple) or, for an error, a StatusException, which the
// module turns into StatusError(code, message). Part of
// matmul_client._native (native_module.cc).
#ifndef MATMUL_CLIENT_PYTHON_NATIVE_CALL_OUTCOME_H_
#define MATMUL_CLIENT_PYTHON_NATIVE_CALL_OUTCOME_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "common/dtype.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul::native {

namespace py = pybind11;

// Thrown for a non-OK status; translated to StatusError(code, message).
class StatusException : public std::exception {
 public:
  explicit StatusException(absl::Status status) : status_(std::move(status)) {}
  const char* what() const noexcept override { return "matmul status"; }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// The outcome of a Multiply, Upload or Download, made without the GIL: an
// error, a tensor or a stored tensor's handle.
struct Outcome {
  absl::Status status;
  std::optional<HostTensor> tensor;
  std::optional<StoredTensor> stored;
};

// A Multiply's outcome: the product or, with `keep`, its handle.
Outcome FromResponse(absl::StatusOr<v1::MultiplyResponse> response, bool keep);

// An Upload's (StoredTensor), a Download's or a streamed multiply's
// (HostTensor) outcome.
template <typename T>
Outcome FromStatusOr(absl::StatusOr<T> result) {
  Outcome out;
  if (!result.ok()) {
    out.status = result.status();
  } else if constexpr (std::is_same_v<T, HostTensor>) {
    out.tensor = *std::move(result);
  } else {
    out.stored = *std::move(result);
  }
  return out;
}

// The product as an array of `dtype` over the tensor's own bytes.
py::array Wrap(HostTensor&& product, const py::dtype& dtype);

// A stored tensor for Python: (id, shape, dtype as the proto enum, device,
// bytes, expire time in Unix milliseconds).
py::tuple StoredTuple(const StoredTensor& s);

// The little-endian NumPy dtype a tensor of `dtype` comes back in (bfloat16
// as its uint16 bits).
py::dtype WireDtype(DType dtype);

// The Python value of a successful outcome: the tensor as an array of
// `dtype` (None: its own dtype's, and then (array, dtype enum)), or the
// stored tensor's tuple. Throws StatusException for an error.
py::object ToPython(Outcome&& out, const py::object& dtype);

}  // namespace matmul::native

#endif  // MATMUL_CLIENT_PYTHON_NATIVE_CALL_OUTCOME_H_
