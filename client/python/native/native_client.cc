#include "client/python/native/native_client.h"

#include <Python.h>
#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/lib/multiply_encoding.h"
#include "client/python/native/call_outcome.h"
#include "client/python/native/wire_operand.h"
#include "matmul/v1/matmul.pb.h"
#include "proto/dtype_mapping.h"

namespace matmul::native {

absl::Duration Timeout(std::optional<double> seconds) {
  if (!seconds.has_value()) return absl::InfiniteDuration();
  return absl::Seconds(*seconds);
}

NativeClient::NativeClient(
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
    if (root_certificates.has_value()) ssl.pem_root_certs = *root_certificates;
    if (private_key.has_value()) ssl.pem_private_key = *private_key;
    if (certificate_chain.has_value()) ssl.pem_cert_chain = *certificate_chain;
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
NativeClient::~NativeClient() {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) {
    client_.release();  // NOLINT: deliberately leaked at exit
    return;
  }
  std::thread([client = std::move(client_)]() mutable {
    client.reset();
  }).detach();
}

grpc::ByteBuffer NativeClient::Encode(const py::object& a, int a_dtype,
                                      const std::string& a_handle,
                                      const py::object& b, int b_dtype,
                                      const std::string& b_handle,
                                      bool transpose_a, bool transpose_b,
                                      int compute, bool keep,
                                      int64_t result_ttl) {
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
  return EncodeMultiplyRequestView(header, wa.data, wb.data, std::move(owner));
}

py::object NativeClient::Multiply(const py::object& a, int a_dtype,
                                  const std::string& a_handle,
                                  const py::object& b, int b_dtype,
                                  const std::string& b_handle, bool transpose_a,
                                  bool transpose_b, int compute,
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

PyCall NativeClient::MultiplyAsync(const py::object& a, int a_dtype,
                                   const std::string& a_handle,
                                   const py::object& b, int b_dtype,
                                   const std::string& b_handle,
                                   bool transpose_a, bool transpose_b,
                                   int compute, std::optional<double> timeout,
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

UploadOptions NativeClient::MakeUploadOptions(int device, int64_t ttl_seconds,
                                              std::optional<double> timeout,
                                              const std::string& near) {
  UploadOptions options;
  if (device >= 0) options.device = device;
  options.ttl = absl::Seconds(ttl_seconds);
  options.timeout = Timeout(timeout);
  options.near = near;
  return options;
}

py::object NativeClient::Upload(const py::array& x, int dtype, int device,
                                int64_t ttl_seconds,
                                std::optional<double> timeout,
                                const std::string& near) {
  const WireOperand w = CheckOperand(x, dtype, "array");
  const UploadOptions options =
      MakeUploadOptions(device, ttl_seconds, timeout, near);
  absl::StatusOr<StoredTensor> stored;
  {
    py::gil_scoped_release release;
    stored = client_->Upload(CopyTensor(w), options);
  }
  return ToPython(FromStatusOr(std::move(stored)), py::none());
}

PyCall NativeClient::UploadAsync(const py::array& x, int dtype, int device,
                                 int64_t ttl_seconds,
                                 std::optional<double> timeout,
                                 const std::string& near,
                                 const py::object& done) {
  const WireOperand w = CheckOperand(x, dtype, "array");
  UploadOptions options = MakeUploadOptions(device, ttl_seconds, timeout, near);
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

py::object NativeClient::Download(const std::string& id,
                                  std::optional<double> timeout) {
  absl::StatusOr<HostTensor> tensor;
  {
    py::gil_scoped_release release;
    tensor = client_->Download(id, Timeout(timeout));
  }
  return ToPython(FromStatusOr(std::move(tensor)), py::none());
}

PyCall NativeClient::DownloadAsync(const std::string& id,
                                   std::optional<double> timeout,
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

void NativeClient::Delete(const std::string& id,
                          std::optional<double> timeout) {
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = client_->Delete(id, Timeout(timeout));
  }
  if (!status.ok()) throw StatusException(std::move(status));
}

void NativeClient::WaitForConnected(std::optional<double> timeout) {
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = client_->WaitForConnected(Timeout(timeout));
  }
  if (!status.ok()) throw StatusException(std::move(status));
}

PyCall NativeClient::DeleteAsync(const std::string& id,
                                 std::optional<double> timeout,
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

py::object NativeClient::Self() {
  return py::cast(this, py::return_value_policy::reference);
}

}  // namespace matmul::native
