// PanelSchedule: when a streamed multiply's GEMM can go, as its operands'
// chunks land on the device in any order. B must be whole first. Then,
// for a paneled multiply (StreamStartPlan::paneled: A large, 2-D, not
// transposed), a panel of A's rows is ready once at least `panel_rows` more
// rows are on the device contiguously from the rows already submitted (or
// the rest of A, once A is whole), so the GEMM overlaps the rest of A's
// upload; otherwise the one panel of every row is ready once A is whole.
// No gRPC.
//
// Not thread-safe: the session that owns the multiply serializes.
#ifndef MATMUL_SERVER_STREAM_PANEL_SCHEDULE_H_
#define MATMUL_SERVER_STREAM_PANEL_SCHEDULE_H_

#include <cstdint>
#include <optional>

#include "server/rpc/byte_coverage.h"
#include "server/stream/plan_stream_start.h"

namespace matmul {

class PanelSchedule {
 public:
  // Rows [row0, row0 + rows) of op(A).
  struct Panel {
    int64_t row0 = 0;
    int64_t rows = 0;
  };

  PanelSchedule() = default;
  explicit PanelSchedule(const StreamStartPlan& plan);

  // Operand `op`'s bytes [offset, offset + bytes) are on the device.
  void Uploaded(int op, int64_t offset, int64_t bytes) {
    on_device_[op].Add(offset, bytes);
  }
  // The next panel to multiply, if one is ready; Submit it once its job
  // is made.
  std::optional<Panel> Ready() const;
  void Submit(const Panel& panel) {
    rows_submitted_ = panel.row0 + panel.rows;
    all_submitted_ = rows_submitted_ == rows_;
  }
  // Every row's panel is submitted: no more operand bytes are taken.
  bool all_submitted() const { return all_submitted_; }
  int64_t rows_submitted() const { return rows_submitted_; }

 private:
  int64_t rows_ = 0;       // op(A)'s rows (M)
  int64_t row_bytes_ = 1;  // bytes of one row of A (K elements)
  int64_t need_[2] = {0, 0};
  bool paneled_ = false;
  int64_t panel_rows_ = 0;  // the fewest rows a panel waits for
  ByteCoverage on_device_[2];
  int64_t rows_submitted_ = 0;
  bool all_submitted_ = false;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_PANEL_SCHEDULE_H_
