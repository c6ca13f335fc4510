#include "server/client_usage.h"

#include <algorithm>
#include <utility>
#include <variant>

namespace matmul {
namespace {

prometheus::MetricFamily Family(std::string name, std::string help) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = prometheus::MetricType::Counter;
  return family;
}

void Add(prometheus::MetricFamily& family,
         std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  metric.counter.value = value;
  family.metric.push_back(std::move(metric));
}

}  // namespace

BusBytes JobBusBytes(const JobDescription& description) {
  const MatmulSpec& spec = description.spec;
  BusBytes bytes;
  if (const auto* multiply = std::get_if<MultiplyOp>(&description.op)) {
    bytes.h2d = (multiply->resident_a ? 0 : spec.a_bytes()) +
                (multiply->resident_b ? 0 : spec.b_bytes());
    bytes.d2h = multiply->keep_result ? 0 : spec.c_bytes();
  } else if (std::holds_alternative<UploadOp>(description.op)) {
    bytes.h2d = spec.a_bytes();
  } else if (std::holds_alternative<DownloadOp>(description.op)) {
    bytes.d2h = spec.c_bytes();
  }
  return bytes;
}

void ClientUsage::Usage::Add(const Usage& other) {
  gpu_seconds += other.gpu_seconds;
  h2d_bytes += other.h2d_bytes;
  d2h_bytes += other.d2h_bytes;
}

void ClientUsage::SetMaxClients(int max_clients) {
  absl::MutexLock lock(&mu_);
  max_clients_ = std::max(max_clients, 0);
  capacity_ = std::max(kMinTrackedClients,
                       kTrackedPerLabel * static_cast<size_t>(max_clients_));
  while (static_cast<int>(labeled_.size()) > max_clients_) {
    auto lightest = LightestLabeledLocked();
    Tracked* client = *lightest;
    labeled_.erase(lightest);
    UnlabelLocked(*client);
  }
}

size_t ClientUsage::TrackedClients() const {
  absl::MutexLock lock(&mu_);
  return capacity_;
}

std::vector<ClientUsage::Tracked*>::iterator
ClientUsage::LightestLabeledLocked() {
  return std::min_element(labeled_.begin(), labeled_.end(),
                          [](const Tracked* x, const Tracked* y) {
                            return x->rank_seconds < y->rank_seconds;
                          });
}

void ClientUsage::UnlabelLocked(Tracked& client) {
  other_.Add(client.series);
  client.series = Usage{};
  client.labeled = false;
}

void ClientUsage::MaybeLabelLocked(Tracked& client) {
  if (max_clients_ <= 0) return;
  if (static_cast<int>(labeled_.size()) >= max_clients_) {
    auto lightest = LightestLabeledLocked();
    // Strictly heavier: equals do not trade labels back and forth.
    if (client.rank_seconds <= (*lightest)->rank_seconds) return;
    Tracked* previous = *lightest;
    labeled_.erase(lightest);
    UnlabelLocked(*previous);
  }
  client.labeled = true;
  labeled_.push_back(&client);
}

double ClientUsage::MakeRoomLocked() {
  double floor = 0;
  // capacity_ > max_clients_ >= labelled clients, so an unlabelled one
  // exists. A linear pass, only when a new id comes to a full table (more
  // than one only after SetMaxClients lowered the capacity).
  while (tracked_.size() >= capacity_) {
    auto victim = tracked_.end();
    for (auto it = tracked_.begin(); it != tracked_.end(); ++it) {
      if (it->second.labeled) continue;
      if (victim == tracked_.end() ||
          it->second.rank_seconds < victim->second.rank_seconds) {
        victim = it;
      }
    }
    floor = victim->second.rank_seconds;
    // Its use is in other_ already (an unlabelled client's always is).
    tracked_.erase(victim);
  }
  return floor;
}

void ClientUsage::Record(absl::string_view client, const StageTimings& timings,
                         BusBytes bytes) {
  client = client.substr(0, kMaxClientLength);
  Usage usage;
  usage.gpu_seconds =
      (timings.h2d + timings.compute + timings.d2h) * timings.share;
  usage.h2d_bytes = bytes.h2d;
  usage.d2h_bytes = bytes.d2h;
  absl::MutexLock lock(&mu_);
  if (max_clients_ <= 0 || client == kOther) {
    other_.Add(usage);
    return;
  }
  auto it = tracked_.find(client);
  if (it == tracked_.end()) {
    const double floor = MakeRoomLocked();
    it = tracked_.emplace(std::string(client), Tracked{}).first;
    it->second.id = std::string(client);
    it->second.rank_seconds = floor;
  }
  Tracked& tracked = it->second;
  tracked.rank_seconds += usage.gpu_seconds;
  if (!tracked.labeled) MaybeLabelLocked(tracked);
  (tracked.labeled ? tracked.series : other_).Add(usage);
}

std::vector<prometheus::MetricFamily> ClientUsage::Collect() const {
  prometheus::MetricFamily seconds = Family(
      "matmul_client_gpu_seconds_total",
      "Device time (h2d + compute + d2h stages) of the client's jobs since "
      "it took its label; the --metrics-top-clients heaviest clients by "
      "device time have their own label, the rest (and what clients that "
      "gave their label up had counted) are summed under "
      "client=\"other\".");
  prometheus::MetricFamily bytes = Family(
      "matmul_client_bytes_total",
      "Bytes the client's jobs moved between host and device memory, by "
      "direction (h2d, d2h); clients as in matmul_client_gpu_seconds_total.");
  absl::MutexLock lock(&mu_);
  auto add = [&](const std::string& client, const Usage& usage) {
    const prometheus::ClientMetric::Label label{"client", client};
    Add(seconds, {label}, usage.gpu_seconds);
    Add(bytes, {label, {"direction", "d2h"}},
        static_cast<double>(usage.d2h_bytes));
    Add(bytes, {label, {"direction", "h2d"}},
        static_cast<double>(usage.h2d_bytes));
  };
  std::vector<const Tracked*> labeled(labeled_.begin(), labeled_.end());
  std::sort(labeled.begin(), labeled.end(),
            [](const Tracked* x, const Tracked* y) { return x->id < y->id; });
  for (const Tracked* client : labeled) add(client->id, client->series);
  add(kOther, other_);
  std::vector<prometheus::MetricFamily> out;
  out.push_back(std::move(seconds));
  out.push_back(std::move(bytes));
  return out;
}

}  // namespace matmul
