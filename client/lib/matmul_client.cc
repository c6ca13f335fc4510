#include "client/lib/matmul_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/sync_stream.h>
#include <grpcpp/support/validate_service_config.h>
#include <sys/mman.h>
#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "client/lib/multiply_encoding.h"
#include "client/lib/tensor_proto.h"
#include "client/lib/unary_call.h"
#include "common/handle_id.h"
#include "common/status_macros.h"
#include "proto/dtype_mapping.h"

namespace matmul {
namespace {

using client_internal::SetTimeout;

// A channel argument only this client sets: channels that differ in it are
// never merged onto one connection.
constexpr char kChannelIndexArg[] = "matmul.channel";
constexpr int kMaxChannels = 1024;
// Servers whose striped-call channels a client keeps (StripeChannels).
constexpr size_t kMaxPinnedServers = 16;
// Servers whose handle channels a client keeps (RouteHandles).
constexpr size_t kMaxHomes = 256;
// Longest handle a request's bytes are searched for (RequestHandles).
constexpr uint64_t kMaxRoutedHandleBytes = 1024;
// MultiplyRequest's a_handle and b_handle (proto/matmul/v1/matmul.proto).
constexpr uint32_t kAHandleField = 6;
constexpr uint32_t kBHandleField = 7;
// The longest a striped call waits to learn which server it goes to.
constexpr absl::Duration kMaxStripeProbe = absl::Seconds(10);
// The method an encoded request is sent to.
const char kMultiplyMethod[] = "/matmul.v1.MatmulService/Multiply";
// Ends an asynchronous Multiply: frees `call` (gRPC is done with it), then
// hands its response, or its error, to its `done`.
template <typename Call>
void EndMultiplyCall(Call* call, const grpc::Status& status) {
  std::unique_ptr<Call> owned(call);
  MatmulClient::MultiplyRawDone done = std::move(owned->done);
  absl::StatusOr<v1::MultiplyResponse> result =
      status.ok()
          ? absl::StatusOr<v1::MultiplyResponse>(std::move(owned->response))
          : FromGrpcStatus(status);
  owned.reset();
  std::move(done)(std::move(result));
}

constexpr size_t kMaxClientIdLength = 256;

// The product out of a response, which is moved from.
absl::StatusOr<HostTensor> ResultFromResponse(
    absl::StatusOr<v1::MultiplyResponse> response) {
  if (!response.ok()) return response.status();
  if (!response->has_c() && response->has_c_handle()) {
    return absl::InternalError(
        "the server kept the product (c_handle) instead of returning it");
  }
  absl::StatusOr<HostTensor> c = FromProto(std::move(*response->mutable_c()));
  if (!c.ok()) {
    return absl::InternalError(absl::StrCat(
        "the server's MultiplyResponse is malformed: ", c.status().message()));
  }
  return c;
}

// The kept product's handle out of a response.
absl::StatusOr<StoredTensor> KeptFromResponse(
    absl::StatusOr<v1::MultiplyResponse> response) {
  if (!response.ok()) return response.status();
  if (!response->has_c_handle()) {
    return absl::UnimplementedError(
        "the server returned the product instead of keeping it: it does not "
        "support keep_result (stored tensors)");
  }
  return StoredTensorFromProto(response->c_handle());
}

absl::Status SetOperand(const Operand& operand, const char* name,
                        v1::Tensor* tensor, std::string* handle) {
  if (operand.is_handle()) {
    if (operand.handle().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": the handle id is empty"));
    }
    *handle = operand.handle();
    return absl::OkStatus();
  }
  absl::Status status = ToProto(*operand.tensor(), tensor);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", status.message()));
  }
  return absl::OkStatus();
}

bool IsPolicyName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

// The default service config of the client's channels: the load-balancing
// policy (none when empty), and a retry of any MatmulService call that ends
// UNAVAILABLE or CANCELLED before the server has answered anything, up to
// three times with a short backoff. Under round_robin the retry goes to the
// next server, so a server that drains sends its share to the others instead
// of failing it: it refuses new calls with UNAVAILABLE until its transport
// stops, and a call that reaches it as the transport stops is cancelled by
// gRPC (RST_STREAM). The service answers CANCELLED only to a call that is
// already cancelled, and a call the caller cancels is not retried.
// gRPC retries only what it still holds: a request above the per-call retry
// buffer (256 KiB) is not retried once sent, nor a stream past its first
// answer.
std::string ServiceConfigJson(const std::string& policy) {
  const std::string retry =
      R"("methodConfig": [{"name": [{"service": "matmul.v1.MatmulService"}], )"
      R"("retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.02s", )"
      R"("maxBackoff": "0.2s", "backoffMultiplier": 2, )"
      R"("retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"]}}])";
  if (policy.empty()) return absl::StrCat("{", retry, "}");
  return absl::StrCat("{\"loadBalancingConfig\": [{\"", policy, "\": {}}], ",
                      retry, "}");
}

// `target` with the addresses of an "ipv4:A,B,..." or "ipv6:..." list in a
// random order; any other target as it is. Under round_robin the order
// changes nothing but which connection comes up first, and that one takes
// the calls made before the others are up: a process that makes one call
// (matmul-cli) would send it to the first address nearly every time. A DNS
// name needs no help: servers such as CoreDNS shuffle their answers.
std::string ShuffledAddressList(const std::string& target) {
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::StartsWith(target, scheme)) continue;
    const absl::string_view list =
        absl::string_view(target).substr(scheme.size());
    if (absl::StartsWith(list, "/") || !absl::StrContains(list, ',')) {
      return target;
    }
    std::vector<std::string> addresses = absl::StrSplit(list, ',');
    std::mt19937 shuffle_bits(std::random_device{}());
    std::shuffle(addresses.begin(), addresses.end(), shuffle_bits);
    return absl::StrCat(scheme, absl::StrJoin(addresses, ","));
  }
  return target;
}

// The authority gRPC gives a channel to `target` (its TLS name check and
// :authority), for the targets whose servers have IP addresses: dns: names,
// ipv4:/ipv6: lists and scheme-less host:port. Empty for others (unix:,
// or a scheme this client does not know).
std::string IpTargetAuthority(const std::string& target) {
  for (absl::string_view scheme : {"dns:", "ipv4:", "ipv6:"}) {
    if (!absl::StartsWith(target, scheme)) continue;
    absl::string_view rest = absl::string_view(target).substr(scheme.size());
    if (absl::StartsWith(rest, "//")) {  // dns://DNS-SERVER/name:port
      const size_t slash = rest.find('/', 2);
      rest = slash == absl::string_view::npos ? "" : rest.substr(slash);
    }
    absl::ConsumePrefix(&rest, "/");
    return std::string(rest);
  }
  const bool other_scheme = absl::StartsWith(target, "unix:") ||
                            absl::StartsWith(target, "unix-abstract:") ||
                            absl::StartsWith(target, "vsock:");
  return other_scheme || absl::StrContains(target, '/') ? "" : target;
}

// Reads protobuf's wire format from a ByteBuffer's slices in place.
class SliceReader {
 public:
  explicit SliceReader(const grpc::ByteBuffer& buffer) {
    (void)buffer.Dump(&slices_);
  }
  bool Varint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte = 0;
      if (!Byte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  // Skips `n` bytes, or copies them to `out` when it is not null.
  bool Take(uint64_t n, std::string* out) {
    while (n > 0) {
      if (slice_ == slices_.size()) return false;
      const grpc::Slice& slice = slices_[slice_];
      const uint64_t here = std::min<uint64_t>(n, slice.size() - at_);
      if (out != nullptr) {
        out->append(reinterpret_cast<const char*>(slice.begin()) + at_, here);
      }
      n -= here;
      Advance(here);
    }
    return true;
  }
  bool AtEnd() {
    Advance(0);
    return slice_ == slices_.size();
  }

 private:
  bool Byte(uint8_t* byte) {
    Advance(0);
    if (slice_ == slices_.size()) return false;
    *byte = slices_[slice_].begin()[at_];
    Advance(1);
    return true;
  }
  // Moves `n` bytes on within the current slice, then past empty slices.
  void Advance(uint64_t n) {
    at_ += n;
    while (slice_ < slices_.size() && at_ == slices_[slice_].size()) {
      ++slice_;
      at_ = 0;
    }
  }

  std::vector<grpc::Slice> slices_;
  size_t slice_ = 0;
  size_t at_ = 0;
};

// The a_handle and b_handle of an encoded MultiplyRequest, read without
// copying its operands; empty where it has none, or where the bytes do not
// parse (the server will say what is wrong with them).
void RequestHandles(const grpc::ByteBuffer& request, std::string* a,
                    std::string* b) {
  SliceReader reader(request);
  while (!reader.AtEnd()) {
    uint64_t tag = 0;
    if (!reader.Varint(&tag)) return;
    const uint32_t field = static_cast<uint32_t>(tag >> 3);
    uint64_t value = 0;
    switch (tag & 7) {
      case 0:
        if (!reader.Varint(&value)) return;
        break;
      case 1:
        if (!reader.Take(8, nullptr)) return;
        break;
      case 5:
        if (!reader.Take(4, nullptr)) return;
        break;
      case 2: {
        if (!reader.Varint(&value)) return;
        std::string* out = field == kAHandleField   ? a
                           : field == kBHandleField ? b
                                                    : nullptr;
        if (out != nullptr && value <= kMaxRoutedHandleBytes) {
          out->clear();  // the last occurrence wins, as in protobuf
          if (!reader.Take(value, out)) return;
        } else if (!reader.Take(value, nullptr)) {
          return;
        }
        break;
      }
      default:
        return;
    }
  }
}

}  // namespace

const std::string& MatmulClient::HandleRoute::home() const {
  static const std::string* const kNone = new std::string();
  return home_ == nullptr ? *kNone : home_->address;
}

absl::Status MatmulClient::HandleRoute::Finish(absl::Status status) const {
  if (home_ == nullptr || status.code() != absl::StatusCode::kUnavailable) {
    return status;
  }
  return absl::NotFoundError(absl::StrCat(
      "the server holding this handle (", home_->address,
      ") is not reachable, and its stored tensors are gone with it: ",
      status.message()));
}

absl::StatusOr<MatmulClient::HandleRoute> MatmulClient::RouteHandles(
    absl::string_view a, absl::string_view b) {
  HandleRoute route;
  if (pin_stripes_) {
    std::optional<HandleHome> home_a = HandleHomeOf(a);
    std::optional<HandleHome> home_b = HandleHomeOf(b);
    if (home_a.has_value() && home_b.has_value() &&
        home_a->address != home_b->address) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a and b are stored on different servers (", home_a->address, " and ",
          home_b->address,
          "): the stored operands of one multiply must live on one server "
          "(upload one near the other: the upload's `near` option)"));
    }
    const std::optional<HandleHome>& home =
        home_a.has_value() ? home_a : home_b;
    if (home.has_value() && home->address != target_authority_) {
      absl::MutexLock lock(&homes_mu_);
      std::shared_ptr<const HomeChannel>& entry = homes_[home->address];
      if (entry == nullptr) {
        auto made = std::make_shared<HomeChannel>();
        made->address = home->address;
        made->channel = make_channel_(0, home->address);
        made->stub = v1::MatmulService::NewStub(made->channel);
        made->multiply_stub = std::make_unique<MultiplyStub>(made->channel);
        entry = std::move(made);
      }
      route.home_ = entry;
      if (homes_.size() > kMaxHomes) {
        // Another server's: calls using it hold it until they end.
        for (auto it = homes_.begin(); it != homes_.end(); ++it) {
          if (it->first != home->address) {
            homes_.erase(it);
            break;
          }
        }
      }
    }
  }
  if (route.home_ != nullptr) {
    route.stub_ = route.home_->stub.get();
    route.multiply_stub_ = route.home_->multiply_stub.get();
    route.channel_ = &route.home_->channel;
    return route;
  }
  const uint64_t n = next_stub_.fetch_add(1, std::memory_order_relaxed);
  route.stub_ = stubs_[n % stubs_.size()].get();
  route.multiply_stub_ = multiply_stubs_[n % multiply_stubs_.size()].get();
  route.channel_ = &channels_[n % channels_.size()];
  return route;
}

absl::StatusOr<int64_t> TtlSeconds(absl::Duration ttl, absl::string_view what) {
  if (ttl == absl::ZeroDuration()) return 0;
  if (ttl < absl::ZeroDuration() || ttl == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": expected zero (the server's default) or a "
                     "finite positive duration, got ",
                     absl::FormatDuration(ttl)));
  }
  return absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)));
}

absl::Status CheckClientId(absl::string_view id) {
  if (id.size() > kMaxClientIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("client id: at most ", kMaxClientIdLength,
                     " characters, got ", id.size()));
  }
  for (char c : id) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("client id \"", absl::CHexEscape(id),
                       "\": only printable ASCII may go in metadata"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredTensor> StoredTensorFromProto(
    const v1::TensorHandle& handle) {
  auto malformed = [](absl::string_view why) {
    return absl::InternalError(
        absl::StrCat("the server's TensorHandle is malformed: ", why));
  };
  if (handle.id().empty()) return malformed("no id");
  std::optional<DType> dtype = DTypeFromProto(handle.dtype());
  if (!dtype.has_value()) {
    return malformed(absl::StrCat("unknown dtype ", handle.dtype()));
  }
  StoredTensor stored;
  stored.id = handle.id();
  stored.shape.assign(handle.shape().begin(), handle.shape().end());
  for (int64_t d : stored.shape) {
    if (d < 0) return malformed("a negative dimension");
  }
  stored.dtype = *dtype;
  stored.device = handle.device();
  stored.bytes = handle.bytes();
  stored.expire_time = absl::FromUnixMillis(handle.expire_time_unix_ms());
  return stored;
}

absl::StatusOr<v1::MultiplyRequest> MakeMultiplyRequest(
    const Operand& a, const Operand& b, const MultiplyOptions& options) {
  v1::MultiplyRequest request;
  RETURN_IF_ERROR(
      SetOperand(a, "a", request.mutable_a(), request.mutable_a_handle()));
  RETURN_IF_ERROR(
      SetOperand(b, "b", request.mutable_b(), request.mutable_b_handle()));
  if (a.is_handle()) request.clear_a();
  if (b.is_handle()) request.clear_b();
  request.set_transpose_a(options.transpose_a);
  request.set_transpose_b(options.transpose_b);
  request.set_compute_mode(ComputeModeToProto(options.compute));
  if (options.keep_result) {
    ASSIGN_OR_RETURN(const int64_t ttl,
                     TtlSeconds(options.result_ttl, "result_ttl"));
    request.set_keep_result(true);
    request.set_result_ttl_seconds(ttl);
  }
  return request;
}

absl::StatusOr<v1::UploadRequest> MakeUploadRequest(
    const HostTensor& tensor, const UploadOptions& options) {
  v1::UploadRequest request;
  if (tensor.shape.size() != 2 && tensor.shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: shape ", ShapeString(tensor.shape), " has ",
                     tensor.shape.size(),
                     " dimension(s); a stored tensor is 2-D [rows, cols] or "
                     "3-D [batch, rows, cols]"));
  }
  absl::Status status = ToProto(tensor, request.mutable_tensor());
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: ", status.message()));
  }
  if (options.device.has_value()) request.set_device(*options.device);
  ASSIGN_OR_RETURN(const int64_t ttl, TtlSeconds(options.ttl, "ttl"));
  request.set_ttl_seconds(ttl);
  return request;
}

absl::StatusOr<std::unique_ptr<MatmulClient>> MatmulClient::Create(
    const std::string& target, const ClientOptions& options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("client: the target is empty");
  }
  if (options.max_message_bytes <= 0 ||
      options.max_message_bytes > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("client: max_message_bytes must be in [1, 2147483647], "
                     "got ",
                     options.max_message_bytes));
  }
  if (options.channels < 1 || options.channels > kMaxChannels) {
    return absl::InvalidArgumentError(
        absl::StrCat("client: channels must be in [1, ", kMaxChannels,
                     "], got ", options.channels));
  }
  if (absl::Status s = CheckClientId(options.client_id); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("client: ", s.message()));
  }
  if (!options.load_balancing_policy.empty() &&
      !IsPolicyName(options.load_balancing_policy)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client: \"", options.load_balancing_policy,
                     "\" is not a load-balancing policy name"));
  }
  const std::string service_config =
      ServiceConfigJson(options.load_balancing_policy);
  if (const std::string error =
          grpc::experimental::ValidateServiceConfigJSON(service_config);
      !error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("client: load-balancing policy \"",
                     options.load_balancing_policy, "\": ", error));
  }

  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials != nullptr ? options.credentials
                                     : grpc::InsecureChannelCredentials();
  ChannelMaker make_channel =
      [target, credentials, channel_args = options.channel_args,
       string_args = options.channel_string_args,
       limit = static_cast<int>(options.max_message_bytes), service_config,
       shuffle = options.load_balancing_policy == "round_robin"](
          int index, const std::string& address) {
        grpc::ChannelArguments args;
        // The caller's arguments first: of two values for one key, gRPC uses
        // the first, so they override the settings below.
        for (const auto& [name, value] : channel_args) args.SetInt(name, value);
        for (const auto& [name, value] : string_args)
          args.SetString(name, value);
        args.SetMaxReceiveMessageSize(limit);
        args.SetMaxSendMessageSize(limit);
        // Each channel gets its own subchannels, hence its own connection, even
        // when another client in the process talks to the same server.
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        args.SetInt(kChannelIndexArg, index);
        if (!address.empty()) {
          // One server, as the target would reach it (a caller's
          // authority, first, wins).
          args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, IpTargetAuthority(target));
          return grpc::CreateCustomChannel(address, credentials, args);
        }
        args.SetServiceConfigJSON(service_config);
        if (!shuffle)
          return grpc::CreateCustomChannel(target, credentials, args);
        const std::string shuffled = ShuffledAddressList(target);
        if (shuffled != target) {
          // The authority gRPC derives from the target as given (its list),
          // so that :authority and the TLS name check do not vary with the
          // order. A caller's setting, first, wins.
          args.SetString(GRPC_ARG_DEFAULT_AUTHORITY,
                         target.substr(target.find(':') + 1));
        }
        return grpc::CreateCustomChannel(shuffled, credentials, args);
      };
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < options.channels; ++i) {
    channels.push_back(make_channel(i, ""));
  }
  const bool pin_stripes = options.load_balancing_policy == "round_robin" &&
                           !IpTargetAuthority(target).empty();
  return std::unique_ptr<MatmulClient>(new MatmulClient(
      std::move(channels), options.client_id, std::move(make_channel),
      pin_stripes, IpTargetAuthority(target)));
}

MatmulClient::MatmulClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
                           std::string client_id, ChannelMaker make_channel,
                           bool pin_stripes, std::string target_authority)
    : channels_(std::move(channels)),
      client_id_(std::move(client_id)),
      make_channel_(std::move(make_channel)),
      pin_stripes_(pin_stripes),
      target_authority_(std::move(target_authority)) {
  for (const std::shared_ptr<grpc::Channel>& channel : channels_) {
    stubs_.push_back(v1::MatmulService::NewStub(channel));
    multiply_stubs_.push_back(std::make_unique<MultiplyStub>(channel));
  }
}

v1::MatmulService::Stub& MatmulClient::NextStub() {
  const uint64_t n = next_stub_.fetch_add(1, std::memory_order_relaxed);
  return *stubs_[n % stubs_.size()];
}

absl::Status MatmulClient::WaitForConnected(absl::Duration timeout) {
  std::vector<std::shared_ptr<grpc::Channel>> channels = channels_;
  {
    absl::MutexLock lock(&stripe_mu_);
    channels.insert(channels.end(), extra_channels_.begin(),
                    extra_channels_.end());
  }
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  // An infinite timeout saturates to time_point::max(), which gRPC reads as
  // no deadline.
  const std::chrono::system_clock::time_point deadline =
      absl::ToChronoTime(absl::Now() + timeout);
  std::vector<int> not_ready;
  for (size_t i = 0; i < channels.size(); ++i) {
    if (!channels[i]->WaitForConnected(deadline)) {
      not_ready.push_back(static_cast<int>(i));
    }
  }
  if (not_ready.empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "client: channel(s) ", absl::StrJoin(not_ready, ", "), " of ",
      channels.size(), " not connected after ", absl::FormatDuration(timeout)));
}

std::vector<std::shared_ptr<grpc::Channel>> MatmulClient::StripeChannels(
    int k, absl::Duration timeout, const std::string& server) {
  if (pin_stripes_) {
    // Which server the spread picks for this multiply: the peer of a call
    // over it. A peer with no IP address, or a failed call, leaves the
    // stripes on the client's channels (the multiply then fails, or works,
    // on its own).
    std::string peer = server;
    if (peer.empty()) {
      grpc::ClientContext context;
      PrepareContext(context, std::min(timeout, kMaxStripeProbe), "");
      v1::GetServerInfoResponse response;
      const grpc::Status probed = NextStub().GetServerInfo(
          &context, v1::GetServerInfoRequest(), &response);
      if (probed.ok()) peer = context.peer();
      if (!absl::StartsWith(peer, "ipv4:") &&
          !absl::StartsWith(peer, "ipv6:")) {
        peer.clear();
      }
    }
    if (!peer.empty()) {
      absl::MutexLock lock(&stripe_mu_);
      auto it = std::find_if(
          pinned_channels_.begin(), pinned_channels_.end(),
          [&peer](const auto& entry) { return entry.first == peer; });
      if (it == pinned_channels_.end()) {
        if (pinned_channels_.size() == kMaxPinnedServers) {
          pinned_channels_.erase(pinned_channels_.begin());
        }
        pinned_channels_.emplace_back(
            peer, std::vector<std::shared_ptr<grpc::Channel>>());
        it = pinned_channels_.end() - 1;
      }
      std::vector<std::shared_ptr<grpc::Channel>>& pinned = it->second;
      while (static_cast<int>(pinned.size()) < k) {
        pinned.push_back(make_channel_(static_cast<int>(pinned.size()), peer));
      }
      return {pinned.begin(), pinned.begin() + k};
    }
  }
  const int n = static_cast<int>(channels_.size());
  std::vector<std::shared_ptr<grpc::Channel>> out;
  if (k <= n) {
    const uint64_t first = next_stub_.fetch_add(1, std::memory_order_relaxed);
    for (int i = 0; i < k; ++i) out.push_back(channels_[(first + i) % n]);
    return out;
  }
  out = channels_;
  absl::MutexLock lock(&stripe_mu_);
  while (n + static_cast<int>(extra_channels_.size()) < k) {
    extra_channels_.push_back(
        make_channel_(n + static_cast<int>(extra_channels_.size()), ""));
  }
  out.insert(out.end(), extra_channels_.begin(),
             extra_channels_.begin() + (k - n));
  return out;
}

void MatmulClient::PrepareContext(grpc::ClientContext& context,
                                  absl::Duration timeout,
                                  const std::string& client_id) const {
  SetTimeout(&context, timeout);
  const std::string& id = client_id.empty() ? client_id_ : client_id;
  if (!id.empty()) context.AddMetadata(kClientIdMetadataKey, id);
}

absl::StatusOr<HostTensor> MatmulClient::Multiply(
    const Operand& a, const Operand& b, const MultiplyOptions& options) {
  if (options.keep_result) {
    return absl::InvalidArgumentError(
        "MultiplyOptions.keep_result is set: call MultiplyAndKeep, which "
        "returns the stored product's handle");
  }
  RETURN_IF_ERROR(CheckClientId(options.client_id));
  ASSIGN_OR_RETURN(v1::MultiplyRequest request,
                   MakeMultiplyRequest(a, b, options));
  ASSIGN_OR_RETURN(const HandleRoute route,
                   RouteHandles(request.a_handle(), request.b_handle()));
  return ResultFromResponse(MultiplyEncodedOn(
      route, EncodeMultiplyRequest(std::move(request)), options));
}

void MatmulClient::MultiplyAsync(const Operand& a, const Operand& b,
                                 const MultiplyOptions& options,
                                 MultiplyDone done) {
  if (options.keep_result) {
    std::move(done)(absl::InvalidArgumentError(
        "MultiplyOptions.keep_result is set: call MultiplyAndKeepAsync, which "
        "returns the stored product's handle"));
    return;
  }
  if (absl::Status s = CheckClientId(options.client_id); !s.ok()) {
    std::move(done)(s);
    return;
  }
  absl::StatusOr<v1::MultiplyRequest> request =
      MakeMultiplyRequest(a, b, options);
  if (!request.ok()) {
    std::move(done)(request.status());
    return;
  }
  absl::StatusOr<HandleRoute> route =
      RouteHandles(request->a_handle(), request->b_handle());
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  MultiplyEncodedAsyncOn(
      *std::move(route), EncodeMultiplyRequest(*std::move(request)), options,
      [done = std::move(done)](
          absl::StatusOr<v1::MultiplyResponse> response) mutable {
        std::move(done)(ResultFromResponse(std::move(response)));
      });
}

absl::StatusOr<StoredTensor> MatmulClient::MultiplyAndKeep(
    const Operand& a, const Operand& b, const MultiplyOptions& options) {
  RETURN_IF_ERROR(CheckClientId(options.client_id));
  MultiplyOptions keep = options;
  keep.keep_result = true;
  ASSIGN_OR_RETURN(v1::MultiplyRequest request,
                   MakeMultiplyRequest(a, b, keep));
  ASSIGN_OR_RETURN(const HandleRoute route,
                   RouteHandles(request.a_handle(), request.b_handle()));
  return KeptFromResponse(MultiplyEncodedOn(
      route, EncodeMultiplyRequest(std::move(request)), keep));
}

void MatmulClient::MultiplyAndKeepAsync(const Operand& a, const Operand& b,
                                        const MultiplyOptions& options,
                                        StoredDone done) {
  if (absl::Status s = CheckClientId(options.client_id); !s.ok()) {
    std::move(done)(s);
    return;
  }
  MultiplyOptions keep = options;
  keep.keep_result = true;
  absl::StatusOr<v1::MultiplyRequest> request = MakeMultiplyRequest(a, b, keep);
  if (!request.ok()) {
    std::move(done)(request.status());
    return;
  }
  absl::StatusOr<HandleRoute> route =
      RouteHandles(request->a_handle(), request->b_handle());
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  MultiplyEncodedAsyncOn(
      *std::move(route), EncodeMultiplyRequest(*std::move(request)), keep,
      [done = std::move(done)](
          absl::StatusOr<v1::MultiplyResponse> response) mutable {
        std::move(done)(KeptFromResponse(std::move(response)));
      });
}

absl::StatusOr<v1::MultiplyResponse> MatmulClient::MultiplyRaw(
    const v1::MultiplyRequest& request, const MultiplyOptions& options) {
  RETURN_IF_ERROR(CheckClientId(options.client_id));
  ASSIGN_OR_RETURN(const HandleRoute route,
                   RouteHandles(request.a_handle(), request.b_handle()));
  grpc::ClientContext context;
  PrepareContext(context, options.timeout, options.client_id);
  v1::MultiplyResponse response;
  RETURN_IF_ERROR(route.Finish(
      FromGrpcStatus(route.stub().Multiply(&context, request, &response))));
  return response;
}

void MatmulClient::MultiplyRawAsync(const v1::MultiplyRequest& request,
                                    const MultiplyOptions& options,
                                    MultiplyRawDone done) {
  if (absl::Status s = CheckClientId(options.client_id); !s.ok()) {
    std::move(done)(s);
    return;
  }
  // Lives until the reaction below runs; gRPC needs the context and the
  // response until then.
  absl::StatusOr<HandleRoute> route =
      RouteHandles(request.a_handle(), request.b_handle());
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  struct Call {
    grpc::ClientContext context;
    v1::MultiplyResponse response;
    MultiplyRawDone done;
  };
  auto* call = new Call;
  call->done = [done = std::move(done), route = *route](
                   absl::StatusOr<v1::MultiplyResponse> response) mutable {
    std::move(done)(route.Finish(std::move(response)));
  };
  PrepareContext(call->context, options.timeout, options.client_id);
  route->stub().async()->Multiply(
      &call->context, &request, &call->response,
      [call](grpc::Status status) { EndMultiplyCall(call, status); });
}

absl::StatusOr<v1::MultiplyResponse> MatmulClient::MultiplyEncoded(
    const grpc::ByteBuffer& request, const MultiplyOptions& options) {
  std::string a_handle, b_handle;
  if (pin_stripes_) RequestHandles(request, &a_handle, &b_handle);
  ASSIGN_OR_RETURN(const HandleRoute route, RouteHandles(a_handle, b_handle));
  return MultiplyEncodedOn(route, request, options);
}

absl::StatusOr<v1::MultiplyResponse> MatmulClient::MultiplyEncodedOn(
    const HandleRoute& route, const grpc::ByteBuffer& request,
    const MultiplyOptions& options) {
  RETURN_IF_ERROR(CheckClientId(options.client_id));
  grpc::ClientContext context;
  PrepareContext(context, options.timeout, options.client_id);
  v1::MultiplyResponse response;
  // gRPC's blocking call: the calling thread polls for its own reply and
  // returns from there, where a callback would complete on a gRPC thread
  // that then has to wake this one (one thread hand-off per call, which
  // showed in the latency of small multiplies).
  const grpc::internal::RpcMethod method(kMultiplyMethod,
                                         grpc::internal::RpcMethod::NORMAL_RPC);
  RETURN_IF_ERROR(route.Finish(FromGrpcStatus(
      grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, v1::MultiplyResponse>(
          route.channel().get(), method, &context, request, &response))));
  return response;
}

void MatmulClient::MultiplyEncodedAsync(const grpc::ByteBuffer& request,
                                        const MultiplyOptions& options,
                                        MultiplyRawDone done) {
  std::string a_handle, b_handle;
  if (pin_stripes_) RequestHandles(request, &a_handle, &b_handle);
  absl::StatusOr<HandleRoute> route = RouteHandles(a_handle, b_handle);
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  MultiplyEncodedAsyncOn(*std::move(route), request, options, std::move(done));
}

void MatmulClient::MultiplyEncodedAsyncOn(HandleRoute route,
                                          const grpc::ByteBuffer& request,
                                          const MultiplyOptions& options,
                                          MultiplyRawDone done) {
  if (absl::Status s = CheckClientId(options.client_id); !s.ok()) {
    std::move(done)(s);
    return;
  }
  // Lives until the reaction below runs (and, with a canceller, until a
  // Cancel that is using its context returns); gRPC needs the context, the
  // request and the response until then.
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request;  // shares the encoding's slices
    v1::MultiplyResponse response;
    MultiplyRawDone done;
    HandleRoute route;           // keeps a handle's channel alive
    std::shared_ptr<Call> self;  // released by the reaction
  };
  auto shared = std::make_shared<Call>();
  Call* call = shared.get();
  call->request = request;
  call->done = std::move(done);
  call->route = std::move(route);
  PrepareContext(call->context, options.timeout, options.client_id);
  if (options.canceller != nullptr) {
    options.canceller->Attach(
        std::shared_ptr<grpc::ClientContext>(shared, &call->context));
  }
  call->self = std::move(shared);
  call->route.multiply_stub().UnaryCall(
      &call->context, kMultiplyMethod, grpc::StubOptions(), &call->request,
      &call->response, [call](grpc::Status status) {
        std::shared_ptr<Call> owned = std::move(call->self);
        MultiplyRawDone done = std::move(owned->done);
        absl::StatusOr<v1::MultiplyResponse> result =
            status.ok() ? absl::StatusOr<v1::MultiplyResponse>(
                              std::move(owned->response))
                        : owned->route.Finish(FromGrpcStatus(status));
        owned.reset();
        std::move(done)(std::move(result));
      });
}

void CallCanceller::Attach(std::shared_ptr<grpc::ClientContext> context) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      context_ = std::move(context);
      return;
    }
  }
  context->TryCancel();  // before the call starts: it starts cancelled
}

void CallCanceller::Cancel() {
  std::shared_ptr<grpc::ClientContext> context;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    context = context_.lock();
  }
  // Outside the lock: gRPC may run the call's reaction on this thread.
  if (context != nullptr) context->TryCancel();
}

absl::StatusOr<v1::GetServerInfoResponse> MatmulClient::GetServerInfo(
    absl::Duration timeout) {
  grpc::ClientContext context;
  PrepareContext(context, timeout, "");
  v1::GetServerInfoResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(NextStub().GetServerInfo(
      &context, v1::GetServerInfoRequest(), &response)));
  return response;
}

}  // namespace matmul
