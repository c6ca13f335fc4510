// A MultiplyRequest on the wire without the protobuf serializer in the data
// path. Serializing a request with protobuf copies every operand byte into
// gRPC's send buffer; EncodeMultiplyRequest writes only the header (shapes,
// dtypes, options, handles) and lets each operand's data follow as a slice
// over the request's own memory, so gRPC writes it to the socket from there.
//
// The bytes are protobuf's encoding of the same message: each inline
// operand's Tensor occurs twice, first with its shape and dtype, then with
// its data, and protobuf merges the two (any parser, e.g. the server's
// DecodeMultiplyRequest or ParseFromString, reads the original request).
#ifndef MATMUL_CLIENT_LIB_MULTIPLY_ENCODING_H_
#define MATMUL_CLIENT_LIB_MULTIPLY_ENCODING_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

// Takes `request` over (its operands' data is moved, not copied) and returns
// its encoding. The buffer's data slices keep that memory alive for as long
// as gRPC or any copy of the buffer holds them; copies of the buffer share
// it, so one encoding can be sent by any number of calls, at once or later.
grpc::ByteBuffer EncodeMultiplyRequest(v1::MultiplyRequest request);

// The same for operands that live in the caller's memory (a NumPy array's
// buffer): `header` is the request without its operands' data (its Tensor
// fields carry shape and dtype, and must hold no data), and `a_data` and
// `b_data` follow as those operands' data, sent from where they are, not
// copied. Each data slice holds a reference to `owner` until gRPC lets go of
// it; the caller keeps the memory alive and unchanged until `owner` is
// released. Empty data (a handle operand, an empty tensor) adds nothing.
grpc::ByteBuffer EncodeMultiplyRequestView(const v1::MultiplyRequest& header,
                                           absl::string_view a_data,
                                           absl::string_view b_data,
                                           std::shared_ptr<const void> owner);

// A MultiplyStreamRequest carrying an OperandChunk of `operand` at `offset`,
// encoded the same way: `data` follows as a slice over the caller's memory,
// not copied, holding a reference to `owner` until gRPC lets go of it.
grpc::ByteBuffer EncodeOperandChunk(uint64_t request_id, v1::Operand operand,
                                    int64_t offset, absl::string_view data,
                                    std::shared_ptr<const void> owner);

// A MultiplyStreamResponse that carries a ResultChunk, read from gRPC's
// slices without copying its data: `data` are the pieces of the chunk's
// bytes, in order, inside `slices` (held here).
struct ResultChunkView {
  uint64_t request_id = 0;
  int64_t offset = 0;
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> data;
  int64_t data_bytes = 0;
};

// Reads `message` as a MultiplyStreamResponse carrying a ResultChunk into
// `view`. False for any other message (a result, an error) and for one
// this reader does not follow (malformed, or a field repeated): parse those
// with protobuf.
bool DecodeResultChunk(const grpc::ByteBuffer& message, ResultChunkView* view);

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_MULTIPLY_ENCODING_H_
