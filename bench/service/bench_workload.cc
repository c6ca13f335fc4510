#include "bench/service/bench_workload.h"

#include <cblas.h>

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/lib/tensor_proto.h"
#include "common/element.h"

namespace matmul {
namespace {

// Largest operand the bench builds, bytes.
constexpr int64_t kMaxOperandBytes = int64_t{1} << 34;

// SplitMix64: small, fast and good enough for test operands.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1), 53 random bits.
  double Uniform() {
    return static_cast<double>(Next() >> 11) * 0x1.0p-52 - 1.0;
  }

 private:
  uint64_t state_;
};

// `count` random elements of `dtype` as little-endian bytes.
std::string RandomData(DType dtype, int64_t count, SplitMix64& rng) {
  std::string data(static_cast<size_t>(count) * DTypeSize(dtype), '\0');
  char* out = data.data();
  for (int64_t i = 0; i < count; ++i) {
    StoreElement(dtype, rng.Uniform(), out + i * DTypeSize(dtype));
  }
  return data;
}

double ElementAt(DType dtype, const char* data, int64_t i) {
  return LoadElement(dtype, data + i * DTypeSize(dtype));
}

std::vector<double> ToDoubles(DType dtype, const std::string& data) {
  const int64_t count = static_cast<int64_t>(data.size() / DTypeSize(dtype));
  std::vector<double> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = ElementAt(dtype, data.data(), i);
  return out;
}

void FillTensor(const BenchShape& shape, int64_t rows, int64_t cols,
                DType dtype, SplitMix64& rng, v1::Tensor* t) {
  if (shape.batch > 0) t->add_shape(shape.batch);
  t->add_shape(rows);
  t->add_shape(cols);
  t->set_dtype(DTypeToProto(dtype));
  *t->mutable_data() = RandomData(dtype, shape.matrices() * rows * cols, rng);
}

absl::Status CheckDims(const BenchShape& s) {
  for (int64_t d : {s.m, s.k, s.n}) {
    if (d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", s.ToString(), ": dimensions must be >= 1"));
    }
  }
  if (s.batch < 0) {
    return absl::InvalidArgumentError("the batch must be >= 1");
  }
  // Each operand and the result below kMaxOperandBytes (at 8 bytes per
  // element), without overflowing on the way.
  const int64_t limit = kMaxOperandBytes / 8;
  const int64_t b = s.matrices();
  for (auto [r, c] : {std::pair{s.m, s.k}, {s.k, s.n}, {s.m, s.n}}) {
    if (r > limit / c || r * c > limit / b) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", s.ToString(),
                       " is too large for the bench (an operand "
                       "over ",
                       kMaxOperandBytes, " bytes)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string BenchShape::ToString() const {
  if (batch > 0) return absl::StrCat(batch, "x", m, "x", k, "x", n);
  return absl::StrCat(m, "x", k, "x", n);
}

absl::StatusOr<BenchShape> ParseShape(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  std::vector<std::string> parts = absl::StrSplit(lower, 'x');
  std::vector<int64_t> dims;
  for (const std::string& part : parts) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(part, &d) || d < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--shape takes N, MxKxN or BxMxKxN with positive integers, got \"",
          text, "\""));
    }
    dims.push_back(d);
  }
  BenchShape shape;
  switch (dims.size()) {
    case 1:
      shape.m = shape.k = shape.n = dims[0];
      break;
    case 3:
      shape.m = dims[0];
      shape.k = dims[1];
      shape.n = dims[2];
      break;
    case 4:
      shape.batch = dims[0];
      shape.m = dims[1];
      shape.k = dims[2];
      shape.n = dims[3];
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "--shape takes N, MxKxN or BxMxKxN, got \"", text, "\""));
  }
  if (absl::Status s = CheckDims(shape); !s.ok()) return s;
  return shape;
}

absl::StatusOr<std::vector<BenchShape>> ParseShapeMix(absl::string_view text) {
  std::vector<BenchShape> mix;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    absl::StatusOr<BenchShape> shape = ParseShape(part);
    if (!shape.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--shape-mix takes shapes (N, MxKxN or BxMxKxN) separated by "
          "commas; \"",
          part, "\" in \"", text, "\" is not one"));
    }
    mix.push_back(*shape);
  }
  if (mix.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape-mix takes at most 64 shapes, got ", mix.size()));
  }
  return mix;
}

std::string ShapeMixName(const std::vector<BenchShape>& mix) {
  return absl::StrJoin(mix, ",", [](std::string* out, const BenchShape& s) {
    absl::StrAppend(out, s.ToString());
  });
}

absl::StatusOr<DType> ParseDType(absl::string_view text) {
  for (DType d :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    if (text == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--dtype takes float32, float64, float16 or bfloat16, got \"", text,
      "\""));
}

absl::StatusOr<ComputeMode> ParseComputeMode(absl::string_view text) {
  if (text == "strict") return ComputeMode::kStrict;
  if (text == "tf32") return ComputeMode::kTf32;
  return absl::InvalidArgumentError(
      absl::StrCat("--compute takes strict or tf32, got \"", text, "\""));
}

absl::string_view ResidentName(Resident resident) {
  switch (resident) {
    case Resident::kOperands:
      return "operands";
    case Resident::kAll:
      return "all";
    case Resident::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<Resident> ParseResident(absl::string_view text) {
  if (text == "none") return Resident::kNone;
  if (text == "operands") return Resident::kOperands;
  if (text == "all") return Resident::kAll;
  return absl::InvalidArgumentError(absl::StrCat(
      "--resident takes none, operands or all, got \"", text, "\""));
}

absl::StatusOr<std::vector<std::unique_ptr<v1::MultiplyRequest>>>
ResidentRequests(const Workload& workload,
                 const std::vector<std::string>& a_ids,
                 const std::vector<std::string>& b_ids, bool keep_result,
                 int64_t result_ttl_seconds) {
  if (a_ids.size() != workload.requests.size() ||
      b_ids.size() != workload.requests.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resident requests: ", workload.requests.size(), " request(s) but ",
        a_ids.size(), " A and ", b_ids.size(), " B handle(s)"));
  }
  std::vector<std::unique_ptr<v1::MultiplyRequest>> out;
  for (size_t i = 0; i < workload.requests.size(); ++i) {
    const v1::MultiplyRequest& inline_request = *workload.requests[i];
    auto r = std::make_unique<v1::MultiplyRequest>();
    r->set_a_handle(a_ids[i]);
    r->set_b_handle(b_ids[i]);
    r->set_transpose_a(inline_request.transpose_a());
    r->set_transpose_b(inline_request.transpose_b());
    r->set_compute_mode(inline_request.compute_mode());
    if (keep_result) {
      r->set_keep_result(true);
      r->set_result_ttl_seconds(result_ttl_seconds);
    }
    out.push_back(std::move(r));
  }
  return out;
}

int64_t OperandBytes(const BenchShape& shape, DType dtype) {
  return shape.matrices() * (shape.m * shape.k + shape.k * shape.n) *
         static_cast<int64_t>(DTypeSize(dtype));
}

absl::StatusOr<Workload> BuildMixedWorkload(const std::vector<BenchShape>& mix,
                                            DType dtype, ComputeMode compute,
                                            int distinct, uint64_t seed) {
  if (distinct < 1) {
    return absl::InvalidArgumentError("at least one distinct request");
  }
  if (mix.empty()) return absl::InvalidArgumentError("an empty shape mix");
  for (const BenchShape& shape : mix) {
    if (absl::Status s = CheckDims(shape); !s.ok()) return s;
  }
  Workload w;
  w.shape = mix.front();
  if (mix.size() > 1) w.mix = mix;
  w.dtype = dtype;
  w.compute = compute;
  const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
  for (const BenchShape& shape : mix) {
    request_bytes += OperandBytes(shape, dtype);
    response_bytes += shape.matrices() * shape.m * shape.n * size;
    w.flops_per_request += 2.0 * static_cast<double>(shape.matrices()) *
                           static_cast<double>(shape.m) *
                           static_cast<double>(shape.k) *
                           static_cast<double>(shape.n);
  }
  const int64_t shapes = static_cast<int64_t>(mix.size());
  w.request_bytes = (request_bytes + shapes / 2) / shapes;
  w.response_bytes = (response_bytes + shapes / 2) / shapes;
  w.flops_per_request /= static_cast<double>(shapes);
  for (int i = 0; i < distinct; ++i) {
    for (size_t j = 0; j < mix.size(); ++j) {
      const BenchShape& shape = mix[j];
      // One shape: the seeds BuildWorkload always used.
      const uint64_t index =
          static_cast<uint64_t>(i) * mix.size() + static_cast<uint64_t>(j);
      SplitMix64 rng(seed * 0x100000001b3ull + index);
      auto request = std::make_unique<v1::MultiplyRequest>();
      FillTensor(shape, shape.m, shape.k, dtype, rng, request->mutable_a());
      FillTensor(shape, shape.k, shape.n, dtype, rng, request->mutable_b());
      request->set_compute_mode(ComputeModeToProto(compute));
      w.requests.push_back(std::move(request));
      w.shapes.push_back(shape);
    }
  }
  return w;
}

absl::StatusOr<Workload> BuildWorkload(const BenchShape& shape, DType dtype,
                                       ComputeMode compute, int distinct,
                                       uint64_t seed) {
  return BuildMixedWorkload({shape}, dtype, compute, distinct, seed);
}

absl::StatusOr<std::unique_ptr<ResponseVerifier>> ResponseVerifier::Create(
    const Workload& workload) {
  std::vector<Reference> refs;
  for (size_t r = 0; r < workload.requests.size(); ++r) {
    const auto& request = workload.requests[r];
    const BenchShape& s =
        r < workload.shapes.size() ? workload.shapes[r] : workload.shape;
    const int64_t batch = s.matrices();
    const std::vector<double> a =
        ToDoubles(workload.dtype, request->a().data());
    const std::vector<double> b =
        ToDoubles(workload.dtype, request->b().data());
    if (static_cast<int64_t>(a.size()) != batch * s.m * s.k ||
        static_cast<int64_t>(b.size()) != batch * s.k * s.n) {
      return absl::InternalError("a request does not match its shape");
    }
    Reference ref;
    ref.c.assign(static_cast<size_t>(batch * s.m * s.n), 0.0);
    ref.row_norm.assign(static_cast<size_t>(batch * s.m), 0.0);
    ref.col_norm.assign(static_cast<size_t>(batch * s.n), 0.0);
    for (int64_t p = 0; p < batch; ++p) {
      const double* ap = a.data() + p * s.m * s.k;
      const double* bp = b.data() + p * s.k * s.n;
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                  static_cast<int>(s.m), static_cast<int>(s.n),
                  static_cast<int>(s.k), 1.0, ap, static_cast<int>(s.k), bp,
                  static_cast<int>(s.n), 0.0, ref.c.data() + p * s.m * s.n,
                  static_cast<int>(s.n));
      for (int64_t i = 0; i < s.m; ++i) {
        double sum = 0;
        for (int64_t q = 0; q < s.k; ++q)
          sum += ap[i * s.k + q] * ap[i * s.k + q];
        ref.row_norm[p * s.m + i] = std::sqrt(sum);
      }
      std::vector<double> col(static_cast<size_t>(s.n), 0.0);
      for (int64_t q = 0; q < s.k; ++q) {
        for (int64_t j = 0; j < s.n; ++j)
          col[j] += bp[q * s.n + j] * bp[q * s.n + j];
      }
      for (int64_t j = 0; j < s.n; ++j) {
        ref.col_norm[p * s.n + j] = std::sqrt(col[j]);
      }
    }
    refs.push_back(std::move(ref));
  }
  double e_acc = 0;
  double e_out = 0;
  switch (workload.dtype) {
    case DType::kFloat64:
      e_acc = 1e-10;
      e_out = 0x1.0p-52;
      break;
    case DType::kFloat32:
      e_acc = workload.compute == ComputeMode::kTf32 ? 2e-3 : 1e-4;
      e_out = 0x1.0p-23;
      break;
    case DType::kFloat16:
      e_acc = 1e-3;
      e_out = 0x1.0p-10;
      break;
    case DType::kBFloat16:
      e_acc = 1e-3;
      e_out = 0x1.0p-7;
      break;
  }
  return std::unique_ptr<ResponseVerifier>(
      new ResponseVerifier(workload, std::move(refs), e_acc, e_out));
}

ResponseVerifier::ResponseVerifier(const Workload& workload,
                                   std::vector<Reference> refs, double e_acc,
                                   double e_out)
    : workload_(workload),
      refs_(std::move(refs)),
      e_acc_(e_acc),
      e_out_(e_out) {}

absl::Status ResponseVerifier::Check(
    int index, const v1::MultiplyResponse& response) const {
  if (index < 0 || index >= static_cast<int>(refs_.size())) {
    return absl::InternalError(
        absl::StrCat("no reference for request ", index));
  }
  const BenchShape& s = static_cast<size_t>(index) < workload_.shapes.size()
                            ? workload_.shapes[index]
                            : workload_.shape;
  const v1::Tensor& c = response.c();
  if (c.dtype() != DTypeToProto(workload_.dtype)) {
    return absl::DataLossError(absl::StrCat("the result's dtype is ",
                                            v1::Dtype_Name(c.dtype()), ", not ",
                                            DTypeName(workload_.dtype)));
  }
  std::vector<int64_t> want_shape;
  if (s.batch > 0) want_shape.push_back(s.batch);
  want_shape.push_back(s.m);
  want_shape.push_back(s.n);
  if (std::vector<int64_t>(c.shape().begin(), c.shape().end()) != want_shape) {
    std::vector<int64_t> got(c.shape().begin(), c.shape().end());
    return absl::DataLossError(
        absl::StrCat("the result's shape is [", absl::StrJoin(got, ", "),
                     "], not [", absl::StrJoin(want_shape, ", "), "]"));
  }
  const Reference& ref = refs_[index];
  const int64_t count = static_cast<int64_t>(ref.c.size());
  if (static_cast<int64_t>(c.data().size()) !=
      count * static_cast<int64_t>(DTypeSize(workload_.dtype))) {
    return absl::DataLossError(
        absl::StrCat("the result holds ", c.data().size(), " bytes, not ",
                     count * DTypeSize(workload_.dtype)));
  }
  int64_t bad = 0;
  int64_t first = -1;
  double first_got = 0;
  double first_tolerance = 0;
  const char* data = c.data().data();
  for (int64_t p = 0, e = 0; p < s.matrices(); ++p) {
    const double* row_norm = ref.row_norm.data() + p * s.m;
    const double* col_norm = ref.col_norm.data() + p * s.n;
    for (int64_t i = 0; i < s.m; ++i) {
      const double row_tolerance = e_acc_ * row_norm[i];
      for (int64_t j = 0; j < s.n; ++j, ++e) {
        const double got = ElementAt(workload_.dtype, data, e);
        const double want = ref.c[e];
        const double tolerance = row_tolerance * col_norm[j] +
                                 e_out_ * std::abs(want) +
                                 std::numeric_limits<double>::min();
        // Written so that NaN fails.
        if (!(std::abs(got - want) <= tolerance) && bad++ == 0) {
          first = e;
          first_got = got;
          first_tolerance = tolerance;
        }
      }
    }
  }
  if (bad == 0) return absl::OkStatus();
  const int64_t p = first / (s.m * s.n);
  const int64_t i = (first / s.n) % s.m;
  const int64_t j = first % s.n;
  const std::string where = s.batch > 0
                                ? absl::StrCat("[", p, ", ", i, ", ", j, "]")
                                : absl::StrCat("[", i, ", ", j, "]");
  return absl::DataLossError(absl::StrCat(
      bad, " of ", count, " elements are wrong; C", where, " is ", first_got,
      ", expected ", ref.c[first], " (tolerance ", first_tolerance, ")"));
}

}  // namespace matmul
