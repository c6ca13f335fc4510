// Test support for the metrics tests: plain-socket HTTP GETs against a
// server's metrics port, a parser of the Prometheus text format, and
// `promtool check metrics`.
#ifndef MATMUL_TESTS_METRICS_SCRAPE_CLIENT_H_
#define MATMUL_TESTS_METRICS_SCRAPE_CLIENT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace matmul::testing {

struct HttpReply {
  int status = 0;
  std::string headers;
  std::string body;
};

// One HTTP/1.1 request over a plain socket; the server closes after it.
inline HttpReply HttpRequestRaw(int port, const std::string& request) {
  HttpReply reply;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return reply;
  }
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string raw;
  char buffer[65536];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof buffer, 0)) > 0) raw.append(buffer, n);
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return reply;
  reply.headers = raw.substr(0, end);
  reply.body = raw.substr(end + 4);
  const std::vector<std::string> first =
      absl::StrSplit(raw.substr(0, raw.find("\r\n")), ' ');
  if (first.size() >= 2) (void)absl::SimpleAtoi(first[1], &reply.status);
  return reply;
}

inline HttpReply HttpGet(int port, const std::string& target) {
  return HttpRequestRaw(
      port,
      absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
}

// Sample key ("name{labels}") -> value of a text-format scrape.
inline std::map<std::string, double> ParseScrape(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == absl::string_view::npos ||
        !absl::SimpleAtod(line.substr(space + 1), &value)) {
      ADD_FAILURE() << "unparsable sample line: " << line;
      continue;
    }
    out[std::string(line.substr(0, space))] = value;
  }
  return out;
}

// Sum of every sample of `name` whose key contains all of `parts`.
inline double Sum(const std::map<std::string, double>& samples,
                  const std::string& name,
                  const std::vector<std::string>& parts = {}) {
  double sum = 0;
  for (const auto& [key, value] : samples) {
    if (key.substr(0, key.find('{')) != name) continue;
    bool all = true;
    for (const std::string& p : parts) all = all && absl::StrContains(key, p);
    if (all) sum += value;
  }
  return sum;
}

// Scrapes until `done` holds for the samples (metrics of an RPC are
// recorded in OnDone, just after the client has its reply), at most 5 s.
inline std::map<std::string, double> ScrapeUntil(
    int port,
    const std::function<bool(const std::map<std::string, double>&)>& done) {
  std::map<std::string, double> samples;
  for (int i = 0; i < 100; ++i) {
    HttpReply reply = HttpGet(port, "/metrics");
    samples = ParseScrape(reply.body);
    if (reply.status == 200 && done(samples)) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return samples;
}

// `promtool check metrics` on `text`: its exit status and output.
inline std::pair<int, std::string> Promtool(const std::string& text) {
  const std::string dir =
      std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string input =
      absl::StrCat(dir, "/matmul_scrape_", getpid(), ".txt");
  std::ofstream(input) << text;
  const char* promtool = std::getenv("PROMTOOL");
  const std::string command =
      absl::StrCat(promtool != nullptr ? promtool : "promtool",
                   " check metrics < ", input, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    output.append(buffer, n);
  }
  const int status = pclose(pipe);
  std::remove(input.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_METRICS_SCRAPE_CLIENT_H_
