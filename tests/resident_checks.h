// Test support: the resident-tensor checks every engine must pass (upload,
// multiply with resident operands in any mix, results kept on the engine,
// download, memory accounting).
#ifndef MATMUL_TESTS_RESIDENT_CHECKS_H_
#define MATMUL_TESTS_RESIDENT_CHECKS_H_

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/reference_gemm.h"

namespace matmul::testing {

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
  up_a.kind = JobKind::kUpload;
  up_a.a = a;
  JobOutcome ra = Run(engine, UploadSpec(dtype, 1, m, k), up_a);
  ASSERT_TRUE(ra.status.ok()) << ra.status;
  ASSERT_NE(ra.resident, nullptr);
  EXPECT_TRUE(ra.c.empty());
  EXPECT_EQ(ra.resident->rows(), m);
  EXPECT_EQ(ra.resident->cols(), k);
  EXPECT_EQ(ra.resident->bytes(), static_cast<int64_t>(a.size()));
  EngineJob::Options up_b;
  up_b.kind = JobKind::kUpload;
  up_b.a = b;
  JobOutcome rb = Run(engine, UploadSpec(dtype, 1, k, n), up_b);
  ASSERT_TRUE(rb.status.ok()) << rb.status;
  EXPECT_GT(engine.stats().devices[0].device_memory_used_bytes, base_memory);

  // Resident x resident, kept on the engine.
  const MatmulSpec ab = MakeSpec(dtype, 1, 1, m, n, k, false, false, false);
  EngineJob::Options mul;
  mul.resident_a = ra.resident;
  mul.resident_b = rb.resident;
  mul.keep_result = true;
  JobOutcome rc = Run(engine, ab, mul);
  ASSERT_TRUE(rc.status.ok()) << rc.status;
  ASSERT_NE(rc.resident, nullptr);
  EXPECT_TRUE(rc.c.empty());
  EXPECT_EQ(rc.resident->rows(), m);
  EXPECT_EQ(rc.resident->cols(), n);

  // Download it and compare with A·B.
  EngineJob::Options down;
  down.kind = JobKind::kDownload;
  down.resident_a = rc.resident;
  JobOutcome c = Run(engine, DownloadSpec(dtype, 1, m, n), down);
  ASSERT_TRUE(c.status.ok()) << c.status;
  const std::vector<double> ref_ab = ReferenceGemm(
      ab, ToDoubles(dtype, a.data(), m * k), ToDoubles(dtype, b.data(), k * n));
  EXPECT_LT(RelativeError(ToDoubles(dtype, c.c.data(), m * n), ref_ab), tol);

  // Resident result × staged operand, returned: (A·B)·D.
  const MatmulSpec cd = MakeSpec(dtype, 1, 1, m, p, n, false, false, false);
  EngineJob::Options chain;
  chain.resident_a = rc.resident;
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
  mixed.resident_b = rb.resident;
  JobOutcome f = Run(engine, ab, mixed);
  ASSERT_TRUE(f.status.ok()) << f.status;
  EXPECT_LT(RelativeError(ToDoubles(dtype, f.c.data(), m * n), ref_ab), tol);

  // Dropping the last references frees the memory.
  ra.resident.reset();
  rb.resident.reset();
  rc.resident.reset();
  mul.resident_a.reset();
  mul.resident_b.reset();
  down.resident_a.reset();
  chain.resident_a.reset();
  mixed.resident_b.reset();
  // The engine drops its finished jobs (and their references) just after
  // calling Done.
  for (int i = 0;
       i < 200 &&
       engine.stats().devices[0].device_memory_used_bytes != base_memory;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(engine.stats().devices[0].device_memory_used_bytes, base_memory);
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_RESIDENT_CHECKS_H_
