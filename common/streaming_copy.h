// StreamingCopy: memcpy with non-temporal (streaming) stores, whose lines go
// to memory instead of into the CPU's caches. For staging that a GPU's copy
// engine reads next: a plain copy leaves the destination's lines dirty in the
// caches, so the engine's reads of it must be served from there. Where the
// CPU has no streaming stores (not x86-64 with SSE2) it is memcpy.
#ifndef MATMUL_COMMON_STREAMING_COPY_H_
#define MATMUL_COMMON_STREAMING_COPY_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace matmul {

// Copies `bytes` from `from` to `to` (not overlapping). The stores are
// fenced (sfence) before it returns, so that they are ordered before any
// later store of this thread, such as a release that hands the bytes to
// another thread, or a doorbell that starts a DMA.
inline void StreamingCopy(void* to, const void* from, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<std::byte*>(to);
  const auto* s = static_cast<const std::byte*>(from);
  // Up to the destination's first 16-byte boundary, plainly.
  const size_t head = std::min(
      bytes, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & size_t{15});
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const auto* src = reinterpret_cast<const __m128i*>(s + i);
    auto* dst = reinterpret_cast<__m128i*>(d + i);
    const __m128i v0 = _mm_loadu_si128(src);
    const __m128i v1 = _mm_loadu_si128(src + 1);
    const __m128i v2 = _mm_loadu_si128(src + 2);
    const __m128i v3 = _mm_loadu_si128(src + 3);
    _mm_stream_si128(dst, v0);
    _mm_stream_si128(dst + 1, v1);
    _mm_stream_si128(dst + 2, v2);
    _mm_stream_si128(dst + 3, v3);
  }
  std::memcpy(d + i, s + i, bytes - i);  // the tail, under 64 bytes
  _mm_sfence();
#else
  std::memcpy(to, from, bytes);
#endif
}

}  // namespace matmul

#endif  // MATMUL_COMMON_STREAMING_COPY_H_
