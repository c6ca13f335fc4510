// MatmulServer: the whole server in one object, for main() and for tests. It
// owns the gRPC server (MatmulService, grpc.health.v1, reflection) and the
// engine, and runs the start-up and drain sequences.
#ifndef MATMUL_SERVER_MATMUL_SERVER_H_
#define MATMUL_SERVER_MATMUL_SERVER_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_args.h"
#include "gpu/engine.h"
#include "server/device_health_monitor.h"
#include "server/handle_registry.h"
#include "server/http/metrics_exporter.h"
#include "server/idle_memory_trimmer.h"
#include "server/request_limits.h"
#include "server/rpc/matmul_service.h"
#include "server/staging_copier.h"
#include "server/unix_socket_listener.h"

namespace matmul {

struct ServerOptions {
  // gRPC listening address, e.g. "0.0.0.0:50051" or "127.0.0.1:0".
  std::string listen_address = "0.0.0.0:50051";
  // The address clients elsewhere reach this server at, host:port (e.g. the
  // pod's IP and port), or a host alone, which gets the bound port (an IPv6
  // address in brackets or not: Kubernetes' status.podIP as it is):
  // stored-tensor handles name it, so that spreading clients send the calls
  // naming a handle here (common/handle_id.h). Empty:
  // listen_address's host and the bound port when that host is a concrete
  // IP address ("127.0.0.1:0" gives 127.0.0.1 and the port picked), else
  // none, and handles name no server ("h-" ids, which clients send over
  // their spread). Start fails (INVALID_ARGUMENT) for one that is neither
  // host:port nor a host.
  std::string advertise_address;
  // Credentials for listen_address: TLS or mutual TLS; null for plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Also listen on this unix socket path (plaintext; same-host clients,
  // protected by the file's permissions; server/unix_socket_listener.h);
  // empty: none.
  std::string unix_socket;
  // A plaintext listener that serves only grpc.health.v1, for probes that
  // cannot speak TLS (e.g. "0.0.0.0:8081"); empty: none.
  std::string health_address;
  // Most concurrent streams (RPCs) one client connection may open; 0 keeps
  // gRPC's default (unlimited).
  int max_concurrent_streams = 0;
  // Extra gRPC arguments (transport tuning), set after the ones above.
  GrpcArgs grpc_args;
  // Prometheus /metrics and /timeline over HTTP, e.g. "0.0.0.0:9464" or
  // "127.0.0.1:0"; empty: not served (metrics are still recorded).
  std::string metrics_address;
  RequestLimits limits;
  // Inline operands are copied from gRPC's buffers into engine staging by
  // the thread that dispatches the request, with these helper threads
  // taking part in one large copy at a time (server/staging_copier.h).
  StagingCopyOptions staging_copy;
  // Stored tensors (Upload, keep_result): quotas per client and lifetimes.
  HandleLimits handle_limits;
  // On Shutdown: how long health reports NOT_SERVING while RPCs are still
  // accepted, so that load balancers stop sending here first.
  absl::Duration drain_grace = absl::ZeroDuration();
  // Then: how long in-flight RPCs get to finish before they are cancelled.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Connections are closed (GOAWAY) after this age, plus the grace for
  // their RPCs, so that clients re-resolve and rebalance. Zero: never.
  absl::Duration max_connection_age = absl::ZeroDuration();
  absl::Duration max_connection_age_grace = absl::Seconds(60);
  // The server pings a connection that has been quiet this long and closes
  // it if the ping is not answered within the timeout, so that a client
  // that vanished without closing (a crashed node, a dropped NAT entry)
  // does not hold its RPCs and their memory. Zero: gRPC's default (2 h).
  absl::Duration keepalive_time = absl::Seconds(60);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // How often the engine's device health is looked at, and how long no
  // device may be healthy before the liveness health service turns
  // NOT_SERVING so that the pod is restarted (zero: never); see
  // server/device_health_monitor.h.
  absl::Duration health_check_interval = absl::Seconds(1);
  absl::Duration unhealthy_restart_after = absl::Seconds(60);
  // Clients with a label of their own in the per-client usage metrics (the
  // heaviest by GPU seconds: server/client_usage.h); the rest count as
  // client="other".
  int metrics_top_clients = 20;
  // Called once the port is bound, before the engine is built (health is
  // NOT_SERVING until then). Optional.
  std::function<void(int port)> on_listening;
  // Once no call has started and no work has been in flight for this long
  // after work, free heap memory goes back to the system
  // (server/idle_memory_trimmer.h); zero: never.
  absl::Duration trim_memory_after = absl::Seconds(2);
};

// Health service names. "" and kServiceName follow the gRPC convention;
// the probes use the two named ones: liveness stays SERVING while the
// process drains, readiness does not. With no healthy device left, all but
// liveness go NOT_SERVING, and liveness too once that has lasted
// ServerOptions::unhealthy_restart_after.
inline constexpr char kLivenessService[] = "liveness";
inline constexpr char kReadinessService[] = "readiness";
inline constexpr char kServiceName[] = "matmul.v1.MatmulService";

// Thread-safe.
class MatmulServer {
 public:
  using EngineProvider =
      absl::AnyInvocable<absl::StatusOr<std::unique_ptr<Engine>>() &&>;

  // Starts listening with health NOT_SERVING, then builds the engine with
  // `provider` and turns health SERVING. Fails if the address cannot be
  // bound or the engine cannot be built.
  static absl::StatusOr<std::unique_ptr<MatmulServer>> Start(
      const ServerOptions& options, EngineProvider provider);

  ~MatmulServer();

  // The bound port (useful with port 0).
  int port() const { return port_; }
  // The bound health-only port, or 0 if there is none.
  int health_port() const { return health_port_; }
  // The bound metrics port, or 0 if metrics are not served.
  int metrics_port() const {
    return metrics_ == nullptr ? 0 : metrics_->port();
  }
  Engine& engine() { return *engine_; }
  MatmulServiceImpl& service() { return *service_; }

  // Graceful stop: health NOT_SERVING; after drain_grace, new RPCs are
  // refused and in-flight ones get drain_timeout to finish; then the engine
  // stops. Idempotent; blocks until done.
  void Shutdown();

 private:
  explicit MatmulServer(const ServerOptions& options);
  // Serving statuses on the main server and the health-only one.
  void SetHealthEverywhere(bool ready, bool live = true);

  const ServerOptions options_;
  std::unique_ptr<MatmulServiceImpl> service_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<grpc::Server> server_;
  // Feeds server_ (so destroyed before it): the Unix socket's connections.
  std::unique_ptr<UnixSocketListener> unix_listener_;
  std::unique_ptr<grpc::Server> health_server_;
  int port_ = 0;
  int health_port_ = 0;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  // Sets health from the devices' health while serving; Shutdown stops it
  // before it sets NOT_SERVING for the drain.
  std::unique_ptr<DeviceHealthMonitor> health_monitor_;
  // Last: it reads the service and the engine, so it goes first. It keeps
  // serving through Shutdown, so that a scrape sees the drain.
  std::unique_ptr<MetricsExporter> metrics_;
  std::unique_ptr<IdleMemoryTrimmer> trimmer_;
};

// The version string reported by GetServerInfo and metrics.
std::string ServerVersion();

// The server-wide stored-tensor limit when --max-stored-bytes gives none:
// half of the GPUs' memory on the CUDA engine, a quarter of the host memory
// the process may use (RAM, or its cgroup's limit) on the host engine.
int64_t DefaultStoredBytes(const EngineInfo& info);

}  // namespace matmul

#endif  // MATMUL_SERVER_MATMUL_SERVER_H_
