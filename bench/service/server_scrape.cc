#include "bench/service/server_scrape.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace matmul {
namespace {

// One sample line "name{labels} value [timestamp]": its name, labels (the
// text between the braces) and value; false for comments and junk.
bool ParseSample(absl::string_view line, absl::string_view& name,
                 absl::string_view& labels, double& value) {
  if (line.empty() || line[0] == '#') return false;
  size_t end = line.find_first_of("{ ");
  if (end == absl::string_view::npos) return false;
  name = line.substr(0, end);
  labels = "";
  absl::string_view rest = line.substr(end);
  if (!rest.empty() && rest[0] == '{') {
    const size_t close = rest.rfind('}');
    if (close == absl::string_view::npos) return false;
    labels = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
  }
  rest = absl::StripLeadingAsciiWhitespace(rest);
  const size_t space = rest.find(' ');
  if (space != absl::string_view::npos) rest = rest.substr(0, space);
  return absl::SimpleAtod(rest, &value);
}

}  // namespace

ServerCounters ParseServerCounters(absl::string_view text) {
  ServerCounters c;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    absl::string_view name, labels;
    double v = 0;
    if (!ParseSample(absl::StripTrailingAsciiWhitespace(line), name, labels,
                     v)) {
      continue;
    }
    if (name == "matmul_device_compute_busy_seconds_total") {
      c.compute_busy_s += v;
    } else if (name == "matmul_device_busy_seconds_total") {
      c.device_busy_s += v;
    } else if (name == "matmul_requests_total") {
      if (absl::StrContains(labels, "method=\"Multiply\"") &&
          absl::StrContains(labels, "code=\"OK\"")) {
        c.multiplies_ok += v;
      } else if (absl::StrContains(labels, "method=\"MultiplyStream\"") &&
                 absl::StrContains(labels, "code=\"OK\"")) {
        c.stream_multiplies_ok += v;
      }
    } else if (name == "matmul_stream_jobs_total") {
      c.engine_jobs += v;
    } else if (name == "matmul_batch_size_count") {
      c.launches += v;
    } else if (name == "matmul_batch_size_sum") {
      c.launched_requests += v;
    }
  }
  return c;
}

ServerDelta Subtract(const ServerCounters& before, const ServerCounters& after,
                     bool streamed) {
  ServerDelta d;
  d.multiplies_ok =
      streamed ? after.stream_multiplies_ok - before.stream_multiplies_ok
               : after.multiplies_ok - before.multiplies_ok;
  d.compute_busy_s = after.compute_busy_s - before.compute_busy_s;
  d.device_busy_s = after.device_busy_s - before.device_busy_s;
  d.launches = after.launches - before.launches;
  d.launched_requests = after.launched_requests - before.launched_requests;
  if (d.multiplies_ok > 0) {
    d.compute_us_per_request = d.compute_busy_s * 1e6 / d.multiplies_ok;
    d.device_busy_us_per_request = d.device_busy_s * 1e6 / d.multiplies_ok;
    d.jobs_per_request =
        (after.engine_jobs - before.engine_jobs) / d.multiplies_ok;
  }
  return d;
}

absl::StatusOr<ScrapeTarget> ParseScrapeTarget(absl::string_view text) {
  ScrapeTarget t;
  absl::string_view rest = text;
  absl::ConsumePrefix(&rest, "http://");
  const size_t slash = rest.find('/');
  if (slash != absl::string_view::npos) {
    t.path = std::string(rest.substr(slash));
    rest = rest.substr(0, slash);
  }
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(rest.substr(colon + 1), &t.port) || t.port < 1 ||
      t.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--server-metrics takes HOST:PORT or http://HOST:PORT/PATH, got \"",
        text, "\""));
  }
  absl::string_view host = rest.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  t.host = std::string(host);
  return t;
}

absl::StatusOr<ServerCounters> Scrape(const ScrapeTarget& target,
                                      absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(target.port);
  if (int rc = getaddrinfo(target.host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("server metrics: cannot resolve ", target.host, ": ",
                     gai_strerror(rc)));
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("server metrics: cannot connect to ", target.host, ":",
                     target.port, ": ", std::strerror(errno)));
  }
  const std::string request =
      absl::StrCat("GET ", target.path, " HTTP/1.1\r\nHost: ", target.host,
                   "\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n =
        send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError("server metrics: send failed");
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[16384];
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
      close(fd);
      return absl::DeadlineExceededError("server metrics: no answer in time");
    }
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0) {
      close(fd);
      return absl::UnavailableError("server metrics: read failed");
    }
    if (n == 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos ||
      response.find(" 200", 0) > response.find("\r\n")) {
    return absl::UnavailableError(
        absl::StrCat("server metrics: not a 200 answer from ", target.host, ":",
                     target.port, target.path));
  }
  // The server answers with Content-Length, never chunked.
  return ParseServerCounters(absl::string_view(response).substr(body + 4));
}

absl::StatusOr<ServerCounters> ScrapeAfter(const ScrapeTarget& target,
                                           const ServerCounters& before,
                                           double client_ok, bool streamed,
                                           absl::Duration timeout,
                                           absl::Duration settle) {
  const absl::Time give_up = absl::Now() + settle;
  absl::StatusOr<ServerCounters> after = Scrape(target, timeout);
  while (after.ok() &&
         Subtract(before, *after, streamed).multiplies_ok < client_ok &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    after = Scrape(target, timeout);
  }
  return after;
}

}  // namespace matmul
