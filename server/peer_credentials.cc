#include "server/peer_credentials.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/bounded_text.h"

namespace matmul {
namespace {

// A number, or a name looked up with `lookup` (getpwnam_r / getgrnam_r
// through a lambda); nullopt when neither.
template <typename Lookup>
std::optional<uint32_t> IdOf(absl::string_view text, Lookup lookup) {
  uint32_t id = 0;
  if (absl::SimpleAtoi(text, &id)) return id;
  return lookup(std::string(text));
}

std::optional<uint32_t> UserId(const std::string& name) {
  passwd entry;
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) !=
          0 ||
      found == nullptr) {
    return std::nullopt;
  }
  return found->pw_uid;
}

std::optional<uint32_t> GroupId(const std::string& name) {
  group entry;
  group* found = nullptr;
  std::vector<char> buffer(65536);
  if (getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) !=
          0 ||
      found == nullptr) {
    return std::nullopt;
  }
  return found->gr_gid;
}

}  // namespace

absl::StatusOr<PeerAllowList> PeerAllowList::Parse(absl::string_view text) {
  PeerAllowList list;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) continue;
    absl::string_view name = entry;
    const bool is_group = absl::ConsumePrefix(&name, "group:");
    if (!is_group) absl::ConsumePrefix(&name, "user:");
    const std::optional<uint32_t> id =
        name.empty() ? std::nullopt
                     : (is_group ? IdOf(name, GroupId) : IdOf(name, UserId));
    if (!id.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no ", is_group ? "group" : "user", " \"", BoundedForMessage(name),
          "\" (entries are user:NAME, user:UID, group:NAME or group:GID)"));
    }
    if (is_group) {
      list.gids.push_back(*id);
    } else {
      list.uids.push_back(*id);
    }
  }
  return list;
}

bool PeerAllowList::Allows(const PeerCredentials& peer) const {
  if (peer.uid == geteuid()) return true;
  if (std::find(uids.begin(), uids.end(), peer.uid) != uids.end()) return true;
  for (gid_t gid : gids) {
    if (peer.gid == gid || std::find(peer.groups.begin(), peer.groups.end(),
                                     gid) != peer.groups.end()) {
      return true;
    }
  }
  return false;
}

std::string PeerAllowList::Describe() const {
  std::string out = absl::StrCat("uid ", geteuid(), " (the server's)");
  for (uid_t uid : uids) absl::StrAppend(&out, ", uid ", uid);
  for (gid_t gid : gids) absl::StrAppend(&out, ", gid ", gid);
  return out;
}

}  // namespace matmul
