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

#include "matmul/v1/matmul.pb.h"

namespace matmul {

// Takes `request` over (its operands' data is moved, not copied) and returns
// its encoding. The buffer's data slices keep that memory alive for as long
// as gRPC or any copy of the buffer holds them; copies of the buffer share
// it, so one encoding can be sent by any number of calls, at once or later.
grpc::ByteBuffer EncodeMultiplyRequest(v1::MultiplyRequest request);

}  // namespace matmul

#endif  // MATMUL_CLIENT_LIB_MULTIPLY_ENCODING_H_
