#include "server/rpc/multiply.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "matmul/v1/matmul.pb.h"
#include "server/request_validation.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/multiply_wire.h"
#include "server/rpc/raw_messages.h"
#include "server/rpc/stored_tensors.h"
#include "server/rpc/unary_job_reactor.h"

namespace matmul {
namespace {

// Multiply, decoded from the wire without copying operand data.
class MultiplyReactor final : public UnaryJobReactor {
 public:
  MultiplyReactor(ServiceState& state, grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : UnaryJobReactor(state, context, RpcMethod::kMultiply),
        request_(request),
        response_(response) {}

  void Start();

  absl::Status WriteOperands(absl::Span<std::byte> a,
                             absl::Span<std::byte> b) override {
    const int64_t want_a = a.empty() ? 0 : wire_.a.data_bytes;
    const int64_t want_b = b.empty() ? 0 : wire_.b.data_bytes;
    if (static_cast<int64_t>(a.size()) != want_a ||
        static_cast<int64_t>(b.size()) != want_b) {
      return absl::InternalError(absl::StrCat("staging size mismatch: a ",
                                              a.size(), " vs ", want_a, ", b ",
                                              b.size(), " vs ", want_b));
    }
    absl::Status copied = Copy([&] {
      if (!a.empty()) CopyPieces(wire_.a.data, a.data());
      if (!b.empty()) CopyPieces(wire_.b.data, b.data());
    });
    if (copied.ok()) {
      state_.copied_operand_bytes.fetch_add(
          static_cast<int64_t>(a.size() + b.size()), std::memory_order_relaxed);
    }
    return copied;
  }

 private:
  absl::Status Respond(const MatmulSpec& spec, JobResult& result) override;

  const grpc::ByteBuffer* const request_;
  grpc::ByteBuffer* const response_;
  std::vector<grpc::Slice> slices_;  // the request's bytes, referenced
  std::vector<ByteChunk> chunks_;
  WireMultiplyRequest wire_;
  std::vector<int64_t> a_shape_;  // of stored operands
  std::vector<int64_t> b_shape_;
  bool keep_result_ = false;
  absl::Duration keep_ttl_;
};

void MultiplyReactor::Start() {
  if (!Open()) return;
  // A request that never fully arrived is the client's cancellation, not
  // a malformed request.
  if (absl::Status arrived = RequestArrived(*request_, *context_);
      !arrived.ok()) {
    Reject(RequestRejection(arrived), arrived);
    return;
  }
  if (grpc::Status dumped = request_->Dump(&slices_); !dumped.ok()) {
    RejectRequest(
        absl::InvalidArgumentError("cannot read the request's bytes"));
    return;
  }
  chunks_.reserve(slices_.size());
  for (const grpc::Slice& slice : slices_) {
    chunks_.emplace_back(slice.begin(), slice.size());
  }
  absl::StatusOr<WireMultiplyRequest> wire = DecodeMultiplyRequest(chunks_);
  if (!wire.ok()) {
    RejectRequest(wire.status());
    return;
  }
  wire_ = std::move(*wire);

  JobDescription job;
  MultiplyOp multiply;
  MultiplyHeader header = wire_.header();
  if (!wire_.a_handle.empty()) {
    if (absl::Status s = ResolveHandle(state_.handles, wire_.a_handle, "a",
                                       header.a, multiply.resident_a, a_shape_);
        !s.ok()) {
      RejectRequest(s);
      return;
    }
  }
  if (!wire_.b_handle.empty()) {
    if (absl::Status s = ResolveHandle(state_.handles, wire_.b_handle, "b",
                                       header.b, multiply.resident_b, b_shape_);
        !s.ok()) {
      RejectRequest(s);
      return;
    }
  }
  absl::StatusOr<MatmulSpec> spec =
      ValidateMultiplyHeader(header, state_.limits);
  if (!spec.ok()) {
    RejectRequest(spec.status());
    return;
  }
  job.spec = *spec;
  if (wire_.keep_result) {
    absl::StatusOr<absl::Duration> ttl =
        state_.handles.Ttl(wire_.result_ttl_seconds);
    if (!ttl.ok()) {
      RejectRequest(ttl.status());
      return;
    }
    keep_ttl_ = *ttl;
    keep_result_ = multiply.keep_result = true;
  }
  Operation op;
  op.kind = OperationKind::kMultiply;
  op.spec = &job.spec;
  // Bytes this request holds in server memory: its operands in gRPC's
  // buffers (until it finishes) and its product in staging.
  op.held_bytes = (multiply.resident_a ? 0 : spec->a_bytes()) +
                  (multiply.resident_b ? 0 : spec->b_bytes()) +
                  (multiply.keep_result ? 0 : spec->c_bytes());
  if (multiply.keep_result) {
    op.stored_bytes = spec->c_bytes();
    op.client = ClientKey(*context_);
  }
  if (!Admit(std::move(op))) return;
  job.op = std::move(multiply);
  Submit(std::move(job));
}

absl::Status MultiplyReactor::Respond(const MatmulSpec& spec,
                                      JobResult& result) {
  const std::vector<int64_t> c_shape =
      ApiShape(spec.c_is_3d, spec.batch, spec.m, spec.n);
  if (keep_result_) {
    if (result.resident() == nullptr || !lease_.has_reservation()) {
      return absl::InternalError("the engine kept no result");
    }
    const HandleRegistry::Entry entry = state_.handles.Add(
        lease_.TakeReservation(), result.resident(), c_shape, keep_ttl_);
    v1::MultiplyResponse response;
    FillHandle(entry, response.mutable_c_handle());
    response.mutable_placement()->set_device(result.placement().device);
    response.mutable_placement()->set_stream(result.placement().stream);
    const std::string bytes = response.SerializeAsString();
    grpc::Slice slice(bytes);
    *response_ = grpc::ByteBuffer(&slice, 1);
    return absl::OkStatus();
  }
  // The product goes out as its own slice, straight from staging; the
  // staging is released when gRPC has sent it.
  const ResponseFraming framing = FrameMultiplyResponse(
      c_shape, DTypeToProto(spec.dtype), spec.c_bytes(),
      result.placement().device, result.placement().stream);
  auto* held = new JobResult(std::move(result));
  grpc::Slice parts[3] = {
      grpc::Slice(framing.prefix),
      grpc::Slice(
          const_cast<std::byte*>(held->c().data()), held->c().size(),
          [](void* p) { delete static_cast<JobResult*>(p); }, held),
      grpc::Slice(framing.suffix)};
  *response_ = grpc::ByteBuffer(parts, 3);
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* StartMultiply(ServiceState& state,
                                        grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) {
  auto* reactor = new MultiplyReactor(state, context, request, response);
  reactor->Start();
  return reactor;
}

}  // namespace matmul
