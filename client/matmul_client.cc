#include "client/matmul_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/validate_service_config.h>

#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/tensor_proto.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

// A channel argument only this client sets: channels that differ in it are
// never merged onto one connection.
constexpr char kChannelIndexArg[] = "matmul.channel";
constexpr int kMaxChannels = 1024;

void SetTimeout(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  // A finite timeout far in the future saturates to time_point::max(),
  // which gRPC reads as no deadline.
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// The product out of a response, which is moved from.
absl::StatusOr<HostTensor> ResultFromResponse(
    absl::StatusOr<v1::MultiplyResponse> response) {
  if (!response.ok()) return response.status();
  absl::StatusOr<HostTensor> c = FromProto(std::move(*response->mutable_c()));
  if (!c.ok()) {
    return absl::InternalError(absl::StrCat(
        "the server's MultiplyResponse is malformed: ", c.status().message()));
  }
  return c;
}

bool IsPolicyName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

absl::StatusOr<v1::MultiplyRequest> MakeMultiplyRequest(
    const HostTensor& a, const HostTensor& b, const MultiplyOptions& options) {
  v1::MultiplyRequest request;
  absl::Status status = ToProto(a, request.mutable_a());
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("a: ", status.message()));
  }
  status = ToProto(b, request.mutable_b());
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("b: ", status.message()));
  }
  request.set_transpose_a(options.transpose_a);
  request.set_transpose_b(options.transpose_b);
  request.set_compute_mode(ComputeModeToProto(options.compute));
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
  std::string service_config;
  if (!options.load_balancing_policy.empty()) {
    if (!IsPolicyName(options.load_balancing_policy)) {
      return absl::InvalidArgumentError(
          absl::StrCat("client: \"", options.load_balancing_policy,
                       "\" is not a load-balancing policy name"));
    }
    service_config = absl::StrCat("{\"loadBalancingConfig\": [{\"",
                                  options.load_balancing_policy, "\": {}}]}");
    const std::string error =
        grpc::experimental::ValidateServiceConfigJSON(service_config);
    if (!error.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("client: load-balancing policy \"",
                       options.load_balancing_policy, "\": ", error));
    }
  }

  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials != nullptr ? options.credentials
                                     : grpc::InsecureChannelCredentials();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < options.channels; ++i) {
    grpc::ChannelArguments args;
    const int limit = static_cast<int>(options.max_message_bytes);
    args.SetMaxReceiveMessageSize(limit);
    args.SetMaxSendMessageSize(limit);
    // Each channel gets its own subchannels, hence its own connection, even
    // when another client in the process talks to the same server.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(kChannelIndexArg, i);
    if (!service_config.empty()) args.SetServiceConfigJSON(service_config);
    channels.push_back(grpc::CreateCustomChannel(target, credentials, args));
  }
  return std::unique_ptr<MatmulClient>(new MatmulClient(std::move(channels)));
}

MatmulClient::MatmulClient(std::vector<std::shared_ptr<grpc::Channel>> channels)
    : channels_(std::move(channels)) {
  for (const std::shared_ptr<grpc::Channel>& channel : channels_) {
    stubs_.push_back(v1::MatmulService::NewStub(channel));
  }
}

v1::MatmulService::Stub& MatmulClient::NextStub() {
  const uint64_t n = next_stub_.fetch_add(1, std::memory_order_relaxed);
  return *stubs_[n % stubs_.size()];
}

absl::StatusOr<HostTensor> MatmulClient::Multiply(
    const HostTensor& a, const HostTensor& b, const MultiplyOptions& options) {
  ASSIGN_OR_RETURN(v1::MultiplyRequest request,
                   MakeMultiplyRequest(a, b, options));
  return ResultFromResponse(MultiplyRaw(request, options));
}

void MatmulClient::MultiplyAsync(const HostTensor& a, const HostTensor& b,
                                 const MultiplyOptions& options,
                                 MultiplyDone done) {
  absl::StatusOr<v1::MultiplyRequest> request =
      MakeMultiplyRequest(a, b, options);
  if (!request.ok()) {
    std::move(done)(request.status());
    return;
  }
  auto owned = std::make_unique<v1::MultiplyRequest>(*std::move(request));
  const v1::MultiplyRequest& sent = *owned;
  MultiplyRawAsync(
      sent, options,
      [owned = std::move(owned), done = std::move(done)](
          absl::StatusOr<v1::MultiplyResponse> response) mutable {
        owned.reset();  // gRPC is done with it; free it before `done` runs.
        std::move(done)(ResultFromResponse(std::move(response)));
      });
}

absl::StatusOr<v1::MultiplyResponse> MatmulClient::MultiplyRaw(
    const v1::MultiplyRequest& request, const MultiplyOptions& options) {
  grpc::ClientContext context;
  SetTimeout(&context, options.timeout);
  v1::MultiplyResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(NextStub().Multiply(&context, request, &response)));
  return response;
}

void MatmulClient::MultiplyRawAsync(const v1::MultiplyRequest& request,
                                    const MultiplyOptions& options,
                                    MultiplyRawDone done) {
  // Lives until the reaction below runs; gRPC needs the context and the
  // response until then.
  struct Call {
    grpc::ClientContext context;
    v1::MultiplyResponse response;
    MultiplyRawDone done;
  };
  auto* call = new Call;
  call->done = std::move(done);
  SetTimeout(&call->context, options.timeout);
  NextStub().async()->Multiply(
      &call->context, &request, &call->response, [call](grpc::Status status) {
        std::unique_ptr<Call> owned(call);
        MultiplyRawDone done = std::move(owned->done);
        absl::StatusOr<v1::MultiplyResponse> result =
            status.ok() ? absl::StatusOr<v1::MultiplyResponse>(
                              std::move(owned->response))
                        : FromGrpcStatus(status);
        owned.reset();
        std::move(done)(std::move(result));
      });
}

absl::StatusOr<v1::GetServerInfoResponse> MatmulClient::GetServerInfo(
    absl::Duration timeout) {
  grpc::ClientContext context;
  SetTimeout(&context, timeout);
  v1::GetServerInfoResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(NextStub().GetServerInfo(
      &context, v1::GetServerInfoRequest(), &response)));
  return response;
}

}  // namespace matmul
