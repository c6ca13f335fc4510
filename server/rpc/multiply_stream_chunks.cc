// MultiplyStreamReactor, chunk intake: an operand chunk read on this call
// (or, for a striped multiply, forwarded by a joining call) is checked
// against what its operand has received so far and staged at its offset.
// Chunks may come in any order; each operand byte comes exactly once.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "matmul/v1/matmul.pb.h"
#include "server/rpc/call_helpers.h"
#include "server/rpc/multiply_stream.h"

namespace matmul {
void MultiplyStreamReactor::HandleChunk(const WireStreamRequest& request,
                                        std::vector<grpc::Slice>& slices,
                                        Actions& actions) {
  const uint64_t id = request.request_id;
  auto it = open_.find(id);
  if (it == open_.end()) {
    if (failed_.contains(id)) return;  // its error was sent already
    SendError(id, absl::InvalidArgumentError(absl::StrCat(
                      "chunk for request_id ", id,
                      ", which is not open on this stream (send its start or "
                      "join first)")));
    RememberFailed(id);
    return;
  }
  std::shared_ptr<Multiply> m = it->second;
  Chunk chunk;
  chunk.slices = std::move(slices);
  chunk.data = request.data;
  chunk.bytes = request.data_bytes;
  if (m->owner != nullptr) {
    // A joined multiply: its owner checks and stages the chunk, which this
    // stream's window holds until then.
    held_chunk_bytes_ += std::max<int64_t>(chunk.bytes, 0);
    Ref();
    chunk.held_by = this;
    Post(m->owner,
         [owned = m->owned, op = request.operand, offset = request.offset,
          chunk = std::move(chunk)](MultiplyStreamReactor& owner) mutable {
           owner.StripeChunk(owned, op, offset, std::move(chunk));
         });
    return;
  }
  TakeChunk(m, request.operand, request.offset, std::move(chunk), actions);
}

void MultiplyStreamReactor::TakeChunk(const std::shared_ptr<Multiply>& m,
                                      int operand, int64_t offset, Chunk chunk,
                                      Actions& actions) {
  const uint64_t id = m->id;
  // Fails `m`; a forwarded chunk goes back to its joiner's window.
  auto fail = [&](const std::string& message)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                    DropChunk(chunk);
                    Fail(m, absl::InvalidArgumentError(message));
                  };
  if (m->multiply_submitted) {
    fail(absl::StrCat("chunk for request_id ", id,
                      " after all its operand bytes"));
    return;
  }
  const int op = operand - v1::OPERAND_A;
  if (operand != v1::OPERAND_A && operand != v1::OPERAND_B) {
    fail(absl::StrCat("chunk.operand: expected OPERAND_A or OPERAND_B, got ",
                      operand));
    return;
  }
  const char* name = StreamOperandName(op);
  const int64_t elem = m->spec.elem_size();
  if (!m->staged[op]) {
    fail(absl::StrCat("chunk for operand ", name, ", which is given by ", name,
                      "_handle and takes no chunks"));
    return;
  }
  if (chunk.bytes <= 0 || chunk.bytes % elem != 0) {
    fail(absl::StrCat("chunk.data: expected a positive whole number of ", elem,
                      "-byte elements, got ", chunk.bytes, " bytes"));
    return;
  }
  if (offset < 0 || offset % elem != 0) {
    fail(absl::StrCat("chunk.offset: expected a whole number of ", elem,
                      "-byte elements in operand ", name, ", got ", offset));
    return;
  }
  if (offset > m->need[op] - chunk.bytes) {
    fail(absl::StrCat("operand ", name, ": the chunk of ", chunk.bytes,
                      " bytes at offset ", offset, " runs past its end at ",
                      m->need[op], " bytes"));
    return;
  }
  if (std::optional<ByteCoverage::Range> seen =
          m->coverage[op].Overlap(offset, chunk.bytes)) {
    fail(absl::StrCat("operand ", name, ": the chunk of bytes [", offset, ", ",
                      offset + chunk.bytes, ") overlaps bytes [", seen->first,
                      ", ", seen->second,
                      ") that arrived before (each byte comes once)"));
    return;
  }
  m->coverage[op].Add(offset, chunk.bytes);
  const double now = SecondsSince(m->started);
  if (m->chunks++ == 0) m->first_chunk_s = now;
  chunk.at = m->at[op] + offset;
  m->received[op] += chunk.bytes;
  if (chunk.held_by == nullptr) held_chunk_bytes_ += chunk.bytes;
  if (m->received[0] == m->need[0] && m->received[1] == m->need[1]) {
    m->last_chunk_s = now;
    m->uploaded_by_last_chunk = m->uploaded;
  }
  if (m->allocated) {
    const int64_t held = chunk.bytes;
    ++m->uploads_in_flight;
    actions.jobs.push_back(NewJob(m, Step::kUpload, held, &chunk));
  } else {
    m->waiting.push_back(std::move(chunk));
  }
}

}  // namespace matmul
