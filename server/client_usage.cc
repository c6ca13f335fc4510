#include "server/client_usage.h"

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

void ClientUsage::SetMaxClients(int max_clients) {
  absl::MutexLock lock(&mu_);
  max_clients_ = max_clients;
}

void ClientUsage::Record(absl::string_view client, const StageTimings& timings,
                         BusBytes bytes) {
  client = client.substr(0, kMaxClientLength);
  const double seconds =
      (timings.h2d + timings.compute + timings.d2h) * timings.share;
  absl::MutexLock lock(&mu_);
  Usage* usage = &other_;
  if (auto it = clients_.find(client); it != clients_.end()) {
    usage = &it->second;
  } else if (static_cast<int>(clients_.size()) < max_clients_ &&
             client != kOther) {
    usage = &clients_[std::string(client)];
  }
  usage->gpu_seconds += seconds;
  usage->h2d_bytes += bytes.h2d;
  usage->d2h_bytes += bytes.d2h;
}

std::vector<prometheus::MetricFamily> ClientUsage::Collect() const {
  prometheus::MetricFamily seconds = Family(
      "matmul_client_gpu_seconds_total",
      "Device time (h2d + compute + d2h stages) of the client's jobs; the "
      "first --metrics-top-clients clients have their own label, the rest "
      "are summed under client=\"other\".");
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
  for (const auto& [client, usage] : clients_) add(client, usage);
  add(kOther, other_);
  std::vector<prometheus::MetricFamily> out;
  out.push_back(std::move(seconds));
  out.push_back(std::move(bytes));
  return out;
}

}  // namespace matmul
