// HttpServer: a minimal HTTP/1.1 server for the metrics port: GET and HEAD,
// no request bodies, one request per connection (Connection: close). It
// exists because prometheus-cpp's Exposer cannot run inside matmul-server:
// civetweb starts its threads with a fixed 100 KiB stack, and glibc refuses
// such threads (EINVAL) once the static TLS of the process's libraries is
// larger than that; cuBLASLt alone brings 92 KiB and OpenBLAS 60 KiB. This
// server's threads use the default stack.
//
// Design: one poller thread accepts every connection and reads, without
// blocking, the request heads of all connections still sending them; each
// connection has `head_timeout` (5 s) from its accept to send its whole head
// (at most kMaxRequestHead, 8 KiB) or it is closed. A complete head is
// handed to a queue served by `threads` worker threads, which run the
// handler and write the reply, each send timing out after `send_timeout`
// (10 s). So a silent or slow-sending client holds no worker, and only a
// client that stops reading the reply holds one, for at most send_timeout.
//
// Limits: the poller holds at most `max_waiting` (256) connections; when
// another is accepted beyond that, the oldest it holds is closed unanswered
// (a scrape sends its head at once, so it is never the oldest). The same
// happens when accept() finds no free file descriptor.
// At most `max_waiting` complete requests wait for a worker; beyond that a
// request is answered 503 by the poller. A head over 8 KiB (request line
// included) is answered 431 by the poller, which then reads and discards
// what the client still sends for up to 1 s before closing, so that the
// reply is not lost to a reset.
#ifndef MATMUL_SERVER_HTTP_HTTP_SERVER_H_
#define MATMUL_SERVER_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

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

// Limits of an HttpServer (see the top of this file); the defaults are the
// metrics port's. Tests shorten head_timeout.
struct HttpServerLimits {
  absl::Duration head_timeout = absl::Seconds(5);   // accept to end of head
  absl::Duration send_timeout = absl::Seconds(10);  // each send of a reply
  int max_waiting = 256;  // connections being read; requests queued
};

// Thread-safe. The handler runs on the server's worker threads, possibly on
// several at once.
class HttpServer {
 public:
  using Handler = absl::AnyInvocable<HttpResponse(const HttpRequest&) const>;

  // The longest request head (request line, headers, blank line) answered;
  // a longer one gets 431.
  static constexpr size_t kMaxRequestHead = 8 << 10;

  // Listens on `address` ("127.0.0.1:0", "0.0.0.0:9464", "[::]:9464"; port
  // 0 picks a free one) and serves with `threads` workers. UNAVAILABLE if
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, Handler handler, int threads = 2,
      HttpServerLimits limits = {});

  // Stops accepting, closes the connections still sending their heads and
  // the requests no worker has started, lets each worker finish the request
  // it is answering, and joins the threads.
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  // A connection whose head is complete, waiting for a worker.
  struct Request {
    int fd = -1;
    std::string head;  // up to and including the blank line
  };

  HttpServer(int listen_fd, int port, Handler handler, HttpServerLimits limits);

  void PollLoop();
  // Queues a complete head for the workers; false if the queue is full.
  bool Enqueue(int fd, std::string head) ABSL_LOCKS_EXCLUDED(mu_);
  bool WorkReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Serve(int fd, absl::string_view head) const;

  const int listen_fd_;
  const int port_;
  const Handler handler_;
  const HttpServerLimits limits_;
  int wake_fds_[2] = {-1, -1};  // a pipe; written once to stop the poller

  absl::Mutex mu_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread poller_;
  std::vector<std::thread> workers_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_HTTP_HTTP_SERVER_H_
