#include "server/rpc/transfers.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/request_validation.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_messages.h"
#include "server/rpc/stored_tensors.h"
#include "server/rpc/unary_job_reactor.h"

namespace matmul {
namespace {

// Upload and Download: one tensor into or out of engine memory. The
// reactor owns the parsed request and the response message; the raw
// response is serialized from it.
class TransferReactor final : public UnaryJobReactor {
 public:
  TransferReactor(ServiceState& state, grpc::CallbackServerContext* context,
                  RpcMethod method, grpc::ByteBuffer* response)
      : UnaryJobReactor(state, context, method), response_(response) {}

  // Each parses `request`, then starts the transfer.
  void StartUpload(const grpc::ByteBuffer* request);
  void StartDownload(const grpc::ByteBuffer* request);

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte>) override {
    if (upload_ == nullptr || a.size() != upload_->tensor().data().size()) {
      return absl::InternalError("staging size mismatch");
    }
    const std::string& data = upload_->tensor().data();
    state_.metrics->RecordPayload(PayloadPath::kHandle, PayloadDirection::kIn,
                                  static_cast<int64_t>(a.size()));
    return Copy([&] { std::memcpy(a.data(), data.data(), a.size()); });
  }

 private:
  absl::Status Respond(const MatmulSpec& spec, JobResult& result) override;

  grpc::ByteBuffer* const response_;
  // Set by StartUpload or StartDownload (the other stays null).
  const v1::UploadRequest* upload_ = nullptr;
  const v1::DownloadRequest* download_ = nullptr;
  v1::UploadRequest upload_request_;
  v1::DownloadRequest download_request_;
  std::vector<int64_t> shape_;
  absl::Duration ttl_;
  std::shared_ptr<ResidentTensor> downloading_;
};

void TransferReactor::StartUpload(const grpc::ByteBuffer* request) {
  if (!Parse(request, upload_request_)) return;
  upload_ = &upload_request_;
  if (!Open()) return;
  OperandHeader header;
  header.present = upload_->has_tensor();
  header.shape = absl::MakeConstSpan(upload_->tensor().shape().data(),
                                     upload_->tensor().shape_size());
  header.dtype = upload_->tensor().dtype();
  header.data_bytes = static_cast<int64_t>(upload_->tensor().data().size());
  absl::StatusOr<TensorDims> dims =
      ValidateTensor(header, "tensor", state_.limits);
  if (!dims.ok()) {
    RejectRequest(dims.status());
    return;
  }
  JobDescription job;
  job.op = UploadOp{};
  job.spec.dtype = dims->dtype;
  job.spec.a_batch = job.spec.batch = dims->batch;
  job.spec.m = dims->rows;
  job.spec.k = dims->cols;
  job.spec.n = 0;
  absl::StatusOr<absl::Duration> ttl =
      state_.handles.Ttl(upload_->ttl_seconds());
  if (!ttl.ok()) {
    RejectRequest(ttl.status());
    return;
  }
  ttl_ = *ttl;
  shape_ = ApiShape(dims->is_3d, dims->batch, dims->rows, dims->cols);
  Operation op;
  op.kind = OperationKind::kUpload;
  op.spec = &job.spec;
  op.held_bytes = header.data_bytes;  // the request, until it is staged
  op.stored_bytes = header.data_bytes;
  op.client = Client();
  if (!Admit(std::move(op))) return;
  if (upload_->has_device()) {
    const std::vector<DeviceInfo>& devices = lease_.engine()->info().devices;
    const bool known = std::any_of(
        devices.begin(), devices.end(),
        [&](const DeviceInfo& d) { return d.index == upload_->device(); });
    if (!known) {
      RejectRequest(absl::InvalidArgumentError(
          absl::StrCat("device: no device ", upload_->device(), " (",
                       devices.size(), " on this server; see GetServerInfo)")));
      return;
    }
    job.device = upload_->device();
  }
  Submit(std::move(job));
}

void TransferReactor::StartDownload(const grpc::ByteBuffer* request) {
  if (!Parse(request, download_request_)) return;
  download_ = &download_request_;
  if (!Open()) return;
  absl::StatusOr<HandleRegistry::Entry> entry =
      state_.handles.Get(download_->handle());
  if (!entry.ok()) {
    RejectRequest(
        absl::Status(entry.status().code(),
                     absl::StrCat("handle: ", entry.status().message())));
    return;
  }
  shape_ = entry->shape;
  JobDescription job;
  job.op = DownloadOp{entry->tensor, 0};
  job.spec.dtype = entry->tensor->dtype();
  job.spec.batch = entry->tensor->batch();
  job.spec.a_batch = job.spec.b_batch = 0;
  job.spec.m = entry->tensor->rows();
  job.spec.n = entry->tensor->cols();
  job.spec.k = 0;
  if (job.spec.c_bytes() > state_.limits.max_message_bytes - 128) {
    RejectRequest(absl::ResourceExhaustedError(
        absl::StrCat("the stored tensor is ", job.spec.c_bytes(),
                     " bytes, over the server's max message size of ",
                     state_.limits.max_message_bytes, " bytes")));
    return;
  }
  Operation op;
  op.kind = OperationKind::kDownload;
  op.spec = &job.spec;
  op.held_bytes = job.spec.c_bytes();  // staging, then the response
  if (!Admit(std::move(op))) return;
  Submit(std::move(job));
}

absl::Status TransferReactor::Respond(const MatmulSpec& spec,
                                      JobResult& result) {
  if (upload_ != nullptr) {
    if (result.resident() == nullptr) {
      return absl::InternalError("the engine stored nothing");
    }
    if (!lease_.has_reservation()) {
      return absl::InternalError("the upload holds no quota reservation");
    }
    const HandleRegistry::Entry entry = state_.handles.Add(
        lease_.TakeReservation(), result.resident(), shape_, ttl_);
    v1::UploadResponse response;
    FillHandle(entry, response.mutable_handle());
    return SerializeResponse(response, response_);
  }
  v1::DownloadResponse response;
  v1::Tensor* tensor = response.mutable_tensor();
  for (int64_t d : shape_) tensor->add_shape(d);
  tensor->set_dtype(DTypeToProto(spec.dtype));
  tensor->set_data(reinterpret_cast<const char*>(result.c().data()),
                   result.c().size());
  // The one copy of result bytes out of staging in the server (Multiply and
  // MultiplyStream send their products from staging).
  state_.copied_result_bytes.fetch_add(static_cast<int64_t>(result.c().size()),
                                       std::memory_order_relaxed);
  state_.metrics->RecordPayload(PayloadPath::kHandle, PayloadDirection::kOut,
                                static_cast<int64_t>(result.c().size()));
  return SerializeResponse(response, response_);
}

}  // namespace

grpc::ServerUnaryReactor* StartUpload(ServiceState& state,
                                      grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) {
  auto* reactor =
      new TransferReactor(state, context, RpcMethod::kUpload, response);
  reactor->StartUpload(request);
  return reactor;
}

grpc::ServerUnaryReactor* StartDownload(ServiceState& state,
                                        grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) {
  auto* reactor =
      new TransferReactor(state, context, RpcMethod::kDownload, response);
  reactor->StartDownload(request);
  return reactor;
}

grpc::ServerUnaryReactor* DeleteHandle(ServiceState& state,
                                       grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) {
  const auto started = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::DeleteRequest parsed;
  absl::Status status = ParseRequest(*context, request, parsed);
  if (!status.ok()) {
    state.admission.RecordRejection(RequestRejection(status));
  } else {
    status = state.handles.Delete(parsed.handle());
    if (!status.ok()) {
      status = absl::Status(status.code(),
                            absl::StrCat("handle: ", status.message()));
    } else {
      status = SerializeResponse(v1::DeleteResponse(), response);
    }
  }
  const grpc::Status reply = ToGrpcStatus(status);
  state.metrics->RecordRequest(RpcMethod::kDelete, reply.error_code(),
                               SecondsSince(started));
  reactor->Finish(reply);
  return reactor;
}

}  // namespace matmul
