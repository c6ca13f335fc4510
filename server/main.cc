// matmul-server: flags, signals and start-up. Everything else lives in
// MatmulServer. Flags may be written with dashes or underscores
// (--max-message-bytes or --max_message_bytes); common/command_line.h
// parses them.
//
// Exit status: 0 after a clean shutdown (SIGTERM, SIGINT; repeated
// SIGTERMs during the drain change nothing), --help or --version; 1 when
// the server cannot start (a port in use, no CUDA device for
// --engine=cuda); 2 for a usage error; 130 when a SIGINT during the drain
// cut it short.
#include <grpcpp/security/server_credentials.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/build_info.h"
#include "common/command_line.h"
#include "common/dtype.h"
#include "common/grpc_args.h"
#include "common/log.h"
#include "common/mutex_mode.h"
#include "gpu/engine_factory.h"
#include "server/matmul_server.h"
#include "server/peer_credentials.h"
#include "server/shutdown_signals.h"

ABSL_FLAG(std::string, host, "0.0.0.0",
          "Address to listen on for gRPC (0.0.0.0, ::, 127.0.0.1, ...)");
ABSL_FLAG(int32_t, port, 50051, "gRPC port (0 picks a free one)");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port clients elsewhere reach this server at (e.g. the pod's "
          "IP and port; a host alone gets --port); stored-tensor handles "
          "name it so that spreading clients send calls naming a handle "
          "here. Empty: --host and the port when --host is a concrete IP "
          "address, else handles name no server");
ABSL_FLAG(int32_t, metrics_port, 9464,
          "Prometheus /metrics HTTP port (0 disables)");
ABSL_FLAG(std::string, engine, "auto",
          "auto (CUDA if a GPU is visible, else host), cuda or host");
ABSL_FLAG(int32_t, streams_per_device, 4,
          "CUDA streams per GPU (host engine: worker lanes)");
ABSL_FLAG(int64_t, pinned_pool_bytes, int64_t{4} << 30,
          "Pinned staging memory per GPU, bytes (CUDA engine)");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{1} << 30,
          "Largest request or response message, bytes (at most 2^31-1)");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{8} << 30,
          "Operand and result bytes held by requests in flight; beyond it "
          "requests get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_elements_per_operand, int64_t{1} << 31,
          "Largest operand or result, elements");
ABSL_FLAG(absl::Duration, stripe_join_timeout, absl::Seconds(10),
          "How long a MultiplyStream call joining a striped multiply waits "
          "for the call that starts it (NOT_FOUND after that); at most 10m");
ABSL_FLAG(absl::Duration, drain_grace, absl::ZeroDuration(),
          "On SIGTERM: report NOT_SERVING this long before refusing new "
          "requests (let load balancers catch up)");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM: how long in-flight requests get to finish");
ABSL_FLAG(absl::Duration, trim_memory_after, absl::Seconds(2),
          "Once no call has started and nothing has been in flight for this "
          "long after work, give freed heap memory back to the system "
          "(malloc_trim); 0 disables");
ABSL_FLAG(absl::Duration, unhealthy_restart_after, absl::Seconds(60),
          "With no healthy device left (a failed GPU), readiness turns "
          "NOT_SERVING at once; after this long liveness does too, so that "
          "the pod is restarted; 0 never fails liveness for it");
ABSL_FLAG(int32_t, metrics_top_clients, 20,
          "Clients with their own label in matmul_client_* metrics (the "
          "heaviest by GPU seconds); the rest count as client=\"other\"");
ABSL_FLAG(absl::Duration, max_connection_age, absl::Minutes(5),
          "Close client connections (with GOAWAY) after this long, so that "
          "long-lived clients rebalance across replicas; 0 disables");
ABSL_FLAG(int64_t, batch_window_us, 1000,
          "While every stream is busy, small multiplies of one shape and "
          "dtype wait at most this long to go out as one batched GEMM; 0 "
          "when each request must run on its own, whatever the throughput");
ABSL_FLAG(int64_t, completion_poll_us, 1000,
          "CUDA engine: how long a thread polls the GPU for finished work "
          "after each submit, keeping a core busy meanwhile; 0 on a node "
          "short of CPU (small requests then wait for CUDA's callbacks)");
ABSL_FLAG(std::string, unix_socket, "",
          "Also listen on this unix socket path (plaintext, same host)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve gRPC over TLS (with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mTLS)");
ABSL_FLAG(int32_t, health_port, 0,
          "Plaintext port serving only grpc.health.v1, for probes that "
          "cannot speak TLS (0: none)");
ABSL_FLAG(int32_t, max_concurrent_streams, 1024,
          "Most concurrent RPCs one client connection may have open");
ABSL_FLAG(std::string, grpc_arg, "",
          "Extra gRPC server arguments, NAME=INTEGER[,NAME=INTEGER...], for "
          "transport settings no other flag covers");
ABSL_FLAG(int64_t, max_stored_bytes_per_client, int64_t{64} << 30,
          "Engine memory one client may hold in stored tensors, bytes");
ABSL_FLAG(int64_t, max_stored_bytes, 0,
          "Bytes of stored tensors for all clients together (0: half of the "
          "GPUs' memory, or a quarter of host memory on the host engine); "
          "the per-client limit never exceeds it");
ABSL_FLAG(int64_t, max_handles_per_client, 4096,
          "Stored tensors one client may hold");
ABSL_FLAG(int64_t, max_shared_memory_regions_per_client, 64,
          "Shared-memory regions one client may hold registered "
          "(RegisterSharedMemory, Unix socket only); their bytes count "
          "against the stored-bytes limits");
ABSL_FLAG(std::string, shared_memory_peers, "",
          "Users and groups besides the server's own user that may register "
          "shared memory over the Unix socket: user:NAME, user:UID, "
          "group:NAME or group:GID, comma-separated (a bare NAME is a user)");
ABSL_FLAG(absl::Duration, default_handle_ttl, absl::Minutes(10),
          "Lifetime of a stored tensor when the request gives none");
ABSL_FLAG(absl::Duration, max_handle_ttl, absl::Hours(24),
          "Longest lifetime a request may ask for");
ABSL_FLAG(absl::Duration, max_connection_age_grace, absl::Seconds(60),
          "Time RPCs get to finish on a connection closed for its age");
ABSL_FLAG(absl::Duration, keepalive_time, absl::Seconds(60),
          "Ping a client connection that has been quiet this long, and close "
          "it (cancelling its RPCs) if the ping goes unanswered for "
          "--keepalive-timeout; 0: gRPC's default (2h)");
ABSL_FLAG(absl::Duration, keepalive_timeout, absl::Seconds(20),
          "How long a keepalive ping may go unanswered");

namespace {

// --help's groups; every flag here can also come from the environment as
// MATMUL_<NAME> (e.g. MATMUL_ENGINE=cuda, MATMUL_MAX_MESSAGE_BYTES=...); the
// command line wins.
const std::vector<matmul::FlagGroup>& ServerFlags() {
  static const auto* groups = new std::vector<matmul::FlagGroup>{
      {"Listening",
       {"host=ADDRESS", "port", "unix_socket=PATH", "metrics_port",
        "health_port"}},
      {"TLS", {"tls_cert=FILE", "tls_key=FILE", "tls_client_ca=FILE"}},
      {"Engine",
       {"engine=auto|cuda|host", "streams_per_device", "pinned_pool_bytes"}},
      {"Request limits", {"max_message_bytes", "max_inflight_bytes"}},
      {"Stored tensors and shared memory",
       {"max_stored_bytes", "max_stored_bytes_per_client",
        "max_handles_per_client", "default_handle_ttl", "max_handle_ttl",
        "max_shared_memory_regions_per_client",
        "shared_memory_peers=USER|group:GROUP,..."}},
      {"Connections", {"max_connection_age", "keepalive_time"}},
      {"Draining (SIGTERM)", {"drain_grace", "drain_timeout"}},
      {"Health", {"unhealthy_restart_after"}},
  };
  return *groups;
}

// Flags an operator rarely sets, listed by --helpfull only.
const std::vector<matmul::FlagGroup>& TuningFlags() {
  static const auto* groups = new std::vector<matmul::FlagGroup>{
      {"Tuning",
       {"batch_window_us", "completion_poll_us", "max_elements_per_operand",
        "stripe_join_timeout=DURATION", "max_concurrent_streams",
        "max_connection_age_grace", "keepalive_timeout",
        "grpc_arg=NAME=INT,...", "trim_memory_after", "metrics_top_clients",
        "advertise_address=HOST[:PORT]"}},
  };
  return *groups;
}

// Every flag: --help's groups, then the tuning ones.
std::vector<matmul::FlagGroup> AllFlags() {
  std::vector<matmul::FlagGroup> all = ServerFlags();
  for (const matmul::FlagGroup& g : TuningFlags()) all.push_back(g);
  return all;
}

constexpr char kUsage[] =
    "matmul-server: multiplies matrices for gRPC clients on GPUs (or the "
    "CPU)\n"
    "\n"
    "usage: matmul-server [--flag=VALUE | --flag VALUE]...\n"
    "\n"
    "Flags are spelled with dashes (or underscores: --max_message_bytes).\n"
    "Each can also come from the environment as MATMUL_<NAME>, e.g.\n"
    "MATMUL_ENGINE=cuda or MATMUL_MAX_MESSAGE_BYTES=65536; the command line\n"
    "wins. --version prints the version, commit and CUDA versions;\n"
    "--helpfull adds the tuning flags, which most deployments leave alone.\n"
    "\n";

// The contents of a file named by a flag.
absl::StatusOr<std::string> ReadFile(const std::string& flag,
                                     const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--", flag, ": cannot read ", path));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// TLS credentials from the --tls-* flags; null when TLS is off.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsCredentials() {
  const std::string cert_path = absl::GetFlag(FLAGS_tls_cert);
  const std::string key_path = absl::GetFlag(FLAGS_tls_key);
  const std::string ca_path = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert_path.empty() && key_path.empty()) {
    if (!ca_path.empty()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca needs --tls-cert and --tls-key");
    }
    return std::shared_ptr<grpc::ServerCredentials>();
  }
  if (cert_path.empty() || key_path.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  absl::StatusOr<std::string> cert = ReadFile("tls_cert", cert_path);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile("tls_key", key_path);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      ca_path.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!ca_path.empty()) {
    absl::StatusOr<std::string> ca = ReadFile("tls_client_ca", ca_path);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  return grpc::SslServerCredentials(ssl);
}

// The MATMUL_<NAME> variables as --name=value arguments, then the command
// line's (argv[1..]), so that the command line wins.
std::vector<std::string> ArgsWithEnvironment(int argc, char** argv) {
  std::vector<std::string> args;
  for (const std::string& name : matmul::FlagsOf(AllFlags())) {
    std::string env = absl::StrCat("MATMUL_", name);
    for (char& c : env) c = static_cast<char>(std::toupper(c));
    if (const char* value = std::getenv(env.c_str()); value != nullptr) {
      args.push_back(absl::StrCat("--", name, "=", value));
    }
  }
  if (argc > 1) args.insert(args.end(), argv + 1, argv + argc);
  return args;
}

std::string DescribeEngine(const matmul::Engine& engine) {
  const matmul::EngineInfo& info = engine.info();
  std::string text =
      absl::StrCat("engine ", info.name, ", ", info.streams_per_device,
                   " streams per device");
  for (const matmul::DeviceInfo& d : info.devices) {
    absl::StrAppend(&text, "\n  device ", d.index, ": ", d.name);
    if (!d.uuid.empty()) absl::StrAppend(&text, " ", d.uuid);
    if (d.memory_bytes > 0) {
      absl::StrAppend(&text, ", ", d.memory_bytes >> 20, " MiB, cc ",
                      d.compute_capability, ", ", d.multiprocessors, " SMs, ",
                      d.copy_engines, " copy engines, pinned pool ",
                      d.staging_bytes >> 20, " MiB");
    } else {
      absl::StrAppend(&text, ", ", d.multiprocessors, " cores");
    }
  }
  return text;
}

// Answers --helpfull, --help and --version: the exit status, or nothing
// when the command line asks for none of them.
std::optional<int> AnswerInfoRequest(
    const std::vector<std::string>& command_line) {
  for (const std::string& arg : command_line) {
    if (arg == "--helpfull") {
      std::fputs(absl::StrCat(kUsage, matmul::FlagsHelp(AllFlags())).c_str(),
                 stdout);
      return 0;
    }
  }
  switch (matmul::FindInfoRequest(command_line)) {
    case matmul::InfoRequest::kHelp:
      std::fputs(absl::StrCat(kUsage, matmul::FlagsHelp(ServerFlags())).c_str(),
                 stdout);
      return 0;
    case matmul::InfoRequest::kVersion:
      std::fputs(matmul::VersionText("matmul-server").c_str(), stdout);
      return 0;
    case matmul::InfoRequest::kNone:
      break;
  }
  return std::nullopt;
}

matmul::EngineOptions EngineOptionsFromFlags(matmul::EngineKind kind) {
  matmul::EngineOptions engine_options;
  engine_options.kind = kind;
  engine_options.streams_per_device = absl::GetFlag(FLAGS_streams_per_device);
  engine_options.batch_window =
      absl::Microseconds(absl::GetFlag(FLAGS_batch_window_us));
  engine_options.completion_poll = absl::Microseconds(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_completion_poll_us)));
  engine_options.pinned_pool_bytes = absl::GetFlag(FLAGS_pinned_pool_bytes);
  return engine_options;
}

// HOST:PORT, with an IPv6 host in brackets.
std::string HostPort(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos && host[0] != '[';
  return absl::StrCat(ipv6 ? "[" : "", host, ipv6 ? "]" : "", ":", port);
}

// The addresses and socket the server listens on.
absl::Status SetListening(matmul::ServerOptions& options) {
  const std::string host = absl::GetFlag(FLAGS_host);
  options.listen_address = HostPort(host, absl::GetFlag(FLAGS_port));
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < 0 || metrics_port > 65535) {
    return absl::InvalidArgumentError("--metrics-port must be in [0, 65535]");
  }
  if (metrics_port > 0) options.metrics_address = HostPort(host, metrics_port);
  if (absl::GetFlag(FLAGS_health_port) > 0) {
    options.health_address = HostPort(host, absl::GetFlag(FLAGS_health_port));
  }
  options.unix_socket = absl::GetFlag(FLAGS_unix_socket);
  return absl::OkStatus();
}

// Stored tensors and shared-memory regions: how many, how large, how long.
absl::Status SetHandleLimits(matmul::HandleLimits& limits) {
  limits.max_bytes_per_client =
      absl::GetFlag(FLAGS_max_stored_bytes_per_client);
  limits.max_bytes_total = absl::GetFlag(FLAGS_max_stored_bytes);
  if (limits.max_bytes_total < 0) {
    return absl::InvalidArgumentError(
        "--max-stored-bytes must be 0 (the default) or more; see --help");
  }
  limits.max_handles_per_client = absl::GetFlag(FLAGS_max_handles_per_client);
  limits.max_shared_memory_regions_per_client =
      absl::GetFlag(FLAGS_max_shared_memory_regions_per_client);
  if (limits.max_shared_memory_regions_per_client < 0) {
    return absl::InvalidArgumentError(
        "--max-shared-memory-regions-per-client must be 0 (none allowed) or "
        "more; see --help");
  }
  absl::StatusOr<matmul::PeerAllowList> shared_memory_peers =
      matmul::PeerAllowList::Parse(absl::GetFlag(FLAGS_shared_memory_peers));
  if (!shared_memory_peers.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shared-memory-peers: ", shared_memory_peers.status().message()));
  }
  limits.shared_memory_peers = *shared_memory_peers;
  limits.default_ttl = absl::GetFlag(FLAGS_default_handle_ttl);
  limits.max_ttl = absl::GetFlag(FLAGS_max_handle_ttl);
  return absl::OkStatus();
}

// The limits every request is held to.
absl::Status SetRequestLimits(matmul::RequestLimits& limits) {
  limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  limits.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  limits.max_elements_per_operand =
      absl::GetFlag(FLAGS_max_elements_per_operand);
  if (limits.max_message_bytes <= 0 || limits.max_message_bytes > INT32_MAX) {
    return absl::InvalidArgumentError(
        "--max-message-bytes must be in [1, 2147483647]");
  }
  const absl::Duration join_timeout = absl::GetFlag(FLAGS_stripe_join_timeout);
  if (join_timeout < absl::Milliseconds(1) ||
      join_timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stripe-join-timeout must be in [1ms, 10m], got ",
                     absl::FormatDuration(join_timeout)));
  }
  limits.stripe_join_timeout_ms = absl::ToInt64Milliseconds(join_timeout);
  return absl::OkStatus();
}

// The server's options from the flags, checked in the order the flags'
// errors are reported; an error's message names the flag.
absl::StatusOr<matmul::ServerOptions> ServerOptionsFromFlags(
    matmul::EngineKind kind) {
  matmul::ServerOptions options;
  if (absl::Status s = SetListening(options); !s.ok()) return s;
  options.staging_copy.helpers = matmul::DefaultStagingCopyHelpers();
  // Streaming stores leave staging out of the caches for the GPU's upload
  // to read from memory; the host engine's CPU reads the operands next,
  // from the caches.
  options.staging_copy.streaming_stores = matmul::ChoosesCudaEngine(kind);
  options.drain_grace = absl::GetFlag(FLAGS_drain_grace);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  options.trim_memory_after = absl::GetFlag(FLAGS_trim_memory_after);
  options.unhealthy_restart_after =
      absl::GetFlag(FLAGS_unhealthy_restart_after);
  options.metrics_top_clients = absl::GetFlag(FLAGS_metrics_top_clients);
  if (options.metrics_top_clients < 0) {
    return absl::InvalidArgumentError(
        "--metrics-top-clients must be at least 0");
  }
  options.max_connection_age = absl::GetFlag(FLAGS_max_connection_age);
  options.max_connection_age_grace =
      absl::GetFlag(FLAGS_max_connection_age_grace);
  options.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  options.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  absl::StatusOr<matmul::GrpcArgs> grpc_args =
      matmul::ParseGrpcArgs(absl::GetFlag(FLAGS_grpc_arg));
  if (!grpc_args.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-arg: ", grpc_args.status().message()));
  }
  options.grpc_args = *std::move(grpc_args);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tls =
      TlsCredentials();
  if (!tls.ok()) return tls.status();
  options.credentials = *tls;
  if (absl::Status s = SetHandleLimits(options.handle_limits); !s.ok()) {
    return s;
  }
  if (absl::Status s = SetRequestLimits(options.limits); !s.ok()) return s;
  return options;
}

// Why the server did not start, with a hint where --engine=cuda found no
// device.
void LogStartFailure(matmul::EngineKind kind, const absl::Status& status) {
  if (kind == matmul::EngineKind::kCuda && matmul::CudaEngineBuilt() &&
      status.code() == absl::StatusCode::kFailedPrecondition) {
    matmul::LogLine(absl::StrCat(
        "error: --engine=cuda: no CUDA device was found: ", status.message(),
        "; --engine=host or auto runs on the CPU"));
  } else {
    matmul::LogLine(absl::StrCat("error: ", status.ToString()));
  }
}

// The engine, ports and limits the server started with.
void LogServing(const matmul::ServerOptions& options,
                matmul::MatmulServer& server) {
  matmul::LogLine(DescribeEngine(server.engine()));
  if (server.metrics_port() > 0) {
    matmul::LogLine(absl::StrCat("metrics on port ", server.metrics_port(),
                                 " (/metrics, /timeline)"));
  }
  matmul::LogLine(absl::StrCat(
      "serving on port ", server.port(),
      options.credentials != nullptr
          ? (absl::GetFlag(FLAGS_tls_client_ca).empty() ? " (TLS)"
                                                        : " (mutual TLS)")
          : " (plaintext)",
      options.unix_socket.empty()
          ? ""
          : absl::StrCat(" and unix:", options.unix_socket),
      server.health_port() > 0
          ? absl::StrCat("; health-only port ", server.health_port())
          : "",
      "; max message ", options.limits.max_message_bytes,
      " bytes, max in flight ", options.limits.max_inflight_bytes,
      " bytes; staging copy helpers ", options.staging_copy.helpers,
      options.staging_copy.streaming_stores ? ", streaming stores" : ""));
  const std::string home = server.service().handles().home();
  matmul::LogLine(
      home.empty()
          ? std::string("stored-tensor handles name no server (no "
                        "--advertise-address, and --host is not a concrete "
                        "IP address): spreading clients cannot route them")
          : absl::StrCat("stored-tensor handles name this server as ", home));
}

// Waits for SIGTERM or SIGINT, then drains the server: the exit status.
int ServeUntilSignalled(matmul::MatmulServer& server,
                        matmul::ShutdownSignals& signals) {
  const int first = signals.Next();
  matmul::LogLine(
      absl::StrCat("received ", strsignal(first), "; shutting down"));
  // The drain runs beside this thread, which keeps taking signals: a
  // repeated SIGTERM (supervisors resend it) never cuts the drain short; a
  // SIGINT during it (Ctrl-C pressed again) ends the process at once, on
  // purpose and with a non-zero status.
  std::thread drain([&server, &signals] {
    server.Shutdown();
    signals.Wake();
  });
  for (;;) {
    const int next = signals.Next();
    if (next == matmul::ShutdownSignals::kWoken) break;
    if (next == SIGINT) {
      matmul::LogLine(absl::StrCat(
          "received ", strsignal(next),
          " during the drain: exiting now, without waiting for the requests "
          "in flight (exit status 130)"));
      std::_Exit(130);
    }
    matmul::LogLine(absl::StrCat("received ", strsignal(next),
                                 " again; the drain goes on (SIGINT ends it "
                                 "at once)"));
  }
  drain.join();
  matmul::LogLine("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  matmul::SkipMutexDeadlockDetection();  // common/mutex_mode.h
  absl::SetProgramUsageMessage(
      "matmul-server: multiplies matrices for gRPC clients on GPUs (or the "
      "CPU)");
  const std::vector<std::string> command_line(argv + std::min(argc, 1),
                                              argv + argc);
  if (std::optional<int> status = AnswerInfoRequest(command_line)) {
    return *status;
  }
  matmul::FlagParseOptions parse;
  parse.allowed = matmul::FlagsOf(AllFlags());
  parse.allow_repeats = true;  // the environment's, then the command line's
  if (absl::StatusOr<matmul::ParsedFlags> parsed =
          matmul::ParseFlags(ArgsWithEnvironment(argc, argv), parse);
      !parsed.ok()) {
    return matmul::UsageError("matmul-server", parsed.status().message());
  }

  // SIGTERM and SIGINT are taken in one place (shutdown_signals.h), set up
  // before the server starts any thread.
  absl::StatusOr<matmul::ShutdownSignals*> signals =
      matmul::ShutdownSignals::Install();
  if (!signals.ok()) {
    matmul::LogLine(absl::StrCat("error: ", signals.status().message()));
    return 1;
  }

  absl::StatusOr<matmul::EngineKind> kind =
      matmul::ParseEngineKind(absl::GetFlag(FLAGS_engine));
  if (!kind.ok()) {
    matmul::LogLine(absl::StrCat("error: ", kind.status().message()));
    return 2;
  }
  const matmul::EngineOptions engine_options = EngineOptionsFromFlags(*kind);
  absl::StatusOr<matmul::ServerOptions> options = ServerOptionsFromFlags(*kind);
  if (!options.ok()) {
    matmul::LogLine(absl::StrCat("error: ", options.status().message()));
    return 2;
  }

  matmul::LogLine(absl::StrCat("matmul-server ", matmul::ServerVersion(),
                               " (commit ", matmul::GitCommit(), ")",
                               " starting on ", options->listen_address));
  absl::StatusOr<std::unique_ptr<matmul::MatmulServer>> server =
      matmul::MatmulServer::Start(
          *options, [&engine_options] { return CreateEngine(engine_options); });
  if (!server.ok()) {
    LogStartFailure(*kind, server.status());
    return 1;
  }
  LogServing(*options, **server);
  return ServeUntilSignalled(**server, **signals);
}
