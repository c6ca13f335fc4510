// TcpProxy: a loopback TCP proxy for tests, in front of one server port.
// Freeze() makes it a black hole that keeps every connection open but moves
// no more bytes in either direction: what a peer looks like after its node
// crashed or a NAT between them dropped the connection's state.
#ifndef MATMUL_TESTS_TCP_PROXY_H_
#define MATMUL_TESTS_TCP_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace matmul::testing {

class TcpProxy {
 public:
  // Listens on 127.0.0.1 (port() tells where) and forwards every accepted
  // connection to 127.0.0.1:`target_port`.
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(0);
    if (listener_ < 0 ||
        bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
            0 ||
        listen(listener_, 16) != 0) {
      return;
    }
    socklen_t len = sizeof(addr);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~TcpProxy() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (auto [a, b] : pairs_) {
      close(a);
      close(b);
    }
    if (listener_ >= 0) close(listener_);
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  // 0 if the proxy could not listen.
  int port() const { return port_; }
  void Freeze() { frozen_ = true; }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }

  // Until stopped: accepts, and copies bytes both ways unless frozen. Each
  // poll waits at most 20 ms, so a stop is seen promptly.
  void Run() {
    std::array<char, 65536> buffer;
    while (!stop_) {
      std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
      if (!frozen_) {
        for (auto [a, b] : pairs_) {
          // A side that has ended is not read again (-1: poll skips it).
          fds.push_back({ended_.count(a) ? -1 : a, POLLIN, 0});
          fds.push_back({ended_.count(b) ? -1 : b, POLLIN, 0});
        }
      }
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int client = accept(listener_, nullptr, nullptr);
        const int server = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr = Loopback(target_port_);
        if (client >= 0 && server >= 0 &&
            connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ==
                0) {
          pairs_.emplace_back(client, server);
        } else {
          if (client >= 0) close(client);
          if (server >= 0) close(server);
        }
        continue;  // fds no longer matches pairs_
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const auto [a, b] = pairs_[(i - 1) / 2];
        const int from = fds[i].fd;
        const int to = from == a ? b : a;
        const ssize_t n = read(from, buffer.data(), buffer.size());
        if (n <= 0) {
          ended_.insert(from);
          shutdown(to, SHUT_WR);
          continue;
        }
        for (ssize_t sent = 0; sent < n;) {
          const ssize_t w = write(to, buffer.data() + sent, n - sent);
          if (w <= 0) break;
          sent += w;
        }
      }
    }
  }

  const int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> frozen_{false};
  std::vector<std::pair<int, int>> pairs_;  // (client side, server side)
  std::set<int> ended_;                     // sides that reached EOF
  std::thread thread_;
};

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_TCP_PROXY_H_
