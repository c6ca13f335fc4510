#include "gpu/grouped_layout.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace matmul {
namespace {

int64_t Padded(int64_t bytes) {
  return (bytes + kGroupAlignment - 1) / kGroupAlignment * kGroupAlignment;
}

}  // namespace

absl::StatusOr<GroupLayout> GroupLayoutOf(
    const MatmulSpec& spec, const std::vector<MatmulSpec>& members) {
  if (members.empty()) {
    return absl::InvalidArgumentError("a grouped multiply with no members");
  }
  GroupLayout g;
  g.members.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const MatmulSpec& s = members[i];
    if (s.dtype != spec.dtype || s.compute != spec.compute) {
      return absl::InvalidArgumentError(
          absl::StrCat("member ", i,
                       " of a grouped multiply has another dtype or "
                       "compute mode than the group"));
    }
    GroupMember m;
    m.spec = s;
    m.a_offset = g.a_bytes;
    m.b_offset = g.b_bytes;
    m.c_offset = g.c_bytes;
    g.a_bytes += Padded(s.a_bytes());
    g.b_bytes += Padded(s.b_bytes());
    g.c_bytes += Padded(s.c_bytes());
    g.flops += s.flops();
    g.problems += s.batch;
    g.members.push_back(m);
  }
  return g;
}

}  // namespace matmul
