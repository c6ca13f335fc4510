// UnixSocketListener: the server's Unix socket (--unix_socket), accepted by
// the server itself so that a call can learn who is on the other end.
//
// gRPC 1.51 gives a call on a "unix:" listening port of its own no way to
// its peer's credentials: the peer string is the client's socket address
// ("unix:" for the usual unnamed client socket), the auth context of
// insecure (and of local) credentials holds no uid, and nothing public
// leads from a call to its connection's descriptor. So this listener binds
// and accepts itself and hands each connection to the server with
// grpc::AddInsecureChannelFromFd, which names the connection's endpoint
// "fd:N" after its descriptor; that name is the peer string of every call
// on it. The descriptor stays open for as long as any call on the
// connection lives (the endpoint is destroyed with the transport, which
// each call's stream holds), so during a call SO_PEERCRED on N gives the
// credentials the peer connected with (PeerOfCall below).
//
// Thread-compatible: its owner calls Start and Stop (the accept loop runs
// on a thread of its own). Destroy (or Stop) it before the grpc::Server it
// feeds shuts down. PeerOfCall and UnixAddressOfCall are thread-safe.
#ifndef MATMUL_SERVER_UNIX_SOCKET_LISTENER_H_
#define MATMUL_SERVER_UNIX_SOCKET_LISTENER_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/peer_credentials.h"

namespace matmul {

class UnixSocketListener {
 public:
  // Binds `path` (replacing a stale socket file there, never another kind
  // of file) and listens; connections wait in the backlog until Start.
  static absl::StatusOr<std::unique_ptr<UnixSocketListener>> Create(
      const std::string& path);
  ~UnixSocketListener();  // Stop()
  UnixSocketListener(const UnixSocketListener&) = delete;
  UnixSocketListener& operator=(const UnixSocketListener&) = delete;

  // Accepts connections on a thread of its own and hands them to `server`,
  // which must outlive Stop(). Once.
  void Start(grpc::Server* server);
  // Stops accepting, closes the socket and removes its file. Idempotent.
  void Stop();

 private:
  UnixSocketListener(std::string path, int listen_fd, int wake_fd)
      : path_(std::move(path)), listen_fd_(listen_fd), wake_fd_(wake_fd) {}
  void AcceptLoop(grpc::Server* server);

  const std::string path_;
  int listen_fd_;
  int wake_fd_;  // an eventfd: written once by Stop
  std::thread thread_;
};

// Who a call's peer is, for a call on a UnixSocketListener connection.
struct UnixPeer {
  PeerCredentials credentials;
  std::string address;  // "unix:" and the client's socket path, if bound
};

// The peer of a call whose peer string is `peer`: a UnixSocketListener
// connection's ("fd:N") credentials; nullopt for any other peer (TCP,
// or a failing descriptor, which the caller then treats as unknown).
std::optional<UnixPeer> PeerOfCall(absl::string_view peer);

// Only the address of PeerOfCall (one system call, for ClientKey).
std::optional<std::string> UnixAddressOfCall(absl::string_view peer);

}  // namespace matmul

#endif  // MATMUL_SERVER_UNIX_SOCKET_LISTENER_H_
