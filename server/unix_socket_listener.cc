#include "server/unix_socket_listener.h"

#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"

#ifndef GPR_SUPPORT_CHANNELS_FROM_FD
#error "the Unix socket listener needs grpc::AddInsecureChannelFromFd"
#endif

namespace matmul {
namespace {

constexpr absl::string_view kFdPeerPrefix = "fd:";

// The descriptor a UnixSocketListener connection's peer string names
// ("fd:N"), if it is a Unix socket; nullopt for any other peer.
std::optional<int> UnixSocketOf(absl::string_view peer) {
  if (!absl::ConsumePrefix(&peer, kFdPeerPrefix)) return std::nullopt;
  int fd = -1;
  if (!absl::SimpleAtoi(peer, &fd) || fd < 0) return std::nullopt;
  // Defence in depth: only UnixSocketListener makes "fd:" peers.
  sockaddr_un addr{};
  socklen_t addr_len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0 ||
      addr.sun_family != AF_UNIX) {
    return std::nullopt;
  }
  return fd;
}

// "unix:" and the socket path the peer bound, if any (as gRPC names a
// peer on its own unix: ports).
std::string PeerAddress(int fd) {
  sockaddr_un remote{};
  socklen_t remote_len = sizeof(remote);
  std::string address = "unix:";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_len) == 0 &&
      remote_len > offsetof(sockaddr_un, sun_path) &&
      remote.sun_path[0] != '\0') {
    address.append(
        remote.sun_path,
        strnlen(remote.sun_path, remote_len - offsetof(sockaddr_un, sun_path)));
  }
  return address;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<UnixSocketListener>> UnixSocketListener::Create(
    const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix socket path: 1 to ", sizeof(addr.sun_path) - 1,
                     " bytes, got ", path.size()));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  // A socket file left by a server that is gone (as gRPC's own listener
  // does); any other kind of file stays, and bind fails on it.
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    unlink(path.c_str());
  }
  // Non-blocking: accept never waits, so Stop is never held up by it.
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket for", path);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    absl::Status status = Errno("bind and listen on", path);
    close(fd);
    return status;
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    absl::Status status = Errno("eventfd for", path);
    close(fd);
    unlink(path.c_str());
    return status;
  }
  return std::unique_ptr<UnixSocketListener>(
      new UnixSocketListener(path, fd, wake));
}

UnixSocketListener::~UnixSocketListener() { Stop(); }

void UnixSocketListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixSocketListener::Stop() {
  if (listen_fd_ < 0) return;
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // An eventfd write fails only on overflow; the loop wakes either way.
  }
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
  unlink(path_.c_str());
}

void UnixSocketListener::AcceptLoop(grpc::Server* server) {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  // Out of descriptors or memory, the connection stays in the backlog and
  // the socket stays readable: then wait for Stop alone, a little, rather
  // than spin on it.
  bool starved = false;
  while (true) {
    const int ready = poll(starved ? fds + 1 : fds, starved ? 1 : 2,
                           starved ? /*timeout_ms=*/100 : -1);
    starved = false;
    if (ready < 0 && errno != EINTR) {
      LogLine(absl::StrCat("unix socket ", path_,
                           ": poll failed: ", std::strerror(errno)));
      return;
    }
    if (fds[1].revents != 0) return;
    if (ready <= 0 || fds[0].revents == 0) continue;
    fds[0].revents = 0;
    const int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      starved = errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                errno == ENOMEM;
      continue;  // EAGAIN, ECONNABORTED, EINTR: poll again at once
    }
    // gRPC owns the descriptor from here and closes it with the connection.
    grpc::AddInsecureChannelFromFd(server, fd);
  }
}

std::optional<UnixPeer> PeerOfCall(absl::string_view peer) {
  const std::optional<int> fd = UnixSocketOf(peer);
  if (!fd.has_value()) return std::nullopt;
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 ||
      cred_len != sizeof(cred)) {
    return std::nullopt;
  }
  UnixPeer out;
  out.credentials.uid = cred.uid;
  out.credentials.gid = cred.gid;
  out.credentials.pid = cred.pid;
#ifdef SO_PEERGROUPS
  // More groups than fit (ERANGE) leave only the primary one: fewer
  // rights, never more.
  gid_t groups[256];
  socklen_t groups_len = sizeof(groups);
  if (getsockopt(*fd, SOL_SOCKET, SO_PEERGROUPS, groups, &groups_len) == 0) {
    out.credentials.groups.assign(groups, groups + groups_len / sizeof(gid_t));
  }
#endif
  out.address = PeerAddress(*fd);
  return out;
}

std::optional<std::string> UnixAddressOfCall(absl::string_view peer) {
  const std::optional<int> fd = UnixSocketOf(peer);
  if (!fd.has_value()) return std::nullopt;
  return PeerAddress(*fd);
}

}  // namespace matmul
