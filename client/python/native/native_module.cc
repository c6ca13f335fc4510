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
//   - releases the GIL for the whole call, so Python threads run calls in
//     parallel.
//
// multiply_streamed copies each operand once into the library's HostTensor
// (without the GIL) and returns the library's product buffer as the array.
//
// A failed call raises StatusError(code, message), code the gRPC status code
// as an int; _client.py turns it into MatmulError.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "client/lib/multiply_encoding.h"
#include "client/lib/tensor_proto.h"
#include "common/dtype.h"
#include "matmul/v1/matmul.pb.h"
#include "proto/dtype_mapping.h"

namespace py = pybind11;

namespace matmul {
namespace {

// Thrown for a non-OK status; translated to StatusError(code, message).
class StatusException : public std::exception {
 public:
  explicit StatusException(absl::Status status) : status_(std::move(status)) {}
  const char* what() const noexcept override { return "matmul status"; }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

PyObject* g_status_error = nullptr;

absl::Duration Timeout(std::optional<double> seconds) {
  if (!seconds.has_value()) return absl::InfiniteDuration();
  return absl::Seconds(*seconds);
}

// Shape and dtype of an operand in wire form, checked; its bytes.
struct WireOperand {
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  absl::string_view data;
};

WireOperand CheckOperand(const py::array& x, int dtype_proto,
                         const char* name) {
  std::optional<DType> dtype =
      DTypeFromProto(static_cast<v1::Dtype>(dtype_proto));
  if (!v1::Dtype_IsValid(dtype_proto) || !dtype.has_value()) {
    throw py::value_error(
        absl::StrCat(name, ": unknown wire dtype ", dtype_proto));
  }
  if (!(x.flags() & py::array::c_style)) {
    throw py::value_error(absl::StrCat(name, ": not C-contiguous"));
  }
  if (x.itemsize() != static_cast<py::ssize_t>(DTypeSize(*dtype))) {
    throw py::value_error(absl::StrCat(name, ": ", x.itemsize(),
                                       "-byte elements for wire dtype ",
                                       DTypeName(*dtype)));
  }
  WireOperand out;
  out.dtype = *dtype;
  out.shape.assign(x.shape(), x.shape() + x.ndim());
  out.data = absl::string_view(static_cast<const char*>(x.data()),
                               static_cast<size_t>(x.nbytes()));
  return out;
}

// The product as an array of `dtype` over the tensor's own bytes.
py::array Wrap(HostTensor&& product, const py::dtype& dtype) {
  if (dtype.itemsize() != static_cast<py::ssize_t>(DTypeSize(product.dtype))) {
    throw StatusException(absl::InternalError(
        absl::StrCat("the server's product is ", DTypeName(product.dtype),
                     ", not the requested element size ", dtype.itemsize())));
  }
  auto* owned = new HostTensor(std::move(product));
  py::capsule base(owned, [](void* p) { delete static_cast<HostTensor*>(p); });
  std::vector<py::ssize_t> shape(owned->shape.begin(), owned->shape.end());
  return py::array(dtype, shape, owned->data.data(), base);
}

// Releases the Python references it holds with the GIL, from whichever
// thread drops the last reference (gRPC's or the caller's).
struct PythonRefs {
  py::object a;
  py::object b;
};

void ReleaseRefs(const PythonRefs* refs) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // leak at exit
  PyGILState_STATE state = PyGILState_Ensure();
  delete refs;
  PyGILState_Release(state);
}

class NativeClient {
 public:
  NativeClient(const std::string& target, const std::string& client_id,
               const std::string& load_balancing_policy, int channels) {
    ClientOptions options;
    options.client_id = client_id;
    options.load_balancing_policy = load_balancing_policy;
    options.channels = channels;
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(target, options);
    if (!client.ok()) throw StatusException(client.status());
    client_ = *std::move(client);
  }

  py::array Multiply(const py::array& a, int a_dtype, const py::array& b,
                     int b_dtype, bool transpose_a, bool transpose_b,
                     int compute, std::optional<double> timeout,
                     const py::dtype& result_dtype) {
    const WireOperand wa = CheckOperand(a, a_dtype, "a");
    const WireOperand wb = CheckOperand(b, b_dtype, "b");
    v1::MultiplyRequest header;
    const WireOperand* operands[2] = {&wa, &wb};
    for (int i = 0; i < 2; ++i) {
      v1::Tensor* t = i == 0 ? header.mutable_a() : header.mutable_b();
      for (int64_t d : operands[i]->shape) t->add_shape(d);
      t->set_dtype(DTypeToProto(operands[i]->dtype));
    }
    header.set_transpose_a(transpose_a);
    header.set_transpose_b(transpose_b);
    header.set_compute_mode(static_cast<v1::ComputeMode>(compute));
    MultiplyOptions options;
    options.timeout = Timeout(timeout);

    std::shared_ptr<const void> owner(new PythonRefs{a, b}, ReleaseRefs);
    absl::StatusOr<v1::MultiplyResponse> response;
    absl::StatusOr<HostTensor> product;
    {
      py::gil_scoped_release release;
      {
        const grpc::ByteBuffer request = EncodeMultiplyRequestView(
            header, wa.data, wb.data, std::move(owner));
        response = client_->MultiplyEncoded(request, options);
      }
      if (!response.ok()) {
        product = response.status();
      } else if (!response->has_c()) {
        product = absl::InternalError("the server's reply has no product");
      } else {
        product = FromProto(std::move(*response->mutable_c()));
        if (!product.ok()) {
          product = absl::InternalError(
              absl::StrCat("the server's MultiplyResponse is malformed: ",
                           product.status().message()));
        }
      }
    }
    if (!product.ok()) throw StatusException(product.status());
    return Wrap(*std::move(product), result_dtype);
  }

  py::array MultiplyStreamed(const py::array& a, int a_dtype,
                             const py::array& b, int b_dtype, bool transpose_a,
                             bool transpose_b, int compute,
                             std::optional<double> timeout,
                             const py::dtype& result_dtype,
                             int64_t chunk_bytes) {
    const WireOperand wa = CheckOperand(a, a_dtype, "a");
    const WireOperand wb = CheckOperand(b, b_dtype, "b");
    MultiplyOptions options;
    options.transpose_a = transpose_a;
    options.transpose_b = transpose_b;
    options.compute = compute == v1::COMPUTE_MODE_TF32 ? ComputeMode::kTf32
                                                       : ComputeMode::kStrict;
    options.timeout = Timeout(timeout);
    absl::StatusOr<HostTensor> product;
    {
      // `a` and `b` are referenced by this call's arguments until it
      // returns, so their buffers outlive the copies made here.
      py::gil_scoped_release release;
      HostTensor ta{wa.shape, wa.dtype, std::string(wa.data)};
      HostTensor tb{wb.shape, wb.dtype, std::string(wb.data)};
      product = client_->MultiplyStreamed(ta, tb, options, chunk_bytes);
    }
    if (!product.ok()) throw StatusException(product.status());
    return Wrap(*std::move(product), result_dtype);
  }

  int channel_count() const { return client_->channel_count(); }

 private:
  std::unique_ptr<MatmulClient> client_;
};

}  // namespace
}  // namespace matmul

PYBIND11_MODULE(_native, m) {
  using matmul::NativeClient;
  m.doc() =
      "The native core of matmul_client: Multiply and MultiplyStream over "
      "the C++ client library, operands sent from their own buffers, the GIL "
      "released for the whole call.";
  matmul::g_status_error = PyErr_NewExceptionWithDoc(
      "matmul_client._native.StatusError",
      "A failed call: args are (code, message), code the gRPC status code "
      "as an int.",
      PyExc_RuntimeError, nullptr);
  m.add_object("StatusError", py::handle(matmul::g_status_error));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const matmul::StatusException& e) {
      py::tuple args = py::make_tuple(static_cast<int>(e.status().code()),
                                      std::string(e.status().message()));
      PyErr_SetObject(matmul::g_status_error, args.ptr());
    }
  });
  py::class_<NativeClient>(m, "Client")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    int>(),
           py::arg("target"), py::arg("client_id") = "",
           py::arg("load_balancing_policy") = "", py::arg("channels") = 1)
      .def("multiply", &NativeClient::Multiply, py::arg("a"),
           py::arg("a_dtype"), py::arg("b"), py::arg("b_dtype"),
           py::arg("transpose_a"), py::arg("transpose_b"), py::arg("compute"),
           py::arg("timeout"), py::arg("result_dtype"))
      .def("multiply_streamed", &NativeClient::MultiplyStreamed, py::arg("a"),
           py::arg("a_dtype"), py::arg("b"), py::arg("b_dtype"),
           py::arg("transpose_a"), py::arg("transpose_b"), py::arg("compute"),
           py::arg("timeout"), py::arg("result_dtype"), py::arg("chunk_bytes"))
      .def_property_readonly("channel_count", &NativeClient::channel_count);
}
