// ClientUsage: what each client used of the engine, for charge-back:
//
//   matmul_client_gpu_seconds_total{client}          counter
//   matmul_client_bytes_total{client,direction}      counter (h2d, d2h)
//
// `client` is the id stored tensors are charged to (ClientKey in
// server/rpc/stored_tensors.h: the mTLS certificate's identity, else the
// x-matmul-client header, else the peer address). Cardinality is bounded:
// the first `max_clients` clients to finish a job get a label of their own
// and keep it for the life of the process; every later client is summed
// under client="other". So each series only grows (a client never moves
// between labels), and a scrape has at most max_clients + 1 clients. With
// few clients each has its own series; with many, the heavy long-lived
// ones (those that were there first: the pipelines, not the one-off tools)
// keep theirs and the rest is still counted in "other".
//
// GPU seconds of a job are its device stages (h2d + compute + d2h; CUDA
// events on the CUDA engine, host clocks on the host engine); bytes are
// what it moved between host and device memory. A request merged into a
// batch of n (BatchingEngine) carries the batch's stage times with share
// 1/n, and is charged that share of them.
//
// Thread-safe: Record and Collect may run on any threads at once.
#ifndef MATMUL_SERVER_CLIENT_USAGE_H_
#define MATMUL_SERVER_CLIENT_USAGE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "gpu/engine.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace matmul {

// Bytes a job moves between host and device memory: staged operands in,
// a returned product out (nothing for resident operands or a kept result).
struct BusBytes {
  int64_t h2d = 0;
  int64_t d2h = 0;
};
BusBytes JobBusBytes(const JobDescription& description);

class ClientUsage final : public prometheus::Collectable {
 public:
  // The label that sums every client without one of its own.
  static constexpr char kOther[] = "other";
  // Client ids longer than this are cut to it in the label.
  static constexpr size_t kMaxClientLength = 128;

  explicit ClientUsage(int max_clients = 20) : max_clients_(max_clients) {}

  // Clients given a label of their own from now on (those that have one
  // keep it). Negative counts as 0: everyone is "other".
  void SetMaxClients(int max_clients);

  // One finished job of `client`.
  void Record(absl::string_view client, const StageTimings& timings,
              BusBytes bytes);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct Usage {
    double gpu_seconds = 0;
    int64_t h2d_bytes = 0;
    int64_t d2h_bytes = 0;
  };

  mutable absl::Mutex mu_;
  int max_clients_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Usage, std::less<>> clients_ ABSL_GUARDED_BY(mu_);
  Usage other_ ABSL_GUARDED_BY(mu_);
};

}  // namespace matmul

#endif  // MATMUL_SERVER_CLIENT_USAGE_H_
