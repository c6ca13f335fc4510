// RequestLimits: the bounds every request must stay within. Filled from the
// server's flags; reported by GetServerInfo.
#ifndef MATMUL_SERVER_REQUEST_LIMITS_H_
#define MATMUL_SERVER_REQUEST_LIMITS_H_

#include <cstdint>

namespace matmul {

struct RequestLimits {
  // Largest message received or sent (gRPC caps this at 2 GiB - 1).
  int64_t max_message_bytes = int64_t{1} << 30;
  // Largest operand or result, in elements.
  int64_t max_elements_per_operand = int64_t{1} << 31;
  // Largest single dimension (cuBLAS and OpenBLAS take 32-bit dims).
  int64_t max_dimension = (int64_t{1} << 31) - 1;
  // Largest batch.
  int64_t max_batch = int64_t{1} << 20;
  // Operand + result bytes held in flight by the whole server.
  int64_t max_inflight_bytes = int64_t{8} << 30;
  // How long a MultiplyStreamJoin waits for its striped multiply's start.
  int64_t stripe_join_timeout_ms = 10000;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_REQUEST_LIMITS_H_
