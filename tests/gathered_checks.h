// Checks of a gathered multiply (MultiplyOp::gathered) that run on any
// engine: host_engine_test runs them everywhere, cuda_engine_test on a GPU.
#ifndef MATMUL_TESTS_GATHERED_CHECKS_H_
#define MATMUL_TESTS_GATHERED_CHECKS_H_

#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/float16.h"
#include "gpu/engine.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"
#include "tests/reference_gemm.h"

namespace matmul::testing {

// `count` integers in [-2, 2] as `dtype`: products of k <= 64 of them sum
// exactly in every dtype, bfloat16's 8-bit significand included.
inline std::string SmallIntegerBytes(DType dtype, int64_t count,
                                     absl::BitGen& gen) {
  std::string bytes(static_cast<size_t>(count * DTypeSize(dtype)), '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float v = static_cast<float>(absl::Uniform(gen, -2, 3));
    char* at = bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(at, &v, 4);
        break;
      case DType::kFloat64: {
        const double d = v;
        std::memcpy(at, &d, 8);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = FloatToHalf(v);
        std::memcpy(at, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t h = FloatToBFloat16(v);
        std::memcpy(at, &h, 2);
        break;
      }
    }
  }
  return bytes;
}

// One gathered multiply of `members` members of `spec`'s shape (a plain
// 2-D multiply) on `engine`: each member's operands in a host buffer of
// its own from engine.AllocateHostBuffer (A and B back to back in one when
// `one_buffer`, else two), its product into a buffer of its own when
// `to_destinations`, else back in the job's staging, every member's after
// the last. Every product must be exact.
inline void ExpectGatheredMultiplyExact(Engine& engine, MatmulSpec spec,
                                        int members, bool one_buffer,
                                        bool to_destinations) {
  SCOPED_TRACE(
      absl::StrCat(DTypeName(spec.dtype), ", ", members, " members, ",
                   one_buffer ? "one buffer" : "two",
                   to_destinations ? ", products to destinations" : ""));
  absl::BitGen gen;
  const int64_t a_bytes = spec.a_bytes(), b_bytes = spec.b_bytes();
  const int64_t c_bytes = spec.c_bytes();
  std::vector<HostBuffer> buffers;
  std::vector<std::string> a(members), b(members);
  MultiplyOp op;
  for (int i = 0; i < members; ++i) {
    a[i] = SmallIntegerBytes(spec.dtype, spec.a_elements(), gen);
    b[i] = SmallIntegerBytes(spec.dtype, spec.b_elements(), gen);
    absl::StatusOr<HostBuffer> ab =
        engine.AllocateHostBuffer(a_bytes + (one_buffer ? b_bytes : 0));
    ASSERT_TRUE(ab.ok()) << ab.status();
    GatheredMember member;
    member.operands.a = ab->data();
    member.operands.one_allocation = one_buffer;
    std::memcpy(ab->data(), a[i].data(), a[i].size());
    std::byte* b_at = ab->data() + a_bytes;
    buffers.push_back(std::move(*ab));
    if (!one_buffer) {
      absl::StatusOr<HostBuffer> bb = engine.AllocateHostBuffer(b_bytes);
      ASSERT_TRUE(bb.ok()) << bb.status();
      b_at = bb->data();
      buffers.push_back(std::move(*bb));
    }
    std::memcpy(b_at, b[i].data(), b[i].size());
    member.operands.b = b_at;
    if (to_destinations) {
      absl::StatusOr<HostBuffer> cb = engine.AllocateHostBuffer(c_bytes);
      ASSERT_TRUE(cb.ok()) << cb.status();
      std::memset(cb->data(), 0xff, static_cast<size_t>(c_bytes));
      member.c_destination = cb->data();
      buffers.push_back(std::move(*cb));
    }
    op.gathered.push_back(member);
  }
  MatmulSpec batch = spec;
  batch.batch = batch.a_batch = batch.b_batch = members;
  batch.c_is_3d = true;
  EngineJob::Options options;
  options.op = op;
  const JobOutcome out = Run(engine, batch, std::move(options));
  ASSERT_TRUE(out.status.ok()) << out.status;
  ASSERT_EQ(static_cast<int64_t>(out.c.size()),
            to_destinations ? 0 : members * c_bytes);
  for (int i = 0; i < members; ++i) {
    const char* c =
        to_destinations
            ? reinterpret_cast<const char*>(op.gathered[i].c_destination)
            : out.c.data() + i * c_bytes;
    const std::vector<double> ref = ReferenceGemm(
        spec, ToDoubles(spec.dtype, a[i].data(), spec.a_elements()),
        ToDoubles(spec.dtype, b[i].data(), spec.b_elements()));
    const std::vector<double> got = ToDoubles(spec.dtype, c, spec.c_elements());
    ASSERT_EQ(got.size(), ref.size());
    for (size_t e = 0; e < ref.size(); ++e) {
      ASSERT_EQ(got[e], ref[e]) << "member " << i << " element " << e;
    }
  }
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_GATHERED_CHECKS_H_
