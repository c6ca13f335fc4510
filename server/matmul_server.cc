#include "server/matmul_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/handle_id.h"
#include "common/log.h"
#include "server/unix_socket_listener.h"

namespace matmul {
namespace {

// A duration as a gRPC channel argument in milliseconds (capped at INT_MAX).
int Milliseconds(absl::Duration d) {
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(d), INT_MAX));
}

void SetHealth(grpc::Server& server, bool ready, bool live) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", ready);
  health->SetServingStatus(kServiceName, ready);
  health->SetServingStatus(kReadinessService, ready);
  // Liveness: the process is up and its event loop answers, and it has
  // not been without a healthy device for too long (DeviceHealthMonitor).
  health->SetServingStatus(kLivenessService, live);
}

// The transport settings of the gRPC port: message sizes, connection ages,
// keepalives, and --grpc-arg's extras last.
void SetChannelArguments(const ServerOptions& options,
                         grpc::ServerBuilder& builder) {
  if (options.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               options.max_concurrent_streams);
  }
  const int max_message = static_cast<int>(
      std::min<int64_t>(options.limits.max_message_bytes, INT_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // Without this, gRPC sets SO_REUSEPORT and a second server on a busy port
  // would silently share it instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               Milliseconds(options.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               Milliseconds(options.max_connection_age_grace));
  }
  if (options.keepalive_time > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                               Milliseconds(options.keepalive_time));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                               Milliseconds(options.keepalive_timeout));
  }
  // Clients may keep their connections alive with pings of their own, down
  // to every 10 s and while idle; gRPC's server default (5 min) would answer
  // such a client with GOAWAY "too_many_pings".
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  for (const auto& [name, value] : options.grpc_args) {
    builder.AddChannelArgument(name, value);
  }
}

// Host memory this process may use: physical RAM, or the cgroup's limit
// when it has a smaller one (a container).
int64_t HostMemoryBytes() {
  int64_t bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
                  static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  int64_t limit = 0;
  if (cgroup >> limit && limit > 0) bytes = std::min(bytes, limit);
  return bytes;
}

}  // namespace

int64_t DefaultStoredBytes(const EngineInfo& info) {
  int64_t device_bytes = 0;
  for (const DeviceInfo& d : info.devices) device_bytes += d.memory_bytes;
  // Half of the GPUs' memory (the rest for the multiplies themselves); on
  // the host engine a quarter of what the process may use.
  return device_bytes > 0 ? device_bytes / 2 : HostMemoryBytes() / 4;
}

std::string ServerVersion() { return std::string(ProjectVersion()); }

MatmulServer::MatmulServer(const ServerOptions& options) : options_(options) {}

void MatmulServer::SetHealthEverywhere(bool ready, bool live) {
  if (server_ != nullptr) SetHealth(*server_, ready, live);
  if (health_server_ != nullptr) SetHealth(*health_server_, ready, live);
}

MatmulServer::~MatmulServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<MatmulServer>> MatmulServer::Start(
    const ServerOptions& options, EngineProvider provider) {
  if (!options.advertise_address.empty()) {
    // Checked before anything is bound; resolved with the bound port below.
    if (absl::StatusOr<std::string> checked =
            ResolveAdvertiseAddress(options.advertise_address, 1);
        !checked.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--advertise-address: ", checked.status().message()));
    }
  }
  std::unique_ptr<MatmulServer> self(new MatmulServer(options));
  self->service_ = std::make_unique<MatmulServiceImpl>(
      options.limits, options.handle_limits, ServerVersion(),
      options.staging_copy);
  self->service_->metrics()->client_usage().SetMaxClients(
      options.metrics_top_clients);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address,
                           options.credentials != nullptr
                               ? options.credentials
                               : grpc::InsecureServerCredentials(),
                           &self->port_);
  // The Unix socket is accepted by the server itself, so that shared-memory
  // calls can read their peer's credentials (server/unix_socket_listener.h);
  // bound now, so that a busy path fails the start as a port would.
  if (!options.unix_socket.empty()) {
    absl::StatusOr<std::unique_ptr<UnixSocketListener>> unix_listener =
        UnixSocketListener::Create(options.unix_socket);
    if (!unix_listener.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on unix:", options.unix_socket, ": ",
                       unix_listener.status().message()));
    }
    self->unix_listener_ = std::move(*unix_listener);
  }
  SetChannelArguments(options, builder);
  builder.RegisterService(self->service_.get());
  self->server_ = builder.BuildAndStart();
  if (self->server_ == nullptr || self->port_ == 0) {
    self->unix_listener_.reset();
    if (self->server_ != nullptr) self->server_->Shutdown();
    self->server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address));
  }
  // Handles name this server from the first one on.
  if (!options.advertise_address.empty()) {
    self->service_->handles().SetHome(
        ResolveAdvertiseAddress(options.advertise_address, self->port_)
            .value_or(""));
  } else if (std::optional<std::string> home =
                 DefaultAdvertiseAddress(options.listen_address, self->port_)) {
    self->service_->handles().SetHome(*home);
  }
  if (self->unix_listener_ != nullptr) {
    self->unix_listener_->Start(self->server_.get());
  }
  if (!options.health_address.empty()) {
    grpc::ServerBuilder health_builder;
    health_builder.AddListeningPort(options.health_address,
                                    grpc::InsecureServerCredentials(),
                                    &self->health_port_);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    self->health_server_ = health_builder.BuildAndStart();
    if (self->health_server_ == nullptr || self->health_port_ == 0) {
      self->health_server_.reset();
      self->Shutdown();
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", options.health_address));
    }
  }
  self->SetHealthEverywhere(/*ready=*/false);
  // Metrics come up before the engine, so that a slow start is visible.
  if (!options.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsExporter>> metrics =
        MetricsExporter::Start(options.metrics_address, self->service_.get(),
                               ServerVersion());
    if (!metrics.ok()) {
      self->Shutdown();
      return metrics.status();
    }
    self->metrics_ = std::move(*metrics);
  }
  if (options.on_listening) options.on_listening(self->port_);

  absl::StatusOr<std::unique_ptr<Engine>> engine = std::move(provider)();
  if (!engine.ok()) {
    self->Shutdown();
    return engine.status();
  }
  self->engine_ = std::move(*engine);
  self->service_->handles().SetDefaultTotalBytes(
      DefaultStoredBytes(self->engine_->info()));
  self->service_->SetEngine(self->engine_.get());
  self->SetHealthEverywhere(/*ready=*/true);
  if (options.trim_memory_after > absl::ZeroDuration()) {
    MatmulServiceImpl* service = self->service_.get();
    self->trimmer_ = std::make_unique<IdleMemoryTrimmer>(
        options.trim_memory_after, [service] {
          return IdleMemoryTrimmer::Activity{service->calls_started(),
                                             service->inflight_requests() > 0};
        });
    self->trimmer_->Start();
  }
  MatmulServer* server = self.get();
  self->health_monitor_ = std::make_unique<DeviceHealthMonitor>(
      self->engine_.get(), options.health_check_interval,
      options.unhealthy_restart_after, [server](HealthVerdict verdict) {
        server->SetHealthEverywhere(verdict.serving, verdict.live);
      });
  return self;
}

void MatmulServer::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  trimmer_.reset();
  // No health change from the devices after this: the drain's own follows.
  health_monitor_.reset();
  if (server_ != nullptr && engine_ == nullptr) {
    // Start failed (no engine): nothing was served, nothing to drain.
    SetHealthEverywhere(/*ready=*/false);
    service_->StartDraining();
    unix_listener_.reset();
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
  } else if (server_ != nullptr) {
    SetHealthEverywhere(/*ready=*/false);
    if (options_.drain_grace > absl::ZeroDuration()) {
      LogLine(absl::StrCat("draining: NOT_SERVING for ",
                           absl::FormatDuration(options_.drain_grace),
                           " before refusing new requests"));
      absl::SleepFor(options_.drain_grace);
    }
    // Refuse new work (UNAVAILABLE) while the admitted work finishes;
    // streams with nothing open end at once. At the deadline, what still
    // runs is answered UNAVAILABLE (retryable) by the service itself, and
    // the transport stops.
    service_->StartDraining();
    const absl::Time deadline = absl::Now() + options_.drain_timeout;
    LogLine(absl::StrCat("draining: ", service_->inflight_requests(),
                         " requests in flight, waiting up to ",
                         absl::FormatDuration(options_.drain_timeout)));
    if (!service_->AwaitCallsEnded(deadline)) {
      LogLine(absl::StrCat("draining: ending ", service_->inflight_requests(),
                           " requests still in flight with UNAVAILABLE"));
      service_->CutCallsForDrain();
    }
    // Calls the service has finished may still have bytes queued in the
    // transport: gRPC's Shutdown flushes them until its deadline, and only
    // cancels (losing them) after it. A second, at least, for the cut ones.
    // No new connection on the Unix socket from here, as on gRPC's ports.
    unix_listener_.reset();
    server_->Shutdown(
        absl::ToChronoTime(std::max(deadline, absl::Now() + absl::Seconds(1))));
  }
  if (health_server_ != nullptr) health_server_->Shutdown();
  // Stored tensors live in engine memory: free them before the engine goes.
  if (service_ != nullptr) service_->handles().Clear();
  // Registrations end with their calls; this drops any left (a start that
  // failed). Regions multiplies still use go when the engine has run them.
  if (service_ != nullptr) service_->regions().Clear();
  if (engine_ != nullptr) engine_->Shutdown();
}

}  // namespace matmul
