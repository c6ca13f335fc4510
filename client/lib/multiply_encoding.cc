#include "client/lib/multiply_encoding.h"

#include <grpcpp/support/slice.h>

#include <algorithm>
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

// Reads protobuf's wire format across slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {
    for (const grpc::Slice& s : slices) total_ += s.size();
  }

  size_t pos() const { return pos_; }
  size_t total() const { return total_; }

  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!Byte(&byte)) return false;
      *v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // The next `n` bytes as pieces of the slices.
  bool Take(size_t n, std::vector<absl::string_view>* out) {
    if (n > total_ - pos_) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[slice_];
      const size_t here = std::min(n, s.size() - in_slice_);
      if (here > 0) {
        out->emplace_back(reinterpret_cast<const char*>(s.begin()) + in_slice_,
                          here);
      }
      Advance(here);
      n -= here;
    }
    return true;
  }

 private:
  bool Byte(uint8_t* byte) {
    if (pos_ >= total_) return false;
    while (in_slice_ >= slices_[slice_].size()) {
      ++slice_;
      in_slice_ = 0;
    }
    *byte = slices_[slice_].begin()[in_slice_];
    Advance(1);
    return true;
  }

  void Advance(size_t n) {
    pos_ += n;
    in_slice_ += n;
    while (slice_ < slices_.size() && in_slice_ >= slices_[slice_].size() &&
           slice_ + 1 < slices_.size()) {
      in_slice_ -= slices_[slice_].size();
      ++slice_;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t total_ = 0;
  size_t pos_ = 0;
  size_t slice_ = 0;
  size_t in_slice_ = 0;
};

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

bool DecodeResultChunk(const grpc::ByteBuffer& message, ResultChunkView* view) {
  view->slices.clear();
  view->data.clear();
  view->request_id = 0;
  view->offset = 0;
  view->data_bytes = 0;
  if (!message.Dump(&view->slices).ok()) return false;
  SliceReader r(view->slices);
  bool chunk = false;
  while (r.pos() < r.total()) {
    uint64_t key;
    if (!r.Varint(&key)) return false;
    const uint64_t field = key >> 3;
    const int type = static_cast<int>(key & 7);
    if (field == v1::MultiplyStreamResponse::kRequestIdFieldNumber &&
        type == wire::kVarint) {
      if (!r.Varint(&view->request_id)) return false;
      continue;
    }
    // Only one ResultChunk, each of its fields once: anything else is for
    // protobuf, which knows how to merge.
    if (field != v1::MultiplyStreamResponse::kChunkFieldNumber ||
        type != wire::kLengthDelimited || chunk) {
      return false;
    }
    chunk = true;
    uint64_t length;
    if (!r.Varint(&length) || length > r.total() - r.pos()) return false;
    const size_t end = r.pos() + length;
    bool offset_seen = false;
    bool data_seen = false;
    while (r.pos() < end) {
      uint64_t inner;
      if (!r.Varint(&inner)) return false;
      if ((inner >> 3) == v1::ResultChunk::kOffsetFieldNumber &&
          (inner & 7) == wire::kVarint && !offset_seen) {
        uint64_t offset;
        if (!r.Varint(&offset)) return false;
        view->offset = static_cast<int64_t>(offset);
        offset_seen = true;
      } else if ((inner >> 3) == v1::ResultChunk::kDataFieldNumber &&
                 (inner & 7) == wire::kLengthDelimited && !data_seen) {
        uint64_t n;
        if (!r.Varint(&n) || n > end - r.pos() || !r.Take(n, &view->data)) {
          return false;
        }
        view->data_bytes = static_cast<int64_t>(n);
        data_seen = true;
      } else {
        return false;
      }
    }
    if (r.pos() != end) return false;
  }
  return chunk;
}

}  // namespace matmul
