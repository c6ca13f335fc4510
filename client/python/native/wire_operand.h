// What the native core takes from Python for a call: an operand in its wire
// form (a C-contiguous, little-endian array of the wire dtype), checked and
// seen as bytes without a copy, and the references that keep such arrays
// alive while gRPC holds their bytes without the GIL. Part of
// matmul_client._native (native_module.cc).
#ifndef MATMUL_CLIENT_PYTHON_NATIVE_WIRE_OPERAND_H_
#define MATMUL_CLIENT_PYTHON_NATIVE_WIRE_OPERAND_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/lib/host_tensor.h"
#include "common/dtype.h"

namespace matmul::native {

namespace py = pybind11;

// Shape and dtype of an operand in wire form, checked; its bytes.
struct WireOperand {
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  absl::string_view data;
};

// `x` as an operand of wire dtype `dtype_proto` (a v1::Dtype); its bytes are
// the array's own, valid while `x` lives. Raises ValueError (naming the
// operand `name`) for an unknown dtype, an array that is not C-contiguous,
// or elements of another size.
WireOperand CheckOperand(const py::array& x, int dtype_proto, const char* name);

// A tensor for the library's HostTensor calls (Upload): its bytes copied.
HostTensor CopyTensor(const WireOperand& w);

// Releases the Python references it holds with the GIL, from whichever
// thread drops the last reference (gRPC's or the caller's): hold one with
// std::shared_ptr<const void>(new PythonRefs{a, b}, ReleaseRefs).
struct PythonRefs {
  py::object a;
  py::object b;
};

void ReleaseRefs(const PythonRefs* refs);

}  // namespace matmul::native

#endif  // MATMUL_CLIENT_PYTHON_NATIVE_WIRE_OPERAND_H_
