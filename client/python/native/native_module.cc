// matmul_client._native: the Python package's native core, over the C++
// client library (client/lib). It takes operands already in their wire form
// (C-contiguous, little-endian arrays of the wire dtype; _client.py makes
// them, copying only an array that is not) and
//
//   - sends them from the arrays' own buffers (EncodeMultiplyRequestView: the
//     request's data slices point into the arrays, which stay referenced
//     until gRPC lets go of them), no copy on the client;
//   - returns the product as an array over the reply's bytes (protobuf's
//     parse of the response is the one copy on the way back: the array owns
//     the parsed string, nothing copies it again);
//   - releases the GIL for the RPC, so Python threads run calls in
//     parallel.
//
// An operand may instead be a stored tensor's handle (the array None), and
// keep=True returns the kept product's handle as a tuple (StoredTuple).
// multiply_streamed sends the arrays from their own buffers too (the
// library's MultiplyStreamedView); upload copies each array once into the
// library's HostTensor (without the GIL); download returns the library's
// buffer.
//
// The *_async methods start the library's asynchronous call and return at
// once (a Call, whose cancel() cancels the RPC); the library completes
// them on a gRPC thread, which takes the GIL only to call done(ok, value)
// (value: the result, or (code, message)). multiply_streamed_async runs the
// library's blocking MultiplyStreamed on a thread of its own, which ends
// with the call (promptly once cancelled). matmul_client.aio hands the
// outcome to its event loop with call_soon_threadsafe;
// Client.multiply_async to a concurrent.futures.Future.
//
// A failed call raises StatusError(code, message), code the gRPC status code
// as an int; _client.py turns it into MatmulError.
//
// The module's files, in client/python/native/: native_module.cc (this
// one: the Python names), native_client.{h,cc} (Client, its unary calls),
// streamed_multiply.cc (Client's streamed multiply), wire_operand.{h,cc}
// (operands in), call_outcome.{h,cc} (results and errors out) and
// async_call.{h,cc} (asynchronous completion and Call).
#include <Python.h>
#include <grpc/grpc.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/python/native/async_call.h"
#include "client/python/native/call_outcome.h"
#include "client/python/native/native_client.h"
#include "common/mutex_mode.h"

namespace py = pybind11;

namespace {

// StatusError, the exception a StatusException becomes.
PyObject* g_status_error = nullptr;

}  // namespace

PYBIND11_MODULE(_native, m) {
  using matmul::native::NativeClient;
  using matmul::native::PyCall;
  using matmul::native::StatusException;
  // The core's Abseil (Debian's, linked into this module alone; grpcio's
  // wheel carries its own) would otherwise check lock order on every mutex
  // lock behind one global spinlock (common/mutex_mode.h).
  matmul::SkipMutexDeadlockDetection();
  m.doc() =
      "The native core of matmul_client: Multiply and MultiplyStream over "
      "the C++ client library, operands sent from their own buffers, the GIL "
      "released for the whole call.";
  // gRPC stays initialized for the life of the process. Otherwise dropping
  // the last Client (which may happen on a gRPC thread, when an
  // asynchronous call holds it) shuts gRPC down while its callback threads
  // still poll their completion queue (grpc_completion_queue_next crashed
  // so in test_aio's many-awaits test).
  grpc_init();
  g_status_error = PyErr_NewExceptionWithDoc(
      "matmul_client._native.StatusError",
      "A failed call: args are (code, message), code the gRPC status code "
      "as an int.",
      PyExc_RuntimeError, nullptr);
  m.add_object("StatusError", py::handle(g_status_error));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusException& e) {
      py::tuple args = py::make_tuple(static_cast<int>(e.status().code()),
                                      std::string(e.status().message()));
      PyErr_SetObject(g_status_error, args.ptr());
    }
  });
  py::class_<PyCall>(m, "Call")
      .def("cancel", &PyCall::Cancel,
           "Cancels the call (CANCELLED unless it finished first).")
      .def_property_readonly("cancellable", &PyCall::cancellable);
  py::class_<NativeClient>(m, "Client")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    int, bool, std::optional<std::string>,
                    std::optional<std::string>, std::optional<std::string>,
                    const std::vector<std::pair<std::string, int>>&,
                    const std::vector<std::pair<std::string, std::string>>&>(),
           py::arg("target"), py::arg("client_id") = "",
           py::arg("load_balancing_policy") = "", py::arg("channels") = 1,
           py::arg("tls") = false, py::arg("root_certificates") = py::none(),
           py::arg("private_key") = py::none(),
           py::arg("certificate_chain") = py::none(),
           py::arg("int_options") = std::vector<std::pair<std::string, int>>(),
           py::arg("string_options") =
               std::vector<std::pair<std::string, std::string>>())
      .def("multiply", &NativeClient::Multiply, py::arg("a"),
           py::arg("a_dtype"), py::arg("a_handle"), py::arg("b"),
           py::arg("b_dtype"), py::arg("b_handle"), py::arg("transpose_a"),
           py::arg("transpose_b"), py::arg("compute"), py::arg("timeout"),
           py::arg("result_dtype"), py::arg("keep"), py::arg("result_ttl"))
      .def("multiply_async", &NativeClient::MultiplyAsync, py::arg("a"),
           py::arg("a_dtype"), py::arg("a_handle"), py::arg("b"),
           py::arg("b_dtype"), py::arg("b_handle"), py::arg("transpose_a"),
           py::arg("transpose_b"), py::arg("compute"), py::arg("timeout"),
           py::arg("result_dtype"), py::arg("keep"), py::arg("result_ttl"),
           py::arg("done"))
      .def("multiply_streamed", &NativeClient::MultiplyStreamed, py::arg("a"),
           py::arg("a_dtype"), py::arg("a_handle"), py::arg("b"),
           py::arg("b_dtype"), py::arg("b_handle"), py::arg("transpose_a"),
           py::arg("transpose_b"), py::arg("compute"), py::arg("timeout"),
           py::arg("result_dtype"), py::arg("chunk_bytes"),
           py::arg("stripes") = 1)
      .def("multiply_streamed_async", &NativeClient::MultiplyStreamedAsync,
           py::arg("a"), py::arg("a_dtype"), py::arg("a_handle"), py::arg("b"),
           py::arg("b_dtype"), py::arg("b_handle"), py::arg("transpose_a"),
           py::arg("transpose_b"), py::arg("compute"), py::arg("timeout"),
           py::arg("result_dtype"), py::arg("chunk_bytes"), py::arg("done"),
           py::arg("stripes") = 1)
      .def("upload", &NativeClient::Upload, py::arg("array"), py::arg("dtype"),
           py::arg("device"), py::arg("ttl_seconds"), py::arg("timeout"),
           py::arg("near"))
      .def("upload_async", &NativeClient::UploadAsync, py::arg("array"),
           py::arg("dtype"), py::arg("device"), py::arg("ttl_seconds"),
           py::arg("timeout"), py::arg("near"), py::arg("done"))
      .def("download", &NativeClient::Download, py::arg("id"),
           py::arg("timeout"))
      .def("download_async", &NativeClient::DownloadAsync, py::arg("id"),
           py::arg("timeout"), py::arg("done"))
      .def("delete", &NativeClient::Delete, py::arg("id"), py::arg("timeout"))
      .def("delete_async", &NativeClient::DeleteAsync, py::arg("id"),
           py::arg("timeout"), py::arg("done"))
      .def("wait_for_connected", &NativeClient::WaitForConnected,
           py::arg("timeout"))
      .def_property_readonly("channel_count", &NativeClient::channel_count);
}
