#include "client/python/native/call_outcome.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/lib/tensor_proto.h"
#include "common/dtype.h"
#include "proto/dtype_mapping.h"

namespace matmul::native {

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

py::tuple StoredTuple(const StoredTensor& s) {
  py::tuple shape(s.shape.size());
  for (size_t i = 0; i < s.shape.size(); ++i) shape[i] = py::int_(s.shape[i]);
  const int64_t expire_ms = s.expire_time == absl::InfinitePast()
                                ? 0
                                : absl::ToUnixMillis(s.expire_time);
  return py::make_tuple(s.id, shape, static_cast<int>(DTypeToProto(s.dtype)),
                        s.device, s.bytes, expire_ms);
}

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

}  // namespace matmul::native
