#include "bench/service/bench_stability.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace matmul {

Stability JudgeStability(const std::vector<double>& window_rates,
                         double tolerance) {
  Stability s;
  if (window_rates.empty()) return s;
  const size_t n = std::min<size_t>(window_rates.size(), Stability::kWindows);
  const auto last = window_rates.end() - static_cast<std::ptrdiff_t>(n);
  const double lo = *std::min_element(last, window_rates.end());
  const double hi = *std::max_element(last, window_rates.end());
  s.spread = lo > 0 ? hi / lo - 1 : std::numeric_limits<double>::infinity();
  s.stable = n == static_cast<size_t>(Stability::kWindows) && lo > 0 &&
             s.spread <= tolerance;
  return s;
}

std::string StabilityLine(const std::vector<double>& window_rates,
                          const Stability& stability, double tolerance) {
  std::string spread = std::isfinite(stability.spread)
                           ? absl::StrFormat("%.1f%%", 100 * stability.spread)
                           : std::string("infinite");
  std::string line =
      stability.stable
          ? absl::StrFormat("stable after %d windows (spread %s):",
                            window_rates.size(), spread)
          : absl::StrFormat(
                "NOT stable after %d windows (spread %s, tolerance %.0f%%):",
                window_rates.size(), spread, 100 * tolerance);
  for (double r : window_rates)
    absl::StrAppend(&line, absl::StrFormat(" %.1f", r));
  absl::StrAppend(&line, " req/s");
  return line;
}

}  // namespace matmul
