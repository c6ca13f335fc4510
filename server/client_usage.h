// ClientUsage: what each client used of the engine, for charge-back:
//
//   matmul_client_gpu_seconds_total{client}          counter
//   matmul_client_bytes_total{client,direction}      counter (h2d, d2h)
//
// `client` is the id stored tensors are charged to (ClientKey in
// server/rpc/stored_tensors.h: the mTLS certificate's identity, else the
// x-matmul-client header, else the peer address).
//
// Cardinality is bounded whatever the number of client ids: the
// `max_clients` heaviest clients by GPU seconds have a label of their own,
// and everything else is summed under client="other". A client takes a
// label when its GPU seconds pass those of the lightest labelled client
// (which then gives its label up) or while labels are free. A labelled
// client's series counts its use from when it took the label; a client
// that gives its label up adds what its series counted to "other", and
// its series stops. So no series ever goes down, every job is counted in
// exactly one series (the series sum to all use), and a scrape has at most
// max_clients + 1 clients.
//
// To rank clients without a table that grows with every id ever seen,
// GPU seconds are tracked for at most TrackedClients() ids at once, by the
// space-saving method (Metwally et al., 2005): a new id past that replaces
// the unlabelled id with the least seconds and starts from its count. A
// count may thus be over a client's own use by what the id it replaced
// had, never under, and any client with more than 1/TrackedClients() of
// all GPU seconds is tracked. Only the ranking uses these counts; the
// series count jobs exactly.
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
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
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
  // Client ids tracked for ranking: at least this many, and
  // kTrackedPerLabel per label.
  static constexpr size_t kMinTrackedClients = 1024;
  static constexpr size_t kTrackedPerLabel = 8;

  explicit ClientUsage(int max_clients = 20) { SetMaxClients(max_clients); }

  // Labels from now on (negative counts as 0: everyone is "other"). With
  // fewer than are held, the lightest labelled clients give theirs up.
  void SetMaxClients(int max_clients);

  // One finished job of `client`.
  void Record(absl::string_view client, const StageTimings& timings,
              BusBytes bytes);

  std::vector<prometheus::MetricFamily> Collect() const override;

  // Ids tracked for ranking at most.
  size_t TrackedClients() const;

 private:
  struct Usage {
    double gpu_seconds = 0;
    int64_t h2d_bytes = 0;
    int64_t d2h_bytes = 0;
    void Add(const Usage& other);
  };
  struct Tracked {
    std::string id;
    // GPU seconds for ranking (space-saving count: see above).
    double rank_seconds = 0;
    bool labeled = false;
    // Use since the label was taken; empty while unlabelled.
    Usage series;
  };

  // Takes `client` a label if it now ranks among the top max_clients_,
  // taking the lightest holder's if none is free.
  void MaybeLabelLocked(Tracked& client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `client` gives its label up; its series goes into other_.
  void UnlabelLocked(Tracked& client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The labelled client with the fewest rank seconds (labeled_ not empty).
  std::vector<Tracked*>::iterator LightestLabeledLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes room for one more tracked id: drops the unlabelled ones with the
  // fewest rank seconds, and returns the last one's count (0 if there was
  // room): the newcomer's starting count.
  double MakeRoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  int max_clients_ ABSL_GUARDED_BY(mu_) = 0;
  size_t capacity_ ABSL_GUARDED_BY(mu_) = kMinTrackedClients;
  // Node-based: labeled_ points into it.
  absl::node_hash_map<std::string, Tracked> tracked_ ABSL_GUARDED_BY(mu_);
  std::vector<Tracked*> labeled_ ABSL_GUARDED_BY(mu_);
  // Unlabelled clients' use, and the series of clients that gave up their
  // label.
  Usage other_ ABSL_GUARDED_BY(mu_);
};

}  // namespace matmul

#endif  // MATMUL_SERVER_CLIENT_USAGE_H_
