#include "bench/service/bench_shared_memory.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace matmul {
namespace {

int64_t Aligned(int64_t bytes) {
  return (bytes + kSharedTensorAlignment - 1) / kSharedTensorAlignment *
         kSharedTensorAlignment;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemoryPoint>> SharedMemoryPoint::Create(
    MatmulClient* client, const Workload& workload, int slots) {
  if (slots < 1 || workload.requests.empty()) {
    return absl::InvalidArgumentError(
        "shared memory: a point needs a slot and a request");
  }
  std::unique_ptr<SharedMemoryPoint> point(new SharedMemoryPoint);
  for (int i = 0; i < slots; ++i) {
    const int w = i % static_cast<int>(workload.requests.size());
    const v1::MultiplyRequest& source = *workload.requests[w];
    SharedTensor a{{source.a().shape().begin(), source.a().shape().end()},
                   workload.dtype,
                   0};
    SharedTensor b{{source.b().shape().begin(), source.b().shape().end()},
                   workload.dtype,
                   0};
    ASSIGN_OR_RETURN(const std::vector<int64_t> c_shape,
                     ProductShape(a.shape, b.shape, source.transpose_a(),
                                  source.transpose_b()));
    ASSIGN_OR_RETURN(const int64_t c_bytes, NumBytes(c_shape, workload.dtype));
    const int64_t bytes =
        Aligned(static_cast<int64_t>(source.a().data().size())) +
        Aligned(static_cast<int64_t>(source.b().data().size())) +
        std::max<int64_t>(c_bytes, 1);
    absl::StatusOr<std::unique_ptr<SharedMemorySession>> session =
        SharedMemorySession::Create(client, bytes);
    if (!session.ok()) {
      return absl::Status(
          session.status().code(),
          absl::StrCat("shared memory: registering region ", i + 1, " of ",
                       slots, " (", bytes, " bytes): ",
                       absl::StatusCodeToString(session.status().code()), ": ",
                       session.status().message()));
    }
    SharedMemorySession& s = **session;
    ASSIGN_OR_RETURN(a, s.Allocate(a.shape, a.dtype));
    ASSIGN_OR_RETURN(b, s.Allocate(b.shape, b.dtype));
    ASSIGN_OR_RETURN(SharedTensor c, s.Allocate(c_shape, workload.dtype));
    for (auto [t, data] : {std::make_pair(&a, &source.a().data()),
                           std::make_pair(&b, &source.b().data())}) {
      ASSIGN_OR_RETURN(absl::Span<char> place, s.Bytes(*t));
      if (place.size() != data->size()) {
        return absl::InternalError("shared memory: an operand's size");
      }
      if (!place.empty()) std::memcpy(place.data(), data->data(), data->size());
    }
    MultiplyOptions options;
    options.transpose_a = source.transpose_a();
    options.transpose_b = source.transpose_b();
    options.compute = source.compute_mode() == v1::COMPUTE_MODE_TF32
                          ? ComputeMode::kTf32
                          : ComputeMode::kStrict;
    ASSIGN_OR_RETURN(
        v1::MultiplyRequest request,
        MakeSharedMultiplyRequest(s.region_id(), a, b, c.offset, options));
    point->requests_.push_back(
        std::make_unique<v1::MultiplyRequest>(std::move(request)));
    point->request_ptrs_.push_back(point->requests_.back().get());
    point->workload_index_.push_back(w);
    point->c_.push_back(std::move(c));
    point->region_bytes_ += bytes;
    point->sessions_.push_back(*std::move(session));
  }
  return point;
}

LoadGenerator::ResponseChecker SharedMemoryPoint::Checker(
    const ResponseVerifier* verifier) {
  return [this, verifier](int index, const v1::MultiplyResponse& response) {
    if (index < 0 || index >= static_cast<int>(sessions_.size())) {
      return absl::InternalError(
          absl::StrCat("no session for request ", index));
    }
    const SharedTensor& c = c_[index];
    if (!response.c().data().empty() || !response.c().has_shared() ||
        response.c().shared().offset() != c.offset ||
        response.c().shared().region_id() != sessions_[index]->region_id()) {
      return absl::DataLossError(
          "the response does not place the product where it was asked for");
    }
    absl::StatusOr<absl::Span<char>> bytes = sessions_[index]->Bytes(c);
    if (!bytes.ok()) return bytes.status();
    v1::MultiplyResponse with_data = response;
    with_data.mutable_c()->clear_shared();
    with_data.mutable_c()->set_data(bytes->data(), bytes->size());
    return verifier->Check(workload_index_[index], with_data);
  };
}

}  // namespace matmul
