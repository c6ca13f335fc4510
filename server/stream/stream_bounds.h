// The bounds one MultiplyStream call keeps (see server/rpc/multiply_stream.h
// for what each one holds back): shared by the reactor and the gRPC-free
// pieces of the stream session in this folder.
#ifndef MATMUL_SERVER_STREAM_STREAM_BOUNDS_H_
#define MATMUL_SERVER_STREAM_STREAM_BOUNDS_H_

#include <cstddef>
#include <cstdint>

namespace matmul {

struct StreamBounds {
  // Received chunk bytes a call holds (not yet staged) before it stops
  // reading.
  static constexpr int64_t kMaxHeldChunkBytes = int64_t{256} << 20;
  // Result chunks per call in staging or in the send queue.
  static constexpr int kMaxResultChunksInFlight = 8;
  static constexpr int kMaxOpenMultiplies = 64;
  // Answers other than result chunks waiting to be sent before the call
  // stops reading.
  static constexpr int kMaxUnsentReplies = 64;
  // Failed ids whose late chunks are dropped quietly.
  static constexpr size_t kMaxRememberedFailures = 4096;
  static constexpr int64_t kDefaultResultChunkBytes = int64_t{4} << 20;
  // Row panels: an A of at least kMinPanelBytes is multiplied in panels
  // of at least 1/kPanels of its rows.
  static constexpr int64_t kMinPanelBytes = int64_t{1} << 20;
  static constexpr int64_t kPanels = 8;
  // B's place in the tensor that holds both staged operands.
  static constexpr int64_t kOperandAlignment = 256;
  // A striped multiply's streams.
  static constexpr int kMinStripes = 2;
  static constexpr int kMaxStripes = 16;
  static constexpr size_t kMinStripeKeyBytes = 16;
  static constexpr size_t kMaxStripeKeyBytes = 64;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_STREAM_BOUNDS_H_
