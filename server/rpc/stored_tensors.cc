#include "server/rpc/stored_tensors.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proto/dtype_mapping.h"
#include "server/unix_socket_listener.h"

namespace matmul {

std::string ClientKey(const grpc::CallbackServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    // The SAN when the certificate has one, else its CN (gRPC's choice).
    const std::vector<grpc::string_ref> identity = auth->GetPeerIdentity();
    if (!identity.empty()) {
      return absl::StrCat("cert:", absl::string_view(identity.front().data(),
                                                     identity.front().size()));
    }
  }
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("x-matmul-client"); it != metadata.end()) {
    return std::string(it->second.data(), it->second.size());
  }
  // "ipv4:127.0.0.1:5000" -> "ipv4:127.0.0.1"; "unix:/path" stays, and a
  // call on the Unix socket ("fd:N", server/unix_socket_listener.h) is
  // known by its peer's address too.
  std::string peer = context.peer();
  if (std::optional<std::string> address = UnixAddressOfCall(peer)) {
    return std::move(*address);
  }
  if (peer.rfind("ipv4:", 0) == 0 || peer.rfind("ipv6:", 0) == 0) {
    const size_t colon = peer.rfind(':');
    if (colon != std::string::npos && colon > 4) peer.resize(colon);
  }
  return peer;
}

absl::Status ResolveHandle(const HandleRegistry& handles,
                           const std::string& handle, const char* name,
                           OperandHeader& operand,
                           std::shared_ptr<ResidentTensor>& tensor,
                           std::vector<int64_t>& shape) {
  if (operand.present) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " and ", name, "_handle are both set; set exactly one"));
  }
  absl::StatusOr<HandleRegistry::Entry> entry = handles.Get(handle);
  if (!entry.ok()) {
    return absl::Status(
        entry.status().code(),
        absl::StrCat(name, "_handle: ", entry.status().message()));
  }
  tensor = entry->tensor;
  shape = entry->shape;
  operand.present = true;
  operand.shape = absl::MakeConstSpan(shape);
  operand.dtype = DTypeToProto(tensor->dtype());
  operand.data_bytes = tensor->bytes();
  return absl::OkStatus();
}

void FillHandle(const HandleRegistry::Entry& entry, v1::TensorHandle* out) {
  out->set_id(entry.id);
  for (int64_t d : entry.shape) out->add_shape(d);
  out->set_dtype(DTypeToProto(entry.tensor->dtype()));
  out->set_device(entry.tensor->device());
  out->set_bytes(entry.tensor->bytes());
  out->set_expire_time_unix_ms(absl::ToUnixMillis(entry.expires));
}

}  // namespace matmul
