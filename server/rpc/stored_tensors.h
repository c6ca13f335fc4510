// Stored tensors as the RPC adapters see them: who a stored tensor is
// charged to, operands named by handle, and handles in responses.
#ifndef MATMUL_SERVER_RPC_STORED_TENSORS_H_
#define MATMUL_SERVER_RPC_STORED_TENSORS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpu/engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/handle_registry.h"
#include "server/request_validation.h"

namespace matmul {

// The client a stored tensor (and its quota) is charged to. Under mutual
// TLS, the identity its verified certificate names: "cert:" and the subject
// alternative name, or the common name when it has none; the
// "x-matmul-client" metadata is then ignored. Otherwise that metadata if the
// call has it (advisory: any client may write any id), else the peer's
// address without its port.
std::string ClientKey(const grpc::CallbackServerContext& context);

// Replaces `operand`'s header with the stored tensor `handle` names (for
// the operand called `name` in messages); `shape` keeps its shape.
absl::Status ResolveHandle(const HandleRegistry& handles,
                           const std::string& handle, const char* name,
                           OperandHeader& operand,
                           std::shared_ptr<ResidentTensor>& tensor,
                           std::vector<int64_t>& shape);

// `entry` as the API's TensorHandle.
void FillHandle(const HandleRegistry::Entry& entry, v1::TensorHandle* out);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_STORED_TENSORS_H_
