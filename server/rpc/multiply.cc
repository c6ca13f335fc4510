#include "server/rpc/multiply.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/mapped_copy.h"
#include "matmul/v1/matmul.pb.h"
#include "server/request_validation.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/multiply_wire.h"
#include "server/rpc/plan_multiply.h"
#include "server/rpc/raw_messages.h"
#include "server/rpc/stored_tensors.h"
#include "server/rpc/unary_job_reactor.h"
#include "server/shared_memory/region_registry.h"

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
    // An operand in a region is staged only beside an inline one (see
    // Start); it is copied from the region.
    const int64_t want_a = a.empty() ? 0 : plan_.staged_bytes[0];
    const int64_t want_b = b.empty() ? 0 : plan_.staged_bytes[1];
    if (static_cast<int64_t>(a.size()) != want_a ||
        static_cast<int64_t>(b.size()) != want_b) {
      return absl::InternalError(absl::StrCat("staging size mismatch: a ",
                                              a.size(), " vs ", want_a, ", b ",
                                              b.size(), " vs ", want_b));
    }
    // A region's bytes are copied with CopyMappedMemory: its client may
    // truncate the object under us, which fails this request, not the
    // server.
    absl::Status faulted = absl::OkStatus();
    absl::Status copied = Copy([&] {
      if (!a.empty() && plan_.in_region[0] != nullptr) {
        faulted = CopyMappedMemory(a.data(), plan_.in_region[0], a.size(),
                                   "operand a (shared memory)");
      }
      if (!b.empty() && plan_.in_region[1] != nullptr && faulted.ok()) {
        faulted = CopyMappedMemory(b.data(), plan_.in_region[1], b.size(),
                                   "operand b (shared memory)");
      }
      if (!faulted.ok()) return;
      // The inline ones, from gRPC's buffers, in one copy.
      StagingCopier::Part inline_parts[2];
      size_t n = 0;
      if (!a.empty() && plan_.in_region[0] == nullptr) {
        inline_parts[n++] = {wire_.a.data, a.data()};
      }
      if (!b.empty() && plan_.in_region[1] == nullptr) {
        inline_parts[n++] = {wire_.b.data, b.data()};
      }
      if (n > 0) {
        state_.staging_copier.Copy(absl::MakeConstSpan(inline_parts, n));
      }
    });
    if (copied.ok()) copied = faulted;
    if (copied.ok()) {
      state_.copied_operand_bytes.fetch_add(
          static_cast<int64_t>(a.size() + b.size()), std::memory_order_relaxed);
    }
    return copied;
  }

 private:
  absl::Status Respond(const MatmulSpec& spec, JobResult& result) override;
  // The regions are the job's: unpinned and unmapped (if unregistered
  // meanwhile) as soon as it is done, before the answer goes out.
  void JobFinished() override {
    for (SharedMemoryRegion::Use& use : plan_.regions) use.Reset();
  }

  const grpc::ByteBuffer* const request_;
  grpc::ByteBuffer* const response_;
  std::vector<grpc::Slice> slices_;  // the request's bytes, referenced
  std::vector<ByteChunk> chunks_;
  WireMultiplyRequest wire_;
  // What PlanMultiply made of it; its job is moved out at Submit, the rest
  // (the regions, held until the job is done, and where the bytes lie) stays.
  MultiplyPlan plan_;
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

  absl::StatusOr<MultiplyPlan> plan = PlanMultiply(
      wire_,
      PlanContext{state_.limits, state_.handles, state_.regions, Client()});
  if (!plan.ok()) {
    RejectRequest(plan.status());
    return;
  }
  plan_ = std::move(*plan);
  Operation op = plan_.Admission();
  if (!Admit(std::move(op))) return;
  state_.metrics->RecordPayload(PayloadPath::kInline, PayloadDirection::kIn,
                                wire_.a.data_bytes + wire_.b.data_bytes);
  Submit(std::move(plan_.job));
}

absl::Status MultiplyReactor::Respond(const MatmulSpec& spec,
                                      JobResult& result) {
  const std::vector<int64_t> c_shape =
      ApiShape(spec.c_is_3d, spec.batch, spec.m, spec.n);
  const int64_t from_regions =
      (plan_.in_region[0] != nullptr ? spec.a_bytes() : 0) +
      (plan_.in_region[1] != nullptr ? spec.b_bytes() : 0);
  if (from_regions > 0) {
    state_.metrics->RecordPayload(PayloadPath::kSharedMemory,
                                  PayloadDirection::kIn, from_regions);
  }
  const int64_t from_gpu = (plan_.in_cuda[0] != nullptr ? spec.a_bytes() : 0) +
                           (plan_.in_cuda[1] != nullptr ? spec.b_bytes() : 0);
  if (from_gpu > 0) {
    state_.metrics->RecordPayload(PayloadPath::kCudaMemory,
                                  PayloadDirection::kIn, from_gpu);
  }
  if (wire_.c_shared.present) {
    // The product is in the region already (the engine wrote it there
    // before the job was done: into GPU memory, its stream synchronized);
    // the answer says where.
    state_.metrics->RecordPayload(plan_.in_cuda[2] != nullptr
                                      ? PayloadPath::kCudaMemory
                                      : PayloadPath::kSharedMemory,
                                  PayloadDirection::kOut, spec.c_bytes());
    v1::MultiplyResponse response;
    v1::Tensor* c = response.mutable_c();
    for (int64_t d : c_shape) c->add_shape(d);
    c->set_dtype(static_cast<v1::Dtype>(DTypeToProto(spec.dtype)));
    c->mutable_shared()->set_region_id(wire_.c_shared.region_id);
    c->mutable_shared()->set_offset(wire_.c_shared.offset);
    response.mutable_placement()->set_device(result.placement().device);
    response.mutable_placement()->set_stream(result.placement().stream);
    return SerializeResponse(response, response_);
  }
  if (plan_.keep_ttl.has_value()) {
    if (result.resident() == nullptr || !lease_.has_reservation()) {
      return absl::InternalError("the engine kept no result");
    }
    const HandleRegistry::Entry entry = state_.handles.Add(
        lease_.TakeReservation(), result.resident(), c_shape, *plan_.keep_ttl);
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
  state_.metrics->RecordPayload(PayloadPath::kInline, PayloadDirection::kOut,
                                spec.c_bytes());
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
