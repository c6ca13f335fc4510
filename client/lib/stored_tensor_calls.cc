// MatmulClient's stored-tensor calls: Upload, Download and Delete, blocking
// and asynchronous. Large tensors travel in chunks (UploadStream,
// DownloadStream), each call one gRPC callback reactor; the blocking calls
// wait for theirs.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/lib/matmul_client.h"
#include "client/lib/tensor_proto.h"
#include "client/lib/unary_call.h"
#include "common/handle_id.h"
#include "common/status_macros.h"
#include "proto/dtype_mapping.h"

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

// Whether Upload sends `tensor` in chunks.
bool Chunked(const HostTensor& tensor, const UploadOptions& options) {
  return options.chunk_bytes > 0 ||
         static_cast<int64_t>(tensor.data.size()) > kUploadChunkedAboveBytes;
}

// `options`, with the device of the tensor it is stored near (`near`)
// unless it names one.
UploadOptions WithNearDevice(const UploadOptions& options) {
  if (options.near.empty() || options.device.has_value()) return options;
  const std::optional<HandleHome> home = HandleHomeOf(options.near);
  if (!home.has_value() || home->device < 0) return options;
  UploadOptions placed = options;
  placed.device = home->device;
  return placed;
}

// The first message of an UploadStream: the UploadRequest without the data.
absl::StatusOr<v1::UploadStreamRequest> MakeUploadStart(
    const HostTensor& tensor, const UploadOptions& options) {
  if (tensor.shape.size() != 2 && tensor.shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: shape ", ShapeString(tensor.shape), " has ",
                     tensor.shape.size(),
                     " dimension(s); a stored tensor is 2-D [rows, cols] or "
                     "3-D [batch, rows, cols]"));
  }
  if (absl::Status s = CheckHostTensor(tensor); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor: ", s.message()));
  }
  if (options.chunk_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: expected 0 (by size) or more, got ",
                     options.chunk_bytes));
  }
  v1::UploadStreamRequest message;
  v1::UploadRequest* start = message.mutable_start();
  for (int64_t d : tensor.shape) start->mutable_tensor()->add_shape(d);
  start->mutable_tensor()->set_dtype(DTypeToProto(tensor.dtype));
  if (options.device.has_value()) start->set_device(*options.device);
  ASSIGN_OR_RETURN(const int64_t ttl, TtlSeconds(options.ttl, "ttl"));
  start->set_ttl_seconds(ttl);
  return message;
}

// One UploadStream call: the start, then the tensor's chunks in order, then
// the close; the answer is the handle. Owns itself until OnDone.
class UploadStreamCall final
    : public grpc::ClientWriteReactor<v1::UploadStreamRequest> {
 public:
  UploadStreamCall(std::shared_ptr<const HostTensor> tensor,
                   v1::UploadStreamRequest start, int64_t chunk_bytes,
                   MatmulClient::StoredDone done)
      : tensor_(std::move(tensor)),
        message_(std::move(start)),
        chunk_bytes_(chunk_bytes),
        done_(std::move(done)) {}

  grpc::ClientContext& context() { return context_; }
  v1::UploadStreamResponse* response() { return &response_; }

  // Starts the call; `self` is this call, kept until OnDone.
  void Go(std::shared_ptr<UploadStreamCall> self) {
    self_ = std::move(self);
    StartWrite(&message_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    // Not ok: the call has ended (OnDone says how).
    if (!ok) return;
    const std::string& data = tensor_->data;
    const int64_t total = static_cast<int64_t>(data.size());
    if (offset_ >= total) {
      StartWritesDone();
      return;
    }
    const int64_t bytes = std::min(chunk_bytes_, total - offset_);
    message_.Clear();
    v1::TensorChunk* chunk = message_.mutable_chunk();
    chunk->set_offset(offset_);
    chunk->set_data(data.data() + offset_, static_cast<size_t>(bytes));
    offset_ += bytes;
    StartWrite(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<UploadStreamCall> self = std::move(self_);
    auto done = std::move(done_);
    v1::UploadResponse upload;
    *upload.mutable_handle() = std::move(*response_.mutable_handle());
    absl::StatusOr<v1::UploadResponse> response =
        status.ok() ? absl::StatusOr<v1::UploadResponse>(std::move(upload))
                    : FromGrpcStatus(status);
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      response = absl::UnimplementedError(absl::StrCat(
          "the server does not take chunked uploads (UploadStream: ",
          status.error_message(),
          "); it stores tensors of at most its max message size, which "
          "Upload sends in one message"));
    }
    tensor_.reset();
    std::move(done)(StoredFromUpload(std::move(response)));
  }

 private:
  std::shared_ptr<const HostTensor> tensor_;
  v1::UploadStreamRequest message_;  // the one write in flight
  const int64_t chunk_bytes_;
  MatmulClient::StoredDone done_;
  grpc::ClientContext context_;
  v1::UploadStreamResponse response_;
  int64_t offset_ = 0;  // of the next chunk
  std::shared_ptr<UploadStreamCall> self_;
};

// One DownloadStream call: the handle, then the chunks, written into the
// tensor in place. Owns itself until OnDone.
class DownloadStreamCall final
    : public grpc::ClientReadReactor<v1::DownloadStreamResponse> {
 public:
  // `fallback` is called instead of `done` when the server has no
  // DownloadStream.
  DownloadStreamCall(
      MatmulClient::TensorDone done,
      absl::AnyInvocable<void(MatmulClient::TensorDone) &&> fallback)
      : done_(std::move(done)), fallback_(std::move(fallback)) {}

  grpc::ClientContext& context() { return context_; }
  v1::DownloadStreamRequest& request() { return request_; }

  void Go(std::shared_ptr<DownloadStreamCall> self) {
    self_ = std::move(self);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the call has ended (OnDone says how)
    if (absl::Status s = Take(); !s.ok()) {
      error_ = std::move(s);
      context_.TryCancel();
      return;
    }
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<DownloadStreamCall> self = std::move(self_);
    auto done = std::move(done_);
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
        !header_.has_value()) {
      std::move(fallback_)(std::move(done));
      return;
    }
    absl::StatusOr<HostTensor> result = std::move(tensor_);
    if (!error_.ok()) {
      result = std::move(error_);
    } else if (!status.ok()) {
      result = FromGrpcStatus(status);
    } else if (!header_.has_value() || received_ != header_->bytes) {
      result = absl::InternalError(absl::StrCat(
          "the server's DownloadStream ended after ", received_, " of ",
          header_.has_value() ? header_->bytes : 0, " bytes"));
    }
    self.reset();
    std::move(done)(std::move(result));
  }

 private:
  // The message just read, into the tensor.
  absl::Status Take() {
    auto malformed = [](absl::string_view why) {
      return absl::InternalError(
          absl::StrCat("the server's DownloadStream is malformed: ", why));
    };
    if (!header_.has_value()) {
      if (message_.kind_case() != v1::DownloadStreamResponse::kHandle) {
        return malformed("its first message is not the handle");
      }
      absl::StatusOr<StoredTensor> stored =
          StoredTensorFromProto(message_.handle());
      if (!stored.ok()) return malformed(stored.status().message());
      absl::StatusOr<int64_t> bytes = NumBytes(stored->shape, stored->dtype);
      if (!bytes.ok() || *bytes != stored->bytes) {
        return malformed("the handle's bytes do not match its shape");
      }
      tensor_.shape = stored->shape;
      tensor_.dtype = stored->dtype;
      tensor_.data.resize(static_cast<size_t>(stored->bytes));
      header_ = *std::move(stored);
      return absl::OkStatus();
    }
    if (message_.kind_case() != v1::DownloadStreamResponse::kChunk) {
      return malformed("a second handle");
    }
    const v1::TensorChunk& chunk = message_.chunk();
    const int64_t bytes = static_cast<int64_t>(chunk.data().size());
    if (chunk.offset() != received_ || bytes > header_->bytes - received_) {
      return malformed(absl::StrCat("a chunk of ", bytes, " bytes at offset ",
                                    chunk.offset(), " after ", received_,
                                    " of ", header_->bytes, " bytes"));
    }
    std::memcpy(tensor_.data.data() + received_, chunk.data().data(),
                static_cast<size_t>(bytes));
    received_ += bytes;
    return absl::OkStatus();
  }

  MatmulClient::TensorDone done_;
  absl::AnyInvocable<void(MatmulClient::TensorDone) &&> fallback_;
  grpc::ClientContext context_;
  v1::DownloadStreamRequest request_;
  v1::DownloadStreamResponse message_;
  std::optional<StoredTensor> header_;
  HostTensor tensor_;
  int64_t received_ = 0;
  absl::Status error_;
  std::shared_ptr<DownloadStreamCall> self_;
};

// Runs an asynchronous call and waits for its outcome.
template <typename T, typename Start>
absl::StatusOr<T> Wait(Start start) {
  absl::Notification finished;
  absl::StatusOr<T> outcome = absl::UnknownError("not run");
  start([&](absl::StatusOr<T> result) {
    outcome = std::move(result);
    finished.Notify();
  });
  finished.WaitForNotification();
  return outcome;
}

}  // namespace

void MatmulClient::UploadChunkedAsync(std::shared_ptr<const HostTensor> tensor,
                                      const UploadOptions& options,
                                      StoredDone done) {
  absl::StatusOr<v1::UploadStreamRequest> start =
      MakeUploadStart(*tensor, options);
  if (!start.ok()) {
    std::move(done)(start.status());
    return;
  }
  absl::StatusOr<HandleRoute> route = RouteHandles(options.near);
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  // UNAVAILABLE from the server of `near` becomes NOT_FOUND, naming it.
  done = [done = std::move(done),
          route = *route](absl::StatusOr<StoredTensor> stored) mutable {
    std::move(done)(route.Finish(std::move(stored)));
  };
  const int64_t elem = static_cast<int64_t>(DTypeSize(tensor->dtype));
  int64_t chunk =
      options.chunk_bytes > 0 ? options.chunk_bytes : kUploadDefaultChunkBytes;
  chunk = std::min<int64_t>(chunk, int64_t{64} << 20);
  chunk = std::max(elem, chunk / elem * elem);
  auto call = std::make_shared<UploadStreamCall>(
      std::move(tensor), *std::move(start), chunk, std::move(done));
  PrepareContext(call->context(), options.timeout, options.client_id);
  if (options.canceller != nullptr) {
    options.canceller->Attach(
        std::shared_ptr<grpc::ClientContext>(call, &call->context()));
  }
  route->stub().async()->UploadStream(&call->context(), call->response(),
                                      call.get());
  call->Go(call);
}

void MatmulClient::DownloadChunkedAsync(
    const std::string& id, absl::Duration timeout, TensorDone done,
    std::shared_ptr<CallCanceller> canceller) {
  absl::StatusOr<HandleRoute> route = RouteHandles(id);
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  // UNAVAILABLE from the handle's server becomes NOT_FOUND, naming it.
  TensorDone finished = [done = std::move(done), route = *route](
                            absl::StatusOr<HostTensor> tensor) mutable {
    std::move(done)(route.Finish(std::move(tensor)));
  };
  auto call = std::make_shared<DownloadStreamCall>(
      std::move(finished),
      [this, id, timeout, canceller](TensorDone done) mutable {
        DownloadUnaryAsync(id, timeout, std::move(done), std::move(canceller));
      });
  call->request().set_handle(id);
  call->request().set_chunk_bytes(kDownloadChunkBytes);
  PrepareContext(call->context(), timeout, "");
  if (canceller != nullptr) {
    canceller->Attach(
        std::shared_ptr<grpc::ClientContext>(call, &call->context()));
  }
  route->stub().async()->DownloadStream(&call->context(), &call->request(),
                                        call.get());
  call->Go(call);
}

absl::StatusOr<StoredTensor> MatmulClient::Upload(const HostTensor& tensor,
                                                  const UploadOptions& given) {
  RETURN_IF_ERROR(CheckClientId(given.client_id));
  const UploadOptions options = WithNearDevice(given);
  auto chunked = [&](const UploadOptions& with) {
    // The caller's tensor outlives the call: no copy.
    std::shared_ptr<const HostTensor> borrowed(&tensor,
                                               [](const HostTensor*) {});
    return Wait<StoredTensor>([&](StoredDone done) {
      UploadChunkedAsync(std::move(borrowed), with, std::move(done));
    });
  };
  absl::StatusOr<StoredTensor> stored;
  if (Chunked(tensor, options)) {
    stored = chunked(options);
  } else {
    ASSIGN_OR_RETURN(const v1::UploadRequest request,
                     MakeUploadRequest(tensor, options));
    ASSIGN_OR_RETURN(const HandleRoute route, RouteHandles(options.near));
    grpc::ClientContext context;
    PrepareContext(context, options.timeout, options.client_id);
    v1::UploadResponse response;
    const grpc::Status status =
        route.stub().Upload(&context, request, &response);
    stored = route.Finish(
        status.ok() ? StoredFromUpload(std::move(response))
                    : absl::StatusOr<StoredTensor>(FromGrpcStatus(status)));
  }
  // A server whose messages are smaller than this client's choice (one
  // message up to kUploadChunkedAboveBytes, then kUploadDefaultChunkBytes
  // chunks) refused one: then in chunks under its limit.
  if (options.chunk_bytes == 0 &&
      stored.status().code() == absl::StatusCode::kResourceExhausted &&
      absl::StrContains(stored.status().message(), "larger than max")) {
    ASSIGN_OR_RETURN(const v1::GetServerInfoResponse info,
                     GetServerInfo(options.timeout));
    const int64_t limit = info.limits().max_message_bytes();
    if (limit > 0) {
      UploadOptions smaller = options;
      smaller.chunk_bytes =
          std::min(kUploadDefaultChunkBytes, std::max(limit / 2, limit - 1024));
      stored = chunked(smaller);
    }
  }
  return stored;
}

void MatmulClient::UploadAsync(const HostTensor& tensor,
                               const UploadOptions& given, StoredDone done) {
  if (absl::Status s = CheckClientId(given.client_id); !s.ok()) {
    std::move(done)(s);
    return;
  }
  const UploadOptions options = WithNearDevice(given);
  if (Chunked(tensor, options)) {
    UploadChunkedAsync(std::make_shared<const HostTensor>(tensor), options,
                       std::move(done));
    return;
  }
  absl::StatusOr<v1::UploadRequest> request =
      MakeUploadRequest(tensor, options);
  if (!request.ok()) {
    std::move(done)(request.status());
    return;
  }
  absl::StatusOr<HandleRoute> route = RouteHandles(options.near);
  if (!route.ok()) {
    std::move(done)(route.status());
    return;
  }
  using Call = AsyncCall<v1::UploadRequest, v1::UploadResponse>;
  auto call = std::make_shared<Call>();
  call->request = *std::move(request);
  call->done = [done = std::move(done), route = *route](
                   absl::StatusOr<v1::UploadResponse> response) mutable {
    std::move(done)(route.Finish(StoredFromUpload(std::move(response))));
  };
  PrepareContext(call->context, options.timeout, options.client_id);
  if (options.canceller != nullptr) {
    options.canceller->Attach(
        std::shared_ptr<grpc::ClientContext>(call, &call->context));
  }
  v1::MatmulService::Stub::async_interface* async = route->stub().async();
  StartAsync(std::move(call), [async](auto&&... args) {
    async->Upload(std::forward<decltype(args)>(args)...);
  });
}

absl::StatusOr<HostTensor> MatmulClient::Download(const std::string& id,
                                                  absl::Duration timeout) {
  if (id.empty()) return absl::InvalidArgumentError("the handle id is empty");
  return Wait<HostTensor>([&](TensorDone done) {
    DownloadChunkedAsync(id, timeout, std::move(done), nullptr);
  });
}

void MatmulClient::DownloadAsync(const std::string& id, absl::Duration timeout,
                                 TensorDone done,
                                 std::shared_ptr<CallCanceller> canceller) {
  if (id.empty()) {
    std::move(done)(absl::InvalidArgumentError("the handle id is empty"));
    return;
  }
  DownloadChunkedAsync(id, timeout, std::move(done), std::move(canceller));
}

void MatmulClient::DownloadUnaryAsync(
    const std::string& id, absl::Duration timeout, TensorDone done,
    std::shared_ptr<CallCanceller> canceller) {
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
