// Tests of HttpServer over real sockets on 127.0.0.1: idle and slow
// connections do not delay a request, the 8 KiB head limit answers 431,
// silent connections are closed at their deadline, and the destructor does
// not wait for them. Every read has a timeout and every loop a bound.
#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kIdle = 64;

HttpResponse Answer(const HttpRequest& request) {
  if (request.path == "/metrics") return {200, "text/plain", "up 1\n"};
  return {404, "text/plain", "not found\n"};
}

std::unique_ptr<HttpServer> StartServer(HttpServerLimits limits = {}) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start("127.0.0.1:0", Answer, 2, limits);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// A socket connected to 127.0.0.1:port whose reads time out after 5 s; -1 on
// failure.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n =
        send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Everything until the server closes (or an error, or the 5 s timeout).
std::string ReadAll(int fd) {
  std::string out;
  for (int i = 0; i < 10000; ++i) {
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

// One request on a fresh connection; the whole reply.
std::string Fetch(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  std::string reply = SendAll(fd, request) ? ReadAll(fd) : "send failed";
  close(fd);
  return reply;
}

// True if the server closed `fd` (EOF or reset) within `within`.
bool ClosedWithin(int fd, absl::Duration within) {
  const timeval timeout = absl::ToTimeval(within);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  for (int i = 0; i < 100; ++i) {
    char buffer[256];
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
  return false;
}

class Connections {
 public:
  ~Connections() {
    for (int fd : fds_) close(fd);
  }
  // `count` connections to `port`, every second one having sent half a
  // request line.
  void Open(int port, int count) {
    for (int i = 0; i < count; ++i) {
      const int fd = Connect(port);
      ASSERT_GE(fd, 0) << "connection " << i;
      fds_.push_back(fd);
      if (i % 2 == 1) {
        ASSERT_TRUE(SendAll(fd, "GET /met"));
      }
    }
  }
  const std::vector<int>& fds() const { return fds_; }

 private:
  std::vector<int> fds_;
};

TEST(HttpServerConnectionTest, AnswersGetHeadAndRefusesOthers) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string get =
      Fetch(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(get, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(get, HasSubstr("\r\n\r\nup 1\n"));
  const std::string head = Fetch(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_FALSE(absl::EndsWith(head, "up 1\n"));
  EXPECT_THAT(Fetch(port, "GET /other HTTP/1.0\r\n\r\n"),
              StartsWith("HTTP/1.1 404 "));
  EXPECT_THAT(Fetch(port, "POST /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 405 "));
  EXPECT_THAT(Fetch(port, "garbage\r\n\r\n"), StartsWith("HTTP/1.1 400 "));
}

TEST(HttpServerConnectionTest, ScrapeIsAnsweredWithIdleConnectionsOpen) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  Connections idle;
  ASSERT_NO_FATAL_FAILURE(idle.Open(server->port(), kIdle));
  const absl::Time start = absl::Now();
  const std::string reply =
      Fetch(server->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_LT(took, absl::Seconds(1));
  std::cout << "scrape with " << kIdle << " idle connections open: " << took
            << "\n";
  RecordProperty("scrape_ms", absl::StrCat(absl::ToInt64Milliseconds(took)));
}

TEST(HttpServerConnectionTest, HeadOver8KiBGets431) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  // A request line over 8 KiB, complete or not.
  const std::string path(HttpServer::kMaxRequestHead + 100, 'a');
  EXPECT_THAT(Fetch(port, absl::StrCat("GET /", path, " HTTP/1.1\r\n\r\n")),
              StartsWith("HTTP/1.1 431 "));
  EXPECT_THAT(Fetch(port, absl::StrCat("GET /", path)),
              StartsWith("HTTP/1.1 431 "));
  // Headers that take the head over 8 KiB.
  const std::string header(HttpServer::kMaxRequestHead, 'h');
  EXPECT_THAT(Fetch(port, absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ",
                                       header, "\r\n\r\n")),
              StartsWith("HTTP/1.1 431 "));
  // A head of exactly 8 KiB is answered.
  std::string exact = "GET /x HTTP/1.1\r\n\r\n";
  exact.insert(5, HttpServer::kMaxRequestHead - exact.size(), 'a');
  ASSERT_EQ(exact.size(), HttpServer::kMaxRequestHead);
  EXPECT_THAT(Fetch(port, exact), StartsWith("HTTP/1.1 404 "));
}

TEST(HttpServerConnectionTest, IdleConnectionIsClosedAtItsDeadline) {
  HttpServerLimits limits;
  limits.head_timeout = absl::Milliseconds(300);
  std::unique_ptr<HttpServer> server = StartServer(limits);
  ASSERT_NE(server, nullptr);
  Connections idle;
  // Taken before the connections open: the server sets each deadline when
  // it accepts the connection, after this, so `took` is at least the
  // timeout however long the test stalls. (Taken after Open, a stall in
  // between made `took` shorter than the timeout.)
  const absl::Time start = absl::Now();
  ASSERT_NO_FATAL_FAILURE(idle.Open(server->port(), 2));
  for (int fd : idle.fds()) {
    EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(3)));
  }
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(2));
  // The server still answers.
  EXPECT_THAT(Fetch(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST(HttpServerConnectionTest, OldestIdleConnectionIsDroppedBeyondTheCap) {
  HttpServerLimits limits;
  limits.max_waiting = 4;
  std::unique_ptr<HttpServer> server = StartServer(limits);
  ASSERT_NE(server, nullptr);
  Connections idle;
  ASSERT_NO_FATAL_FAILURE(idle.Open(server->port(), 6));
  // The two oldest make room for the later ones.
  EXPECT_TRUE(ClosedWithin(idle.fds()[0], absl::Seconds(2)));
  EXPECT_TRUE(ClosedWithin(idle.fds()[1], absl::Seconds(2)));
  EXPECT_THAT(Fetch(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST(HttpServerConnectionTest,
     DestructorReturnsPromptlyWithIdleConnectionsOpen) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  Connections idle;
  ASSERT_NO_FATAL_FAILURE(idle.Open(server->port(), kIdle));
  // Let the poller accept them all before stopping.
  EXPECT_THAT(Fetch(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 200 OK\r\n"));
  const absl::Time start = absl::Now();
  server.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(ClosedWithin(idle.fds().front(), absl::Seconds(1)));
  EXPECT_TRUE(ClosedWithin(idle.fds().back(), absl::Seconds(1)));
}

}  // namespace
}  // namespace matmul
