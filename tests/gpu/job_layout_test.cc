// JobLayout: where each kind of job's operands and result live on the CUDA
// engine, and the device memory, staging and bus bytes that follow. Pins
// today's layout (CPU only, no GPU needed), so that the one layout planner
// the engines will share can be checked against it.
#include "gpu/cuda/job_layout.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"

namespace matmul {
namespace {

using ::matmul::testing::DownloadSpec;
using ::matmul::testing::UploadSpec;

// A stored tensor that only describes itself (no memory behind it).
class FakeResident final : public ResidentTensor {
 public:
  FakeResident(int device, DType dtype, int64_t batch, int64_t rows,
               int64_t cols)
      : ResidentTensor(device, dtype, batch, rows, cols, nullptr) {}
};

MatmulSpec Product(int64_t m, int64_t k, int64_t n) {
  MatmulSpec s;
  s.m = m;
  s.k = k;
  s.n = n;
  return s;
}

absl::StatusOr<JobLayout> Layout(const MatmulSpec& spec, JobDescription job) {
  job.spec = spec;
  return LayoutOf(job);
}

TEST(JobLayoutTest, AlignmentAndDeviceBytes) {
  EXPECT_EQ(AlignUp(0, 256), 0);
  EXPECT_EQ(AlignUp(1, 256), 256);
  EXPECT_EQ(AlignUp(256, 256), 256);
  // float32 2x3 . 3x4: A 24, B 48, C 32 bytes, each its own aligned block.
  EXPECT_EQ(DeviceBytes(Product(2, 3, 4)), 3 * 256);
}

TEST(JobLayoutTest, PlainMultiplyStagesBothAndReturnsC) {
  absl::StatusOr<JobLayout> l = Layout(Product(2, 3, 4), {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->gemm);
  EXPECT_TRUE(l->stage_a);
  EXPECT_TRUE(l->stage_b);
  EXPECT_FALSE(l->keep);
  EXPECT_TRUE(l->return_c);
  EXPECT_EQ(l->transient_bytes, 3 * 256);
  EXPECT_EQ(l->kept_bytes, 0);
  EXPECT_EQ(l->staging_bytes, 24 + 48 + 32);
  EXPECT_EQ(l->moved_bytes, 24 + 48 + 32);
  EXPECT_EQ(l->required_device, -1);
}

// Staging is [A][B][C] and device memory is carved A, B, C at
// kDeviceAlignment: A and B are back to back in both, and go up in one copy,
// exactly when A's bytes are a multiple of the alignment.
TEST(JobLayoutTest, OperandsGoUpInOneCopyWhenAFillsItsAlignedBlock) {
  auto contiguous = [](const MatmulSpec& spec) {
    absl::StatusOr<JobLayout> l = Layout(spec, {});
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return false;
    // Addresses only; nothing is read or written through them.
    std::byte* staging = reinterpret_cast<std::byte*>(uintptr_t{1} << 20);
    std::byte* device = reinterpret_cast<std::byte*>(uintptr_t{1} << 30);
    return OperandsContiguous(staging, staging + l->b_staging_offset(), device,
                              device + AlignUp(l->a_bytes, kDeviceAlignment),
                              l->a_bytes);
  };
  EXPECT_TRUE(contiguous(Product(64, 64, 64)));     // A: 16 KiB
  EXPECT_TRUE(contiguous(Product(256, 256, 256)));  // A: 256 KiB
  EXPECT_TRUE(contiguous(Product(8, 8, 3)));        // A: 8x8 floats, 256 B
  EXPECT_FALSE(contiguous(Product(2, 3, 4)));       // A: 24 B
  EXPECT_FALSE(contiguous(Product(100, 3, 100)));   // A: 1,200 B
}

TEST(JobLayoutTest, KeptProductStaysOnTheDeviceAndIsNotReturned) {
  JobDescription o;
  o.op = MultiplyOp{nullptr, nullptr, /*keep_result=*/true, {}};
  absl::StatusOr<JobLayout> l = Layout(Product(2, 3, 4), o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->keep);
  EXPECT_FALSE(l->return_c);
  EXPECT_EQ(l->transient_bytes, 2 * 256);  // A and B only
  EXPECT_EQ(l->kept_bytes, 256);           // C
  EXPECT_EQ(l->staging_bytes, 24 + 48);
  EXPECT_EQ(l->moved_bytes, 24 + 48);
}

TEST(JobLayoutTest, ResidentOperandIsNotStagedAndPicksTheDevice) {
  JobDescription o;
  o.op = MultiplyOp{std::make_shared<FakeResident>(2, DType::kFloat32, 1, 2, 3),
                    nullptr,
                    false,
                    {}};
  absl::StatusOr<JobLayout> l = Layout(Product(2, 3, 4), o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->stage_a);
  EXPECT_TRUE(l->stage_b);
  EXPECT_EQ(l->transient_bytes, 2 * 256);  // B and C
  EXPECT_EQ(l->staging_bytes, 48 + 32);
  EXPECT_EQ(l->moved_bytes, 48 + 32);
  EXPECT_EQ(l->required_device, 2);
}

TEST(JobLayoutTest, OperandsOnDifferentGpusAreInvalid) {
  JobDescription o;
  o.op = MultiplyOp{std::make_shared<FakeResident>(0, DType::kFloat32, 1, 2, 3),
                    std::make_shared<FakeResident>(1, DType::kFloat32, 1, 3, 4),
                    false,
                    {}};
  absl::StatusOr<JobLayout> l = Layout(Product(2, 3, 4), o);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(l.status().message(), ::testing::HasSubstr("different GPUs"));
}

TEST(JobLayoutTest, AskedDeviceMustMatchTheResidentOperand) {
  JobDescription o;
  o.device = 1;
  o.op = MultiplyOp{nullptr,
                    std::make_shared<FakeResident>(0, DType::kFloat32, 1, 3, 4),
                    false,
                    {}};
  EXPECT_EQ(Layout(Product(2, 3, 4), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.device = 0;
  absl::StatusOr<JobLayout> l = Layout(Product(2, 3, 4), o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->required_device, 0);
}

TEST(JobLayoutTest, UploadOfANewTensorKeepsIt) {
  JobDescription o;
  o.op = UploadOp{};
  absl::StatusOr<JobLayout> l = Layout(UploadSpec(DType::kFloat32, 1, 4, 8), o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->stage_a);
  EXPECT_FALSE(l->stage_b);
  EXPECT_TRUE(l->keep);
  EXPECT_FALSE(l->return_c);
  EXPECT_EQ(l->transient_bytes, 0);
  EXPECT_EQ(l->kept_bytes, 256);  // 128 bytes, aligned
  EXPECT_EQ(l->staging_bytes, 128);
  EXPECT_EQ(l->moved_bytes, 128);
}

TEST(JobLayoutTest, PieceUploadIntoATargetKeepsNothingNew) {
  JobDescription o;
  o.op = UploadOp{
      std::make_shared<FakeResident>(3, DType::kFloat32, 1, 8, 8),  // 256 B
      128};
  absl::StatusOr<JobLayout> l = Layout(UploadSpec(DType::kFloat32, 1, 4, 8), o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->keep);
  EXPECT_EQ(l->kept_bytes, 0);
  EXPECT_EQ(l->transient_bytes, 0);
  EXPECT_EQ(l->staging_bytes, 128);
  EXPECT_EQ(l->byte_offset, 128);
  EXPECT_EQ(l->required_device, 3);
  std::get<UploadOp>(o.op).byte_offset = 192;  // 128 from 192 runs past 256
  EXPECT_EQ(Layout(UploadSpec(DType::kFloat32, 1, 4, 8), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(JobLayoutTest, DownloadReturnsFromTheResidentSource) {
  JobDescription o;
  o.op = DownloadOp{std::make_shared<FakeResident>(1, DType::kFloat32, 1, 4, 8),
                    0};
  absl::StatusOr<JobLayout> l =
      Layout(DownloadSpec(DType::kFloat32, 1, 4, 8), o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->stage_a);
  EXPECT_FALSE(l->stage_b);
  EXPECT_FALSE(l->keep);
  EXPECT_TRUE(l->return_c);
  EXPECT_EQ(l->transient_bytes, 0);
  EXPECT_EQ(l->kept_bytes, 0);
  EXPECT_EQ(l->staging_bytes, 128);
  EXPECT_EQ(l->moved_bytes, 128);
  EXPECT_EQ(l->required_device, 1);
}

TEST(JobLayoutTest, AllocateKeepsDeviceMemoryAndMovesNothing) {
  JobDescription o;
  o.op = AllocateOp{};
  absl::StatusOr<JobLayout> l = Layout(UploadSpec(DType::kFloat32, 2, 4, 8), o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->stage_a);
  EXPECT_TRUE(l->keep);
  EXPECT_EQ(l->kept_bytes, 256);  // 2 x 128 bytes
  EXPECT_EQ(l->transient_bytes, 0);
  EXPECT_EQ(l->staging_bytes, 0);
  EXPECT_EQ(l->moved_bytes, 0);
}

TEST(JobLayoutTest, EstimateGrowsWithWorkAndTensorCoresAreFaster) {
  MatmulSpec strict = Product(1024, 1024, 1024);
  absl::StatusOr<JobLayout> l = Layout(strict, {});
  ASSERT_TRUE(l.ok()) << l.status();
  MatmulSpec tf32 = strict;
  tf32.compute = ComputeMode::kTf32;
  EXPECT_LT(EstimatedSeconds(tf32, *l), EstimatedSeconds(strict, *l));
  absl::StatusOr<JobLayout> small = Layout(Product(64, 64, 64), {});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_LT(EstimatedSeconds(Product(64, 64, 64), *small),
            EstimatedSeconds(strict, *l));
}

}  // namespace
}  // namespace matmul
