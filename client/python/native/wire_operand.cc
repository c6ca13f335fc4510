#include "client/python/native/wire_operand.h"

#include <Python.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "matmul/v1/matmul.pb.h"
#include "proto/dtype_mapping.h"

namespace matmul::native {

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

HostTensor CopyTensor(const WireOperand& w) {
  return HostTensor{w.shape, w.dtype, std::string(w.data)};
}

void ReleaseRefs(const PythonRefs* refs) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // leak at exit
  PyGILState_STATE state = PyGILState_Ensure();
  delete refs;
  PyGILState_Release(state);
}

}  // namespace matmul::native
