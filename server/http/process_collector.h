// ProcessCollector: the standard process_* series every Prometheus client
// library exports (prometheus-cpp does not), read from /proc at each
// scrape, with the names and meanings of the Go and Python clients:
//
//   process_cpu_seconds_total          user + system CPU time
//   process_resident_memory_bytes      RSS
//   process_virtual_memory_bytes       virtual memory size
//   process_open_fds                   open file descriptors
//   process_max_fds                    the soft RLIMIT_NOFILE
//   process_start_time_seconds         start, seconds since the Unix epoch
//
// A value that cannot be read (no /proc: not Linux) is left out, not
// reported as 0.
//
// Thread-safe (Collect keeps no state).
#ifndef MATMUL_SERVER_HTTP_PROCESS_COLLECTOR_H_
#define MATMUL_SERVER_HTTP_PROCESS_COLLECTOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace matmul {

class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// This process's resident memory (process_resident_memory_bytes), or
// nullopt where /proc/self/stat cannot be read.
std::optional<int64_t> ResidentMemoryBytes();

}  // namespace matmul

#endif  // MATMUL_SERVER_HTTP_PROCESS_COLLECTOR_H_
