#include "server/stream/stream_answer.h"

#include "server/rpc/multiply_wire.h"

namespace matmul {

StreamAnswer StreamAnswer::ResultChunk(uint64_t request_id, int64_t offset,
                                       JobResult result) {
  auto product = std::make_shared<JobResult>(std::move(result));
  std::string head = FrameResultChunk(
      request_id, offset, static_cast<int64_t>(product->c().size()));
  return StreamAnswer{std::move(head), std::move(product)};
}

StreamAnswer StreamAnswer::Error(uint64_t request_id, int code,
                                 const std::string& message) {
  v1::MultiplyStreamResponse response;
  response.set_request_id(request_id);
  response.mutable_error()->set_code(code);
  response.mutable_error()->set_message(message);
  return Message(response);
}

}  // namespace matmul
