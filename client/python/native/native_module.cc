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
#include <Python.h>
#include <grpc/grpc.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "client/lib/multiply_encoding.h"
#include "client/lib/tensor_proto.h"
#include "common/dtype.h"
#include "common/mutex_mode.h"
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

// The outcome of a Multiply, Upload or Download, made without the GIL: an
// error, a tensor or a stored tensor's handle.
struct Outcome {
  absl::Status status;
  std::optional<HostTensor> tensor;
  std::optional<StoredTensor> stored;
};

Outcome FromResponse(absl::StatusOr<v1::MultiplyResponse> response, bool keep) {
  Outcome out;
  if (!response.ok()) {
    out.status = response.status();
  } else if (keep) {
    if (!response->has_c_handle()) {
      out.status = absl::UnimplementedError(
          "the server returned the product instead of keeping it: it does "
          "not support stored tensors");
    } else {
      absl::StatusOr<StoredTensor> stored =
          StoredTensorFromProto(response->c_handle());
      if (stored.ok()) {
        out.stored = *std::move(stored);
      } else {
        out.status = stored.status();
      }
    }
  } else if (!response->has_c()) {
    out.status = absl::InternalError("the server's reply has no product");
  } else {
    absl::StatusOr<HostTensor> product =
        FromProto(std::move(*response->mutable_c()));
    if (product.ok()) {
      out.tensor = *std::move(product);
    } else {
      out.status = absl::InternalError(
          absl::StrCat("the server's MultiplyResponse is malformed: ",
                       product.status().message()));
    }
  }
  return out;
}

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

// A stored tensor for Python: (id, shape, dtype as the proto enum, device,
// bytes, expire time in Unix milliseconds).
py::tuple StoredTuple(const StoredTensor& s) {
  py::tuple shape(s.shape.size());
  for (size_t i = 0; i < s.shape.size(); ++i) shape[i] = py::int_(s.shape[i]);
  const int64_t expire_ms = s.expire_time == absl::InfinitePast()
                                ? 0
                                : absl::ToUnixMillis(s.expire_time);
  return py::make_tuple(s.id, shape, static_cast<int>(DTypeToProto(s.dtype)),
                        s.device, s.bytes, expire_ms);
}

// The little-endian NumPy dtype a tensor of `dtype` comes back in (bfloat16
// as its uint16 bits).
py::dtype WireDtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return py::dtype("<f8");
    case DType::kFloat16:
      return py::dtype("<f2");
    case DType::kBFloat16:
      return py::dtype("<u2");
    default:
      return py::dtype("<f4");
  }
}

// The Python value of a successful outcome: the tensor as an array of
// `dtype` (None: its own dtype's, and then (array, dtype enum)), or the
// stored tensor's tuple. Throws StatusException for an error.
py::object ToPython(Outcome&& out, const py::object& dtype) {
  if (!out.status.ok()) throw StatusException(std::move(out.status));
  if (out.stored.has_value()) return StoredTuple(*out.stored);
  if (!out.tensor.has_value()) return py::none();
  if (dtype.is_none()) {
    const int proto = static_cast<int>(DTypeToProto(out.tensor->dtype));
    py::dtype own = WireDtype(out.tensor->dtype);
    return py::make_tuple(Wrap(*std::move(out.tensor), own), proto);
  }
  return Wrap(*std::move(out.tensor), py::reinterpret_borrow<py::dtype>(dtype));
}

// Python objects an asynchronous call holds: its completion callback, the
// dtype of its result and the Client that started it (the library's client
// must outlive its calls, whatever Python drops meanwhile). Released with
// the GIL (ReleaseHeld), from whichever thread drops the last reference.
struct Held {
  py::object done;
  py::object dtype;
  py::object client;
};

void ReleaseHeld(const Held* held) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // leak at exit
  PyGILState_STATE state = PyGILState_Ensure();
  delete held;
  PyGILState_Release(state);
}

// Hands `out` to the call's Python callback as done(ok, value): value is
// the result, or (code, message) for an error. Runs on a gRPC thread (or
// the caller's, for a call that fails before it starts), taking the GIL
// only for this.
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

// What Python holds of an asynchronous call: cancel() cancels it.
class PyCall {
 public:
  explicit PyCall(std::shared_ptr<CallCanceller> canceller)
      : canceller_(std::move(canceller)) {}
  void Cancel() {
    if (canceller_ == nullptr) return;
    py::gil_scoped_release release;
    canceller_->Cancel();
  }
  bool cancellable() const { return canceller_ != nullptr; }

 private:
  std::shared_ptr<CallCanceller> canceller_;
};

// A tensor for the library's HostTensor calls (Upload): its bytes copied.
HostTensor CopyTensor(const WireOperand& w) {
  return HostTensor{w.shape, w.dtype, std::string(w.data)};
}

class NativeClient {
 public:
  NativeClient(
      const std::string& target, const std::string& client_id,
      const std::string& load_balancing_policy, int channels, bool tls,
      std::optional<std::string> root_certificates,
      std::optional<std::string> private_key,
      std::optional<std::string> certificate_chain,
      const std::vector<std::pair<std::string, int>>& int_options,
      const std::vector<std::pair<std::string, std::string>>& string_options) {
    ClientOptions options;
    options.client_id = client_id;
    options.load_balancing_policy = load_balancing_policy;
    options.channels = channels;
    options.channel_args = int_options;
    options.channel_string_args = string_options;
    if (tls) {
      grpc::SslCredentialsOptions ssl;
      if (root_certificates.has_value())
        ssl.pem_root_certs = *root_certificates;
      if (private_key.has_value()) ssl.pem_private_key = *private_key;
      if (certificate_chain.has_value())
        ssl.pem_cert_chain = *certificate_chain;
      options.credentials = grpc::SslCredentials(ssl);
    }
    absl::StatusOr<std::unique_ptr<MatmulClient>> client =
        MatmulClient::Create(target, options);
    if (!client.ok()) throw StatusException(client.status());
    client_ = *std::move(client);
  }

  // The library's client goes on a thread of its own, never on this one:
  // the last reference to a Client may be dropped on a gRPC callback thread
  // (by an asynchronous call's completion), and destroying the last
  // channel there makes gRPC join that very thread's completion queue
  // (grpc_completion_queue_next then crashed on a freed queue); on a Python
  // thread it could wait, holding the GIL, for a callback that waits for
  // the GIL. At exit it is left to the process.
  ~NativeClient() {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) {
      client_.release();  // NOLINT: deliberately leaked at exit
      return;
    }
    std::thread([client = std::move(client_)]() mutable {
      client.reset();
    }).detach();
  }

  NativeClient(const NativeClient&) = delete;
  NativeClient& operator=(const NativeClient&) = delete;

  // The encoded request of a Multiply: operands from the arrays' buffers
  // (or handles), the arrays referenced until gRPC lets go of them.
  grpc::ByteBuffer Encode(const py::object& a, int a_dtype,
                          const std::string& a_handle, const py::object& b,
                          int b_dtype, const std::string& b_handle,
                          bool transpose_a, bool transpose_b, int compute,
                          bool keep, int64_t result_ttl) {
    v1::MultiplyRequest header;
    WireOperand wa, wb;
    const py::object* arrays[2] = {&a, &b};
    const std::string* handles[2] = {&a_handle, &b_handle};
    const int dtypes[2] = {a_dtype, b_dtype};
    WireOperand* wires[2] = {&wa, &wb};
    for (int i = 0; i < 2; ++i) {
      const char* name = i == 0 ? "a" : "b";
      if (arrays[i]->is_none()) {
        if (handles[i]->empty()) {
          throw py::value_error(absl::StrCat(name, ": no array and no handle"));
        }
        if (i == 0) {
          header.set_a_handle(*handles[i]);
        } else {
          header.set_b_handle(*handles[i]);
        }
        continue;
      }
      *wires[i] = CheckOperand(py::reinterpret_borrow<py::array>(*arrays[i]),
                               dtypes[i], name);
      v1::Tensor* t = i == 0 ? header.mutable_a() : header.mutable_b();
      for (int64_t d : wires[i]->shape) t->add_shape(d);
      t->set_dtype(DTypeToProto(wires[i]->dtype));
    }
    header.set_transpose_a(transpose_a);
    header.set_transpose_b(transpose_b);
    header.set_compute_mode(static_cast<v1::ComputeMode>(compute));
    header.set_keep_result(keep);
    header.set_result_ttl_seconds(result_ttl);
    std::shared_ptr<const void> owner(new PythonRefs{a, b}, ReleaseRefs);
    return EncodeMultiplyRequestView(header, wa.data, wb.data,
                                     std::move(owner));
  }

  py::object Multiply(const py::object& a, int a_dtype,
                      const std::string& a_handle, const py::object& b,
                      int b_dtype, const std::string& b_handle,
                      bool transpose_a, bool transpose_b, int compute,
                      std::optional<double> timeout,
                      const py::object& result_dtype, bool keep,
                      int64_t result_ttl) {
    MultiplyOptions options;
    options.timeout = Timeout(timeout);
    Outcome out;
    {
      grpc::ByteBuffer request =
          Encode(a, a_dtype, a_handle, b, b_dtype, b_handle, transpose_a,
                 transpose_b, compute, keep, result_ttl);
      py::gil_scoped_release release;
      out = FromResponse(client_->MultiplyEncoded(request, options), keep);
      // `request` (and with it the last reference to the operands'
      // slices) goes before the GIL comes back: ReleaseRefs takes it.
      request.Clear();
    }
    return ToPython(std::move(out), result_dtype);
  }

  PyCall MultiplyAsync(const py::object& a, int a_dtype,
                       const std::string& a_handle, const py::object& b,
                       int b_dtype, const std::string& b_handle,
                       bool transpose_a, bool transpose_b, int compute,
                       std::optional<double> timeout,
                       const py::object& result_dtype, bool keep,
                       int64_t result_ttl, const py::object& done) {
    MultiplyOptions options;
    options.timeout = Timeout(timeout);
    options.canceller = std::make_shared<CallCanceller>();
    PyCall call(options.canceller);
    std::shared_ptr<const Held> held(new Held{done, result_dtype, Self()},
                                     ReleaseHeld);
    grpc::ByteBuffer request =
        Encode(a, a_dtype, a_handle, b, b_dtype, b_handle, transpose_a,
               transpose_b, compute, keep, result_ttl);
    {
      py::gil_scoped_release release;
      client_->MultiplyEncodedAsync(
          request, options,
          [held = std::move(held),
           keep](absl::StatusOr<v1::MultiplyResponse> response) mutable {
            Complete(std::move(held), FromResponse(std::move(response), keep));
          });
      request.Clear();
    }
    return call;
  }

  // A streamed multiply's operands, checked: each an array (a view of its
  // buffer, which the caller keeps referenced until the library's call has
  // returned) or, when it is None, the stored tensor `x_handle`; and its
  // options.
  struct StreamedArguments {
    StreamedOperand operands[2];
    MultiplyOptions options;
  };
  static StreamedArguments CheckStreamed(const py::object& a, int a_dtype,
                                         const std::string& a_handle,
                                         const py::object& b, int b_dtype,
                                         const std::string& b_handle,
                                         bool transpose_a, bool transpose_b,
                                         int compute,
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

  // Each operand is an array (sent from its buffer) or, when it is None,
  // the stored tensor `x_handle`.
  py::object MultiplyStreamed(const py::object& a, int a_dtype,
                              const std::string& a_handle, const py::object& b,
                              int b_dtype, const std::string& b_handle,
                              bool transpose_a, bool transpose_b, int compute,
                              std::optional<double> timeout,
                              const py::dtype& result_dtype,
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
      product = client_->MultiplyStreamedView(
          args.operands[0], args.operands[1], args.options, stream);
    }
    return ToPython(FromStatusOr(std::move(product)), result_dtype);
  }

  // MultiplyStreamed without blocking: the library's blocking call runs on
  // a thread of its own (which sends the arrays from their buffers, holding
  // them until the call has returned), and done(ok, value) gets its
  // outcome; Call.cancel() cancels the stream (MultiplyOptions::canceller),
  // which ends the thread promptly.
  PyCall MultiplyStreamedAsync(const py::object& a, int a_dtype,
                               const std::string& a_handle, const py::object& b,
                               int b_dtype, const std::string& b_handle,
                               bool transpose_a, bool transpose_b, int compute,
                               std::optional<double> timeout,
                               const py::dtype& result_dtype,
                               int64_t chunk_bytes, const py::object& done,
                               int stripes) {
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

  static UploadOptions MakeUploadOptions(int device, int64_t ttl_seconds,
                                         std::optional<double> timeout) {
    UploadOptions options;
    if (device >= 0) options.device = device;
    options.ttl = absl::Seconds(ttl_seconds);
    options.timeout = Timeout(timeout);
    return options;
  }

  py::object Upload(const py::array& x, int dtype, int device,
                    int64_t ttl_seconds, std::optional<double> timeout) {
    const WireOperand w = CheckOperand(x, dtype, "array");
    const UploadOptions options =
        MakeUploadOptions(device, ttl_seconds, timeout);
    absl::StatusOr<StoredTensor> stored;
    {
      py::gil_scoped_release release;
      stored = client_->Upload(CopyTensor(w), options);
    }
    return ToPython(FromStatusOr(std::move(stored)), py::none());
  }

  PyCall UploadAsync(const py::array& x, int dtype, int device,
                     int64_t ttl_seconds, std::optional<double> timeout,
                     const py::object& done) {
    const WireOperand w = CheckOperand(x, dtype, "array");
    UploadOptions options = MakeUploadOptions(device, ttl_seconds, timeout);
    options.canceller = std::make_shared<CallCanceller>();
    PyCall call(options.canceller);
    std::shared_ptr<const Held> held(new Held{done, py::none(), Self()},
                                     ReleaseHeld);
    {
      py::gil_scoped_release release;
      client_->UploadAsync(
          CopyTensor(w), options,
          [held = std::move(held)](absl::StatusOr<StoredTensor> s) mutable {
            Complete(std::move(held), FromStatusOr(std::move(s)));
          });
    }
    return call;
  }

  // (array, dtype enum): the array in the tensor's little-endian wire dtype.
  py::object Download(const std::string& id, std::optional<double> timeout) {
    absl::StatusOr<HostTensor> tensor;
    {
      py::gil_scoped_release release;
      tensor = client_->Download(id, Timeout(timeout));
    }
    return ToPython(FromStatusOr(std::move(tensor)), py::none());
  }

  PyCall DownloadAsync(const std::string& id, std::optional<double> timeout,
                       const py::object& done) {
    auto canceller = std::make_shared<CallCanceller>();
    std::shared_ptr<const Held> held(new Held{done, py::none(), Self()},
                                     ReleaseHeld);
    {
      py::gil_scoped_release release;
      client_->DownloadAsync(
          id, Timeout(timeout),
          [held = std::move(held)](absl::StatusOr<HostTensor> t) mutable {
            Complete(std::move(held), FromStatusOr(std::move(t)));
          },
          canceller);
    }
    return PyCall(std::move(canceller));
  }

  void Delete(const std::string& id, std::optional<double> timeout) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Delete(id, Timeout(timeout));
    }
    if (!status.ok()) throw StatusException(std::move(status));
  }

  PyCall DeleteAsync(const std::string& id, std::optional<double> timeout,
                     const py::object& done) {
    auto canceller = std::make_shared<CallCanceller>();
    std::shared_ptr<const Held> held(new Held{done, py::none(), Self()},
                                     ReleaseHeld);
    {
      py::gil_scoped_release release;
      client_->DeleteAsync(
          id, Timeout(timeout),
          [held = std::move(held)](absl::Status status) mutable {
            Outcome out;
            out.status = std::move(status);
            Complete(std::move(held), std::move(out));
          },
          canceller);
    }
    return PyCall(std::move(canceller));
  }

  int channel_count() const { return client_->channel_count(); }

 private:
  // This client's Python object (pybind11 finds the existing instance).
  py::object Self() {
    return py::cast(this, py::return_value_policy::reference);
  }

  std::unique_ptr<MatmulClient> client_;
};

}  // namespace
}  // namespace matmul

PYBIND11_MODULE(_native, m) {
  using matmul::NativeClient;
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
  py::class_<matmul::PyCall>(m, "Call")
      .def("cancel", &matmul::PyCall::Cancel,
           "Cancels the call (CANCELLED unless it finished first).")
      .def_property_readonly("cancellable", &matmul::PyCall::cancellable);
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
           py::arg("device"), py::arg("ttl_seconds"), py::arg("timeout"))
      .def("upload_async", &NativeClient::UploadAsync, py::arg("array"),
           py::arg("dtype"), py::arg("device"), py::arg("ttl_seconds"),
           py::arg("timeout"), py::arg("done"))
      .def("download", &NativeClient::Download, py::arg("id"),
           py::arg("timeout"))
      .def("download_async", &NativeClient::DownloadAsync, py::arg("id"),
           py::arg("timeout"), py::arg("done"))
      .def("delete", &NativeClient::Delete, py::arg("id"), py::arg("timeout"))
      .def("delete_async", &NativeClient::DeleteAsync, py::arg("id"),
           py::arg("timeout"), py::arg("done"))
      .def_property_readonly("channel_count", &NativeClient::channel_count);
}
