// The layout planner (gpu/layout_planner.h), the one place both engines learn
// where a job's operands and result live: every kind of job, staged and
// resident operands, kept and returned results, transfers at offsets and out
// of bounds, devices, batch broadcast and transposes.
#include "gpu/layout_planner.h"

#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine_job.h"

namespace matmul {
namespace {

using ::matmul::testing::DownloadSpec;
using ::matmul::testing::UploadSpec;
using ::testing::HasSubstr;

// A stored tensor that only describes itself (no memory behind it).
class FakeResident final : public ResidentTensor {
 public:
  FakeResident(int device, DType dtype, int64_t batch, int64_t rows,
               int64_t cols)
      : ResidentTensor(device, dtype, batch, rows, cols, nullptr) {}
};

std::shared_ptr<ResidentTensor> Resident(int device, int64_t batch,
                                         int64_t rows, int64_t cols) {
  return std::make_shared<FakeResident>(device, DType::kFloat32, batch, rows,
                                        cols);
}

// float32 [m, k] . [k, n]: A is 4mk bytes, B 4kn, C 4mn.
MatmulSpec Product(int64_t m, int64_t k, int64_t n) {
  MatmulSpec s;
  s.m = m;
  s.k = k;
  s.n = n;
  return s;
}

absl::StatusOr<LayoutPlan> Plan(const MatmulSpec& spec, JobDescription job) {
  job.spec = spec;
  return PlanLayout(job);
}

MultiplyOp Multiply(std::shared_ptr<ResidentTensor> a,
                    std::shared_ptr<ResidentTensor> b,
                    bool keep_result = false) {
  MultiplyOp op;
  op.resident_a = std::move(a);
  op.resident_b = std::move(b);
  op.keep_result = keep_result;
  return op;
}

TEST(LayoutPlannerTest, StagedOperandsAndReturnedProduct) {
  // A 24, B 48, C 32 bytes.
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->gemm);
  EXPECT_FALSE(p->upload);
  EXPECT_FALSE(p->download);
  EXPECT_FALSE(p->allocate);
  EXPECT_TRUE(p->stage_a);
  EXPECT_TRUE(p->stage_b);
  EXPECT_FALSE(p->prestaged);
  EXPECT_FALSE(p->keep);
  EXPECT_TRUE(p->return_c);
  EXPECT_TRUE(p->transient_a);
  EXPECT_TRUE(p->transient_b);
  EXPECT_TRUE(p->transient_c);
  EXPECT_EQ(p->staged_a_bytes, 24);
  EXPECT_EQ(p->staged_b_bytes, 48);
  EXPECT_EQ(p->returned_c_bytes, 32);
  EXPECT_EQ(p->staging_bytes, 24 + 48 + 32);
  EXPECT_EQ(p->b_staging_offset(), 24);
  EXPECT_EQ(p->c_staging_offset(), 24 + 48);
  EXPECT_EQ(p->moved_bytes, 24 + 48 + 32);
  EXPECT_EQ(p->kept_tensor_bytes, 0);
  EXPECT_EQ(p->byte_offset, 0);
  EXPECT_EQ(p->required_device, -1);
}

TEST(LayoutPlannerTest, ResidentAIsNeitherStagedNorMovedAndPicksTheDevice) {
  JobDescription o;
  o.op = Multiply(Resident(2, 1, 2, 3), nullptr);
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->stage_a);
  EXPECT_FALSE(p->transient_a);
  EXPECT_TRUE(p->stage_b);
  EXPECT_EQ(p->staged_a_bytes, 0);
  EXPECT_EQ(p->b_staging_offset(), 0);
  EXPECT_EQ(p->c_staging_offset(), 48);
  EXPECT_EQ(p->staging_bytes, 48 + 32);
  EXPECT_EQ(p->moved_bytes, 48 + 32);
  EXPECT_EQ(p->required_device, 2);
  EXPECT_EQ(p->byte_offset, 0);
}

TEST(LayoutPlannerTest, ResidentBIsNeitherStagedNorMoved) {
  JobDescription o;
  o.op = Multiply(nullptr, Resident(1, 1, 3, 4));
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->stage_a);
  EXPECT_FALSE(p->stage_b);
  EXPECT_FALSE(p->transient_b);
  EXPECT_EQ(p->staged_b_bytes, 0);
  EXPECT_EQ(p->c_staging_offset(), 24);
  EXPECT_EQ(p->staging_bytes, 24 + 32);
  EXPECT_EQ(p->required_device, 1);
}

TEST(LayoutPlannerTest, BothResidentOnOneDeviceStageNothing) {
  JobDescription o;
  o.op = Multiply(Resident(1, 1, 2, 3), Resident(1, 1, 3, 4));
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->stage_a);
  EXPECT_FALSE(p->stage_b);
  EXPECT_EQ(p->staging_bytes, 32);  // the returned C only
  EXPECT_EQ(p->c_staging_offset(), 0);
  EXPECT_EQ(p->moved_bytes, 32);
  EXPECT_EQ(p->required_device, 1);
}

TEST(LayoutPlannerTest, KeptProductIsANewResidentTensorNotReturned) {
  JobDescription o;
  o.op = Multiply(nullptr, nullptr, /*keep_result=*/true);
  MatmulSpec spec = Product(2, 3, 4);
  spec.batch = spec.a_batch = spec.b_batch = 5;
  absl::StatusOr<LayoutPlan> p = Plan(spec, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->keep);
  EXPECT_FALSE(p->keeps_a);
  EXPECT_FALSE(p->return_c);
  EXPECT_FALSE(p->transient_c);
  EXPECT_EQ(p->kept.batch, 5);
  EXPECT_EQ(p->kept.rows, 2);
  EXPECT_EQ(p->kept.cols, 4);
  EXPECT_EQ(p->kept_tensor_bytes, 5 * 32);
  EXPECT_EQ(p->returned_c_bytes, 0);
  EXPECT_EQ(p->staging_bytes, 5 * (24 + 48));
  EXPECT_EQ(p->moved_bytes, 5 * (24 + 48));
}

TEST(LayoutPlannerTest, PrestagedOperandsAreMovedButNotStaged) {
  JobDescription o;
  MultiplyOp prestaged;
  prestaged.prestaged = PrestagedOperands{};
  o.op = prestaged;
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->prestaged);
  EXPECT_TRUE(p->stage_a);
  EXPECT_TRUE(p->stage_b);
  EXPECT_EQ(p->staged_a_bytes, 0);
  EXPECT_EQ(p->staged_b_bytes, 0);
  EXPECT_EQ(p->c_staging_offset(), 0);
  EXPECT_EQ(p->staging_bytes, 32);
  EXPECT_EQ(p->moved_bytes, 24 + 48 + 32);
}

// A gathered batch (MultiplyOp::gathered) stages no operands, as a
// prestaged job, and returns every member's C in staging.
TEST(LayoutPlannerTest, GatheredMembersAreMovedButNotStaged) {
  const std::byte bytes[2] = {};
  MatmulSpec spec = Product(2, 3, 4);
  spec.batch = spec.a_batch = spec.b_batch = 3;
  spec.c_is_3d = true;
  JobDescription o;
  MultiplyOp gathered;
  gathered.gathered.assign(
      3, GatheredMember{PrestagedOperands{&bytes[0], &bytes[1]}});
  o.op = gathered;
  absl::StatusOr<LayoutPlan> p = Plan(spec, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->prestaged);
  EXPECT_EQ(p->gathered, 3);
  EXPECT_EQ(p->staged_a_bytes + p->staged_b_bytes, 0);
  EXPECT_EQ(p->staging_bytes, 3 * 32);
  EXPECT_EQ(p->moved_bytes, 3 * (24 + 48 + 32));
  EXPECT_FALSE(p->c_to_destination);
  // Every member's product into its own memory: staging holds nothing.
  std::byte c[32];
  for (GatheredMember& member : gathered.gathered) member.c_destination = c;
  o.op = gathered;
  p = Plan(spec, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->c_to_destination);
  EXPECT_EQ(p->staging_bytes, 0);
  EXPECT_EQ(p->returned_c_bytes, 0);
  EXPECT_EQ(p->c_out_bytes, 3 * 32);
}

TEST(LayoutPlannerTest, AGatheredBatchOfTheWrongSizeOrKindIsInvalid) {
  const std::byte bytes[2] = {};
  MatmulSpec spec = Product(2, 3, 4);
  spec.batch = spec.a_batch = spec.b_batch = 3;
  spec.c_is_3d = true;
  auto plan = [&](MatmulSpec s, MultiplyOp op) {
    JobDescription o;
    o.op = std::move(op);
    return Plan(s, o).status();
  };
  MultiplyOp two;
  two.gathered.assign(2,
                      GatheredMember{PrestagedOperands{&bytes[0], &bytes[1]}});
  EXPECT_EQ(plan(spec, two).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan(spec, two).message()),
              HasSubstr("gathered multiply of 2 members"));
  MultiplyOp three;
  three.gathered.assign(
      3, GatheredMember{PrestagedOperands{&bytes[0], &bytes[1]}});
  MatmulSpec broadcast = spec;
  broadcast.b_batch = 1;
  EXPECT_EQ(plan(broadcast, three).code(), absl::StatusCode::kInvalidArgument);
  MultiplyOp kept = three;
  kept.keep_result = true;
  EXPECT_EQ(plan(spec, kept).code(), absl::StatusCode::kInvalidArgument);
  MultiplyOp also_prestaged = three;
  also_prestaged.prestaged = PrestagedOperands{&bytes[0], &bytes[1]};
  EXPECT_EQ(plan(spec, also_prestaged).code(),
            absl::StatusCode::kInvalidArgument);
  MultiplyOp missing = three;
  missing.gathered[1].operands.b = nullptr;
  EXPECT_EQ(plan(spec, missing).code(), absl::StatusCode::kInvalidArgument);
  // Some members with a product destination and some without.
  std::byte c[32];
  MultiplyOp mixed = three;
  mixed.gathered[2].c_destination = c;
  EXPECT_EQ(plan(spec, mixed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan(spec, three).code(), absl::StatusCode::kOk);
}

TEST(LayoutPlannerTest, ProductIntoADestinationIsMovedButNotStaged) {
  JobDescription o;
  MultiplyOp op;
  op.prestaged = PrestagedOperands{};
  std::byte destination[32];
  op.c_destination = destination;
  o.op = op;
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->return_c);
  EXPECT_TRUE(p->c_to_destination);
  EXPECT_EQ(p->returned_c_bytes, 0);
  EXPECT_EQ(p->c_out_bytes, 32);
  EXPECT_EQ(p->staging_bytes, 0);
  EXPECT_EQ(p->moved_bytes, 24 + 48 + 32);
}

TEST(LayoutPlannerTest, AProductInPlaceIsNeitherReturnedNorAllocated) {
  // A client's GPU memory (RegisterCudaMemory): A and C in it, B staged.
  MultiplyOp op = Multiply(Resident(1, 1, 2, 3), nullptr);
  op.c_target = Resident(1, 1, 2, 4);
  JobDescription job;
  job.op = std::move(op);
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), std::move(job));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->c_in_place);
  EXPECT_FALSE(p->return_c);
  EXPECT_FALSE(p->c_to_destination);
  EXPECT_FALSE(p->keep);
  EXPECT_FALSE(p->transient_c);
  EXPECT_EQ(p->returned_c_bytes, 0);
  EXPECT_EQ(p->c_out_bytes, 0);
  EXPECT_EQ(p->staging_bytes, 48);  // B only
  EXPECT_EQ(p->moved_bytes, 48);
  EXPECT_EQ(p->required_device, 1);
}

TEST(LayoutPlannerTest, AProductTargetTooSmallOrBesideAnotherIsInvalid) {
  MultiplyOp small;
  small.c_target = Resident(0, 1, 1, 7);  // 28 bytes, C is 32
  JobDescription job;
  job.op = small;
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), job);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("do not fit"));
  MultiplyOp kept;
  kept.c_target = Resident(0, 1, 2, 4);
  kept.keep_result = true;
  job.op = kept;
  p = Plan(Product(2, 3, 4), job);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  // A target on another GPU than a resident operand.
  MultiplyOp apart = Multiply(Resident(0, 1, 2, 3), nullptr);
  apart.c_target = Resident(1, 1, 2, 4);
  job.op = apart;
  p = Plan(Product(2, 3, 4), job);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("different GPUs"));
}

TEST(LayoutPlannerTest, UploadOfANewTensorKeepsA) {
  JobDescription o;
  o.op = UploadOp{nullptr, 64};  // the offset is ignored without a target
  absl::StatusOr<LayoutPlan> p = Plan(UploadSpec(DType::kFloat32, 3, 4, 8), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->gemm);
  EXPECT_TRUE(p->upload);
  EXPECT_TRUE(p->stage_a);
  EXPECT_FALSE(p->stage_b);
  EXPECT_FALSE(p->transient_a);  // A goes straight into the kept tensor
  EXPECT_FALSE(p->transient_c);
  EXPECT_TRUE(p->keep);
  EXPECT_TRUE(p->keeps_a);
  EXPECT_FALSE(p->return_c);
  EXPECT_EQ(p->kept.batch, 3);
  EXPECT_EQ(p->kept.rows, 4);
  EXPECT_EQ(p->kept.cols, 8);
  EXPECT_EQ(p->kept_tensor_bytes, 3 * 128);
  EXPECT_EQ(p->staging_bytes, 3 * 128);
  EXPECT_EQ(p->moved_bytes, 3 * 128);
  EXPECT_EQ(p->byte_offset, 0);
}

TEST(LayoutPlannerTest, UploadIntoATargetAtAnOffset) {
  JobDescription o;
  o.op = UploadOp{Resident(3, 1, 8, 8), 128};  // 256 bytes
  absl::StatusOr<LayoutPlan> p = Plan(UploadSpec(DType::kFloat32, 1, 4, 8), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->stage_a);
  EXPECT_FALSE(p->keep);
  EXPECT_FALSE(p->return_c);
  EXPECT_EQ(p->kept_tensor_bytes, 0);
  EXPECT_EQ(p->staging_bytes, 128);
  EXPECT_EQ(p->byte_offset, 128);
  EXPECT_EQ(p->required_device, 3);
}

TEST(LayoutPlannerTest, UploadOutsideItsTargetIsInvalid) {
  JobDescription o;
  // 256 bytes; 128 bytes from 192 run past them.
  o.op = UploadOp{Resident(0, 1, 8, 8), 192};
  absl::StatusOr<LayoutPlan> p = Plan(UploadSpec(DType::kFloat32, 1, 4, 8), o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "upload of 128 bytes at offset 192 runs outside its 256-byte "
            "tensor");
  std::get<UploadOp>(o.op).byte_offset = -1;
  EXPECT_EQ(Plan(UploadSpec(DType::kFloat32, 1, 4, 8), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::get<UploadOp>(o.op).byte_offset = 128;  // exactly to the end
  EXPECT_TRUE(Plan(UploadSpec(DType::kFloat32, 1, 4, 8), o).ok());
}

TEST(LayoutPlannerTest, DownloadAtAnOffsetReturnsC) {
  JobDescription o;
  o.op = DownloadOp{Resident(1, 2, 4, 8), 128};  // 256 bytes
  absl::StatusOr<LayoutPlan> p =
      Plan(DownloadSpec(DType::kFloat32, 1, 4, 8), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->gemm);
  EXPECT_TRUE(p->download);
  EXPECT_FALSE(p->stage_a);
  EXPECT_FALSE(p->stage_b);
  EXPECT_FALSE(p->keep);
  EXPECT_TRUE(p->return_c);
  EXPECT_FALSE(p->transient_c);  // read in place
  EXPECT_EQ(p->returned_c_bytes, 128);
  EXPECT_EQ(p->c_staging_offset(), 0);
  EXPECT_EQ(p->staging_bytes, 128);
  EXPECT_EQ(p->moved_bytes, 128);
  EXPECT_EQ(p->byte_offset, 128);
  EXPECT_EQ(p->required_device, 1);
}

TEST(LayoutPlannerTest, DownloadOutsideItsSourceIsInvalid) {
  JobDescription o;
  o.op = DownloadOp{Resident(0, 1, 4, 8), 64};  // 128 bytes
  absl::StatusOr<LayoutPlan> p =
      Plan(DownloadSpec(DType::kFloat32, 1, 4, 8), o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "download of 128 bytes at offset 64 runs outside its 128-byte "
            "tensor");
  // No source at all: a zero-byte tensor.
  o.op = DownloadOp{nullptr, 0};
  EXPECT_THAT(
      Plan(DownloadSpec(DType::kFloat32, 1, 4, 8), o).status().message(),
      HasSubstr("outside its 0-byte tensor"));
}

TEST(LayoutPlannerTest, AllocateKeepsAAndMovesNothing) {
  JobDescription o;
  o.op = AllocateOp{};
  o.device = 1;
  absl::StatusOr<LayoutPlan> p = Plan(UploadSpec(DType::kFloat32, 2, 4, 8), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->allocate);
  EXPECT_FALSE(p->gemm);
  EXPECT_FALSE(p->stage_a);
  EXPECT_FALSE(p->return_c);
  EXPECT_TRUE(p->keep);
  EXPECT_TRUE(p->keeps_a);
  EXPECT_EQ(p->kept.batch, 2);
  EXPECT_EQ(p->kept_tensor_bytes, 256);
  EXPECT_EQ(p->staging_bytes, 0);
  EXPECT_EQ(p->moved_bytes, 0);
  EXPECT_EQ(p->required_device, 1);
}

TEST(LayoutPlannerTest, OperandsOnDifferentDevicesAreInvalid) {
  JobDescription o;
  o.op = Multiply(Resident(0, 1, 2, 3), Resident(1, 1, 3, 4));
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "the operands live on different GPUs (0 and 1); download one and "
            "upload it to the other");
}

TEST(LayoutPlannerTest, AskedDeviceMustMatchResidentOperandsAndTarget) {
  JobDescription o;
  o.device = 1;
  o.op = Multiply(nullptr, Resident(0, 1, 3, 4));
  EXPECT_EQ(Plan(Product(2, 3, 4), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.device = 0;
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->required_device, 0);

  JobDescription upload;
  upload.op = UploadOp{Resident(3, 1, 4, 8), 0};
  upload.device = 2;
  EXPECT_EQ(Plan(UploadSpec(DType::kFloat32, 1, 4, 8), upload).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LayoutPlannerTest, HostTensorsNeedNoDevice) {
  // The host engine's tensors are on device -1, which names no device.
  JobDescription o;
  o.op = Multiply(Resident(-1, 1, 2, 3), Resident(-1, 1, 3, 4));
  absl::StatusOr<LayoutPlan> p = Plan(Product(2, 3, 4), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->required_device, -1);
}

TEST(LayoutPlannerTest, ResidentOperandsAndPrestagingComeFromTheOperation) {
  const std::shared_ptr<ResidentTensor> a = Resident(0, 1, 2, 3);
  const std::shared_ptr<ResidentTensor> b = Resident(0, 1, 3, 4);
  JobDescription job;
  job.op = Multiply(a, b);
  ResidentOperands r = ResidentOperandsOf(job);
  EXPECT_EQ(r.a, a);
  EXPECT_EQ(r.b, b);
  EXPECT_EQ(r.target, nullptr);
  EXPECT_FALSE(PrestagedOf(job).has_value());

  job.op = UploadOp{a, 0};
  r = ResidentOperandsOf(job);
  EXPECT_EQ(r.a, nullptr);
  EXPECT_EQ(r.target, a);

  job.op = DownloadOp{b, 0};
  r = ResidentOperandsOf(job);
  EXPECT_EQ(r.a, b);  // the source is read as A
  EXPECT_EQ(r.b, nullptr);

  job.op = AllocateOp{};
  r = ResidentOperandsOf(job);
  EXPECT_EQ(r.a, nullptr);
  EXPECT_EQ(r.b, nullptr);
  EXPECT_EQ(r.target, nullptr);

  std::byte bytes[2];
  MultiplyOp prestaged;
  prestaged.prestaged = PrestagedOperands{&bytes[0], &bytes[1]};
  job.op = prestaged;
  ASSERT_TRUE(PrestagedOf(job).has_value());
  EXPECT_EQ(PrestagedOf(job)->b, &bytes[1]);
}

TEST(LayoutPlannerTest, StridesOfAPlainProduct) {
  const GemmStrides s = StridesOf(Product(2, 3, 4));
  EXPECT_EQ(s.lda, 3);  // A is [m, k]
  EXPECT_EQ(s.ldb, 4);  // B is [k, n]
  EXPECT_EQ(s.ldc, 4);  // C is [m, n]
  EXPECT_EQ(s.stride_a, 0);
  EXPECT_EQ(s.stride_b, 0);
  EXPECT_EQ(s.stride_c, 8);
}

TEST(LayoutPlannerTest, TransposesChangeTheLeadingDimensions) {
  MatmulSpec spec = Product(2, 3, 4);
  spec.transpose_a = true;  // A stored [k, m]
  GemmStrides s = StridesOf(spec);
  EXPECT_EQ(s.lda, 2);
  EXPECT_EQ(s.ldb, 4);
  spec.transpose_a = false;
  spec.transpose_b = true;  // B stored [n, k]
  s = StridesOf(spec);
  EXPECT_EQ(s.lda, 3);
  EXPECT_EQ(s.ldb, 3);
  EXPECT_EQ(s.ldc, 4);
  spec.transpose_a = true;
  s = StridesOf(spec);
  EXPECT_EQ(s.lda, 2);
  EXPECT_EQ(s.ldb, 3);
}

TEST(LayoutPlannerTest, BroadcastOperandsHaveStrideZero) {
  MatmulSpec spec = Product(2, 3, 4);
  spec.batch = 5;
  spec.a_batch = 1;  // broadcast A
  spec.b_batch = 5;
  GemmStrides s = StridesOf(spec);
  EXPECT_EQ(s.stride_a, 0);
  EXPECT_EQ(s.stride_b, 12);
  EXPECT_EQ(s.stride_c, 8);
  spec.a_batch = 5;
  spec.b_batch = 1;  // broadcast B
  s = StridesOf(spec);
  EXPECT_EQ(s.stride_a, 6);
  EXPECT_EQ(s.stride_b, 0);

  // The plan carries the strides of a multiply, and stages A and B as
  // stored (one copy of a broadcast operand).
  absl::StatusOr<LayoutPlan> p = Plan(spec, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->strides.stride_a, 6);
  EXPECT_EQ(p->strides.stride_b, 0);
  EXPECT_EQ(p->staged_a_bytes, 5 * 24);
  EXPECT_EQ(p->staged_b_bytes, 48);
  EXPECT_EQ(p->returned_c_bytes, 5 * 32);
}

}  // namespace
}  // namespace matmul
