// Small helpers the RPC adapters share: call timing and API shapes.
#ifndef MATMUL_SERVER_RPC_CALL_HELPERS_H_
#define MATMUL_SERVER_RPC_CALL_HELPERS_H_

#include <chrono>
#include <cstdint>
#include <vector>

namespace matmul {

// Whether a gRPC deadline (time_point::max() for none) has passed.
inline bool DeadlinePassed(std::chrono::system_clock::time_point deadline) {
  return deadline != std::chrono::system_clock::time_point::max() &&
         std::chrono::system_clock::now() >= deadline;
}

// Whether a cancellation gRPC reported at `deadline` is the deadline's:
// gRPC does not say why it cancelled, and its deadline timer can fire a few
// milliseconds before the system clock reaches the deadline (measured: up
// to 3 ms), so a cancel within 50 ms of it counts as the deadline's.
inline bool CancelledByDeadline(
    std::chrono::system_clock::time_point deadline) {
  return deadline != std::chrono::system_clock::time_point::max() &&
         std::chrono::system_clock::now() + std::chrono::milliseconds(50) >=
             deadline;
}

inline double SecondsSince(std::chrono::steady_clock::time_point since,
                           std::chrono::steady_clock::time_point now =
                               std::chrono::steady_clock::now()) {
  return std::chrono::duration<double>(now - since).count();
}

// The API shape of a [batch, rows, cols] tensor.
inline std::vector<int64_t> ApiShape(bool is_3d, int64_t batch, int64_t rows,
                                     int64_t cols) {
  if (is_3d) return {batch, rows, cols};
  return {rows, cols};
}

}  // namespace matmul

#endif  // MATMUL_SERVER_RPC_CALL_HELPERS_H_
