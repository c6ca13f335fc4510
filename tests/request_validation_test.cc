#include "server/request_validation.h"

#include <cstdint>
#include <initializer_list>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

v1::Tensor MakeTensor(std::initializer_list<int64_t> shape,
                      v1::Dtype dtype = v1::DTYPE_FLOAT32,
                      int64_t data_bytes = -1) {
  v1::Tensor t;
  int64_t elements = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    elements *= d;
  }
  t.set_dtype(dtype);
  const int64_t size =
      dtype == v1::DTYPE_FLOAT64                                    ? 8
      : (dtype == v1::DTYPE_FLOAT16 || dtype == v1::DTYPE_BFLOAT16) ? 2
                                                                    : 4;
  if (data_bytes < 0) data_bytes = elements > 0 ? elements * size : 0;
  t.set_data(std::string(static_cast<size_t>(data_bytes), '\0'));
  return t;
}

v1::MultiplyRequest MakeRequest(v1::Tensor a, v1::Tensor b) {
  v1::MultiplyRequest r;
  *r.mutable_a() = std::move(a);
  *r.mutable_b() = std::move(b);
  return r;
}

void ExpectError(const v1::MultiplyRequest& request, absl::StatusCode code,
                 const std::string& message_part,
                 const RequestLimits& limits = RequestLimits()) {
  absl::StatusOr<MatmulSpec> spec = ValidateMultiplyRequest(request, limits);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), code) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(message_part));
}

TEST(RequestValidationTest, Plain2D) {
  absl::StatusOr<MatmulSpec> spec = ValidateMultiplyRequest(
      MakeRequest(MakeTensor({3, 4}), MakeTensor({4, 5})), RequestLimits());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->m, 3);
  EXPECT_EQ(spec->k, 4);
  EXPECT_EQ(spec->n, 5);
  EXPECT_EQ(spec->batch, 1);
  EXPECT_FALSE(spec->c_is_3d);
  EXPECT_EQ(spec->dtype, DType::kFloat32);
  EXPECT_EQ(spec->compute, ComputeMode::kStrict);
}

TEST(RequestValidationTest, TransposesSwapTheLastTwoAxes) {
  v1::MultiplyRequest r = MakeRequest(MakeTensor({4, 3}), MakeTensor({5, 4}));
  r.set_transpose_a(true);
  r.set_transpose_b(true);
  r.set_compute_mode(v1::COMPUTE_MODE_TF32);
  absl::StatusOr<MatmulSpec> spec = ValidateMultiplyRequest(r, RequestLimits());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->m, 3);
  EXPECT_EQ(spec->k, 4);
  EXPECT_EQ(spec->n, 5);
  EXPECT_TRUE(spec->transpose_a);
  EXPECT_TRUE(spec->transpose_b);
  EXPECT_EQ(spec->compute, ComputeMode::kTf32);
}

TEST(RequestValidationTest, BatchedAndBroadcast) {
  absl::StatusOr<MatmulSpec> both = ValidateMultiplyRequest(
      MakeRequest(MakeTensor({7, 3, 4}), MakeTensor({7, 4, 5})),
      RequestLimits());
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->batch, 7);
  EXPECT_EQ(both->a_batch, 7);
  EXPECT_EQ(both->b_batch, 7);
  EXPECT_TRUE(both->c_is_3d);

  absl::StatusOr<MatmulSpec> b2d = ValidateMultiplyRequest(
      MakeRequest(MakeTensor({7, 3, 4}), MakeTensor({4, 5})), RequestLimits());
  ASSERT_TRUE(b2d.ok()) << b2d.status();
  EXPECT_EQ(b2d->batch, 7);
  EXPECT_EQ(b2d->b_batch, 1);

  absl::StatusOr<MatmulSpec> a2d = ValidateMultiplyRequest(
      MakeRequest(MakeTensor({3, 4}), MakeTensor({6, 4, 5})), RequestLimits());
  ASSERT_TRUE(a2d.ok()) << a2d.status();
  EXPECT_EQ(a2d->batch, 6);
  EXPECT_EQ(a2d->a_batch, 1);

  absl::StatusOr<MatmulSpec> one = ValidateMultiplyRequest(
      MakeRequest(MakeTensor({1, 3, 4}), MakeTensor({6, 4, 5})),
      RequestLimits());
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->batch, 6);
  EXPECT_EQ(one->a_batch, 1);
}

TEST(RequestValidationTest, EmptyRequest) {
  ExpectError(v1::MultiplyRequest(), absl::StatusCode::kInvalidArgument,
              "a and b: required");
}

TEST(RequestValidationTest, MissingOperand) {
  v1::MultiplyRequest r;
  *r.mutable_a() = MakeTensor({2, 2});
  ExpectError(r, absl::StatusCode::kInvalidArgument, "b: required");
  v1::MultiplyRequest r2;
  *r2.mutable_b() = MakeTensor({2, 2});
  ExpectError(r2, absl::StatusCode::kInvalidArgument, "a: required");
}

TEST(RequestValidationTest, UnspecifiedAndUnknownDtype) {
  ExpectError(MakeRequest(MakeTensor({2, 2}, v1::DTYPE_UNSPECIFIED, 16),
                          MakeTensor({2, 2})),
              absl::StatusCode::kInvalidArgument,
              "a.dtype: expected DTYPE_FLOAT32, DTYPE_FLOAT64, DTYPE_FLOAT16 "
              "or DTYPE_BFLOAT16, got DTYPE_UNSPECIFIED");
  v1::MultiplyRequest r = MakeRequest(MakeTensor({2, 2}), MakeTensor({2, 2}));
  r.mutable_b()->set_dtype(static_cast<v1::Dtype>(42));
  ExpectError(r, absl::StatusCode::kInvalidArgument,
              "b.dtype: expected DTYPE_FLOAT32, DTYPE_FLOAT64, DTYPE_FLOAT16 "
              "or DTYPE_BFLOAT16, got unknown value 42");
}

TEST(RequestValidationTest, DifferentDtypes) {
  ExpectError(
      MakeRequest(MakeTensor({2, 2}), MakeTensor({2, 2}, v1::DTYPE_FLOAT64)),
      absl::StatusCode::kInvalidArgument,
      "b.dtype: expected DTYPE_FLOAT32 (the dtype of a), got "
      "DTYPE_FLOAT64");
}

TEST(RequestValidationTest, UnknownComputeMode) {
  v1::MultiplyRequest r = MakeRequest(MakeTensor({2, 2}), MakeTensor({2, 2}));
  r.set_compute_mode(static_cast<v1::ComputeMode>(9));
  ExpectError(r, absl::StatusCode::kInvalidArgument,
              "compute_mode: expected COMPUTE_MODE_STRICT or "
              "COMPUTE_MODE_TF32, got unknown value 9");
}

TEST(RequestValidationTest, WrongRank) {
  ExpectError(MakeRequest(MakeTensor({4}), MakeTensor({4, 4})),
              absl::StatusCode::kInvalidArgument,
              "a.shape: expected 2 dimensions [rows, cols] or 3 [batch, rows, "
              "cols], got 1 ([4])");
  ExpectError(MakeRequest(MakeTensor({2, 2}), MakeTensor({1, 1, 2, 2})),
              absl::StatusCode::kInvalidArgument,
              "b.shape: expected 2 dimensions [rows, cols] or 3 [batch, rows, "
              "cols], got 4 ([1, 1, 2, 2])");
  ExpectError(MakeRequest(MakeTensor({}), MakeTensor({2, 2})),
              absl::StatusCode::kInvalidArgument, "got 0 ([])");
}

TEST(RequestValidationTest, ZeroAndNegativeDims) {
  ExpectError(
      MakeRequest(MakeTensor({0, 4}, v1::DTYPE_FLOAT32, 0), MakeTensor({4, 4})),
      absl::StatusCode::kInvalidArgument,
      "a.shape[0]: expected a positive dimension, got 0");
  v1::MultiplyRequest r = MakeRequest(MakeTensor({2, 2}), MakeTensor({2, 2}));
  r.mutable_b()->set_shape(1, -3);
  ExpectError(r, absl::StatusCode::kInvalidArgument,
              "b.shape[1]: expected a positive dimension, got -3");
}

TEST(RequestValidationTest, WrongByteCount) {
  ExpectError(MakeRequest(MakeTensor({3, 4}, v1::DTYPE_FLOAT32, 47),
                          MakeTensor({4, 5})),
              absl::StatusCode::kInvalidArgument,
              "a.data: expected 48 bytes (shape [3, 4] of DTYPE_FLOAT32, 4 "
              "bytes each), got 47");
  ExpectError(MakeRequest(MakeTensor({3, 4}, v1::DTYPE_BFLOAT16),
                          MakeTensor({4, 5}, v1::DTYPE_BFLOAT16, 80)),
              absl::StatusCode::kInvalidArgument,
              "b.data: expected 40 bytes (shape [4, 5] of DTYPE_BFLOAT16, 2 "
              "bytes each), got 80");
}

TEST(RequestValidationTest, InnerDimensionsDiffer) {
  ExpectError(MakeRequest(MakeTensor({3, 4}), MakeTensor({5, 6})),
              absl::StatusCode::kInvalidArgument,
              "inner dimensions differ: op(a) is [3, 4] and op(b) is [5, 6]; "
              "expected op(a)'s columns (4) to equal op(b)'s rows, got 5");
  // With transpose_a, A [4, 3] is used as [3, 4]: still no match for [3, 6].
  v1::MultiplyRequest r = MakeRequest(MakeTensor({4, 3}), MakeTensor({3, 6}));
  r.set_transpose_a(true);
  ExpectError(r, absl::StatusCode::kInvalidArgument,
              "op(a) is [3, 4] and op(b) is [3, 6]");
}

TEST(RequestValidationTest, BatchMismatch) {
  ExpectError(MakeRequest(MakeTensor({2, 3, 4}), MakeTensor({3, 4, 5})),
              absl::StatusCode::kInvalidArgument,
              "batch dimensions differ: a.shape[0] is 2 and b.shape[0] is 3");
}

TEST(RequestValidationTest, DimensionOverLimit) {
  RequestLimits limits;
  limits.max_dimension = 100;
  ExpectError(MakeRequest(MakeTensor({101, 2}), MakeTensor({2, 2})),
              absl::StatusCode::kResourceExhausted,
              "a.shape[0]: 101 exceeds the server's limit of 100 per "
              "dimension",
              limits);
  limits.max_batch = 4;
  ExpectError(MakeRequest(MakeTensor({5, 2, 2}), MakeTensor({2, 2})),
              absl::StatusCode::kResourceExhausted,
              "a.shape[0]: 5 exceeds the server's limit of 4 per batch",
              limits);
}

TEST(RequestValidationTest, ElementsOverLimit) {
  RequestLimits limits;
  limits.max_elements_per_operand = 100;
  ExpectError(MakeRequest(MakeTensor({11, 10}), MakeTensor({10, 2})),
              absl::StatusCode::kResourceExhausted,
              "a: shape [11, 10] has 110 elements, over the server's limit of "
              "100 elements per operand",
              limits);
  // Operands within the limit, result over it.
  ExpectError(MakeRequest(MakeTensor({50, 1}), MakeTensor({1, 50})),
              absl::StatusCode::kResourceExhausted,
              "the result [1, 50, 50] would have 2500 elements", limits);
}

// Adversarial dims whose products overflow int64 must be refused cleanly,
// never wrap into a small byte count that matches a short payload.
TEST(RequestValidationTest, AdversarialDimsDoNotOverflow) {
  RequestLimits limits;
  limits.max_dimension = INT64_MAX;
  limits.max_batch = INT64_MAX;
  limits.max_elements_per_operand = INT64_MAX;
  for (int64_t big : {int64_t{1} << 31, int64_t{1} << 62, INT64_MAX}) {
    v1::MultiplyRequest r = MakeRequest(MakeTensor({1, 1}), MakeTensor({1, 1}));
    r.mutable_a()->clear_shape();
    r.mutable_a()->add_shape(big);
    r.mutable_a()->add_shape(big);
    absl::StatusOr<MatmulSpec> spec = ValidateMultiplyRequest(r, limits);
    ASSERT_FALSE(spec.ok()) << big;
    EXPECT_TRUE(spec.status().code() == absl::StatusCode::kResourceExhausted ||
                spec.status().code() == absl::StatusCode::kInvalidArgument)
        << spec.status();
  }
  // 2^32 * 2^32 wraps to 0 in 64 bits; 2^62 * 4 bytes wraps to 0 as well.
  v1::MultiplyRequest wrap =
      MakeRequest(MakeTensor({1, 1}), MakeTensor({1, 1}));
  wrap.mutable_a()->clear_shape();
  wrap.mutable_a()->add_shape(int64_t{1} << 32);
  wrap.mutable_a()->add_shape(int64_t{1} << 32);
  wrap.mutable_a()->set_data("");
  ExpectError(wrap, absl::StatusCode::kResourceExhausted,
              "more than 2^63 elements", limits);
  v1::MultiplyRequest bytes_wrap =
      MakeRequest(MakeTensor({1, 1}), MakeTensor({1, 1}));
  bytes_wrap.mutable_a()->clear_shape();
  bytes_wrap.mutable_a()->add_shape(int64_t{1} << 31);
  bytes_wrap.mutable_a()->add_shape(int64_t{1} << 31);
  bytes_wrap.mutable_a()->set_data("");
  ExpectError(bytes_wrap, absl::StatusCode::kInvalidArgument,
              "a.data:", limits);
  // Default limits: 2^31 is over the per-dimension limit.
  v1::MultiplyRequest dflt =
      MakeRequest(MakeTensor({1, 1}), MakeTensor({1, 1}));
  dflt.mutable_b()->set_shape(0, int64_t{1} << 31);
  ExpectError(dflt, absl::StatusCode::kResourceExhausted,
              "b.shape[0]: 2147483648 exceeds the server's limit");
}

TEST(RequestValidationTest, ResultOverMessageLimit) {
  RequestLimits limits;
  limits.max_message_bytes = 1 << 20;
  // 1 x 1024 times 1024 x 1024 floats: operands small, result 4 MiB.
  ExpectError(MakeRequest(MakeTensor({1024, 1}), MakeTensor({1, 1024})),
              absl::StatusCode::kResourceExhausted,
              "would be 4194304 bytes, over the server's max message size of "
              "1048576 bytes",
              limits);
}

TEST(RequestValidationTest, OverInflightBudget) {
  RequestLimits limits;
  limits.max_inflight_bytes = 1000;
  ExpectError(MakeRequest(MakeTensor({10, 10}), MakeTensor({10, 10})),
              absl::StatusCode::kResourceExhausted,
              "needs 1200 bytes in flight (operands and result), over the "
              "server's limit of 1000",
              limits);
}

TEST(RequestValidationTest, DtypeMappingRoundTrips) {
  for (DType t :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    EXPECT_EQ(DTypeFromProto(DTypeToProto(t)), t);
  }
  EXPECT_FALSE(DTypeFromProto(v1::DTYPE_UNSPECIFIED).has_value());
}

}  // namespace
}  // namespace matmul
