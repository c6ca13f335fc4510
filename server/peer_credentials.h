// Who is on the other end of a same-host connection, and which such peers
// may use shared memory (RegisterSharedMemory and its kin): the server's
// own user always, and the users and groups --shared-memory-peers names.
//
// Plain values; thread-compatible.
#ifndef MATMUL_SERVER_PEER_CREDENTIALS_H_
#define MATMUL_SERVER_PEER_CREDENTIALS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace matmul {

// A Unix-socket peer's credentials as the kernel recorded them when it
// connected (SO_PEERCRED, SO_PEERGROUPS).
struct PeerCredentials {
  uid_t uid = 0;
  gid_t gid = 0;              // primary group
  std::vector<gid_t> groups;  // supplementary groups, where the kernel tells
  pid_t pid = 0;
};

// Users and groups allowed besides the server's own (effective) user.
struct PeerAllowList {
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;

  // Comma-separated entries: "user:NAME", "user:UID", "group:NAME",
  // "group:GID"; a bare NAME or UID is a user. Names are looked up now.
  // INVALID_ARGUMENT naming the entry for an unknown name or a bad one.
  static absl::StatusOr<PeerAllowList> Parse(absl::string_view text);

  // The server's user, a listed user, or a member (primary or
  // supplementary) of a listed group.
  bool Allows(const PeerCredentials& peer) const;

  // "uid 0, uid 1000, gid 27": the server's uid first, for messages.
  std::string Describe() const;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_PEER_CREDENTIALS_H_
