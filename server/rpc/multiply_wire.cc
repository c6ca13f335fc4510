#include "server/rpc/multiply_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/wire_format.h"

namespace matmul {
namespace {

using wire::kEndGroup;
using wire::kFixed32;
using wire::kFixed64;
using wire::kLengthDelimited;
using wire::kStartGroup;
using wire::kVarint;
using wire::PutKey;
using wire::PutVarint;

// Sequential reader over the chunks; positions count from the start of the
// message.
class Reader {
 public:
  explicit Reader(absl::Span<const ByteChunk> chunks) : chunks_(chunks) {
    for (const ByteChunk& c : chunks) total_ += static_cast<int64_t>(c.size());
  }

  int64_t pos() const { return pos_; }
  int64_t total() const { return total_; }

  bool ReadVarint(uint64_t* value) {
    uint64_t result = 0;
    for (int i = 0; i < 10; ++i) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      result |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return false;  // more than 10 bytes
  }

  // Advances `n` bytes; appends them to `pieces` as spans when given.
  bool Take(int64_t n, std::vector<ByteChunk>* pieces) {
    if (n < 0 || n > total_ - pos_) return false;
    while (n > 0) {
      Normalize();
      const ByteChunk& chunk = chunks_[index_];
      const int64_t take =
          std::min<int64_t>(n, static_cast<int64_t>(chunk.size()) - offset_);
      if (pieces != nullptr) pieces->push_back(chunk.subspan(offset_, take));
      offset_ += take;
      pos_ += take;
      n -= take;
    }
    return true;
  }

 private:
  void Normalize() {
    while (index_ < chunks_.size() &&
           offset_ == static_cast<int64_t>(chunks_[index_].size())) {
      ++index_;
      offset_ = 0;
    }
  }

  bool ReadByte(uint8_t* byte) {
    Normalize();
    if (index_ == chunks_.size()) return false;
    *byte = chunks_[index_][offset_++];
    ++pos_;
    return true;
  }

  absl::Span<const ByteChunk> chunks_;
  size_t index_ = 0;
  int64_t offset_ = 0;
  int64_t pos_ = 0;
  int64_t total_ = 0;
};

absl::Status Malformed(const Reader& r, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed request message at byte ", r.pos(), " of ",
                   r.total(), ": ", what));
}

// Reads a field key; fails on field number 0 or a read past `end`.
absl::Status ReadKey(Reader& r, int64_t end, int* field, int* wire_type) {
  // Keys are 32-bit varints of at most 5 bytes; like protobuf, bits beyond
  // 32 in the fifth byte are dropped.
  uint64_t key = 0;
  const int64_t start = r.pos();
  if (!r.ReadVarint(&key) || r.pos() > end) {
    return Malformed(r, "truncated field key");
  }
  if (r.pos() - start > 5) return Malformed(r, "field key over 5 bytes");
  key &= UINT32_MAX;
  *field = static_cast<int>(key >> 3);
  *wire_type = static_cast<int>(key & 7);
  if (*field == 0) return Malformed(r, "field number 0");
  return absl::OkStatus();
}

absl::Status ReadVarint(Reader& r, int64_t end, uint64_t* value) {
  if (!r.ReadVarint(value) || r.pos() > end) {
    return Malformed(r, "truncated or overlong varint");
  }
  return absl::OkStatus();
}

// Reads a length prefix and returns where the delimited bytes end.
absl::StatusOr<int64_t> ReadLength(Reader& r, int64_t end) {
  uint64_t length = 0;
  if (absl::Status s = ReadVarint(r, end, &length); !s.ok()) return s;
  if (length > static_cast<uint64_t>(end - r.pos())) {
    return Malformed(r, absl::StrCat("length ", length, " runs past the end"));
  }
  return r.pos() + static_cast<int64_t>(length);
}

absl::Status SkipField(Reader& r, int64_t end, int wire_type) {
  switch (wire_type) {
    case kVarint: {
      uint64_t ignored;
      return ReadVarint(r, end, &ignored);
    }
    case kFixed64:
    case kFixed32: {
      const int64_t n = wire_type == kFixed64 ? 8 : 4;
      if (n > end - r.pos() || !r.Take(n, nullptr)) {
        return Malformed(r, "truncated fixed-width field");
      }
      return absl::OkStatus();
    }
    case kLengthDelimited: {
      absl::StatusOr<int64_t> field_end = ReadLength(r, end);
      if (!field_end.ok()) return field_end.status();
      r.Take(*field_end - r.pos(), nullptr);
      return absl::OkStatus();
    }
    case kStartGroup:
      // Deprecated groups, skipped as protobuf does: fields up to the
      // matching end-group key.
      return absl::InternalError("handled by SkipGroup");
    default:
      return Malformed(r, absl::StrCat("unexpected wire type ", wire_type));
  }
}

absl::Status SkipAny(Reader& r, int64_t end, int field, int wire_type,
                     int depth);

absl::Status SkipGroup(Reader& r, int64_t end, int group_field, int depth) {
  if (depth > 32) return Malformed(r, "groups nested too deeply");
  while (true) {
    int field, wire_type;
    if (absl::Status s = ReadKey(r, end, &field, &wire_type); !s.ok()) return s;
    if (wire_type == kEndGroup) {
      if (field != group_field) return Malformed(r, "mismatched end group");
      return absl::OkStatus();
    }
    if (absl::Status s = SkipAny(r, end, field, wire_type, depth + 1);
        !s.ok()) {
      return s;
    }
  }
}

absl::Status SkipAny(Reader& r, int64_t end, int field, int wire_type,
                     int depth) {
  if (wire_type == kStartGroup) return SkipGroup(r, end, field, depth);
  return SkipField(r, end, wire_type);
}

// Reads a length-delimited proto3 string field's bytes (the length is
// next); fails if they are not UTF-8, as protobuf does.
absl::Status ReadUtf8String(Reader& r, int64_t end, std::string* out,
                            absl::string_view what);

// A SharedMemoryRef; a second occurrence merges into the first.
absl::Status DecodeSharedRef(Reader& r, int64_t end, WireSharedRef* ref) {
  ref->present = true;
  while (r.pos() < end) {
    int field, wire_type;
    if (absl::Status s = ReadKey(r, end, &field, &wire_type); !s.ok()) return s;
    if (field == 1 && wire_type == kLengthDelimited) {
      if (absl::Status s =
              ReadUtf8String(r, end, &ref->region_id, "a region id");
          !s.ok()) {
        return s;
      }
    } else if (field == 2 && wire_type == kVarint) {
      uint64_t v;
      if (absl::Status s = ReadVarint(r, end, &v); !s.ok()) return s;
      ref->offset = static_cast<int64_t>(v);
    } else if (absl::Status s = SkipAny(r, end, field, wire_type, 0); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeTensor(Reader& r, int64_t end, WireTensor* t) {
  t->present = true;
  while (r.pos() < end) {
    int field, wire_type;
    if (absl::Status s = ReadKey(r, end, &field, &wire_type); !s.ok()) return s;
    if (field == 1 && wire_type == kLengthDelimited) {  // packed shape
      absl::StatusOr<int64_t> packed_end = ReadLength(r, end);
      if (!packed_end.ok()) return packed_end.status();
      while (r.pos() < *packed_end) {
        uint64_t d;
        if (absl::Status s = ReadVarint(r, *packed_end, &d); !s.ok()) return s;
        t->shape.push_back(static_cast<int64_t>(d));
      }
    } else if (field == 1 && wire_type == kVarint) {  // unpacked shape
      uint64_t d;
      if (absl::Status s = ReadVarint(r, end, &d); !s.ok()) return s;
      t->shape.push_back(static_cast<int64_t>(d));
    } else if (field == 2 && wire_type == kVarint) {
      uint64_t v;
      if (absl::Status s = ReadVarint(r, end, &v); !s.ok()) return s;
      t->dtype = static_cast<int32_t>(static_cast<uint32_t>(v));
    } else if (field == 3 && wire_type == kLengthDelimited) {
      absl::StatusOr<int64_t> data_end = ReadLength(r, end);
      if (!data_end.ok()) return data_end.status();
      t->data.clear();
      t->data_bytes = *data_end - r.pos();
      r.Take(t->data_bytes, &t->data);
    } else if (field == 4 && wire_type == kLengthDelimited) {
      absl::StatusOr<int64_t> ref_end = ReadLength(r, end);
      if (!ref_end.ok()) return ref_end.status();
      if (absl::Status s = DecodeSharedRef(r, *ref_end, &t->shared); !s.ok()) {
        return s;
      }
    } else if (absl::Status s = SkipAny(r, end, field, wire_type, 0); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Whether `s` is well-formed UTF-8 (as protobuf checks proto3 strings:
// no overlong forms, no surrogates, nothing above U+10FFFF).
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (int j = 1; j <= n; ++j) {
      const auto cc = static_cast<unsigned char>(s[i + j]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = cp << 6 | (cc & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
        (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// Reads a length-delimited bytes field (the length is next) into `out`.
absl::Status ReadBytes(Reader& r, int64_t end, std::string* out) {
  absl::StatusOr<int64_t> bytes_end = ReadLength(r, end);
  if (!bytes_end.ok()) return bytes_end.status();
  std::vector<ByteChunk> pieces;
  r.Take(*bytes_end - r.pos(), &pieces);
  out->clear();
  for (const ByteChunk& piece : pieces) {
    out->append(reinterpret_cast<const char*>(piece.data()), piece.size());
  }
  return absl::OkStatus();
}

absl::Status ReadUtf8String(Reader& r, int64_t end, std::string* out,
                            absl::string_view what) {
  if (absl::Status s = ReadBytes(r, end, out); !s.ok()) return s;
  // proto3 strings must be UTF-8; protobuf refuses the message if not.
  if (!IsUtf8(*out)) return Malformed(r, absl::StrCat(what, " is not UTF-8"));
  return absl::OkStatus();
}

// int32 fields: negative values take ten bytes, sign-extended.
uint64_t Int32Wire(int32_t v) {
  return static_cast<uint64_t>(static_cast<int64_t>(v));
}

}  // namespace

MultiplyHeader WireMultiplyRequest::header() const {
  auto operand = [](const WireTensor& t) {
    OperandHeader h;
    h.present = t.present;
    h.shape = absl::MakeConstSpan(t.shape);
    h.dtype = t.dtype;
    h.data_bytes = t.data_bytes;
    return h;
  };
  MultiplyHeader h;
  h.a = operand(a);
  h.b = operand(b);
  h.transpose_a = transpose_a;
  h.transpose_b = transpose_b;
  h.compute_mode = compute_mode;
  return h;
}

absl::StatusOr<WireMultiplyRequest> DecodeMultiplyRequest(
    absl::Span<const ByteChunk> chunks) {
  Reader r(chunks);
  const int64_t end = r.total();
  WireMultiplyRequest request;
  while (r.pos() < end) {
    int field, wire_type;
    if (absl::Status s = ReadKey(r, end, &field, &wire_type); !s.ok()) return s;
    if ((field == 1 || field == 2) && wire_type == kLengthDelimited) {
      absl::StatusOr<int64_t> tensor_end = ReadLength(r, end);
      if (!tensor_end.ok()) return tensor_end.status();
      if (absl::Status s = DecodeTensor(r, *tensor_end,
                                        field == 1 ? &request.a : &request.b);
          !s.ok()) {
        return s;
      }
    } else if ((field == 3 || field == 4 || field == 5 || field == 8 ||
                field == 9) &&
               wire_type == kVarint) {
      uint64_t v;
      if (absl::Status s = ReadVarint(r, end, &v); !s.ok()) return s;
      if (field == 3) request.transpose_a = v != 0;
      if (field == 4) request.transpose_b = v != 0;
      if (field == 5) {
        request.compute_mode = static_cast<int32_t>(static_cast<uint32_t>(v));
      }
      if (field == 8) request.keep_result = v != 0;
      if (field == 9) request.result_ttl_seconds = static_cast<int64_t>(v);
    } else if ((field == 6 || field == 7) && wire_type == kLengthDelimited) {
      if (absl::Status s = ReadUtf8String(
              r, end, field == 6 ? &request.a_handle : &request.b_handle,
              "a handle");
          !s.ok()) {
        return s;
      }
    } else if (field == 10 && wire_type == kLengthDelimited) {
      absl::StatusOr<int64_t> ref_end = ReadLength(r, end);
      if (!ref_end.ok()) return ref_end.status();
      if (absl::Status s = DecodeSharedRef(r, *ref_end, &request.c_shared);
          !s.ok()) {
        return s;
      }
    } else if (absl::Status s = SkipAny(r, end, field, wire_type, 0); !s.ok()) {
      return s;
    }
  }
  return request;
}

absl::StatusOr<WireStreamRequest> DecodeMultiplyStreamRequest(
    absl::Span<const ByteChunk> chunks) {
  Reader r(chunks);
  const int64_t end = r.total();
  WireStreamRequest request;
  while (r.pos() < end) {
    int field, wire_type;
    if (absl::Status s = ReadKey(r, end, &field, &wire_type); !s.ok()) return s;
    if (field == 1 && wire_type == kVarint) {
      if (absl::Status s = ReadVarint(r, end, &request.request_id); !s.ok()) {
        return s;
      }
    } else if (field == 2 && wire_type == kLengthDelimited) {
      // MultiplyStreamStart. Protobuf merges repeated occurrences of a oneof
      // member and clears it when another member comes.
      absl::StatusOr<int64_t> start_end = ReadLength(r, end);
      if (!start_end.ok()) return start_end.status();
      if (request.kind != WireStreamRequest::Kind::kStart) {
        request.start_pieces.clear();
        request.result_chunk_bytes = 0;
        request.stripe_key.clear();
        request.stripes = 0;
      }
      request.kind = WireStreamRequest::Kind::kStart;
      while (r.pos() < *start_end) {
        int f, wt;
        if (absl::Status s = ReadKey(r, *start_end, &f, &wt); !s.ok()) return s;
        if (f == 1 && wt == kLengthDelimited) {
          absl::StatusOr<int64_t> inner_end = ReadLength(r, *start_end);
          if (!inner_end.ok()) return inner_end.status();
          std::vector<ByteChunk> pieces;
          r.Take(*inner_end - r.pos(), &pieces);
          // Each occurrence must be valid on its own, as protobuf checks.
          absl::StatusOr<WireMultiplyRequest> inner =
              DecodeMultiplyRequest(pieces);
          if (!inner.ok()) return inner.status();
          request.start_pieces.insert(request.start_pieces.end(),
                                      pieces.begin(), pieces.end());
        } else if (f == 2 && wt == kVarint) {
          uint64_t v;
          if (absl::Status s = ReadVarint(r, *start_end, &v); !s.ok()) return s;
          request.result_chunk_bytes = static_cast<int64_t>(v);
        } else if (f == 3 && wt == kLengthDelimited) {
          if (absl::Status s = ReadBytes(r, *start_end, &request.stripe_key);
              !s.ok()) {
            return s;
          }
        } else if (f == 4 && wt == kVarint) {
          uint64_t v;
          if (absl::Status s = ReadVarint(r, *start_end, &v); !s.ok()) return s;
          request.stripes = static_cast<int32_t>(static_cast<uint32_t>(v));
        } else if (absl::Status s = SkipAny(r, *start_end, f, wt, 0); !s.ok()) {
          return s;
        }
      }
    } else if (field == 3 && wire_type == kLengthDelimited) {
      // OperandChunk.
      absl::StatusOr<int64_t> chunk_end = ReadLength(r, end);
      if (!chunk_end.ok()) return chunk_end.status();
      if (request.kind != WireStreamRequest::Kind::kChunk) {
        request.operand = 0;
        request.offset = 0;
        request.data.clear();
        request.data_bytes = 0;
      }
      request.kind = WireStreamRequest::Kind::kChunk;
      while (r.pos() < *chunk_end) {
        int f, wt;
        if (absl::Status s = ReadKey(r, *chunk_end, &f, &wt); !s.ok()) return s;
        if ((f == 1 || f == 2) && wt == kVarint) {
          uint64_t v;
          if (absl::Status s = ReadVarint(r, *chunk_end, &v); !s.ok()) return s;
          if (f == 1)
            request.operand = static_cast<int32_t>(static_cast<uint32_t>(v));
          if (f == 2) request.offset = static_cast<int64_t>(v);
        } else if (f == 3 && wt == kLengthDelimited) {
          absl::StatusOr<int64_t> data_end = ReadLength(r, *chunk_end);
          if (!data_end.ok()) return data_end.status();
          request.data.clear();
          request.data_bytes = *data_end - r.pos();
          r.Take(request.data_bytes, &request.data);
        } else if (absl::Status s = SkipAny(r, *chunk_end, f, wt, 0); !s.ok()) {
          return s;
        }
      }
    } else if (field == 4 && wire_type == kLengthDelimited) {
      // MultiplyStreamJoin.
      absl::StatusOr<int64_t> join_end = ReadLength(r, end);
      if (!join_end.ok()) return join_end.status();
      if (request.kind != WireStreamRequest::Kind::kJoin) {
        request.stripe_key.clear();
      }
      request.kind = WireStreamRequest::Kind::kJoin;
      while (r.pos() < *join_end) {
        int f, wt;
        if (absl::Status s = ReadKey(r, *join_end, &f, &wt); !s.ok()) return s;
        if (f == 1 && wt == kLengthDelimited) {
          if (absl::Status s = ReadBytes(r, *join_end, &request.stripe_key);
              !s.ok()) {
            return s;
          }
        } else if (absl::Status s = SkipAny(r, *join_end, f, wt, 0); !s.ok()) {
          return s;
        }
      }
    } else if (absl::Status s = SkipAny(r, end, field, wire_type, 0); !s.ok()) {
      return s;
    }
  }
  if (request.kind == WireStreamRequest::Kind::kStart) {
    // The merged start: its occurrences' bytes decoded as one message.
    absl::StatusOr<WireMultiplyRequest> start =
        DecodeMultiplyRequest(request.start_pieces);
    if (!start.ok()) return start.status();
    request.start = std::move(*start);
  }
  return request;
}

std::string FrameResultChunk(uint64_t request_id, int64_t offset,
                             int64_t data_bytes) {
  std::string chunk_head;
  if (offset != 0) {
    PutKey(chunk_head, 1, kVarint);
    PutVarint(chunk_head, static_cast<uint64_t>(offset));
  }
  PutKey(chunk_head, 2, kLengthDelimited);
  PutVarint(chunk_head, static_cast<uint64_t>(data_bytes));
  std::string prefix;
  if (request_id != 0) {
    PutKey(prefix, 1, kVarint);
    PutVarint(prefix, request_id);
  }
  PutKey(prefix, 3, kLengthDelimited);
  PutVarint(prefix, chunk_head.size() + static_cast<uint64_t>(data_bytes));
  prefix += chunk_head;
  return prefix;
}

void CopyPieces(absl::Span<const ByteChunk> pieces, std::byte* out) {
  for (const ByteChunk& piece : pieces) {
    if (piece.empty()) continue;  // its data() may be null
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}

ResponseFraming FrameMultiplyResponse(absl::Span<const int64_t> c_shape,
                                      int dtype, int64_t c_bytes, int device,
                                      int stream) {
  // Tensor c: packed shape (1), dtype (2), data (3) last so that the data
  // can follow the prefix as its own slice.
  std::string shape;
  for (int64_t d : c_shape) PutVarint(shape, static_cast<uint64_t>(d));
  std::string tensor_head;
  PutKey(tensor_head, 1, kLengthDelimited);
  PutVarint(tensor_head, shape.size());
  tensor_head += shape;
  if (dtype != 0) {
    PutKey(tensor_head, 2, kVarint);
    PutVarint(tensor_head, Int32Wire(dtype));
  }
  PutKey(tensor_head, 3, kLengthDelimited);
  PutVarint(tensor_head, static_cast<uint64_t>(c_bytes));
  const uint64_t tensor_size =
      tensor_head.size() + static_cast<uint64_t>(c_bytes);

  ResponseFraming framing;
  framing.prefix.reserve(16 + tensor_head.size());
  PutKey(framing.prefix, 1, kLengthDelimited);
  PutVarint(framing.prefix, tensor_size);
  framing.prefix += tensor_head;

  // Placement (2): proto3 leaves zero-valued fields out.
  std::string placement;
  if (device != 0) {
    PutKey(placement, 1, kVarint);
    PutVarint(placement, Int32Wire(device));
  }
  if (stream != 0) {
    PutKey(placement, 2, kVarint);
    PutVarint(placement, Int32Wire(stream));
  }
  PutKey(framing.suffix, 2, kLengthDelimited);
  PutVarint(framing.suffix, placement.size());
  framing.suffix += placement;
  return framing;
}

}  // namespace matmul
