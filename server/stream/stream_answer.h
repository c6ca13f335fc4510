// StreamAnswer: one MultiplyStreamResponse a MultiplyStream call writes, in
// gRPC-free terms: its bytes, or, for a ResultChunk, the bytes before its
// data (FrameResultChunk) and the job result whose staging holds the data,
// which is sent from there without a copy. The reactor turns it into
// gRPC's buffer as it starts the write. Copies share the staging; it goes
// back to the engine when the last copy (or the transport's) is gone.
#ifndef MATMUL_SERVER_STREAM_STREAM_ANSWER_H_
#define MATMUL_SERVER_STREAM_STREAM_ANSWER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "gpu/engine.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {

struct StreamAnswer {
  // A whole message.
  static StreamAnswer Message(const v1::MultiplyStreamResponse& response) {
    return StreamAnswer{response.SerializeAsString(), nullptr};
  }
  // A ResultChunk of `request_id`: `result`'s product at `offset` in the
  // whole product.
  static StreamAnswer ResultChunk(uint64_t request_id, int64_t offset,
                                  JobResult result);
  // A MultiplyStreamError for `request_id`: the status's code and message
  // (the message already bounded by the caller, as grpc_status.h does).
  static StreamAnswer Error(uint64_t request_id, int code,
                            const std::string& message);

  // The bytes on the wire.
  int64_t bytes() const {
    return static_cast<int64_t>(head.size()) +
           (product != nullptr ? static_cast<int64_t>(product->c().size()) : 0);
  }

  // The message, or the ResultChunk's bytes before its data.
  std::string head;
  // A ResultChunk's data: product->c(), after `head`.
  std::shared_ptr<JobResult> product;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_STREAM_ANSWER_H_
