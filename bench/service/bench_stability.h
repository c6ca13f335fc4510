// When a benchmark point's figure has settled: matmul-bench --stable runs a
// point in windows (of --duration each) until the last three agree, as
// Triton's perf_analyzer does, so that a figure is not read off a warm-up
// transient or a noisy neighbour's burst.
//
// Thread-compatible (plain functions and values).
#ifndef MATMUL_CLIENT_TOOLS_BENCH_STABILITY_H_
#define MATMUL_CLIENT_TOOLS_BENCH_STABILITY_H_

#include <string>
#include <vector>

namespace matmul {

struct Stability {
  // The last `kWindows` windows' requests per second agree: the largest is
  // at most (1 + tolerance) times the smallest, and the smallest is above 0.
  bool stable = false;
  // max / min - 1 of the last kWindows windows (or of all, if fewer); 0
  // with one window; infinity when the smallest is 0.
  double spread = 0;
  static constexpr int kWindows = 3;
};

// `window_rates`: each window's successful requests per second, in order.
Stability JudgeStability(const std::vector<double>& window_rates,
                         double tolerance);

// "stable after 4 windows (spread 3.1%): 1203.4 1180.2 1211.9 1199.0 req/s"
// or "NOT stable after 10 windows (spread 18.2%, tolerance 10%): ...".
std::string StabilityLine(const std::vector<double>& window_rates,
                          const Stability& stability, double tolerance);

}  // namespace matmul

#endif  // MATMUL_CLIENT_TOOLS_BENCH_STABILITY_H_
