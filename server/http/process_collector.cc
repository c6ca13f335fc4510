#include "server/http/process_collector.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace matmul {
namespace {

prometheus::MetricFamily Single(std::string name, std::string help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

std::optional<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The fields of /proc/self/stat after the command name (which may hold
// spaces and parentheses, so it is skipped up to its last ')'): field 3
// (state) is [0], so field N is [N - 3].
std::optional<std::vector<std::string>> StatFields() {
  std::optional<std::string> stat = ReadAll("/proc/self/stat");
  if (!stat) return std::nullopt;
  const size_t paren = stat->rfind(')');
  if (paren == std::string::npos || paren + 2 > stat->size()) {
    return std::nullopt;
  }
  std::vector<std::string> fields =
      absl::StrSplit(stat->substr(paren + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 22) return std::nullopt;  // up to rss (field 24)
  return fields;
}

// The system's boot time, seconds since the epoch (/proc/stat btime).
std::optional<double> BootTime() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("btime ", 0) == 0) {
      double btime = 0;
      if (absl::SimpleAtod(line.substr(6), &btime)) return btime;
    }
  }
  return std::nullopt;
}

std::optional<int> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  int count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory stream's own descriptor
}

// Field 24, rss (pages), of /proc/self/stat's fields.
std::optional<int64_t> ResidentBytesOf(const std::vector<std::string>& f) {
  int64_t pages = 0;
  const long page = sysconf(_SC_PAGESIZE);
  if (page <= 0 || !absl::SimpleAtoi(f[21], &pages)) return std::nullopt;
  return pages * page;
}

}  // namespace

std::optional<int64_t> ResidentMemoryBytes() {
  std::optional<std::vector<std::string>> f = StatFields();
  return f ? ResidentBytesOf(*f) : std::nullopt;
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (std::optional<std::vector<std::string>> f = StatFields()) {
    double utime = 0, stime = 0, start = 0, vsize = 0;
    // Fields 14 utime, 15 stime (ticks), 22 starttime (ticks since boot),
    // 23 vsize (bytes), 24 rss (pages).
    if (absl::SimpleAtod((*f)[11], &utime) &&
        absl::SimpleAtod((*f)[12], &stime) && ticks > 0) {
      out.push_back(Single("process_cpu_seconds_total",
                           "Total user and system CPU time spent in seconds.",
                           MetricType::Counter, (utime + stime) / ticks));
    }
    if (std::optional<int64_t> rss = ResidentBytesOf(*f)) {
      out.push_back(Single("process_resident_memory_bytes",
                           "Resident memory size in bytes.", MetricType::Gauge,
                           static_cast<double>(*rss)));
    }
    if (absl::SimpleAtod((*f)[20], &vsize)) {
      out.push_back(Single("process_virtual_memory_bytes",
                           "Virtual memory size in bytes.", MetricType::Gauge,
                           vsize));
    }
    std::optional<double> boot = BootTime();
    if (boot && absl::SimpleAtod((*f)[19], &start) && ticks > 0) {
      out.push_back(
          Single("process_start_time_seconds",
                 "Start time of the process since unix epoch in seconds.",
                 MetricType::Gauge, *boot + start / ticks));
    }
  }
  if (std::optional<int> fds = OpenFds()) {
    out.push_back(Single("process_open_fds", "Number of open file descriptors.",
                         MetricType::Gauge, *fds));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY) {
    out.push_back(
        Single("process_max_fds", "Maximum number of open file descriptors.",
               MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

}  // namespace matmul
