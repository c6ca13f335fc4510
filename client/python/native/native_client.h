// NativeClient: matmul_client._native.Client, the library's MatmulClient
// (client/lib) for Python. Its methods take operands in wire form (arrays,
// sent from their own buffers, or stored tensors' handles) and release the
// GIL for the RPC; the *_async ones return a Call at once and complete on a
// gRPC thread (async_call.h). The unary methods are in native_client.cc,
// the streamed multiply in streamed_multiply.cc, the Python names in
// native_module.cc.
//
// Thread-safe as MatmulClient is: Python threads may call one Client at
// once, each call releasing the GIL.
#ifndef MATMUL_CLIENT_PYTHON_NATIVE_NATIVE_CLIENT_H_
#define MATMUL_CLIENT_PYTHON_NATIVE_NATIVE_CLIENT_H_

#include <grpcpp/support/byte_buffer.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "client/lib/matmul_client.h"
#include "client/python/native/async_call.h"

namespace matmul::native {

namespace py = pybind11;

// A Python timeout in seconds (None: none) as the library's.
absl::Duration Timeout(std::optional<double> seconds);

class NativeClient {
 public:
  NativeClient(
      const std::string& target, const std::string& client_id,
      const std::string& load_balancing_policy, int channels, bool tls,
      std::optional<std::string> root_certificates,
      std::optional<std::string> private_key,
      std::optional<std::string> certificate_chain,
      const std::vector<std::pair<std::string, int>>& int_options,
      const std::vector<std::pair<std::string, std::string>>& string_options);
  ~NativeClient();

  NativeClient(const NativeClient&) = delete;
  NativeClient& operator=(const NativeClient&) = delete;

  // Each operand is an array (sent from its buffer) or, when it is None,
  // the stored tensor `x_handle`; keep=True returns the kept product's
  // handle (StoredTuple).
  py::object Multiply(const py::object& a, int a_dtype,
                      const std::string& a_handle, const py::object& b,
                      int b_dtype, const std::string& b_handle,
                      bool transpose_a, bool transpose_b, int compute,
                      std::optional<double> timeout,
                      const py::object& result_dtype, bool keep,
                      int64_t result_ttl);

  PyCall MultiplyAsync(const py::object& a, int a_dtype,
                       const std::string& a_handle, const py::object& b,
                       int b_dtype, const std::string& b_handle,
                       bool transpose_a, bool transpose_b, int compute,
                       std::optional<double> timeout,
                       const py::object& result_dtype, bool keep,
                       int64_t result_ttl, const py::object& done);

  // The library's MultiplyStreamedView (streamed_multiply.cc): each operand
  // is an array (sent from its buffer) or, when it is None, the stored
  // tensor `x_handle`.
  py::object MultiplyStreamed(const py::object& a, int a_dtype,
                              const std::string& a_handle, const py::object& b,
                              int b_dtype, const std::string& b_handle,
                              bool transpose_a, bool transpose_b, int compute,
                              std::optional<double> timeout,
                              const py::dtype& result_dtype,
                              int64_t chunk_bytes, int stripes);

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
                               int stripes);

  // `near`: a handle id to store the tensor beside, or "".
  py::object Upload(const py::array& x, int dtype, int device,
                    int64_t ttl_seconds, std::optional<double> timeout,
                    const std::string& near);

  PyCall UploadAsync(const py::array& x, int dtype, int device,
                     int64_t ttl_seconds, std::optional<double> timeout,
                     const std::string& near, const py::object& done);

  // (array, dtype enum): the array in the tensor's little-endian wire dtype.
  py::object Download(const std::string& id, std::optional<double> timeout);

  PyCall DownloadAsync(const std::string& id, std::optional<double> timeout,
                       const py::object& done);

  void Delete(const std::string& id, std::optional<double> timeout);

  PyCall DeleteAsync(const std::string& id, std::optional<double> timeout,
                     const py::object& done);

  // MatmulClient::WaitForConnected, the GIL released; raises StatusError
  // (DEADLINE_EXCEEDED) when the timeout passes first.
  void WaitForConnected(std::optional<double> timeout);

  int channel_count() const { return client_->channel_count(); }

 private:
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
                                         std::optional<double> timeout);

  // The encoded request of a Multiply: operands from the arrays' buffers
  // (or handles), the arrays referenced until gRPC lets go of them.
  grpc::ByteBuffer Encode(const py::object& a, int a_dtype,
                          const std::string& a_handle, const py::object& b,
                          int b_dtype, const std::string& b_handle,
                          bool transpose_a, bool transpose_b, int compute,
                          bool keep, int64_t result_ttl);

  static UploadOptions MakeUploadOptions(int device, int64_t ttl_seconds,
                                         std::optional<double> timeout,
                                         const std::string& near);

  // This client's Python object (pybind11 finds the existing instance).
  py::object Self();

  std::unique_ptr<MatmulClient> client_;
};

}  // namespace matmul::native

#endif  // MATMUL_CLIENT_PYTHON_NATIVE_NATIVE_CLIENT_H_
