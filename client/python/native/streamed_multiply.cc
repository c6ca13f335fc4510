// NativeClient's streamed multiply (native_client.h): multiply_streamed and
// multiply_streamed_async, over the library's MultiplyStreamedView.
#include <Python.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "client/python/native/async_call.h"
#include "client/python/native/call_outcome.h"
#include "client/python/native/native_client.h"
#include "client/python/native/wire_operand.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul::native {

NativeClient::StreamedArguments NativeClient::CheckStreamed(
    const py::object& a, int a_dtype, const std::string& a_handle,
    const py::object& b, int b_dtype, const std::string& b_handle,
    bool transpose_a, bool transpose_b, int compute,
    std::optional<double> timeout) {
  const py::object* arrays[2] = {&a, &b};
  const std::string* handles[2] = {&a_handle, &b_handle};
  const int dtypes[2] = {a_dtype, b_dtype};
  StreamedArguments args;
  for (int i = 0; i < 2; ++i) {
    const char* name = i == 0 ? "a" : "b";
    StreamedOperand& view = args.operands[i];
    if (!arrays[i]->is_none()) {
      WireOperand wire = CheckOperand(
          py::reinterpret_borrow<py::array>(*arrays[i]), dtypes[i], name);
      view.shape = std::move(wire.shape);
      view.dtype = wire.dtype;
      view.data = wire.data;
    } else if (handles[i]->empty()) {
      throw py::value_error(absl::StrCat(name, ": no array and no handle"));
    } else {
      view.handle = *handles[i];
    }
  }
  MultiplyOptions& options = args.options;
  options.transpose_a = transpose_a;
  options.transpose_b = transpose_b;
  options.compute = compute == v1::COMPUTE_MODE_TF32 ? ComputeMode::kTf32
                                                     : ComputeMode::kStrict;
  options.timeout = Timeout(timeout);
  return args;
}

py::object NativeClient::MultiplyStreamed(
    const py::object& a, int a_dtype, const std::string& a_handle,
    const py::object& b, int b_dtype, const std::string& b_handle,
    bool transpose_a, bool transpose_b, int compute,
    std::optional<double> timeout, const py::dtype& result_dtype,
    int64_t chunk_bytes, int stripes) {
  StreamedArguments args =
      CheckStreamed(a, a_dtype, a_handle, b, b_dtype, b_handle, transpose_a,
                    transpose_b, compute, timeout);
  // Sent from the arrays' own buffers: `a` and `b` are referenced by this
  // call's arguments until it returns, and the library returns only once
  // gRPC has let go of them.
  StreamOptions stream;
  stream.chunk_bytes = chunk_bytes;
  stream.stripes = stripes;
  absl::StatusOr<HostTensor> product;
  {
    py::gil_scoped_release release;
    product = client_->MultiplyStreamedView(args.operands[0], args.operands[1],
                                            args.options, stream);
  }
  return ToPython(FromStatusOr(std::move(product)), result_dtype);
}

PyCall NativeClient::MultiplyStreamedAsync(
    const py::object& a, int a_dtype, const std::string& a_handle,
    const py::object& b, int b_dtype, const std::string& b_handle,
    bool transpose_a, bool transpose_b, int compute,
    std::optional<double> timeout, const py::dtype& result_dtype,
    int64_t chunk_bytes, const py::object& done, int stripes) {
  StreamedArguments args =
      CheckStreamed(a, a_dtype, a_handle, b, b_dtype, b_handle, transpose_a,
                    transpose_b, compute, timeout);
  args.options.canceller = std::make_shared<CallCanceller>();
  PyCall call(args.options.canceller);
  std::shared_ptr<const Held> held(new Held{done, result_dtype, Self()},
                                   ReleaseHeld);
  // The arrays stay referenced until the call has returned (the library
  // returns once gRPC has let go of their bytes).
  std::shared_ptr<const void> refs(new PythonRefs{a, b}, ReleaseRefs);
  StreamOptions stream;
  stream.chunk_bytes = chunk_bytes;
  stream.stripes = stripes;
  std::thread([this, args = std::move(args), stream, held = std::move(held),
               refs = std::move(refs)]() mutable {
    absl::StatusOr<HostTensor> product = client_->MultiplyStreamedView(
        args.operands[0], args.operands[1], args.options, stream);
    refs.reset();  // the arrays, released with the GIL (ReleaseRefs)
    Complete(std::move(held), FromStatusOr(std::move(product)));
  }).detach();
  return call;
}

}  // namespace matmul::native
