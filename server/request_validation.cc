#include "server/request_validation.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/bounded_text.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

// Bytes a response needs beside C's data (tags, lengths, shape, placement).
constexpr int64_t kResponseOverheadBytes = 128;

std::string ShapeString(absl::Span<const int64_t> s) { return BoundedShape(s); }

std::string DtypeString(int value) {
  if (v1::Dtype_IsValid(value)) {
    return v1::Dtype_Name(static_cast<v1::Dtype>(value));
  }
  return absl::StrCat("unknown value ", value);
}

// Dimensions of one validated operand; 2-D operands have batch 1.
struct OperandDims {
  bool is_3d = false;
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
};

absl::StatusOr<OperandDims> CheckOperand(const OperandHeader& t,
                                         absl::string_view name, DType dtype,
                                         const RequestLimits& limits) {
  const int rank = static_cast<int>(t.shape.size());
  if (rank != 2 && rank != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        ".shape: expected 2 dimensions [rows, cols] or 3 [batch, rows, "
        "cols], got ",
        rank, " (", ShapeString(t.shape), ")"));
  }
  int64_t elements = 1;
  bool overflow = false;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = t.shape[i];
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ".shape[", i, "]: expected a positive dimension, got ", d));
    }
    const bool is_batch = rank == 3 && i == 0;
    const int64_t limit = is_batch ? limits.max_batch : limits.max_dimension;
    if (d > limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          name, ".shape[", i, "]: ", d, " exceeds the server's limit of ",
          limit, is_batch ? " per batch" : " per dimension"));
    }
    overflow = overflow || __builtin_mul_overflow(elements, d, &elements);
  }
  if (overflow || elements > limits.max_elements_per_operand) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": shape ", ShapeString(t.shape), " has ",
                     overflow ? "more than 2^63" : absl::StrCat(elements),
                     " elements, over the server's limit of ",
                     limits.max_elements_per_operand, " elements per operand"));
  }
  int64_t bytes = 0;
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  if (t.data_follows && t.data_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        ".data: expected no bytes here (they follow in OperandChunks), got ",
        t.data_bytes));
  }
  if (__builtin_mul_overflow(elements, elem, &bytes) ||
      (!t.data_follows && t.data_bytes != bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".data: expected ", bytes, " bytes (shape ",
                     ShapeString(t.shape), " of ", DtypeString(t.dtype), ", ",
                     elem, " bytes each), got ", t.data_bytes));
  }
  OperandDims dims;
  dims.is_3d = rank == 3;
  dims.batch = rank == 3 ? t.shape[0] : 1;
  dims.rows = t.shape[rank - 2];
  dims.cols = t.shape[rank - 1];
  return dims;
}

absl::StatusOr<DType> CheckDtype(const OperandHeader& t,
                                 absl::string_view name) {
  std::optional<DType> dtype = DTypeFromProto(static_cast<v1::Dtype>(t.dtype));
  if (!dtype.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        ".dtype: expected DTYPE_FLOAT32, DTYPE_FLOAT64, DTYPE_FLOAT16 or "
        "DTYPE_BFLOAT16, got ",
        DtypeString(t.dtype)));
  }
  return *dtype;
}

}  // namespace

absl::StatusOr<TensorDims> ValidateTensor(const OperandHeader& tensor,
                                          absl::string_view name,
                                          const RequestLimits& limits) {
  if (!tensor.present) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": required"));
  }
  ASSIGN_OR_RETURN(const DType dtype, CheckDtype(tensor, name));
  ASSIGN_OR_RETURN(const OperandDims dims,
                   CheckOperand(tensor, name, dtype, limits));
  TensorDims out;
  out.dtype = dtype;
  out.batch = dims.batch;
  out.rows = dims.rows;
  out.cols = dims.cols;
  out.is_3d = dims.is_3d;
  return out;
}

MultiplyHeader HeaderOf(const v1::MultiplyRequest& request) {
  auto operand = [](bool present, const v1::Tensor& t) {
    OperandHeader h;
    h.present = present;
    h.shape = absl::MakeConstSpan(t.shape().data(), t.shape_size());
    h.dtype = t.dtype();
    h.data_bytes = static_cast<int64_t>(t.data().size());
    return h;
  };
  MultiplyHeader header;
  header.a = operand(request.has_a(), request.a());
  header.b = operand(request.has_b(), request.b());
  header.transpose_a = request.transpose_a();
  header.transpose_b = request.transpose_b();
  header.compute_mode = request.compute_mode();
  return header;
}

absl::StatusOr<MatmulSpec> ValidateMultiplyRequest(
    const v1::MultiplyRequest& request, const RequestLimits& limits) {
  return ValidateMultiplyHeader(HeaderOf(request), limits);
}

absl::StatusOr<MatmulSpec> ValidateMultiplyHeader(const MultiplyHeader& request,
                                                  const RequestLimits& limits) {
  if (!request.a.present && !request.b.present) {
    return absl::InvalidArgumentError(
        "a and b: required, the request has no operands");
  }
  if (!request.a.present) return absl::InvalidArgumentError("a: required");
  if (!request.b.present) return absl::InvalidArgumentError("b: required");

  ASSIGN_OR_RETURN(const DType dtype, CheckDtype(request.a, "a"));
  ASSIGN_OR_RETURN(const DType b_dtype, CheckDtype(request.b, "b"));
  if (b_dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("b.dtype: expected ", DtypeString(request.a.dtype),
                     " (the dtype of a), got ", DtypeString(request.b.dtype)));
  }

  ComputeMode compute;
  switch (request.compute_mode) {
    case v1::COMPUTE_MODE_UNSPECIFIED:
    case v1::COMPUTE_MODE_STRICT:
      compute = ComputeMode::kStrict;
      break;
    case v1::COMPUTE_MODE_TF32:
      compute = ComputeMode::kTf32;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "compute_mode: expected COMPUTE_MODE_STRICT or COMPUTE_MODE_TF32, "
          "got unknown value ",
          request.compute_mode));
  }

  ASSIGN_OR_RETURN(const OperandDims a,
                   CheckOperand(request.a, "a", dtype, limits));
  ASSIGN_OR_RETURN(const OperandDims b,
                   CheckOperand(request.b, "b", dtype, limits));

  const bool ta = request.transpose_a;
  const bool tb = request.transpose_b;
  const int64_t m = ta ? a.cols : a.rows;
  const int64_t a_k = ta ? a.rows : a.cols;
  const int64_t b_k = tb ? b.cols : b.rows;
  const int64_t n = tb ? b.rows : b.cols;
  if (a_k != b_k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inner dimensions differ: op(a) is [", m, ", ", a_k, "] and op(b) is [",
        b_k, ", ", n, "]; expected op(a)'s columns (", a_k,
        ") to equal op(b)'s rows, got ", b_k, " (a.shape ",
        ShapeString(request.a.shape), ", transpose_a=", ta ? "true" : "false",
        "; b.shape ", ShapeString(request.b.shape),
        ", transpose_b=", tb ? "true" : "false", ")"));
  }
  if (a.batch != b.batch && a.batch != 1 && b.batch != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch dimensions differ: a.shape[0] is ", a.batch,
        " and b.shape[0] is ", b.batch, "; expected them equal, or one of 1"));
  }

  MatmulSpec spec;
  spec.dtype = dtype;
  spec.compute = compute;
  spec.batch = a.batch > b.batch ? a.batch : b.batch;
  spec.a_batch = a.batch;
  spec.b_batch = b.batch;
  spec.m = m;
  spec.n = n;
  spec.k = a_k;
  spec.transpose_a = ta;
  spec.transpose_b = tb;
  spec.c_is_3d = a.is_3d || b.is_3d;

  int64_t c_elements = 0;
  int64_t c_bytes = 0;
  const bool overflow =
      __builtin_mul_overflow(spec.batch, m, &c_elements) ||
      __builtin_mul_overflow(c_elements, n, &c_elements) ||
      __builtin_mul_overflow(c_elements, spec.elem_size(), &c_bytes);
  if (overflow || c_elements > limits.max_elements_per_operand) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the result [", spec.batch, ", ", m, ", ", n, "] would have ",
        overflow ? "more than 2^63" : absl::StrCat(c_elements),
        " elements, over the server's limit of ",
        limits.max_elements_per_operand, " elements per operand"));
  }
  if (c_bytes > limits.max_message_bytes - kResponseOverheadBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the result [", spec.batch, ", ", m, ", ", n, "] would be ", c_bytes,
        " bytes, over the server's max message size of ",
        limits.max_message_bytes, " bytes"));
  }
  const int64_t total = spec.a_bytes() + spec.b_bytes() + c_bytes;
  if (total > limits.max_inflight_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request needs ", total,
        " bytes in flight (operands and result), over the server's limit of ",
        limits.max_inflight_bytes, " bytes (--max-inflight-bytes)"));
  }
  return spec;
}

}  // namespace matmul
