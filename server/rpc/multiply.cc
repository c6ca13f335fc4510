#include "server/rpc/multiply.h"

#include <cstring>
#include <limits>
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
    const int64_t want_a =
        a.empty() ? 0
                  : (in_region_[0] != nullptr ? a_bytes_ : wire_.a.data_bytes);
    const int64_t want_b =
        b.empty() ? 0
                  : (in_region_[1] != nullptr ? b_bytes_ : wire_.b.data_bytes);
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
      if (!a.empty() && in_region_[0] != nullptr) {
        faulted = CopyMappedMemory(a.data(), in_region_[0], a.size(),
                                   "operand a (shared memory)");
      }
      if (!b.empty() && in_region_[1] != nullptr && faulted.ok()) {
        faulted = CopyMappedMemory(b.data(), in_region_[1], b.size(),
                                   "operand b (shared memory)");
      }
      if (!faulted.ok()) return;
      // The inline ones, from gRPC's buffers, in one copy.
      StagingCopier::Part inline_parts[2];
      size_t n = 0;
      if (!a.empty() && in_region_[0] == nullptr) {
        inline_parts[n++] = {wire_.a.data, a.data()};
      }
      if (!b.empty() && in_region_[1] == nullptr) {
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
    for (SharedMemoryRegion::Use& use : regions_) use.Reset();
  }

  // Resolves the operands and product given in regions (Tensor.shared,
  // c_shared) against the validated spec: fills in_region_, c_in_region_
  // and regions_.
  absl::Status ResolveShared(const MatmulSpec& spec);

  const grpc::ByteBuffer* const request_;
  grpc::ByteBuffer* const response_;
  std::vector<grpc::Slice> slices_;  // the request's bytes, referenced
  std::vector<ByteChunk> chunks_;
  WireMultiplyRequest wire_;
  std::vector<int64_t> a_shape_;  // of stored operands
  std::vector<int64_t> b_shape_;
  bool keep_result_ = false;
  absl::Duration keep_ttl_;
  // Operands and product in shared-memory regions: where their bytes are,
  // and the regions, held until the job is done.
  const std::byte* in_region_[2] = {nullptr, nullptr};
  std::byte* c_in_region_ = nullptr;
  SharedMemoryRegion::Use regions_[3];
  int64_t a_bytes_ = 0;
  int64_t b_bytes_ = 0;
};

// Where `ref` (the operand called `name`, `bytes` long) lies in one of
// `owner`'s regions: the region and the first byte.
absl::Status FindInRegion(const SharedMemoryRegistry& regions,
                          const std::string& owner, const WireSharedRef& ref,
                          const char* name, int64_t bytes,
                          std::shared_ptr<SharedMemoryRegion>& found,
                          std::byte*& at) {
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> region =
      regions.Find(owner, ref.region_id);
  if (!region.ok()) {
    return absl::Status(
        region.status().code(),
        absl::StrCat(name, ".region_id: ", region.status().message()));
  }
  const int64_t size = (*region)->bytes();
  if (ref.offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".offset: expected 0 or more, got ", ref.offset));
  }
  if (ref.offset > size || bytes > size - ref.offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", bytes, " bytes at offset ", ref.offset,
                     " run past the end of region ", (*region)->id(), " (",
                     size, " bytes)"));
  }
  if (absl::Status mapped = (*region)->CheckStillMapped(); !mapped.ok()) {
    return absl::Status(mapped.code(),
                        absl::StrCat(name, ": ", mapped.message()));
  }
  at = (*region)->data() + ref.offset;
  found = std::move(*region);
  return absl::OkStatus();
}

absl::Status MultiplyReactor::ResolveShared(const MatmulSpec& spec) {
  const WireSharedRef* refs[3] = {&wire_.a.shared, &wire_.b.shared,
                                  &wire_.c_shared};
  if (!refs[0]->present && !refs[1]->present && !refs[2]->present) {
    return absl::OkStatus();
  }
  if (refs[2]->present && wire_.keep_result) {
    return absl::InvalidArgumentError(
        "keep_result and c_shared are both set; set at most one");
  }
  const std::string owner = ClientKey(*context_);
  const char* names[3] = {"a.shared", "b.shared", "c_shared"};
  const int64_t bytes[3] = {spec.a_bytes(), spec.b_bytes(), spec.c_bytes()};
  std::byte* at[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    if (!refs[i]->present) continue;
    std::shared_ptr<SharedMemoryRegion> region;
    if (absl::Status s = FindInRegion(state_.regions, owner, *refs[i], names[i],
                                      bytes[i], region, at[i]);
        !s.ok()) {
      return s;
    }
    // One hold per region, however many of A, B and C are in it: it counts
    // one multiply in flight.
    bool held = false;
    for (const SharedMemoryRegion::Use& use : regions_) {
      held = held || use.get() == region.get();
    }
    if (!held) regions_[i] = SharedMemoryRegion::Use(std::move(region));
  }
  // The product must not overwrite an operand: what the operand holds when
  // it is read would then depend on the order of the engine's copies.
  for (int i = 0; i < 2; ++i) {
    if (at[2] != nullptr && at[i] != nullptr && at[2] < at[i] + bytes[i] &&
        at[i] < at[2] + bytes[2]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "c_shared: the product's ", bytes[2], " bytes at offset ",
          refs[2]->offset, " overlap ", names[i], "'s ", bytes[i],
          " bytes at offset ", refs[i]->offset));
    }
  }
  in_region_[0] = at[0];
  in_region_[1] = at[1];
  c_in_region_ = at[2];
  a_bytes_ = spec.a_bytes();
  b_bytes_ = spec.b_bytes();
  return absl::OkStatus();
}

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
  // An operand in a region: its shape and dtype are validated as an inline
  // one's, its byte count against the region below.
  const WireTensor* operands[2] = {&wire_.a, &wire_.b};
  const std::string* handles[2] = {&wire_.a_handle, &wire_.b_handle};
  OperandHeader* headers[2] = {&header.a, &header.b};
  for (int i = 0; i < 2; ++i) {
    if (!operands[i]->shared.present) continue;
    const char* name = i == 0 ? "a" : "b";
    if (operands[i]->data_bytes > 0) {
      RejectRequest(absl::InvalidArgumentError(absl::StrCat(
          name, ": data and shared are both set; set exactly one")));
      return;
    }
    if (!handles[i]->empty()) {
      RejectRequest(absl::InvalidArgumentError(
          absl::StrCat(name, ".shared and ", name,
                       "_handle are both set; set exactly one")));
      return;
    }
    headers[i]->data_follows = true;
  }
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
  // Bytes in regions cross no message and hold no server memory, so they
  // are bounded by their regions (and the engine's fit), not by the message
  // size or the in-flight budget; what does travel or stay in the server
  // is checked against those below, once the regions are known.
  const bool any_shared = wire_.a.shared.present || wire_.b.shared.present ||
                          wire_.c_shared.present;
  RequestLimits limits = state_.limits;
  if (any_shared) {
    limits.max_message_bytes = std::numeric_limits<int64_t>::max() / 4;
    limits.max_inflight_bytes = std::numeric_limits<int64_t>::max() / 4;
  }
  absl::StatusOr<MatmulSpec> spec = ValidateMultiplyHeader(header, limits);
  if (!spec.ok()) {
    RejectRequest(spec.status());
    return;
  }
  job.spec = *spec;
  if (any_shared && !wire_.c_shared.present && !wire_.keep_result &&
      spec->c_bytes() > state_.limits.max_message_bytes - 128) {
    RejectRequest(absl::ResourceExhaustedError(
        absl::StrCat("the result would be ", spec->c_bytes(),
                     " bytes, over the server's max message size of ",
                     state_.limits.max_message_bytes,
                     " bytes; have it written into a region (c_shared)")));
    return;
  }
  if (absl::Status s = ResolveShared(*spec); !s.ok()) {
    RejectRequest(s);
    return;
  }
  const bool a_elsewhere =
      in_region_[0] != nullptr || multiply.resident_a != nullptr;
  const bool b_elsewhere =
      in_region_[1] != nullptr || multiply.resident_b != nullptr;
  if ((in_region_[0] != nullptr || in_region_[1] != nullptr) && a_elsewhere &&
      b_elsewhere) {
    // No operand inline: those in regions go to the device straight from
    // there (registered, so the copy engines read them directly), with no
    // staging copy. Beside an inline operand, one in a region is instead
    // copied into staging with it (WriteOperands): one memcpy, as the
    // inline one's, and the engine's staging path is kept whole.
    // Both in one region: one allocation, so the engine may upload them
    // in one copy where B follows A.
    const bool one_region =
        in_region_[0] != nullptr && in_region_[1] != nullptr &&
        wire_.a.shared.region_id == wire_.b.shared.region_id;
    multiply.prestaged =
        PrestagedOperands{in_region_[0], in_region_[1], one_region};
  }
  multiply.c_destination = c_in_region_;
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
  // Bytes this request holds in server memory: its inline operands in
  // gRPC's buffers (until it finishes) and its product in staging. Operands
  // and products in shared-memory regions are not server memory in flight:
  // they are the client's own pages, charged once against its stored-bytes
  // quota when it registered the region; so they take none of the budget
  // (a region operand staged beside an inline one uses engine staging,
  // which the engine's pool bounds, as it does every staged copy). Such a
  // multiply is still admitted like any other: draining, device fit,
  // deadline, and at least one byte of the budget.
  op.held_bytes =
      (multiply.resident_a || in_region_[0] != nullptr ? 0 : spec->a_bytes()) +
      (multiply.resident_b || in_region_[1] != nullptr ? 0 : spec->b_bytes()) +
      (multiply.keep_result || c_in_region_ != nullptr ? 0 : spec->c_bytes());
  if (any_shared && op.held_bytes > state_.limits.max_inflight_bytes) {
    // What the validation above skipped: never admissible, not load.
    RejectRequest(absl::ResourceExhaustedError(absl::StrCat(
        "the request needs ", op.held_bytes,
        " bytes in flight (inline operands and result), over the server's "
        "limit of ",
        state_.limits.max_inflight_bytes, " bytes (--max-inflight-bytes)")));
    return;
  }
  if (multiply.keep_result) {
    op.stored_bytes = spec->c_bytes();
    op.client = ClientKey(*context_);
  }
  if (!Admit(std::move(op))) return;
  state_.metrics->RecordPayload(PayloadPath::kInline, PayloadDirection::kIn,
                                wire_.a.data_bytes + wire_.b.data_bytes);
  job.op = std::move(multiply);
  Submit(std::move(job));
}

absl::Status MultiplyReactor::Respond(const MatmulSpec& spec,
                                      JobResult& result) {
  const std::vector<int64_t> c_shape =
      ApiShape(spec.c_is_3d, spec.batch, spec.m, spec.n);
  const int64_t from_regions = (in_region_[0] != nullptr ? spec.a_bytes() : 0) +
                               (in_region_[1] != nullptr ? spec.b_bytes() : 0);
  if (from_regions > 0) {
    state_.metrics->RecordPayload(PayloadPath::kSharedMemory,
                                  PayloadDirection::kIn, from_regions);
  }
  if (c_in_region_ != nullptr) {
    // The product is in the region already (the engine wrote it there
    // before the job was done); the answer says where.
    state_.metrics->RecordPayload(PayloadPath::kSharedMemory,
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
