#include "gpu/grouped_job.h"

#include <cstring>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"

namespace matmul {

JobDescription GroupedJob::Describe(
    const std::vector<std::unique_ptr<MatmulJob>>& members) {
  JobDescription d;
  // Only the dtype and compute mode: the sizes are the members'.
  d.spec.dtype = members.front()->spec().dtype;
  d.spec.compute = members.front()->spec().compute;
  d.spec.m = d.spec.n = d.spec.k = 0;
  GroupedMultiplyOp op;
  op.members.reserve(members.size());
  for (const auto& member : members) op.members.push_back(member->spec());
  d.op = std::move(op);
  return d;
}

GroupedJob::GroupedJob(std::vector<std::unique_ptr<MatmulJob>> members,
                       absl::AnyInvocable<void() &&> finished)
    : MatmulJob(Describe(members)),
      members_(std::move(members)),
      finished_(std::move(finished)),
      failed_(members_.size()) {
  // The layout the engine plans from the same description.
  absl::StatusOr<GroupLayout> layout = GroupLayoutOf(
      spec(), std::get<GroupedMultiplyOp>(description().op).members);
  if (layout.ok()) {
    layout_ = *std::move(layout);
  } else {
    for (absl::Status& f : failed_) f = layout.status();
  }
}

absl::Status GroupedJob::WriteOperands(absl::Span<std::byte> a,
                                       absl::Span<std::byte> b) {
  if (static_cast<int64_t>(a.size()) < layout_.a_bytes ||
      static_cast<int64_t>(b.size()) < layout_.b_bytes) {
    return absl::InternalError(absl::StrCat(
        "grouped multiply: staging of ", a.size(), " + ", b.size(),
        " bytes for operands of ", layout_.a_bytes, " + ", layout_.b_bytes));
  }
  for (size_t i = 0; i < members_.size() && i < layout_.members.size(); ++i) {
    const GroupMember& m = layout_.members[i];
    absl::Span<std::byte> a_i = a.subspan(m.a_offset, m.spec.a_bytes());
    absl::Span<std::byte> b_i = b.subspan(m.b_offset, m.spec.b_bytes());
    failed_[i] = members_[i]->WriteOperands(a_i, b_i);
    if (!failed_[i].ok()) {
      // A member that went away leaves zeros; its product is discarded.
      std::memset(a_i.data(), 0, a_i.size());
      std::memset(b_i.data(), 0, b_i.size());
    }
  }
  return absl::OkStatus();
}

void GroupedJob::Done(absl::StatusOr<JobResult> result) {
  // The next launch goes out before this one's members are answered.
  if (finished_) std::move(finished_)();
  finished_ = nullptr;
  if (!result.ok()) {
    for (auto& member : members_) member->Done(result.status());
    return;
  }
  const Placement placement = result->placement();
  const StageTimings timings = result->timings();
  const absl::Span<const std::byte> c = result->c();
  // Members share the job's staging; it goes when the last lets go.
  auto shared = std::make_shared<JobResult>(std::move(*result));
  const double n = static_cast<double>(members_.size());
  for (size_t i = 0; i < members_.size(); ++i) {
    if (!failed_[i].ok()) {
      members_[i]->Done(failed_[i]);
      continue;
    }
    const GroupMember& m = layout_.members[i];
    if (m.c_offset + m.spec.c_bytes() > static_cast<int64_t>(c.size())) {
      members_[i]->Done(absl::InternalError(
          "grouped multiply: the engine returned too short a product"));
      continue;
    }
    // Charged by its part of the work, which is what the launch's time is
    // spent on.
    StageTimings own = timings;
    own.share *= layout_.flops > 0 ? m.spec.flops() / layout_.flops : 1.0 / n;
    members_[i]->Done(JobResult(c.subspan(m.c_offset, m.spec.c_bytes()),
                                placement, own,
                                [shared]() mutable { shared.reset(); }));
  }
}

absl::Status GroupedJob::Abandoned() const {
  absl::Status last;
  for (const auto& member : members_) {
    last = member->Abandoned();
    if (last.ok()) return last;
  }
  return last;
}

}  // namespace matmul
