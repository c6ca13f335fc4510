// The Multiply messages on the wire, without the protobuf runtime in the data
// path. Decoding a MultiplyRequest reads its header fields and records where
// each operand's bytes lie in the received buffer, copying nothing, so the
// operands go from gRPC's receive buffers straight into pinned staging (one
// copy). Encoding a MultiplyResponse writes the few header bytes and lets the
// product follow as its own slice, taken from pinned memory without a copy.
//
// The encoding is exactly protobuf's (proto3, matmul/v1/matmul.proto), so
// every client sees an ordinary message. Pure functions; thread-safe.
#ifndef MATMUL_SERVER_RPC_MULTIPLY_WIRE_H_
#define MATMUL_SERVER_RPC_MULTIPLY_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/request_validation.h"

namespace matmul {

using ByteChunk = absl::Span<const uint8_t>;

// A decoded matmul.v1.SharedMemoryRef: a place in a registered region.
struct WireSharedRef {
  bool present = false;
  std::string region_id;
  int64_t offset = 0;
};

// One decoded operand (matmul.v1.Tensor).
struct WireTensor {
  bool present = false;
  std::vector<int64_t> shape;
  int dtype = 0;
  // The data: pieces of the received chunks, in order; data_bytes in all.
  std::vector<ByteChunk> data;
  int64_t data_bytes = 0;
  // Where the data is instead (Tensor.shared).
  WireSharedRef shared;
};

// A decoded matmul.v1.MultiplyRequest. Its data pieces point into the
// chunks it was decoded from, which must outlive it.
struct WireMultiplyRequest {
  WireTensor a;
  WireTensor b;
  bool transpose_a = false;
  bool transpose_b = false;
  int compute_mode = 0;
  std::string a_handle;
  std::string b_handle;
  bool keep_result = false;
  int64_t result_ttl_seconds = 0;
  WireSharedRef c_shared;

  // The header for validation (spans point into this object).
  MultiplyHeader header() const;
};

// Decodes a MultiplyRequest from its bytes, given as `chunks` in order (the
// message may be split anywhere). Protobuf's rules for the known fields: the
// last value of a scalar wins, shapes may be packed or not and repeated
// occurrences append, an operand that occurs twice is merged, and its data
// is the last occurrence's. Unknown fields are skipped; a field whose wire
// type does not match is treated as unknown, as protobuf does.
// INVALID_ARGUMENT, naming the offset, for bytes that are not a valid
// encoding (truncated, bad varint, group wire types, field number 0).
absl::StatusOr<WireMultiplyRequest> DecodeMultiplyRequest(
    absl::Span<const ByteChunk> chunks);

// A decoded matmul.v1.MultiplyStreamRequest. Its data pieces point into the
// chunks it was decoded from, which must outlive it. Like protobuf, the last
// member of the oneof that occurs wins.
struct WireStreamRequest {
  enum class Kind { kNone, kStart, kChunk, kJoin };
  uint64_t request_id = 0;
  Kind kind = Kind::kNone;
  // kStart: the multiply (its operands' data empty if the client obeys).
  WireMultiplyRequest start;
  std::vector<ByteChunk> start_pieces;  // where `start` was decoded from
  int64_t result_chunk_bytes = 0;
  int32_t stripes = 0;
  // kStart: MultiplyStreamStart.stripe_key; kJoin: MultiplyStreamJoin's.
  std::string stripe_key;
  // kChunk.
  int operand = 0;  // raw matmul.v1.Operand value
  int64_t offset = 0;
  std::vector<ByteChunk> data;
  int64_t data_bytes = 0;
};
absl::StatusOr<WireStreamRequest> DecodeMultiplyStreamRequest(
    absl::Span<const ByteChunk> chunks);

// The bytes of a MultiplyStreamResponse carrying a ResultChunk, before its
// data: the message is this prefix followed by the data_bytes of data.
std::string FrameResultChunk(uint64_t request_id, int64_t offset,
                             int64_t data_bytes);

// Copies `pieces` one after another into `out` (their total size).
void CopyPieces(absl::Span<const ByteChunk> pieces, std::byte* out);

// The bytes of a MultiplyResponse around its product's data: the message
// is prefix + data (c_bytes long, not included here) + suffix.
struct ResponseFraming {
  std::string prefix;
  std::string suffix;
};
ResponseFraming FrameMultiplyResponse(absl::Span<const int64_t> c_shape,
                                      int dtype, int64_t c_bytes, int device,
                                      int stream);

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_MULTIPLY_WIRE_H_
