// Minimal structured-enough logging to stderr: one line per event, with a UTC
// timestamp and the program name. Thread-safe (one fwrite per line).
#ifndef MATMUL_COMMON_LOG_H_
#define MATMUL_COMMON_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace matmul {

inline void LogLine(absl::string_view message) {
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(),
                                    absl::UTCTimeZone()),
                   message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace matmul

#endif  // MATMUL_COMMON_LOG_H_
