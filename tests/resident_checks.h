// Test support: the resident-tensor checks every engine must pass (upload,
// multiply with resident operands in any mix, results kept on the engine,
// download, memory accounting).
#ifndef MATMUL_TESTS_RESIDENT_CHECKS_H_
#define MATMUL_TESTS_RESIDENT_CHECKS_H_

#include <algorithm>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/reference_gemm.h"

namespace matmul::testing {

// Waits (up to 2 s) for the engine's device memory in use to return to
// `base`: engines drop finished jobs, and their references, just after
// calling Done.
inline void ExpectMemoryBackTo(Engine& engine, int64_t base) {
  for (int i = 0;
       i < 200 && engine.stats().devices[0].device_memory_used_bytes != base;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(engine.stats().devices[0].device_memory_used_bytes, base);
}

inline void CheckResidentTensors(Engine& engine, DType dtype) {
  const int64_t m = 67, k = 45, n = 33, p = 29;
  absl::BitGen gen;
  const std::string a = RandomBytes(dtype, m * k, gen);
  const std::string b = RandomBytes(dtype, k * n, gen);
  const std::string d = RandomBytes(dtype, n * p, gen);
  const double tol = Tolerance(dtype, ComputeMode::kStrict);
  const int64_t base_memory =
      engine.stats().devices[0].device_memory_used_bytes;

  EngineJob::Options up_a;
  up_a.op = UploadOp{};
  up_a.a = a;
  JobOutcome ra = Run(engine, UploadSpec(dtype, 1, m, k), up_a);
  ASSERT_TRUE(ra.status.ok()) << ra.status;
  ASSERT_NE(ra.resident, nullptr);
  EXPECT_TRUE(ra.c.empty());
  EXPECT_EQ(ra.resident->rows(), m);
  EXPECT_EQ(ra.resident->cols(), k);
  EXPECT_EQ(ra.resident->bytes(), static_cast<int64_t>(a.size()));
  EngineJob::Options up_b;
  up_b.op = UploadOp{};
  up_b.a = b;
  JobOutcome rb = Run(engine, UploadSpec(dtype, 1, k, n), up_b);
  ASSERT_TRUE(rb.status.ok()) << rb.status;
  EXPECT_GT(engine.stats().devices[0].device_memory_used_bytes, base_memory);

  // Resident x resident, kept on the engine.
  const MatmulSpec ab = MakeSpec(dtype, 1, 1, m, n, k, false, false, false);
  EngineJob::Options mul;
  mul.op = MultiplyOp{ra.resident, rb.resident, /*keep_result=*/true, {}};
  JobOutcome rc = Run(engine, ab, mul);
  ASSERT_TRUE(rc.status.ok()) << rc.status;
  ASSERT_NE(rc.resident, nullptr);
  EXPECT_TRUE(rc.c.empty());
  EXPECT_EQ(rc.resident->rows(), m);
  EXPECT_EQ(rc.resident->cols(), n);

  // Download it and compare with A·B.
  EngineJob::Options down;
  down.op = DownloadOp{rc.resident, 0};
  JobOutcome c = Run(engine, DownloadSpec(dtype, 1, m, n), down);
  ASSERT_TRUE(c.status.ok()) << c.status;
  const std::vector<double> ref_ab = ReferenceGemm(
      ab, ToDoubles(dtype, a.data(), m * k), ToDoubles(dtype, b.data(), k * n));
  EXPECT_LT(RelativeError(ToDoubles(dtype, c.c.data(), m * n), ref_ab), tol);

  // Resident result × staged operand, returned: (A·B)·D.
  const MatmulSpec cd = MakeSpec(dtype, 1, 1, m, p, n, false, false, false);
  EngineJob::Options chain;
  chain.op = MultiplyOp{rc.resident, nullptr, false, {}};
  chain.b = d;
  JobOutcome e = Run(engine, cd, chain);
  ASSERT_TRUE(e.status.ok()) << e.status;
  const std::vector<double> ref_cd =
      ReferenceGemm(cd, ToDoubles(dtype, c.c.data(), m * n),
                    ToDoubles(dtype, d.data(), n * p));
  EXPECT_LT(RelativeError(ToDoubles(dtype, e.c.data(), m * p), ref_cd), tol);

  // Staged A × resident B, returned.
  EngineJob::Options mixed;
  mixed.a = a;
  mixed.op = MultiplyOp{nullptr, rb.resident, false, {}};
  JobOutcome f = Run(engine, ab, mixed);
  ASSERT_TRUE(f.status.ok()) << f.status;
  EXPECT_LT(RelativeError(ToDoubles(dtype, f.c.data(), m * n), ref_ab), tol);

  // Dropping the last references frees the memory.
  ra.resident.reset();
  rb.resident.reset();
  rc.resident.reset();
  mul.op = MultiplyOp{};
  down.op = MultiplyOp{};
  chain.op = MultiplyOp{};
  mixed.op = MultiplyOp{};
  // The engine drops its finished jobs (and their references) just after
  // calling Done.
  ExpectMemoryBackTo(engine, base_memory);
}

// A product whose operands reach the engine in pieces, as the streaming RPC
// sends them: one allocation holds A and B, uneven pieces of each are
// uploaded into it at their offsets (A's last piece first), the multiply
// reads views of it, and C comes back in pieces read at offsets.
inline void CheckPiecewiseTransfer(Engine& engine, DType dtype) {
  const int64_t m = 53, k = 71, n = 37;
  absl::BitGen gen;
  const std::string a = RandomBytes(dtype, m * k, gen);
  const std::string b = RandomBytes(dtype, k * n, gen);
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t a_bytes = m * k * elem;
  const int64_t b_at = (a_bytes + 255) / 256 * 256;
  const int64_t total = b_at + k * n * elem;
  const int64_t base_memory =
      engine.stats().devices[0].device_memory_used_bytes;

  EngineJob::Options alloc;
  alloc.op = AllocateOp{};
  JobOutcome buffer = Run(engine, UploadSpec(dtype, 1, 1, total / elem), alloc);
  ASSERT_TRUE(buffer.status.ok()) << buffer.status;
  ASSERT_NE(buffer.resident, nullptr);
  EXPECT_GE(buffer.resident->bytes(), total);
  EXPECT_TRUE(buffer.c.empty());

  // Uploads `bytes` in pieces of `piece` elements, last piece first.
  auto upload = [&](const std::string& bytes, int64_t at, int64_t piece) {
    const int64_t elems = static_cast<int64_t>(bytes.size()) / elem;
    std::vector<int64_t> starts;
    for (int64_t e = 0; e < elems; e += piece) starts.push_back(e);
    std::reverse(starts.begin(), starts.end());
    for (int64_t e : starts) {
      const int64_t count = std::min(piece, elems - e);
      EngineJob::Options up;
      up.op = UploadOp{buffer.resident, at + e * elem};
      up.a = bytes.substr(static_cast<size_t>(e * elem),
                          static_cast<size_t>(count * elem));
      JobOutcome done = Run(engine, UploadSpec(dtype, 1, 1, count), up);
      ASSERT_TRUE(done.status.ok()) << done.status;
      EXPECT_EQ(done.resident, nullptr);  // nothing new kept
    }
  };
  upload(a, 0, 1000);
  upload(b, b_at, 777);

  absl::StatusOr<std::shared_ptr<ResidentTensor>> va =
      ResidentView::Create(buffer.resident, 0, dtype, 1, m, k);
  absl::StatusOr<std::shared_ptr<ResidentTensor>> vb =
      ResidentView::Create(buffer.resident, b_at, dtype, 1, k, n);
  ASSERT_TRUE(va.ok() && vb.ok());
  EXPECT_FALSE(
      ResidentView::Create(buffer.resident, b_at + elem, dtype, 1, k, n).ok());
  const MatmulSpec ab = MakeSpec(dtype, 1, 1, m, n, k, false, false, false);
  EngineJob::Options mul;
  mul.op = MultiplyOp{*va, *vb, /*keep_result=*/true, {}};
  JobOutcome rc = Run(engine, ab, mul);
  ASSERT_TRUE(rc.status.ok()) << rc.status;
  ASSERT_NE(rc.resident, nullptr);

  std::string c(static_cast<size_t>(m * n * elem), '\0');
  const int64_t piece = 300;  // elements
  for (int64_t e = 0; e < m * n; e += piece) {
    const int64_t count = std::min(piece, m * n - e);
    EngineJob::Options down;
    down.op = DownloadOp{rc.resident, e * elem};
    JobOutcome part = Run(engine, DownloadSpec(dtype, 1, 1, count), down);
    ASSERT_TRUE(part.status.ok()) << part.status;
    ASSERT_EQ(part.c.size(), static_cast<size_t>(count * elem));
    c.replace(static_cast<size_t>(e * elem), part.c.size(), part.c);
  }
  const std::vector<double> ref = ReferenceGemm(
      ab, ToDoubles(dtype, a.data(), m * k), ToDoubles(dtype, b.data(), k * n));
  EXPECT_LT(RelativeError(ToDoubles(dtype, c.data(), m * n), ref),
            Tolerance(dtype, ComputeMode::kStrict));

  // Pieces that would reach outside their tensor are refused.
  EngineJob::Options past;
  past.op = UploadOp{buffer.resident, buffer.resident->bytes() - elem};
  past.a = std::string(static_cast<size_t>(2 * elem), '\0');
  EXPECT_EQ(Run(engine, UploadSpec(dtype, 1, 1, 2), past).status.code(),
            absl::StatusCode::kInvalidArgument);
  EngineJob::Options bad_down;
  bad_down.op = DownloadOp{rc.resident, -elem};
  EXPECT_EQ(Run(engine, DownloadSpec(dtype, 1, 1, 1), bad_down).status.code(),
            absl::StatusCode::kInvalidArgument);

  // Views keep their base alive; dropping everything frees the memory.
  buffer.resident.reset();
  past.op = MultiplyOp{};
  rc.resident.reset();
  bad_down.op = MultiplyOp{};
  mul.op = MultiplyOp{};
  va->reset();
  vb->reset();
  ExpectMemoryBackTo(engine, base_memory);
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_RESIDENT_CHECKS_H_
