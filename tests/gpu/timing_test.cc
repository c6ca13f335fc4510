// Timing: stage durations from event times, busy/copy/compute unions over
// streams (CPU only), and, on a GPU, the device clock and the event pool.
#include "gpu/cuda/timing.h"

#include <cuda_runtime.h>

#include "absl/time/clock.h"
#include "gpu/cuda/cuda_resources.h"
#include "gpu/cuda/device_registry.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

TEST(TimingTest, StagesComeFromTheFourEvents) {
  StageTimings t;
  SetDeviceStages({10.0, 12.0, 17.0, 18.5}, t);
  EXPECT_DOUBLE_EQ(t.h2d, 2e-3);
  EXPECT_DOUBLE_EQ(t.compute, 5e-3);
  EXPECT_DOUBLE_EQ(t.d2h, 1.5e-3);
}

TEST(BusyAccountingTest, OverlappingStreamsCountOnceAndCopiesOverlapCompute) {
  BusyAccounting busy;
  // Stream 0: copy [0, 2), compute [2, 6), copy [6, 7).
  busy.Add({0.0, 2.0, 6.0, 7.0});
  // Stream 1: copy [2, 4) while stream 0 computes, compute [4, 6), copy
  // [6, 9).
  busy.Add({2.0, 4.0, 6.0, 9.0});
  const BusyAccounting::Totals t = busy.totals();
  EXPECT_NEAR(t.busy_seconds, 9e-3, 1e-12);  // [0, 9)
  // Copies: [0, 4) and [6, 9) -> 7 ms; compute: [2, 6), stream 1's [4, 6)
  // inside it -> 4 ms.
  EXPECT_NEAR(t.copy_seconds, 7e-3, 1e-12);
  EXPECT_NEAR(t.compute_seconds, 4e-3, 1e-12);
  // Stream 1's copy [2, 4) ran under stream 0's compute.
  EXPECT_NEAR(t.overlap_seconds, 2e-3, 1e-12);
}

class DeviceTimingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU";
  }
};

TEST_F(DeviceTimingTest, ClockPlacesARecordedEventAfterItsAnchorNearNow) {
  ScopedDevice scoped(0);
  ASSERT_TRUE(scoped.status().ok()) << scoped.status();
  absl::StatusOr<CudaStream> stream = CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  DeviceClock clock(0, stream->get());
  ASSERT_TRUE(clock.Refresh().ok());
  absl::StatusOr<CudaEvent> event = CreateEvent();
  ASSERT_TRUE(event.ok()) << event.status();
  absl::SleepFor(absl::Milliseconds(2));
  ASSERT_EQ(cudaEventRecord(event->get(), stream->get()), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(event->get()), cudaSuccess);
  absl::StatusOr<double> ms = clock.DeviceMs(event->get());
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GT(*ms, 1.0);
  EXPECT_LT(absl::AbsDuration(clock.WallTime(*ms) - absl::Now()),
            absl::Seconds(1));
  clock.Reset();
}

TEST_F(DeviceTimingTest, EventPoolHandsBackWhatWasReturned) {
  ScopedDevice scoped(0);
  ASSERT_TRUE(scoped.status().ok()) << scoped.status();
  EventPool pool;
  absl::StatusOr<std::unique_ptr<EventSet>> first = pool.Take();
  ASSERT_TRUE(first.ok()) << first.status();
  EventSet* raw = first->get();
  pool.Return(std::move(*first));
  absl::StatusOr<std::unique_ptr<EventSet>> again = pool.Take();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), raw);
  pool.Clear();
}

// Untimed sets (CudaEngineOptions::timed_job_every) are spares of their
// own: a timed Take never gets one back; they hold only the end event, and
// it carries no time (compute-sanitizer memcheck reports the refused
// cudaEventElapsedTime, and the cudaGetLastError that clears it, as two API
// errors: meant).
TEST_F(DeviceTimingTest, EventPoolKeepsUntimedSetsApart) {
  ScopedDevice scoped(0);
  ASSERT_TRUE(scoped.status().ok()) << scoped.status();
  EventPool pool;
  absl::StatusOr<std::unique_ptr<EventSet>> untimed = pool.Take(false);
  ASSERT_TRUE(untimed.ok()) << untimed.status();
  EXPECT_FALSE((*untimed)->timed);
  EXPECT_EQ((*untimed)->start.get(), nullptr);
  EXPECT_EQ((*untimed)->h2d_done.get(), nullptr);
  EXPECT_EQ((*untimed)->gemm_done.get(), nullptr);
  ASSERT_NE((*untimed)->end.get(), nullptr);
  absl::StatusOr<CudaStream> stream = CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_EQ(cudaEventRecord((*untimed)->end.get(), stream->get()), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize((*untimed)->end.get()), cudaSuccess);
  float ms = 0;
  EXPECT_NE(
      cudaEventElapsedTime(&ms, (*untimed)->end.get(), (*untimed)->end.get()),
      cudaSuccess);
  (void)cudaGetLastError();
  EventSet* raw = untimed->get();
  pool.Return(std::move(*untimed));
  absl::StatusOr<std::unique_ptr<EventSet>> timed = pool.Take();
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_TRUE((*timed)->timed);
  EXPECT_NE(timed->get(), raw);
  absl::StatusOr<std::unique_ptr<EventSet>> again = pool.Take(false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), raw);
  pool.Clear();
}

}  // namespace
}  // namespace matmul
