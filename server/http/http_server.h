// HttpServer: a minimal HTTP/1.1 server for the metrics port: GET and HEAD,
// no request bodies, one request per connection (Connection: close). It
// exists because prometheus-cpp's Exposer cannot run inside matmul-server:
// civetweb starts its threads with a fixed 100 KiB stack, and glibc refuses
// such threads (EINVAL) once the static TLS of the process's libraries is
// larger than that; cuBLASLt alone brings 92 KiB and OpenBLAS 60 KiB. This
// server's threads use the default stack.
//
// A few worker threads each accept and answer one connection at a time;
// every connection has 5 s to send its request head (at most 16 KiB) and
// each send of the reply times out after 10 s, so a slow client cannot hold
// a worker for long.
#ifndef MATMUL_SERVER_HTTP_HTTP_SERVER_H_
#define MATMUL_SERVER_HTTP_HTTP_SERVER_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace matmul {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD"
  std::string path;    // "/metrics"
  std::string query;   // after '?', still percent-encoded; may be empty
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// The value of `name` in a query string ("a=1&seconds=2"), percent- and
// '+'-decoded; nullopt if absent.
std::optional<std::string> QueryParameter(absl::string_view query,
                                          absl::string_view name);

// Thread-safe. The handler runs on the server's worker threads, possibly on
// several at once.
class HttpServer {
 public:
  using Handler = absl::AnyInvocable<HttpResponse(const HttpRequest&) const>;

  // Listens on `address` ("127.0.0.1:0", "0.0.0.0:9464", "[::]:9464"; port
  // 0 picks a free one) and serves with `threads` workers. UNAVAILABLE if
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, Handler handler, int threads = 2);

  // Stops accepting, lets each worker finish the request it is answering,
  // and joins them.
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  HttpServer(int listen_fd, int port, Handler handler);

  void WorkerLoop();
  void Serve(int fd) const;

  const int listen_fd_;
  const int port_;
  const Handler handler_;
  int wake_fds_[2] = {-1, -1};  // a pipe; written once to stop the workers
  std::vector<std::thread> workers_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_HTTP_HTTP_SERVER_H_
