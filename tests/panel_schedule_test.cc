// PanelSchedule (server/stream/panel_schedule.h) driven directly: when a
// streamed multiply's GEMM, or each row panel of it, can go as the
// operands' chunks land on the device in any order. No server and no gRPC.
#include "server/stream/panel_schedule.h"

#include <cstdint>
#include <optional>

#include "gtest/gtest.h"

namespace matmul {
namespace {

constexpr int64_t kRowBytes = 16 * 4;  // K = 16 float32

// A [rows, 16] x [16, 8] float32 multiply; A in panels of `panel_rows`
// rows, or whole (0).
StreamStartPlan Plan(int64_t rows, int64_t panel_rows) {
  StreamStartPlan plan;
  plan.spec.dtype = DType::kFloat32;
  plan.spec.m = rows;
  plan.spec.k = 16;
  plan.spec.n = 8;
  plan.need[0] = rows * kRowBytes;
  plan.need[1] = 16 * 8 * 4;
  plan.paneled = panel_rows > 0;
  plan.panel_rows = panel_rows;
  return plan;
}

TEST(PanelScheduleTest, WholeAWaitsForEveryByteOfBoth) {
  PanelSchedule schedule(Plan(4, 0));
  EXPECT_FALSE(schedule.Ready().has_value());
  schedule.Uploaded(0, 0, 4 * kRowBytes);
  EXPECT_FALSE(schedule.Ready().has_value());  // B first
  schedule.Uploaded(1, 256, 256);
  EXPECT_FALSE(schedule.Ready().has_value());
  schedule.Uploaded(1, 0, 256);
  std::optional<PanelSchedule::Panel> panel = schedule.Ready();
  ASSERT_TRUE(panel.has_value());
  EXPECT_EQ(panel->row0, 0);
  EXPECT_EQ(panel->rows, 4);
  EXPECT_FALSE(schedule.all_submitted());
  schedule.Submit(*panel);
  EXPECT_TRUE(schedule.all_submitted());
  EXPECT_FALSE(schedule.Ready().has_value());
}

TEST(PanelScheduleTest, NotPaneledAWaitsWholeEvenWithBThere) {
  PanelSchedule schedule(Plan(8, 0));
  schedule.Uploaded(1, 0, 512);
  schedule.Uploaded(0, 0, 7 * kRowBytes);
  EXPECT_FALSE(schedule.Ready().has_value());
  schedule.Uploaded(0, 7 * kRowBytes, kRowBytes);
  ASSERT_TRUE(schedule.Ready().has_value());
  EXPECT_EQ(schedule.Ready()->rows, 8);
}

TEST(PanelScheduleTest, PanelsGoAsTheirRowsArriveInOrder) {
  PanelSchedule schedule(Plan(8, 2));
  schedule.Uploaded(0, 0, 3 * kRowBytes);
  EXPECT_FALSE(schedule.Ready().has_value());  // B first
  schedule.Uploaded(1, 0, 512);
  std::optional<PanelSchedule::Panel> panel = schedule.Ready();
  ASSERT_TRUE(panel.has_value());
  EXPECT_EQ(panel->row0, 0);
  EXPECT_EQ(panel->rows, 3);  // every row there, at least panel_rows
  schedule.Submit(*panel);
  EXPECT_EQ(schedule.rows_submitted(), 3);
  schedule.Uploaded(0, 3 * kRowBytes, kRowBytes);
  EXPECT_FALSE(schedule.Ready().has_value());  // one row: under 2
  schedule.Uploaded(0, 4 * kRowBytes, kRowBytes);
  panel = schedule.Ready();
  ASSERT_TRUE(panel.has_value());
  EXPECT_EQ(panel->row0, 3);
  EXPECT_EQ(panel->rows, 2);
  schedule.Submit(*panel);
  // The rest of A: its last panel may be short.
  schedule.Uploaded(0, 5 * kRowBytes, 3 * kRowBytes);
  panel = schedule.Ready();
  ASSERT_TRUE(panel.has_value());
  EXPECT_EQ(panel->row0, 5);
  EXPECT_EQ(panel->rows, 3);
  schedule.Submit(*panel);
  EXPECT_TRUE(schedule.all_submitted());
}

TEST(PanelScheduleTest, RowsPastAGapWaitForIt) {
  PanelSchedule schedule(Plan(8, 2));
  schedule.Uploaded(1, 0, 512);
  // Rows 2..7 arrive first: nothing from row 0 yet.
  schedule.Uploaded(0, 2 * kRowBytes, 6 * kRowBytes);
  EXPECT_FALSE(schedule.Ready().has_value());
  // Row 1 too: row 0 is still missing.
  schedule.Uploaded(0, kRowBytes, kRowBytes);
  EXPECT_FALSE(schedule.Ready().has_value());
  schedule.Uploaded(0, 0, kRowBytes);
  std::optional<PanelSchedule::Panel> panel = schedule.Ready();
  ASSERT_TRUE(panel.has_value());
  EXPECT_EQ(panel->row0, 0);
  EXPECT_EQ(panel->rows, 8);  // A is whole: one panel of every row
}

}  // namespace
}  // namespace matmul
