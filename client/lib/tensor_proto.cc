#include "client/lib/tensor_proto.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

absl::StatusOr<HostTensor> HeaderFromProto(const v1::Tensor& tensor) {
  std::optional<DType> dtype = DTypeFromProto(tensor.dtype());
  if (!dtype.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor dtype ", v1::Dtype_Name(tensor.dtype()), " (",
        static_cast<int>(tensor.dtype()), ") is not a supported element type"));
  }
  HostTensor out;
  out.dtype = *dtype;
  out.shape.assign(tensor.shape().begin(), tensor.shape().end());
  ASSIGN_OR_RETURN(const int64_t bytes, NumBytes(out.shape, out.dtype));
  if (static_cast<uint64_t>(bytes) != tensor.data().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of shape ", ShapeString(out.shape), " and dtype ",
                     std::string(DTypeName(out.dtype)), " needs ", bytes,
                     " bytes of data, got ", tensor.data().size()));
  }
  return out;
}

void ShapeToProto(const HostTensor& tensor, v1::Tensor* out) {
  out->mutable_shape()->Assign(tensor.shape.begin(), tensor.shape.end());
  out->set_dtype(DTypeToProto(tensor.dtype));
}

}  // namespace

absl::Status ToProto(const HostTensor& tensor, v1::Tensor* out) {
  RETURN_IF_ERROR(CheckHostTensor(tensor));
  ShapeToProto(tensor, out);
  out->set_data(tensor.data);
  return absl::OkStatus();
}

absl::Status ToProto(HostTensor&& tensor, v1::Tensor* out) {
  RETURN_IF_ERROR(CheckHostTensor(tensor));
  ShapeToProto(tensor, out);
  out->set_data(std::move(tensor.data));
  return absl::OkStatus();
}

absl::StatusOr<HostTensor> FromProto(const v1::Tensor& tensor) {
  ASSIGN_OR_RETURN(HostTensor out, HeaderFromProto(tensor));
  out.data = tensor.data();
  return out;
}

absl::StatusOr<HostTensor> FromProto(v1::Tensor&& tensor) {
  ASSIGN_OR_RETURN(HostTensor out, HeaderFromProto(tensor));
  // Moving out of a message that lives on an arena copies; off an arena
  // (as in MatmulClient) it is a pointer swap.
  out.data = std::move(*tensor.mutable_data());
  return out;
}

}  // namespace matmul
