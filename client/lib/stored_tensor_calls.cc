// MatmulClient's stored-tensor calls: Upload, Download and Delete, blocking
// and asynchronous.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/lib/matmul_client.h"
#include "client/lib/tensor_proto.h"
#include "client/lib/unary_call.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

using client_internal::AsyncCall;
using client_internal::StartAsync;

// The stored tensor out of an UploadResponse.
absl::StatusOr<StoredTensor> StoredFromUpload(
    absl::StatusOr<v1::UploadResponse> response) {
  if (!response.ok()) return response.status();
  if (!response->has_handle()) {
    return absl::InternalError("the server's UploadResponse has no handle");
  }
  return StoredTensorFromProto(response->handle());
}

// The tensor out of a DownloadResponse, which is moved from.
absl::StatusOr<HostTensor> TensorFromDownload(
    absl::StatusOr<v1::DownloadResponse> response) {
  if (!response.ok()) return response.status();
  absl::StatusOr<HostTensor> t =
      FromProto(std::move(*response->mutable_tensor()));
  if (!t.ok()) {
    return absl::InternalError(absl::StrCat(
        "the server's DownloadResponse is malformed: ", t.status().message()));
  }
  return t;
}

}  // namespace

absl::StatusOr<StoredTensor> MatmulClient::Upload(
    const HostTensor& tensor, const UploadOptions& options) {
  RETURN_IF_ERROR(CheckClientId(options.client_id));
  ASSIGN_OR_RETURN(const v1::UploadRequest request,
                   MakeUploadRequest(tensor, options));
  grpc::ClientContext context;
  PrepareContext(context, options.timeout, options.client_id);
  v1::UploadResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(NextStub().Upload(&context, request, &response)));
  return StoredFromUpload(std::move(response));
}

void MatmulClient::UploadAsync(const HostTensor& tensor,
                               const UploadOptions& options, StoredDone done) {
  if (absl::Status s = CheckClientId(options.client_id); !s.ok()) {
    std::move(done)(s);
    return;
  }
  absl::StatusOr<v1::UploadRequest> request =
      MakeUploadRequest(tensor, options);
  if (!request.ok()) {
    std::move(done)(request.status());
    return;
  }
  using Call = AsyncCall<v1::UploadRequest, v1::UploadResponse>;
  auto call = std::make_shared<Call>();
  call->request = *std::move(request);
  call->done = [done = std::move(done)](
                   absl::StatusOr<v1::UploadResponse> response) mutable {
    std::move(done)(StoredFromUpload(std::move(response)));
  };
  PrepareContext(call->context, options.timeout, options.client_id);
  if (options.canceller != nullptr) {
    options.canceller->Attach(
        std::shared_ptr<grpc::ClientContext>(call, &call->context));
  }
  v1::MatmulService::Stub::async_interface* async = NextStub().async();
  StartAsync(std::move(call), [async](auto&&... args) {
    async->Upload(std::forward<decltype(args)>(args)...);
  });
}

absl::StatusOr<HostTensor> MatmulClient::Download(const std::string& id,
                                                  absl::Duration timeout) {
  if (id.empty()) return absl::InvalidArgumentError("the handle id is empty");
  ASSIGN_OR_RETURN(const HandleRoute route, RouteHandles(id));
  grpc::ClientContext context;
  PrepareContext(context, timeout, "");
  v1::DownloadRequest request;
  request.set_handle(id);
  v1::DownloadResponse response;
  RETURN_IF_ERROR(route.Finish(
      FromGrpcStatus(route.stub().Download(&context, request, &response))));
  return TensorFromDownload(std::move(response));
}

void MatmulClient::DownloadAsync(const std::string& id, absl::Duration timeout,
                                 TensorDone done,
                                 std::shared_ptr<CallCanceller> canceller) {
  if (id.empty()) {
    std::move(done)(absl::InvalidArgumentError("the handle id is empty"));
    return;
  }
  absl::StatusOr<HandleRoute> route = RouteHandles(id);
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  using Call = AsyncCall<v1::DownloadRequest, v1::DownloadResponse>;
  auto call = std::make_shared<Call>();
  call->request.set_handle(id);
  call->done = [done = std::move(done), route = *route](
                   absl::StatusOr<v1::DownloadResponse> response) mutable {
    std::move(done)(TensorFromDownload(route.Finish(std::move(response))));
  };
  PrepareContext(call->context, timeout, "");
  if (canceller != nullptr) {
    canceller->Attach(
        std::shared_ptr<grpc::ClientContext>(call, &call->context));
  }
  v1::MatmulService::Stub::async_interface* async = route->stub().async();
  StartAsync(std::move(call), [async](auto&&... args) {
    async->Download(std::forward<decltype(args)>(args)...);
  });
}

absl::Status MatmulClient::Delete(const std::string& id,
                                  absl::Duration timeout) {
  if (id.empty()) return absl::InvalidArgumentError("the handle id is empty");
  ASSIGN_OR_RETURN(const HandleRoute route, RouteHandles(id));
  grpc::ClientContext context;
  PrepareContext(context, timeout, "");
  v1::DeleteRequest request;
  request.set_handle(id);
  v1::DeleteResponse response;
  return route.Finish(
      FromGrpcStatus(route.stub().Delete(&context, request, &response)));
}

void MatmulClient::DeleteAsync(const std::string& id, absl::Duration timeout,
                               StatusDone done,
                               std::shared_ptr<CallCanceller> canceller) {
  if (id.empty()) {
    std::move(done)(absl::InvalidArgumentError("the handle id is empty"));
    return;
  }
  absl::StatusOr<HandleRoute> route = RouteHandles(id);
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  using Call = AsyncCall<v1::DeleteRequest, v1::DeleteResponse>;
  auto call = std::make_shared<Call>();
  call->request.set_handle(id);
  call->done = [done = std::move(done), route = *route](
                   absl::StatusOr<v1::DeleteResponse> response) mutable {
    std::move(done)(route.Finish(response.status()));
  };
  PrepareContext(call->context, timeout, "");
  if (canceller != nullptr) {
    canceller->Attach(
        std::shared_ptr<grpc::ClientContext>(call, &call->context));
  }
  v1::MatmulService::Stub::async_interface* async = route->stub().async();
  StartAsync(std::move(call), [async](auto&&... args) {
    async->Delete(std::forward<decltype(args)>(args)...);
  });
}

}  // namespace matmul
