// libFuzzer target for Multiply request parsing and validation.
//
// Every input is used twice:
//  1. as the bytes of a matmul.v1.MultiplyRequest on the wire. They are
//     decoded both by protobuf (ParseFromArray) and by the server's zero-copy
//     decoder (DecodeMultiplyRequest, server/rpc/multiply_wire.h), the latter
//     once from one chunk and once split into chunks at input-chosen places,
//     each chunk in its own allocation so that ASan sees any read past one.
//     The decoders must agree: both accept or both refuse, and when they
//     accept, every field and every data byte is the same;
//  2. through a small structured decoding (DecodeStructured below) into
//     shapes, dtypes, flags and a data length, so that the validator's deep
//     paths (dims, broadcast, byte counts, limits, overflow) are reached far
//     more often than by mutating protobuf bytes. That request is also
//     serialized and put through the zero-copy decoder.
// Each request goes through validation with the default limits, with small
// limits and (structured inputs only) with fuzzed limits in the ranges
// matmul-server's flags accept; the protobuf and the zero-copy headers must
// validate identically. An accepted request must satisfy the invariants the
// engines rely on (CheckSpec); its response framing (FrameMultiplyResponse)
// must parse back as the same product; and if it is small, HostGemm runs on
// its data with every buffer placed against a PROT_NONE guard page (so that
// OpenBLAS, which ASan does not instrument, faults on any read or write past
// the end) and its result is checked against a float64 reference.
//
// Build and run: scripts/fuzz.sh [SECONDS]. tests/fuzz/corpus/ is the seed
// corpus; tests/fuzz/make_corpus.py writes it and documents each file.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "google/protobuf/stubs/logging.h"
#include "gpu/host/host_engine.h"
#include "gpu/matmul_spec.h"
#include "matmul/v1/matmul.pb.h"
#include "server/request_limits.h"
#include "server/request_validation.h"
#include "server/rpc/multiply_wire.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

// Largest accepted request that HostGemm runs on: bounded so that one
// execution stays well under a millisecond.
constexpr int64_t kMaxGemmFlops = int64_t{1} << 18;
constexpr int64_t kMaxGemmBytes = int64_t{1} << 16;
// Structured inputs pad their data to the expected size up to this much.
constexpr int64_t kMaxPaddedBytes = int64_t{1} << 20;

[[noreturn]] void Fail(const char* what, const MatmulSpec& spec) {
  std::fprintf(
      stderr,
      "request_fuzzer: invariant violated: %s\n  spec: dtype=%d "
      "batch=%lld a_batch=%lld b_batch=%lld m=%lld n=%lld k=%lld "
      "ta=%d tb=%d c_is_3d=%d\n",
      what, static_cast<int>(spec.dtype), static_cast<long long>(spec.batch),
      static_cast<long long>(spec.a_batch),
      static_cast<long long>(spec.b_batch), static_cast<long long>(spec.m),
      static_cast<long long>(spec.n), static_cast<long long>(spec.k),
      spec.transpose_a, spec.transpose_b, spec.c_is_3d);
  std::abort();
}

#define FUZZ_CHECK(cond, spec)      \
  do {                              \
    if (!(cond)) Fail(#cond, spec); \
  } while (0)

RequestLimits SmallLimits() {
  RequestLimits limits;
  limits.max_message_bytes = 4096;
  limits.max_elements_per_operand = 512;
  limits.max_dimension = 64;
  limits.max_batch = 8;
  limits.max_inflight_bytes = 8192;
  return limits;
}

// Reads the input front to back; past its end every read yields zeros, so
// that any prefix of a seed still decodes.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() {
    const uint16_t lo = Byte();
    return static_cast<uint16_t>(lo | (Byte() << 8));
  }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(Byte()) << (8 * i);
    return v;
  }
  int64_t I64() {
    const uint64_t u = U64();
    int64_t v;
    std::memcpy(&v, &u, sizeof v);
    return v;
  }
  // A dimension: a small one from one byte (0..127), or with the high bit
  // set one of a few adversarial values or any 64-bit value.
  int64_t Dim() {
    const uint8_t b = Byte();
    if ((b & 0x80) == 0) return b;
    switch (b & 0x07) {
      case 0:
        return int64_t{1} << 31;
      case 1:
        return (int64_t{1} << 31) - 1;
      case 2:
        return int64_t{1} << 62;
      case 3:
        return -1;
      case 4:
        return INT64_MAX;
      case 5:
        return INT64_MIN;
      case 6:
        return int64_t{1} << 32;
      default:
        return I64();
    }
  }
  std::string Rest() {
    std::string out(reinterpret_cast<const char*>(data_ + pos_),
                    pos_ < size_ ? size_ - pos_ : 0);
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The byte size `t` would need to be valid, or -1 if it is not computable
// (bad dtype, non-positive dims, overflow).
int64_t ExpectedBytes(const v1::Tensor& t) {
  const std::optional<DType> dtype = DTypeFromProto(t.dtype());
  if (!dtype.has_value()) return -1;
  int64_t n = static_cast<int64_t>(DTypeSize(*dtype));
  for (int64_t d : t.shape()) {
    if (d <= 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

// Fills `t.data` from `payload`: the exact expected length (payload repeated,
// or zeros if there is none), or an explicit length.
void FillData(v1::Tensor& t, bool exact, uint16_t explicit_length,
              const std::string& payload) {
  int64_t length = explicit_length;
  if (exact) {
    const int64_t expected = ExpectedBytes(t);
    length = expected >= 0 && expected <= kMaxPaddedBytes ? expected
                                                          : explicit_length;
  }
  std::string data(static_cast<size_t>(length), '\0');
  if (!payload.empty()) {
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = payload[i % payload.size()];
  }
  t.set_data(std::move(data));
}

// The structured decoding (tests/fuzz/make_corpus.py writes seeds in it):
//   byte 0  flags: bit0 transpose_a, bit1 transpose_b, bit2 a is 3-D,
//           bit3 b is 3-D, bit4 a's data has the exact expected length,
//           bit5 b's likewise, bit6 drop a or b (bit0 of byte 3 picks),
//           bit7 fuzzed limits follow the data lengths
//   byte 1  a.dtype (int8, so negative and unknown values occur)
//   byte 2  b.dtype
//   byte 3  compute_mode (int8); bit0 also picks the operand bit6 drops
//   dims    a's rank dims, then b's (ByteReader::Dim)
//   u16 ×2  explicit data lengths of a and b (used when not exact)
//   [limits: max_message_bytes (u64 % 2^31, at least 1),
//    max_elements_per_operand, max_dimension, max_batch (at least 1),
//    max_inflight_bytes (i64 each)]
//   rest    element bytes, repeated to fill both operands
struct Structured {
  v1::MultiplyRequest request;
  bool has_limits = false;
  RequestLimits limits;
};

Structured DecodeStructured(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  Structured out;
  v1::MultiplyRequest& r = out.request;
  const uint8_t flags = in.Byte();
  const auto a_dtype = static_cast<int8_t>(in.Byte());
  const auto b_dtype = static_cast<int8_t>(in.Byte());
  const uint8_t mode = in.Byte();
  r.set_transpose_a(flags & 0x01);
  r.set_transpose_b(flags & 0x02);
  r.set_compute_mode(
      static_cast<v1::ComputeMode>(static_cast<int8_t>(mode) >> 1));
  v1::Tensor* a = r.mutable_a();
  v1::Tensor* b = r.mutable_b();
  a->set_dtype(static_cast<v1::Dtype>(a_dtype));
  b->set_dtype(static_cast<v1::Dtype>(b_dtype));
  for (int i = 0, rank = flags & 0x04 ? 3 : 2; i < rank; ++i)
    a->add_shape(in.Dim());
  for (int i = 0, rank = flags & 0x08 ? 3 : 2; i < rank; ++i)
    b->add_shape(in.Dim());
  const uint16_t a_length = in.U16();
  const uint16_t b_length = in.U16();
  if (flags & 0x80) {
    out.has_limits = true;
    out.limits.max_message_bytes =
        static_cast<int64_t>(in.U64() % (uint64_t{1} << 31));
    if (out.limits.max_message_bytes == 0) out.limits.max_message_bytes = 1;
    out.limits.max_elements_per_operand = in.I64();
    out.limits.max_dimension = in.I64();
    // 2-D operands count as batch 1, which no limit refuses: below 1 the
    // batch limit has no meaning (and the server's is fixed at 2^20).
    out.limits.max_batch = std::max<int64_t>(1, in.I64());
    out.limits.max_inflight_bytes = in.I64();
  }
  const std::string payload = in.Rest();
  FillData(*a, flags & 0x10, a_length, payload);
  FillData(*b, flags & 0x20, b_length, payload);
  if (flags & 0x40) {
    if (mode & 1) {
      r.clear_b();
    } else {
      r.clear_a();
    }
  }
  return out;
}

// A buffer that ends exactly at a PROT_NONE page: one byte past its end
// faults. Used for the operands and result HostGemm sees.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t size) : size_(size) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t data_pages = (size + page_ - 1) / page_;
    mapped_ = (data_pages + 1) * page_;
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    base_ = static_cast<std::byte*>(p);
    if (mprotect(base_ + data_pages * page_, page_, PROT_NONE) != 0) {
      std::abort();
    }
    data_ = base_ + data_pages * page_ - size;
  }
  ~GuardedBuffer() { munmap(base_, mapped_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  std::byte* data() { return data_; }
  size_t size() const { return size_; }

 private:
  size_t size_;
  size_t page_;
  size_t mapped_;
  std::byte* base_;
  std::byte* data_;
};

// Does |got - want| stay within what the dtype's arithmetic allows? `bound`
// is sum_k |a||b| (float64), the scale of the rounding error.
bool WithinTolerance(DType dtype, int64_t k, double got, double want,
                     double bound) {
  if (!std::isfinite(want) || !std::isfinite(bound)) return true;
  double unit;      // unit roundoff of the arithmetic
  double tiny;      // absolute error from subnormal products
  double out_unit;  // rounding of the result to the output dtype
  double out_tiny;
  switch (dtype) {
    case DType::kFloat64:
      unit = 0x1p-53;
      tiny = 0x1p-1074;
      out_unit = 0;
      out_tiny = 0;
      break;
    case DType::kFloat32:
      unit = 0x1p-24;
      tiny = 0x1p-149;
      out_unit = 0;
      out_tiny = 0;
      break;
    case DType::kFloat16:
      unit = 0x1p-24;
      tiny = 0x1p-149;
      out_unit = 0x1p-11;
      out_tiny = 0x1p-25;
      break;
    case DType::kBFloat16:
    default:
      unit = 0x1p-24;
      tiny = 0x1p-149;
      out_unit = 0x1p-8;
      out_tiny = 0x1p-134;
      break;
  }
  // float32 intermediates can overflow where the float64 reference does not.
  const double max_finite = dtype == DType::kFloat64   ? 1.7e308
                            : dtype == DType::kFloat16 ? 65504.0
                                                       : 3.4e38;
  if (bound >= max_finite / 4) return true;
  if (!std::isfinite(got)) return false;
  const double kk = static_cast<double>(k) + 2;
  const double allowed = 2 * kk * (unit * bound + tiny) +
                         out_unit * (std::fabs(want) + 2 * kk * unit * bound) +
                         out_tiny;
  return std::fabs(got - want) <= allowed;
}

// Runs HostGemm on the request's data in guarded buffers and compares it
// with a float64 reference.
void RunGemm(const v1::MultiplyRequest& request, const MatmulSpec& spec) {
  GuardedBuffer a(static_cast<size_t>(spec.a_bytes()));
  GuardedBuffer b(static_cast<size_t>(spec.b_bytes()));
  GuardedBuffer c(static_cast<size_t>(spec.c_bytes()));
  std::memcpy(a.data(), request.a().data().data(), a.size());
  std::memcpy(b.data(), request.b().data().data(), b.size());
  HostGemm(spec, a.data(), b.data(), c.data());

  const std::vector<double> a64 =
      testing::ToDoubles(spec.dtype, a.data(), spec.a_elements());
  const std::vector<double> b64 =
      testing::ToDoubles(spec.dtype, b.data(), spec.b_elements());
  for (double v : a64) {
    if (!std::isfinite(v)) return;  // NaN/Inf propagate in BLAS-specific ways
  }
  for (double v : b64) {
    if (!std::isfinite(v)) return;
  }
  const std::vector<double> got =
      testing::ToDoubles(spec.dtype, c.data(), spec.c_elements());
  const std::vector<double> want = testing::ReferenceGemm(spec, a64, b64);
  // The same product over |a| and |b| bounds the rounding error.
  std::vector<double> a_abs(a64.size()), b_abs(b64.size());
  for (size_t i = 0; i < a64.size(); ++i) a_abs[i] = std::fabs(a64[i]);
  for (size_t i = 0; i < b64.size(); ++i) b_abs[i] = std::fabs(b64[i]);
  const std::vector<double> bound = testing::ReferenceGemm(spec, a_abs, b_abs);
  FUZZ_CHECK(got.size() == want.size(), spec);
  for (size_t i = 0; i < got.size(); ++i) {
    if (!WithinTolerance(spec.dtype, spec.k, got[i], want[i], bound[i])) {
      std::fprintf(stderr, "C[%zu] = %.17g, reference %.17g (scale %.17g)\n", i,
                   got[i], want[i], bound[i]);
      Fail("HostGemm result matches the float64 reference", spec);
    }
  }
}

// The invariants the server and the engines rely on for an accepted request.
void CheckSpec(const v1::MultiplyRequest& request, const RequestLimits& limits,
               const MatmulSpec& spec) {
  FUZZ_CHECK(request.has_a() && request.has_b(), spec);
  FUZZ_CHECK(DTypeFromProto(request.a().dtype()) == spec.dtype, spec);
  FUZZ_CHECK(request.b().dtype() == request.a().dtype(), spec);
  FUZZ_CHECK(spec.transpose_a == request.transpose_a(), spec);
  FUZZ_CHECK(spec.transpose_b == request.transpose_b(), spec);
  FUZZ_CHECK(spec.m > 0 && spec.n > 0 && spec.k > 0 && spec.batch > 0, spec);
  FUZZ_CHECK(spec.m <= limits.max_dimension && spec.n <= limits.max_dimension &&
                 spec.k <= limits.max_dimension,
             spec);
  FUZZ_CHECK(spec.batch <= limits.max_batch, spec);
  FUZZ_CHECK(spec.a_batch == 1 || spec.a_batch == spec.batch, spec);
  FUZZ_CHECK(spec.b_batch == 1 || spec.b_batch == spec.batch, spec);
  FUZZ_CHECK(
      spec.batch == (spec.a_batch > spec.b_batch ? spec.a_batch : spec.b_batch),
      spec);
  FUZZ_CHECK(spec.c_is_3d == (request.a().shape_size() == 3 ||
                              request.b().shape_size() == 3),
             spec);

  // Every size the engines compute (MatmulSpec's accessors multiply without
  // checks) must fit in int64: recompute each with overflow checks first.
  const int64_t elem = spec.elem_size();
  int64_t a_elements, b_elements, c_elements, a_bytes, b_bytes, c_bytes, sum;
  FUZZ_CHECK(!__builtin_mul_overflow(spec.a_batch, spec.m, &a_elements) &&
                 !__builtin_mul_overflow(a_elements, spec.k, &a_elements) &&
                 !__builtin_mul_overflow(a_elements, elem, &a_bytes),
             spec);
  FUZZ_CHECK(!__builtin_mul_overflow(spec.b_batch, spec.k, &b_elements) &&
                 !__builtin_mul_overflow(b_elements, spec.n, &b_elements) &&
                 !__builtin_mul_overflow(b_elements, elem, &b_bytes),
             spec);
  FUZZ_CHECK(!__builtin_mul_overflow(spec.batch, spec.m, &c_elements) &&
                 !__builtin_mul_overflow(c_elements, spec.n, &c_elements) &&
                 !__builtin_mul_overflow(c_elements, elem, &c_bytes),
             spec);
  FUZZ_CHECK(!__builtin_add_overflow(a_bytes, b_bytes, &sum) &&
                 !__builtin_add_overflow(sum, c_bytes, &sum),
             spec);
  FUZZ_CHECK(a_elements == spec.a_elements() && a_bytes == spec.a_bytes(),
             spec);
  FUZZ_CHECK(b_elements == spec.b_elements() && b_bytes == spec.b_bytes(),
             spec);
  FUZZ_CHECK(c_elements == spec.c_elements() && c_bytes == spec.c_bytes(),
             spec);

  // The byte counts are those of the data that came with the request.
  FUZZ_CHECK(static_cast<int64_t>(request.a().data().size()) == a_bytes, spec);
  FUZZ_CHECK(static_cast<int64_t>(request.b().data().size()) == b_bytes, spec);

  // And the result respects the limits.
  FUZZ_CHECK(c_elements <= limits.max_elements_per_operand, spec);
  FUZZ_CHECK(a_elements <= limits.max_elements_per_operand, spec);
  FUZZ_CHECK(b_elements <= limits.max_elements_per_operand, spec);
  FUZZ_CHECK(c_bytes <= limits.max_message_bytes, spec);
  FUZZ_CHECK(sum <= limits.max_inflight_bytes, spec);

  // The stored shapes are the ones the spec describes.
  const auto& as = request.a().shape();
  const auto& bs = request.b().shape();
  const int ar = as.size();
  const int br = bs.size();
  FUZZ_CHECK((ar == 3 ? as[0] : 1) == spec.a_batch, spec);
  FUZZ_CHECK((br == 3 ? bs[0] : 1) == spec.b_batch, spec);
  FUZZ_CHECK(as[ar - 2] == (spec.transpose_a ? spec.k : spec.m), spec);
  FUZZ_CHECK(as[ar - 1] == (spec.transpose_a ? spec.m : spec.k), spec);
  FUZZ_CHECK(bs[br - 2] == (spec.transpose_b ? spec.n : spec.k), spec);
  FUZZ_CHECK(bs[br - 1] == (spec.transpose_b ? spec.k : spec.n), spec);

  if (spec.flops() <= static_cast<double>(kMaxGemmFlops) &&
      sum <= kMaxGemmBytes) {
    RunGemm(request, spec);
  }
}

[[noreturn]] void FailWire(const char* what, const std::string& detail) {
  std::fprintf(stderr, "request_fuzzer: zero-copy decoder: %s\n  %s\n", what,
               detail.c_str());
  std::abort();
}

bool SameSpec(const MatmulSpec& x, const MatmulSpec& y) {
  return x.dtype == y.dtype && x.compute == y.compute && x.batch == y.batch &&
         x.a_batch == y.a_batch && x.b_batch == y.b_batch && x.m == y.m &&
         x.n == y.n && x.k == y.k && x.transpose_a == y.transpose_a &&
         x.transpose_b == y.transpose_b && x.c_is_3d == y.c_is_3d;
}

// The response the server would frame for `spec` must parse, with protobuf,
// as exactly that product.
void CheckFraming(const MatmulSpec& spec, int device, int stream) {
  if (spec.c_bytes() > kMaxGemmBytes) return;
  std::vector<int64_t> shape;
  if (spec.c_is_3d) shape.push_back(spec.batch);
  shape.push_back(spec.m);
  shape.push_back(spec.n);
  std::string data(static_cast<size_t>(spec.c_bytes()), '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  const ResponseFraming framing = FrameMultiplyResponse(
      shape, DTypeToProto(spec.dtype), spec.c_bytes(), device, stream);
  v1::MultiplyResponse response;
  if (!response.ParseFromString(framing.prefix + data + framing.suffix) ||
      !response.has_c() ||
      std::vector<int64_t>(response.c().shape().begin(),
                           response.c().shape().end()) != shape ||
      response.c().dtype() != DTypeToProto(spec.dtype) ||
      response.c().data() != data || response.placement().device() != device ||
      response.placement().stream() != stream) {
    Fail("FrameMultiplyResponse frames a message protobuf reads back", spec);
  }
}

// ValidateTensor (Upload's check of one stored tensor): an accepted tensor's
// byte count is its data's, its dims are positive and within the limits.
void CheckTensor(const OperandHeader& tensor, const RequestLimits& limits) {
  absl::StatusOr<TensorDims> dims = ValidateTensor(tensor, "tensor", limits);
  if (!dims.ok()) {
    const absl::StatusCode code = dims.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kResourceExhausted) {
      FailWire("ValidateTensor refuses with an unexpected code",
               dims.status().ToString());
    }
    return;
  }
  const int64_t elem = static_cast<int64_t>(DTypeSize(dims->dtype));
  int64_t bytes;
  if (!tensor.present || dims->batch < 1 || dims->rows < 1 || dims->cols < 1 ||
      dims->rows > limits.max_dimension || dims->cols > limits.max_dimension ||
      dims->batch > limits.max_batch ||
      dims->is_3d != (tensor.shape.size() == 3) ||
      __builtin_mul_overflow(dims->batch, dims->rows, &bytes) ||
      __builtin_mul_overflow(bytes, dims->cols, &bytes) ||
      bytes > limits.max_elements_per_operand ||
      __builtin_mul_overflow(bytes, elem, &bytes) ||
      bytes != tensor.data_bytes) {
    FailWire("ValidateTensor accepted an inconsistent tensor", "");
  }
}

// Validates `request` (and, if given, the zero-copy decoder's header of the
// same bytes, which must validate identically).
void Validate(const v1::MultiplyRequest& request, const RequestLimits& limits,
              const MultiplyHeader* wire = nullptr) {
  absl::StatusOr<MatmulSpec> spec = ValidateMultiplyRequest(request, limits);
  if (wire != nullptr) {
    CheckTensor(wire->a, limits);
    CheckTensor(wire->b, limits);
    absl::StatusOr<MatmulSpec> wire_spec =
        ValidateMultiplyHeader(*wire, limits);
    if (spec.ok() != wire_spec.ok() ||
        (spec.ok() ? !SameSpec(*spec, *wire_spec)
                   : spec.status() != wire_spec.status())) {
      FailWire(
          "validates differently from the protobuf message",
          spec.ok() ? wire_spec.status().ToString() : spec.status().ToString());
    }
  }
  if (spec.ok()) {
    CheckSpec(request, limits, *spec);
    CheckFraming(*spec, static_cast<int>(request.a().data().size()) - 1,
                 request.b().shape_size());
    return;
  }
  // Refusals carry exactly the two codes the API documents, and a message.
  const absl::StatusCode code = spec.status().code();
  if ((code != absl::StatusCode::kInvalidArgument &&
       code != absl::StatusCode::kResourceExhausted) ||
      spec.status().message().empty()) {
    std::fprintf(stderr, "request_fuzzer: unexpected refusal %s\n",
                 spec.status().ToString().c_str());
    std::abort();
  }
}

// The bytes split into chunks, each in its own exact-size allocation.
class Chunks {
 public:
  Chunks(const uint8_t* data, size_t size, std::vector<size_t> cuts) {
    size_t begin = 0;
    cuts.push_back(size);
    for (size_t cut : cuts) {
      cut = std::min(std::max(cut, begin), size);
      auto chunk = std::make_unique<uint8_t[]>(cut - begin);
      if (cut > begin) std::memcpy(chunk.get(), data + begin, cut - begin);
      spans_.push_back(ByteChunk(chunk.get(), cut - begin));
      storage_.push_back(std::move(chunk));
      begin = cut;
    }
  }
  absl::Span<const ByteChunk> spans() const { return spans_; }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
  std::vector<ByteChunk> spans_;
};

void SameTensor(const char* name, bool has, const v1::Tensor& want,
                const WireTensor& got) {
  if (got.present != has) FailWire("presence differs", name);
  if (std::vector<int64_t>(want.shape().begin(), want.shape().end()) !=
      got.shape) {
    FailWire("shape differs", name);
  }
  if (got.dtype != static_cast<int>(want.dtype())) {
    FailWire("dtype differs", name);
  }
  if (got.data_bytes != static_cast<int64_t>(want.data().size())) {
    FailWire("data size differs", name);
  }
  int64_t pieces = 0;
  for (const ByteChunk& piece : got.data) pieces += piece.size();
  if (pieces != got.data_bytes) FailWire("pieces do not add up", name);
  // Copied into an exact-size buffer: ASan catches a write past the end.
  auto copy = std::make_unique<std::byte[]>(got.data_bytes);
  CopyPieces(got.data, copy.get());
  if (got.data_bytes > 0 &&
      std::memcmp(copy.get(), want.data().data(), got.data_bytes) != 0) {
    FailWire("data bytes differ", name);
  }
}

// Decodes `chunks` with the zero-copy decoder and compares with protobuf's
// `parsed` (nullptr: protobuf refused the bytes). Returns the decoded
// request when both accepted.
std::unique_ptr<WireMultiplyRequest> Differential(
    absl::Span<const ByteChunk> chunks, const v1::MultiplyRequest* parsed) {
  absl::StatusOr<WireMultiplyRequest> wire = DecodeMultiplyRequest(chunks);
  if (parsed == nullptr) {
    if (wire.ok()) FailWire("accepts bytes protobuf refuses", "");
    if (wire.status().code() != absl::StatusCode::kInvalidArgument) {
      FailWire("refuses with a code other than INVALID_ARGUMENT",
               wire.status().ToString());
    }
    return nullptr;
  }
  if (!wire.ok()) {
    FailWire("refuses bytes protobuf accepts", wire.status().ToString());
  }
  SameTensor("a", parsed->has_a(), parsed->a(), wire->a);
  SameTensor("b", parsed->has_b(), parsed->b(), wire->b);
  if (wire->transpose_a != parsed->transpose_a() ||
      wire->transpose_b != parsed->transpose_b() ||
      wire->compute_mode != static_cast<int>(parsed->compute_mode())) {
    FailWire("flags differ", "");
  }
  if (wire->a_handle != parsed->a_handle() ||
      wire->b_handle != parsed->b_handle() ||
      wire->keep_result != parsed->keep_result() ||
      wire->result_ttl_seconds != parsed->result_ttl_seconds()) {
    FailWire("handles, keep_result or result_ttl_seconds differ", "");
  }
  return std::make_unique<WireMultiplyRequest>(*std::move(wire));
}

// The same for a MultiplyStreamRequest (the start's nested MultiplyRequest
// through Differential above).
void StreamDifferential(absl::Span<const ByteChunk> chunks, const uint8_t* data,
                        size_t size) {
  v1::MultiplyStreamRequest parsed;
  const bool parsed_ok = parsed.ParseFromArray(data, static_cast<int>(size));
  absl::StatusOr<WireStreamRequest> wire = DecodeMultiplyStreamRequest(chunks);
  if (!parsed_ok) {
    if (wire.ok()) FailWire("stream: accepts bytes protobuf refuses", "");
    if (wire.status().code() != absl::StatusCode::kInvalidArgument) {
      FailWire("stream: refuses with a code other than INVALID_ARGUMENT",
               wire.status().ToString());
    }
    return;
  }
  if (!wire.ok()) {
    FailWire("stream: refuses bytes protobuf accepts",
             wire.status().ToString());
  }
  if (wire->request_id != parsed.request_id()) {
    FailWire("stream: request_id differs", "");
  }
  switch (parsed.kind_case()) {
    case v1::MultiplyStreamRequest::kStart:
      if (wire->kind != WireStreamRequest::Kind::kStart) {
        FailWire("stream: start not seen", "");
      }
      if (wire->result_chunk_bytes != parsed.start().result_chunk_bytes()) {
        FailWire("stream: result_chunk_bytes differs", "");
      }
      if (wire->stripe_key != parsed.start().stripe_key() ||
          wire->stripes != parsed.start().stripes()) {
        FailWire("stream: stripe_key or stripes differs", "");
      }
      Differential(wire->start_pieces, &parsed.start().request());
      break;
    case v1::MultiplyStreamRequest::kChunk: {
      if (wire->kind != WireStreamRequest::Kind::kChunk) {
        FailWire("stream: chunk not seen", "");
      }
      const v1::OperandChunk& chunk = parsed.chunk();
      if (wire->operand != static_cast<int>(chunk.operand()) ||
          wire->offset != chunk.offset() ||
          wire->data_bytes != static_cast<int64_t>(chunk.data().size())) {
        FailWire("stream: chunk fields differ", "");
      }
      auto copy = std::make_unique<std::byte[]>(wire->data_bytes);
      CopyPieces(wire->data, copy.get());
      if (wire->data_bytes > 0 &&
          std::memcmp(copy.get(), chunk.data().data(), wire->data_bytes) != 0) {
        FailWire("stream: chunk data differs", "");
      }
      break;
    }
    case v1::MultiplyStreamRequest::kJoin:
      if (wire->kind != WireStreamRequest::Kind::kJoin) {
        FailWire("stream: join not seen", "");
      }
      if (wire->stripe_key != parsed.join().stripe_key()) {
        FailWire("stream: join's stripe_key differs", "");
      }
      break;
    case v1::MultiplyStreamRequest::KIND_NOT_SET:
      if (wire->kind != WireStreamRequest::Kind::kNone) {
        FailWire("stream: a kind protobuf does not see", "");
      }
      break;
  }
}

}  // namespace
}  // namespace matmul

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Protobuf logs every refused string field; refusals are expected here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using matmul::Chunks;
  using matmul::RequestLimits;
  static const RequestLimits kDefault;
  static const RequestLimits kSmall = matmul::SmallLimits();

  // 1. The bytes as the wire delivers them: protobuf and the zero-copy
  // decoder, from one chunk and from up to four (one of them empty).
  matmul::v1::MultiplyRequest parsed;
  const bool parsed_ok = parsed.ParseFromArray(data, static_cast<int>(size));
  const Chunks whole(data, size, {});
  std::unique_ptr<matmul::WireMultiplyRequest> wire =
      matmul::Differential(whole.spans(), parsed_ok ? &parsed : nullptr);
  if (size > 0) {
    const size_t first = data[0] % (size + 1);
    const size_t second = first + data[size - 1] % (size - first + 1);
    const Chunks split(data, size, {first, first, second});
    matmul::Differential(split.spans(), parsed_ok ? &parsed : nullptr);
  }
  matmul::StreamDifferential(whole.spans(), data, size);
  if (parsed_ok) {
    const matmul::MultiplyHeader header = wire->header();
    matmul::Validate(parsed, kDefault, &header);
    matmul::Validate(parsed, kSmall, &header);
  }

  // 2. The bytes as a structured request, and that request serialized.
  const matmul::Structured structured = matmul::DecodeStructured(data, size);
  const std::string bytes = structured.request.SerializeAsString();
  const Chunks serialized(reinterpret_cast<const uint8_t*>(bytes.data()),
                          bytes.size(), {bytes.size() / 2});
  wire = matmul::Differential(serialized.spans(), &structured.request);
  const matmul::MultiplyHeader header = wire->header();
  matmul::Validate(structured.request, kDefault, &header);
  matmul::Validate(structured.request, kSmall, &header);
  if (structured.has_limits) {
    matmul::Validate(structured.request, structured.limits, &header);
  }
  return 0;
}
