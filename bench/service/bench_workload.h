// matmul-bench's workload: the shape it multiplies, the prebuilt requests it
// sends (random operands, generated once), and the check of a response
// against a float64 product computed on the host.
//
// Workload is a plain value (movable; share a const one between threads
// freely). ResponseVerifier is immutable after Create: Check may run on any
// number of threads at once.
#ifndef MATMUL_CLIENT_TOOLS_BENCH_WORKLOAD_H_
#define MATMUL_CLIENT_TOOLS_BENCH_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

// C[batch, m, n] = A[batch, m, k] . B[batch, k, n]; batch 0 means plain 2-D
// operands.
struct BenchShape {
  int64_t batch = 0;
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;

  // Products per request (batch 0 counts as 1).
  int64_t matrices() const { return batch > 0 ? batch : 1; }
  // "MxKxN", or "BxMxKxN" when batched.
  std::string ToString() const;
};

// Parses "N" (N x N x N), "MxKxN" or "BxMxKxN" (an upper-case X works too).
// INVALID_ARGUMENT for anything else or a dimension below 1.
absl::StatusOr<BenchShape> ParseShape(absl::string_view text);

// --shape-mix: shapes as ParseShape takes them, separated by commas
// ("64,128,256,512", "64x128x32,512"), at most 64. INVALID_ARGUMENT for an
// empty list or a bad entry (naming it).
absl::StatusOr<std::vector<BenchShape>> ParseShapeMix(absl::string_view text);

// "64x64x64,128x128x128": a mix as the report names it.
std::string ShapeMixName(const std::vector<BenchShape>& mix);

// "float32" | "float64" | "float16" | "bfloat16" and "strict" | "tf32".
absl::StatusOr<DType> ParseDType(absl::string_view text);
absl::StatusOr<ComputeMode> ParseComputeMode(absl::string_view text);

struct Workload {
  BenchShape shape;  // a mix's first shape
  // A shape mix (BuildMixedWorkload): its shapes, in order; empty for one
  // shape.
  std::vector<BenchShape> mix;
  DType dtype = DType::kFloat32;
  ComputeMode compute = ComputeMode::kStrict;
  // Distinct requests, sent in rotation; shapes[i] is requests[i]'s shape.
  std::vector<std::unique_ptr<v1::MultiplyRequest>> requests;
  std::vector<BenchShape> shapes;
  // Payload per request on the wire: A and B's data, C's data (a mix's
  // mean over its shapes, rounded).
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
  // 2 * batch * m * k * n (a mix's mean).
  double flops_per_request = 0;
};

// Where the operands and products of the requests live (--resident):
//  - kNone: A and B travel with every request, C with every response.
//  - kOperands: A and B are uploaded once per point and named by handles;
//    C comes back with every response.
//  - kAll: as kOperands, and C is kept on the server (keep_result); the
//    response carries its handle, which the bench deletes.
enum class Resident { kNone, kOperands, kAll };

// "none" | "operands" | "all".
absl::string_view ResidentName(Resident resident);
// Parses those names; INVALID_ARGUMENT for anything else.
absl::StatusOr<Resident> ParseResident(absl::string_view text);

// The requests of a resident point: for each of the workload's requests, one
// that names its A and B by the handles a_ids[i] and b_ids[i] (in the
// workload's order), with the same transposes and compute mode, and
// keep_result (with result_ttl_seconds) when `keep_result`.
// INVALID_ARGUMENT unless there is one id of each per request.
absl::StatusOr<std::vector<std::unique_ptr<v1::MultiplyRequest>>>
ResidentRequests(const Workload& workload,
                 const std::vector<std::string>& a_ids,
                 const std::vector<std::string>& b_ids, bool keep_result,
                 int64_t result_ttl_seconds);

// Bytes of A plus B (the payload of one request) for a shape and dtype.
int64_t OperandBytes(const BenchShape& shape, DType dtype);

// Builds `distinct` requests whose operands are uniform in [-1, 1), rounded
// to `dtype`, from a generator seeded with `seed` (the same seed gives the
// same bytes). INVALID_ARGUMENT for distinct < 1 or a shape whose operands
// would not fit in memory (over 2^34 bytes each).
absl::StatusOr<Workload> BuildWorkload(const BenchShape& shape, DType dtype,
                                       ComputeMode compute, int distinct,
                                       uint64_t seed);

// A shape mix: `distinct` requests of each shape, interleaved (mix[0],
// mix[1], .., mix[0], ..), so that requests sent in rotation take the
// shapes round-robin. Operands as BuildWorkload's (the same seed gives the
// same bytes). INVALID_ARGUMENT as BuildWorkload, or for an empty mix.
absl::StatusOr<Workload> BuildMixedWorkload(const std::vector<BenchShape>& mix,
                                            DType dtype, ComputeMode compute,
                                            int distinct, uint64_t seed);

// Checks responses against the float64 product of the very operands sent.
// An element passes when
//   |c - ref| <= e_acc * ||A row|| * ||B column|| + e_out * |ref|
// where ||.|| is the Euclidean norm (an upper bound of sum |a||b|, the scale
// of any accumulation error), e_acc is the accumulation error the dtype and
// compute mode allow (float64 1e-10, float32 1e-4, tf32 2e-3, float16 and
// bfloat16 with float32 accumulation 1e-3) and e_out the rounding of the
// result to its dtype (2^-52, 2^-23, 2^-10, 2^-7). A wrong element (another
// element's value, a zero, a transposed result) is off by about
// |A||B| / sqrt(k), far beyond these for any k up to 10^5.
class ResponseVerifier {
 public:
  // Computes the references (one GEMM per distinct request, on the host's
  // BLAS); the workload must outlive the verifier.
  static absl::StatusOr<std::unique_ptr<ResponseVerifier>> Create(
      const Workload& workload);

  // OK, or DATA_LOSS naming the first bad element and how many are bad; or
  // describing a wrong dtype, shape or size. Thread-safe.
  absl::Status Check(int index, const v1::MultiplyResponse& response) const;

 private:
  struct Reference {
    std::vector<double> c;         // [batch, m, n]
    std::vector<double> row_norm;  // [batch, m]: ||A[b, i, :]||
    std::vector<double> col_norm;  // [batch, n]: ||B[b, :, j]||
  };

  ResponseVerifier(const Workload& workload, std::vector<Reference> refs,
                   double e_acc, double e_out);

  const Workload& workload_;
  std::vector<Reference> refs_;
  double e_acc_;
  double e_out_;
};

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_BENCH_WORKLOAD_H_
