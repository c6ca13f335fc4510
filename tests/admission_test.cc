// The admission core on its own: every refusal path, the lease's releases,
// with an injected clock and a fake engine. No server, no sockets, no sleeps.
#include "server/admission/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <utility>
#include <vector>

#include "tests/fake_engine.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

class FakeClock final : public AdmissionClock {
 public:
  absl::Time Now() const override { return now_; }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
};

MatmulSpec Square(int64_t n) {
  MatmulSpec s;
  s.dtype = DType::kFloat32;
  s.m = s.n = s.k = n;
  return s;
}

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest() : admission_(1000, &handles_, &metrics_, &clock_) {
    admission_.SetEngine(&engine_);
  }

  static HandleLimits Quota() {
    HandleLimits limits;
    limits.max_bytes_per_client = 500;
    limits.max_handles_per_client = 3;
    return limits;
  }

  Operation Op(int64_t held) const {
    Operation op;
    op.held_bytes = held;
    op.client = "client-1";
    return op;
  }

  testing::FakeEngine engine_;
  HandleRegistry handles_{Quota()};
  ServerMetrics metrics_;
  FakeClock clock_;
  Admission admission_;
};

TEST_F(AdmissionTest, LeaseHoldsItsBytesAndOneRequestUntilDestroyed) {
  {
    absl::StatusOr<Lease> lease = admission_.Admit(Op(400));
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->engine(), &engine_);
    EXPECT_EQ(lease->held_bytes(), 400);
    EXPECT_EQ(admission_.inflight_bytes().used(), 400);
    EXPECT_EQ(admission_.inflight_requests(), 1);
  }
  EXPECT_EQ(admission_.inflight_bytes().used(), 0);
  EXPECT_EQ(admission_.inflight_requests(), 0);
}

TEST_F(AdmissionTest, MovedLeaseReleasesOnce) {
  absl::StatusOr<Lease> first = admission_.Admit(Op(300));
  ASSERT_TRUE(first.ok());
  Lease moved = std::move(*first);
  Lease target;
  target = std::move(moved);
  EXPECT_EQ(admission_.inflight_bytes().used(), 300);
  target.Release();
  target.Release();
  EXPECT_EQ(admission_.inflight_bytes().used(), 0);
  EXPECT_EQ(admission_.inflight_requests(), 0);
  // Assigning over a live lease releases the old one.
  absl::StatusOr<Lease> a = admission_.Admit(Op(100));
  absl::StatusOr<Lease> b = admission_.Admit(Op(200));
  ASSERT_TRUE(a.ok() && b.ok());
  *a = std::move(*b);
  EXPECT_EQ(admission_.inflight_bytes().used(), 200);
  EXPECT_EQ(admission_.inflight_requests(), 1);
}

TEST_F(AdmissionTest, ZeroByteWorkStillCountsAsInFlight) {
  absl::StatusOr<Lease> lease = admission_.Admit(Op(0));
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(admission_.inflight_bytes().used(), 1);
  EXPECT_EQ(admission_.inflight_requests(), 1);
}

TEST_F(AdmissionTest, OverTheInflightBudgetIsResourceExhaustedWithARetryHint) {
  absl::StatusOr<Lease> held = admission_.Admit(Op(600));
  ASSERT_TRUE(held.ok());
  absl::StatusOr<Lease> refused = admission_.Admit(Op(500));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("server busy: 600 of 1000 in-flight bytes are in use "
                        "and this request needs 500"));
  std::optional<int64_t> pushback = RetryPushbackMs(refused.status());
  ASSERT_TRUE(pushback.has_value());
  EXPECT_GE(*pushback, 10);
  EXPECT_LE(*pushback, 2000);
  EXPECT_EQ(metrics_.rejections(RejectReason::kOverloaded), 1u);
  // The refusal took nothing; what fits still fits.
  EXPECT_EQ(admission_.inflight_bytes().used(), 600);
  EXPECT_TRUE(admission_.Admit(Op(400)).ok());
}

TEST_F(AdmissionTest, StreamedMultiplyRefusalSaysSo) {
  Operation op = Op(2000);
  op.kind = OperationKind::kStreamMultiply;
  absl::StatusOr<Lease> refused = admission_.Admit(op);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("this streamed multiply needs 2000"));
}

TEST_F(AdmissionTest, OtherRefusalsCarryNoRetryHint) {
  admission_.StartDraining();
  absl::StatusOr<Lease> refused = admission_.Admit(Op(1));
  EXPECT_FALSE(RetryPushbackMs(refused.status()).has_value());
}

TEST_F(AdmissionTest, OverTheStoredQuotaIsResourceExhaustedAndTakesNoBudget) {
  Operation op = Op(100);
  op.stored_bytes = 600;
  absl::StatusOr<Lease> refused = admission_.Admit(op);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("client-1"));
  EXPECT_THAT(refused.status().message(), HasSubstr("500 bytes per client"));
  // The client's own quota, not the server's load.
  EXPECT_EQ(metrics_.rejections(RejectReason::kQuota), 1u);
  EXPECT_EQ(metrics_.rejections(RejectReason::kOverloaded), 0u);
  EXPECT_EQ(admission_.inflight_bytes().used(), 0);
  EXPECT_EQ(admission_.inflight_requests(), 0);
}

TEST_F(AdmissionTest, QuotaIsReturnedWithTheLeaseUnlessTaken) {
  Operation op = Op(10);
  op.stored_bytes = 300;
  {
    absl::StatusOr<Lease> lease = admission_.Admit(op);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(lease->has_reservation());
    // 300 of 500 reserved: another 300 does not fit.
    EXPECT_EQ(admission_.Admit(op).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  // Dropped without storing: the quota is back.
  absl::StatusOr<Lease> lease = admission_.Admit(op);
  ASSERT_TRUE(lease.ok());
  HandleRegistry::Reservation kept = lease->TakeReservation();
  EXPECT_FALSE(lease->has_reservation());
  lease->Release();
  EXPECT_EQ(admission_.inflight_bytes().used(), 0);
  // Taken: the quota stays charged after the lease is gone...
  EXPECT_EQ(admission_.Admit(op).status().code(),
            absl::StatusCode::kResourceExhausted);
  // ...until the reservation itself goes.
  kept = HandleRegistry::Reservation();
  EXPECT_TRUE(admission_.Admit(op).ok());
}

TEST_F(AdmissionTest, QuotaIsPerClient) {
  Operation op = Op(10);
  op.stored_bytes = 400;
  absl::StatusOr<Lease> first = admission_.Admit(op);
  ASSERT_TRUE(first.ok());
  op.client = "client-2";
  EXPECT_TRUE(admission_.Admit(op).ok());
}

TEST_F(AdmissionTest, HandleCountQuota) {
  Operation op = Op(1);
  op.stored_bytes = 1;
  std::vector<Lease> leases;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Lease> lease = admission_.Admit(op);
    ASSERT_TRUE(lease.ok()) << i;
    leases.push_back(std::move(*lease));
  }
  absl::StatusOr<Lease> refused = admission_.Admit(op);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("3 stored tensors"));
}

TEST_F(AdmissionTest, DeadlineThatPassedIsDeadlineExceeded) {
  Operation op = Op(10);
  op.deadline = clock_.Now() - absl::Milliseconds(1);
  absl::StatusOr<Lease> refused = admission_.Admit(op);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the deadline passed before the request was admitted"));
  EXPECT_EQ(metrics_.rejections(RejectReason::kDeadline), 1u);
  EXPECT_EQ(admission_.inflight_requests(), 0);
  // Exactly now is passed too.
  op.deadline = clock_.Now();
  EXPECT_EQ(admission_.Admit(op).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(AdmissionTest, DeadlineNearerThanTheEngineCanFinishIsRefusedAtOnce) {
  engine_.minimum_duration_ = absl::Seconds(2);
  const MatmulSpec spec = Square(64);
  Operation op = Op(10);
  op.spec = &spec;
  op.deadline = clock_.Now() + absl::Seconds(1);
  absl::StatusOr<Lease> refused = admission_.Admit(op);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the deadline cannot be met: 1s left, and this "
                        "request needs at least 2s on an idle fake engine"));
  // With time to spare it is admitted; the clock is the injected one.
  op.deadline = clock_.Now() + absl::Seconds(3);
  EXPECT_TRUE(admission_.Admit(op).ok());
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(admission_.Admit(op).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(metrics_.rejections(RejectReason::kDeadline), 2u);
}

TEST_F(AdmissionTest, NoDeadlineIsNeverRefusedForTime) {
  engine_.minimum_duration_ = absl::Hours(1);
  const MatmulSpec spec = Square(64);
  Operation op = Op(10);
  op.spec = &spec;
  EXPECT_TRUE(admission_.Admit(op).ok());
}

TEST_F(AdmissionTest, DrainingIsUnavailable) {
  admission_.StartDraining();
  EXPECT_TRUE(admission_.draining());
  absl::StatusOr<Lease> refused = admission_.Admit(Op(10));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.status().message(), "the server is shutting down");
  EXPECT_EQ(metrics_.rejections(RejectReason::kDraining), 1u);
}

TEST_F(AdmissionTest, NoEngineYetIsUnavailable) {
  admission_.SetEngine(nullptr);
  absl::StatusOr<Lease> refused = admission_.Admit(Op(10));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.status().message(), "the engine is still starting");
  EXPECT_EQ(metrics_.rejections(RejectReason::kUnavailable), 1u);
}

TEST_F(AdmissionTest, WorkThatNeverFitsADeviceIsTheRequestsFault) {
  engine_.fits_status_ = absl::ResourceExhaustedError("needs 2 TB on a device");
  const MatmulSpec spec = Square(64);
  Operation op = Op(10);
  op.spec = &spec;
  absl::StatusOr<Lease> refused = admission_.Admit(op);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(), "needs 2 TB on a device");
  EXPECT_EQ(metrics_.rejections(RejectReason::kTooLarge), 1u);
  EXPECT_EQ(metrics_.rejections(RejectReason::kOverloaded), 0u);
}

TEST_F(AdmissionTest, WorkTheEngineCannotTakeForOtherReasonsIsInvalid) {
  engine_.fits_status_ = absl::InvalidArgumentError("no such device");
  const MatmulSpec spec = Square(64);
  Operation op = Op(10);
  op.spec = &spec;
  absl::StatusOr<Lease> refused = admission_.Admit(op);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(metrics_.rejections(RejectReason::kInvalid), 1u);
  EXPECT_EQ(metrics_.rejections(RejectReason::kTooLarge), 0u);
}

TEST_F(AdmissionTest, RefusalsComeInTheDocumentedOrder) {
  // Draining wins over everything else that is also wrong.
  engine_.fits_status_ = absl::ResourceExhaustedError("never fits");
  const MatmulSpec spec = Square(64);
  Operation op = Op(5000);
  op.spec = &spec;
  op.deadline = clock_.Now() - absl::Seconds(1);
  admission_.StartDraining();
  EXPECT_EQ(admission_.Admit(op).status().code(),
            absl::StatusCode::kUnavailable);
  Admission fresh(1000, &handles_, &metrics_, &clock_);
  fresh.SetEngine(&engine_);
  EXPECT_EQ(fresh.Admit(op).status().message(), "never fits");
  engine_.fits_status_ = absl::OkStatus();
  EXPECT_EQ(fresh.Admit(op).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  op.deadline = absl::InfiniteFuture();
  EXPECT_EQ(fresh.Admit(op).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(AdmissionTest, RefuseAndRecordFailureCountByReason) {
  absl::Status s = admission_.Refuse(RejectReason::kInvalid,
                                     absl::InvalidArgumentError("bad shape"));
  EXPECT_EQ(s, absl::InvalidArgumentError("bad shape"));
  admission_.RecordFailure(absl::DeadlineExceededError("late"));
  admission_.RecordFailure(absl::InternalError("cuBLAS failed"));  // a fault
  EXPECT_EQ(metrics_.rejections(RejectReason::kInvalid), 1u);
  EXPECT_EQ(metrics_.rejections(RejectReason::kDeadline), 1u);
}

TEST_F(AdmissionTest, ConcurrentAdmitsNeverExceedTheBudgetAndAllRelease) {
  std::atomic<int64_t> peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<Lease> lease = admission_.Admit(Op(300));
        if (!lease.ok()) continue;
        const int64_t used = admission_.inflight_bytes().used();
        int64_t seen = peak.load();
        while (used > seen && !peak.compare_exchange_weak(seen, used)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), 1000);
  EXPECT_GE(peak.load(), 300);
  EXPECT_EQ(admission_.inflight_bytes().used(), 0);
  EXPECT_EQ(admission_.inflight_requests(), 0);
}

}  // namespace
}  // namespace matmul
