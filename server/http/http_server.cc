#include "server/http/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace matmul {
namespace {

// How long a connection answered by the poller (431, 503) may go on sending
// before it is closed; see the header.
constexpr absl::Duration kLinger = absl::Seconds(1);
// recv() calls per connection per poll, so one client cannot hold the poller.
constexpr int kReadsPerWakeup = 4;
// How long accepting pauses when the process is out of file descriptors.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

absl::string_view Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

bool SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string Format(const HttpResponse& response, bool head_only) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", response.status, " ", Reason(response.status),
                   "\r\nContent-Type: ", response.content_type,
                   "\r\nContent-Length: ", response.body.size(),
                   "\r\nCache-Control: no-store\r\nConnection: close\r\n");
  if (response.status == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head_only) out += response.body;
  return out;
}

void Respond(int fd, const HttpResponse& response, bool head_only) {
  SendAll(fd, Format(response, head_only));
}

// A connection the poller is reading: in accept order.
struct Pending {
  int fd;
  absl::Time deadline;
  std::string head;
  bool draining = false;  // answered by the poller; discards input until EOF
};

// What the poller does with a connection after reading it.
enum class Next { kKeep, kClose, kHandedOff };

// Answers without blocking (the reply is short and the socket's send buffer
// empty), stops writing, and lets the client's remaining input drain.
void AnswerNow(Pending& p, int status, absl::string_view body) {
  const std::string out =
      Format({status, "text/plain; charset=utf-8", std::string(body)}, false);
  while (send(p.fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
         errno == EINTR) {
  }
  shutdown(p.fd, SHUT_WR);
  p.draining = true;
  p.head = std::string();
  p.deadline = absl::Now() + kLinger;
}

HttpServerLimits Sanitized(HttpServerLimits limits) {
  limits.max_waiting = std::max(limits.max_waiting, 1);
  return limits;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string PercentDecode(absl::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out += ' ';
    } else if (in[i] == '%' && i + 2 < in.size() && HexValue(in[i + 1]) >= 0 &&
               HexValue(in[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(in[i + 1]) * 16 + HexValue(in[i + 2]));
      i += 2;
    } else {
      out += in[i];
    }
  }
  return out;
}

}  // namespace

std::optional<std::string> QueryParameter(absl::string_view query,
                                          absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(query, '&')) {
    const size_t eq = pair.find('=');
    const absl::string_view key = pair.substr(0, eq);
    if (PercentDecode(key) != name) continue;
    return eq == absl::string_view::npos ? std::string()
                                         : PercentDecode(pair.substr(eq + 1));
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, Handler handler, int threads,
    HttpServerLimits limits) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address must be HOST:PORT, got ", address));
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                 port.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                ai->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) {
      const int zero = 0;  // "::" takes IPv4 too, as gRPC's listener does
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    // A long accept queue: a burst of connections while the poller is not
    // scheduled must not drop a scrape's SYN (the client retries after 1 s).
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        listen(fd, SOMAXCONN) == 0) {
      break;
    }
    error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  std::unique_ptr<HttpServer> self(
      new HttpServer(fd, bound_port, std::move(handler), limits));
  if (pipe2(self->wake_fds_, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("metrics server: pipe: ", std::strerror(errno)));
  }
  for (int i = 0; i < std::max(threads, 1); ++i) {
    self->workers_.emplace_back([s = self.get()] { s->WorkerLoop(); });
  }
  self->poller_ = std::thread([s = self.get()] { s->PollLoop(); });
  return self;
}

HttpServer::HttpServer(int listen_fd, int port, Handler handler,
                       HttpServerLimits limits)
    : listen_fd_(listen_fd),
      port_(port),
      handler_(std::move(handler)),
      limits_(Sanitized(limits)) {}

HttpServer::~HttpServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (wake_fds_[1] >= 0) {
    const char stop = 's';
    while (write(wake_fds_[1], &stop, 1) < 0 && errno == EINTR) {
    }
  }
  if (poller_.joinable()) poller_.join();
  for (std::thread& t : workers_) t.join();
  {
    absl::MutexLock lock(&mu_);
    for (const Request& r : queue_) close(r.fd);  // no worker started them
    queue_.clear();
  }
  close(listen_fd_);
  for (int fd : wake_fds_) {
    if (fd >= 0) close(fd);
  }
}

void HttpServer::PollLoop() {
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  absl::Time accept_paused_until = absl::InfinitePast();
  // Reads what `p` has sent; hands a complete head to the workers.
  const auto advance = [this](Pending& p) {
    for (int i = 0; i < kReadsPerWakeup; ++i) {
      char buffer[4096];
      const ssize_t n = recv(p.fd, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return Next::kKeep;
      }
      if (n <= 0) return Next::kClose;  // gone before its head was complete
      if (p.draining) continue;
      const size_t from = p.head.size() < 3 ? 0 : p.head.size() - 3;
      p.head.append(buffer, static_cast<size_t>(n));
      const size_t end = p.head.find("\r\n\r\n", from);
      if (end == std::string::npos && p.head.size() < kMaxRequestHead) {
        continue;
      }
      if (end == std::string::npos || end + 4 > kMaxRequestHead) {
        AnswerNow(p, 431, "request head over 8 KiB\n");
        continue;
      }
      p.head.resize(end + 4);
      if (Enqueue(p.fd, std::move(p.head))) return Next::kHandedOff;
      AnswerNow(p, 503, "too many requests waiting\n");
    }
    return Next::kKeep;
  };
  while (true) {
    const absl::Time now = absl::Now();
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [now](const Pending& p) {
                                   if (now < p.deadline) return false;
                                   close(p.fd);
                                   return true;
                                 }),
                  pending.end());
    const bool accepting = now >= accept_paused_until;
    absl::Time next = accepting ? absl::InfiniteFuture() : accept_paused_until;
    fds.clear();
    fds.push_back({wake_fds_[0], POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (const Pending& p : pending) {
      fds.push_back({p.fd, POLLIN, 0});
      next = std::min(next, p.deadline);
    }
    int timeout_ms = -1;
    if (next != absl::InfiniteFuture()) {
      const int64_t left = absl::ToInt64Milliseconds(next - now) + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;  // stopping
    for (size_t i = 0; i < pending.size(); ++i) {
      if (fds[i + 2].revents == 0) continue;
      const Next what = advance(pending[i]);
      if (what == Next::kKeep) continue;
      if (what == Next::kClose) close(pending[i].fd);
      pending[i].fd = -1;
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const Pending& p) { return p.fd < 0; }),
                  pending.end());
    if (fds[1].revents == 0) continue;
    while (true) {
      const int fd =
          accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
            errno == ENOMEM) {
          if (!pending.empty()) {  // make room: the oldest goes
            close(pending.front().fd);
            pending.erase(pending.begin());
            continue;
          }
          accept_paused_until = absl::Now() + kAcceptPause;
        }
        break;  // EAGAIN: none left
      }
      if (pending.size() >= static_cast<size_t>(limits_.max_waiting)) {
        close(pending.front().fd);
        pending.erase(pending.begin());
      }
      pending.push_back({fd, absl::Now() + limits_.head_timeout, {}});
    }
  }
  for (const Pending& p : pending) close(p.fd);
}

bool HttpServer::Enqueue(int fd, std::string head) {
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= static_cast<size_t>(limits_.max_waiting)) return false;
  queue_.push_back({fd, std::move(head)});
  return true;
}

bool HttpServer::WorkReady() const { return stopping_ || !queue_.empty(); }

void HttpServer::WorkerLoop() {
  while (true) {
    Request request;
    {
      absl::MutexLock lock(&mu_, absl::Condition(this, &HttpServer::WorkReady));
      if (stopping_) return;
      request = std::move(queue_.front());
      queue_.pop_front();
    }
    Serve(request.fd, request.head);
    close(request.fd);
  }
}

void HttpServer::Serve(int fd, absl::string_view head) const {
  // Blocking again, so that SO_SNDTIMEO bounds each send: a client that
  // stops reading cannot hold the worker for long.
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  const timeval send_timeout = absl::ToTimeval(limits_.send_timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  // The request line: METHOD SP TARGET SP HTTP/x.y
  const absl::string_view line = head.substr(0, head.find("\r\n"));
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.") ||
      parts[1].empty() || parts[1][0] != '/') {
    Respond(fd, {400, "text/plain; charset=utf-8", "bad request line\n"},
            false);
    return;
  }
  HttpRequest request;
  request.method = std::string(parts[0]);
  const absl::string_view target = parts[1];
  const size_t question = target.find('?');
  request.path = std::string(target.substr(0, question));
  if (question != absl::string_view::npos) {
    request.query = std::string(target.substr(question + 1));
  }
  const bool head_only = request.method == "HEAD";
  if (request.method != "GET" && !head_only) {
    Respond(fd, {405, "text/plain; charset=utf-8", "only GET and HEAD\n"},
            false);
    return;
  }
  Respond(fd, handler_(request), head_only);
}

}  // namespace matmul
