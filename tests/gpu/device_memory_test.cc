// DeviceMemoryBudget: reservations up to the budget, refusal or waiting when
// it is spent, return on release, and a waiting job that is abandoned.
// CPU only: no GPU needed.
#include "gpu/cuda/device_memory.h"

#include <atomic>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gpu/engine.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;

// A job that only answers the budget's questions.
class BudgetJob final : public MatmulJob {
 public:
  explicit BudgetJob(bool may_wait)
      : MatmulJob(JobDescription{MatmulSpec{}, MultiplyOp{}, -1, may_wait}) {}
  absl::Status WriteOperands(absl::Span<std::byte>,
                             absl::Span<std::byte>) override {
    return absl::OkStatus();
  }
  void Done(absl::StatusOr<JobResult>) override {}
  absl::Status Abandoned() const override {
    return abandoned_.load() ? absl::CancelledError("client went away")
                             : absl::OkStatus();
  }
  void Abandon() { abandoned_.store(true); }

 private:
  std::atomic<bool> abandoned_{false};
};

TEST(DeviceMemoryBudgetTest, ReservesUpToTheBudgetAndReturnsOnRelease) {
  DeviceMemoryBudget budget(0, 1000);
  BudgetJob job(/*may_wait=*/false);
  EXPECT_EQ(budget.budget(), 1000);
  ASSERT_TRUE(budget.Reserve(600, job).ok());
  ASSERT_TRUE(budget.Reserve(400, job).ok());
  EXPECT_EQ(budget.reserved(), 1000);
  EXPECT_FALSE(budget.TryReserve(1));
  budget.Release(400);
  EXPECT_EQ(budget.reserved(), 600);
  EXPECT_TRUE(budget.TryReserve(400));
  budget.Release(1000);
  EXPECT_EQ(budget.reserved(), 0);
}

TEST(DeviceMemoryBudgetTest, SpentBudgetRefusesAJobThatMayNotWait) {
  DeviceMemoryBudget budget(3, 1000);
  BudgetJob job(/*may_wait=*/false);
  ASSERT_TRUE(budget.Reserve(900, job).ok());
  const absl::Status refused = budget.Reserve(200, job);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("GPU 3 has 100 of 1000 bytes"));
  EXPECT_EQ(budget.reserved(), 900);  // a refusal reserves nothing
}

TEST(DeviceMemoryBudgetTest, WaitingJobGetsTheMemoryWhenItIsReleased) {
  DeviceMemoryBudget budget(0, 1000);
  BudgetJob first(/*may_wait=*/false);
  ASSERT_TRUE(budget.Reserve(1000, first).ok());
  BudgetJob waiter(/*may_wait=*/true);
  absl::Notification reserved;
  absl::Status status;
  std::thread t([&] {
    status = budget.Reserve(500, waiter);
    reserved.Notify();
  });
  EXPECT_FALSE(
      reserved.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  budget.Release(1000);
  ASSERT_TRUE(reserved.WaitForNotificationWithTimeout(absl::Seconds(5)));
  t.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(budget.reserved(), 500);
}

TEST(DeviceMemoryBudgetTest, WaitingJobThatIsAbandonedGivesUpWithItsStatus) {
  DeviceMemoryBudget budget(0, 1000);
  BudgetJob first(/*may_wait=*/false);
  ASSERT_TRUE(budget.Reserve(1000, first).ok());
  BudgetJob waiter(/*may_wait=*/true);
  absl::Notification returned;
  absl::Status status;
  std::thread t([&] {
    status = budget.Reserve(500, waiter);
    returned.Notify();
  });
  absl::SleepFor(absl::Milliseconds(20));
  waiter.Abandon();
  // The budget looks again at least every 50 ms.
  ASSERT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(5)));
  t.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(budget.reserved(), 1000);
}

}  // namespace
}  // namespace matmul
