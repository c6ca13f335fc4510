// Small local status macros (the Abseil in Debian 12 predates
// absl/status/status_macros.h).
#ifndef MATMUL_COMMON_STATUS_MACROS_H_
#define MATMUL_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MATMUL_CONCAT_INNER_(a, b) a##b
#define MATMUL_CONCAT_(a, b) MATMUL_CONCAT_INNER_(a, b)

// Returns from the current function with `expr`'s status if it is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status matmul_status_ = (expr);          \
    if (!matmul_status_.ok()) return matmul_status_; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(MATMUL_CONCAT_(matmul_statusor_, __LINE__), lhs, rexpr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                           \
  if (!statusor.ok()) return statusor.status();      \
  lhs = std::move(statusor).value()

#endif  // MATMUL_COMMON_STATUS_MACROS_H_
