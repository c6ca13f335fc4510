#include "client/lib/multiply_encoding.h"

#include <grpcpp/support/slice.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "proto/wire_format.h"

namespace matmul {
namespace {

// The operands' data, moved out of the request; freed when the last slice
// over it is released.
struct OperandData {
  std::string a;
  std::string b;
};

// A slice over `data` that holds `owner` until gRPC lets go of it.
grpc::Slice SliceOver(absl::string_view data,
                      const std::shared_ptr<const void>& owner) {
  auto* hold = new std::shared_ptr<const void>(owner);
  return grpc::Slice(
      const_cast<char*>(data.data()), data.size(),
      [](void* user_data) {
        delete static_cast<std::shared_ptr<const void>*>(user_data);
      },
      hold);
}

}  // namespace

grpc::ByteBuffer EncodeMultiplyRequest(v1::MultiplyRequest request) {
  auto data = std::make_shared<OperandData>();
  if (request.has_a()) data->a.swap(*request.mutable_a()->mutable_data());
  if (request.has_b()) data->b.swap(*request.mutable_b()->mutable_data());
  const absl::string_view a = data->a;
  const absl::string_view b = data->b;
  return EncodeMultiplyRequestView(request, a, b, std::move(data));
}

grpc::ByteBuffer EncodeMultiplyRequestView(const v1::MultiplyRequest& request,
                                           absl::string_view a_data,
                                           absl::string_view b_data,
                                           std::shared_ptr<const void> owner) {
  std::vector<grpc::Slice> slices;
  std::string header = request.SerializeAsString();
  // Each operand's data as a second occurrence of its Tensor field, holding
  // only Tensor.data: [tag a|b][length][tag data][length] then the bytes.
  const int tensor_field[2] = {v1::MultiplyRequest::kAFieldNumber,
                               v1::MultiplyRequest::kBFieldNumber};
  const absl::string_view operand[2] = {a_data, b_data};
  const uint64_t data_key =
      wire::Key(v1::Tensor::kDataFieldNumber, wire::kLengthDelimited);
  for (int i = 0; i < 2; ++i) {
    const uint64_t n = operand[i].size();
    if (n == 0) continue;
    wire::PutKey(header, tensor_field[i], wire::kLengthDelimited);
    wire::PutVarint(header,
                    wire::VarintSize(data_key) + wire::VarintSize(n) + n);
    wire::PutVarint(header, data_key);
    wire::PutVarint(header, n);
    slices.emplace_back(header);
    header.clear();
    slices.push_back(SliceOver(operand[i], owner));
  }
  if (!header.empty()) slices.emplace_back(header);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer EncodeOperandChunk(uint64_t request_id, v1::Operand operand,
                                    int64_t offset, absl::string_view data,
                                    std::shared_ptr<const void> owner) {
  // OperandChunk's fields, then its data's key and length.
  std::string chunk;
  wire::PutKey(chunk, v1::OperandChunk::kOperandFieldNumber, wire::kVarint);
  wire::PutVarint(chunk, static_cast<uint64_t>(operand));
  wire::PutKey(chunk, v1::OperandChunk::kOffsetFieldNumber, wire::kVarint);
  wire::PutVarint(chunk, static_cast<uint64_t>(offset));
  wire::PutKey(chunk, v1::OperandChunk::kDataFieldNumber,
               wire::kLengthDelimited);
  wire::PutVarint(chunk, data.size());
  std::string header;
  wire::PutKey(header, v1::MultiplyStreamRequest::kRequestIdFieldNumber,
               wire::kVarint);
  wire::PutVarint(header, request_id);
  wire::PutKey(header, v1::MultiplyStreamRequest::kChunkFieldNumber,
               wire::kLengthDelimited);
  wire::PutVarint(header, chunk.size() + data.size());
  header += chunk;
  grpc::Slice slices[2] = {grpc::Slice(header), SliceOver(data, owner)};
  return grpc::ByteBuffer(slices, data.empty() ? 1 : 2);
}

}  // namespace matmul
