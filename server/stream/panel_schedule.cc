#include "server/stream/panel_schedule.h"

namespace matmul {

PanelSchedule::PanelSchedule(const StreamStartPlan& plan)
    : rows_(plan.spec.m),
      row_bytes_(plan.spec.k * plan.spec.elem_size()),
      need_{plan.need[0], plan.need[1]},
      paneled_(plan.paneled),
      panel_rows_(plan.panel_rows) {}

std::optional<PanelSchedule::Panel> PanelSchedule::Ready() const {
  if (all_submitted()) return std::nullopt;
  if (on_device_[1].covered() < need_[1]) return std::nullopt;  // B first
  int64_t ready = rows_;  // rows of op(A) on the device, from the first
  if (on_device_[0].covered() < need_[0]) {
    if (!paneled_) return std::nullopt;
    ready = on_device_[0].FirstGap() / row_bytes_;
    if (ready - rows_submitted_ < panel_rows_) return std::nullopt;
  }
  return Panel{rows_submitted_, ready - rows_submitted_};
}

}  // namespace matmul
