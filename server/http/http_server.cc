#include "server/http/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace matmul {
namespace {

constexpr size_t kMaxRequestHead = 16 << 10;
constexpr absl::Duration kRequestBudget = absl::Seconds(5);

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

void Respond(int fd, const HttpResponse& response, bool head_only) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", response.status, " ", Reason(response.status),
                   "\r\nContent-Type: ", response.content_type,
                   "\r\nContent-Length: ", response.body.size(),
                   "\r\nCache-Control: no-store\r\nConnection: close\r\n");
  if (response.status == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head_only) out += response.body;
  SendAll(fd, out);
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
    const std::string& address, Handler handler, int threads) {
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
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) {
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
      new HttpServer(fd, bound_port, std::move(handler)));
  if (pipe2(self->wake_fds_, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("metrics server: pipe: ", std::strerror(errno)));
  }
  for (int i = 0; i < threads; ++i) {
    self->workers_.emplace_back([s = self.get()] { s->WorkerLoop(); });
  }
  return self;
}

HttpServer::HttpServer(int listen_fd, int port, Handler handler)
    : listen_fd_(listen_fd), port_(port), handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  if (wake_fds_[1] >= 0) {
    const char stop = 's';
    while (write(wake_fds_[1], &stop, 1) < 0 && errno == EINTR) {
    }
  }
  for (std::thread& t : workers_) t.join();
  close(listen_fd_);
  for (int fd : wake_fds_) {
    if (fd >= 0) close(fd);
  }
}

void HttpServer::WorkerLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // stopping; the pipe stays readable
    // Another worker may have taken the connection: then EAGAIN.
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    close(fd);
  }
}

void HttpServer::Serve(int fd) const {
  // A client that stops reading cannot hold the worker for long either.
  const timeval send_timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  const absl::Time deadline = absl::Now() + kRequestBudget;
  std::string head;
  size_t end = std::string::npos;
  while (end == std::string::npos) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return;
    pollfd p{fd, POLLIN, 0};
    const int ready =
        poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return;
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    head.append(buffer, static_cast<size_t>(n));
    end = head.find("\r\n\r\n");
    if (end == std::string::npos && head.size() > kMaxRequestHead) {
      Respond(fd, {431, "text/plain; charset=utf-8", "request too large\n"},
              false);
      return;
    }
  }
  // The request line: METHOD SP TARGET SP HTTP/x.y
  const absl::string_view line =
      absl::string_view(head).substr(0, head.find("\r\n"));
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
