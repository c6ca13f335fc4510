// Shared by the client tests that run a MatmulServer in process: the engine
// it runs on (host, or MATMUL_TEST_ENGINE), random operands and their
// values as float64.
#ifndef MATMUL_TESTS_CLIENT_CLIENT_TEST_SUPPORT_H_
#define MATMUL_TESTS_CLIENT_CLIENT_TEST_SUPPORT_H_

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "client/lib/dtype_conversion.h"
#include "client/lib/host_tensor.h"
#include "gpu/engine_factory.h"
#include "gtest/gtest.h"
#include "server/matmul_server.h"
#include "tests/engine_under_test.h"

namespace matmul::testing {

// The engine under test (tests/engine_under_test.h) with 2 streams and
// 256 MiB of staging per device.
inline MatmulServer::EngineProvider Provider() {
  return EngineUnderTestProvider(2);
}

// Uniform values in [-1, 1) as float64, converted to `dtype`.
inline HostTensor Random(std::vector<int64_t> shape, DType dtype,
                         absl::BitGen& gen) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> values(n);
  for (double& v : values) v = absl::Uniform(gen, -1.0, 1.0);
  HostTensor t;
  t.shape = std::move(shape);
  t.dtype = DType::kFloat64;
  t.data.assign(reinterpret_cast<const char*>(values.data()), n * 8);
  if (dtype == DType::kFloat64) return t;
  absl::StatusOr<HostTensor> converted = ConvertDType(t, dtype);
  EXPECT_TRUE(converted.ok());
  return *std::move(converted);
}

inline std::vector<double> AsDoubles(const HostTensor& t) {
  absl::StatusOr<HostTensor> d = ConvertDType(t, DType::kFloat64);
  EXPECT_TRUE(d.ok()) << d.status();
  std::vector<double> out(d->data.size() / 8);
  std::memcpy(out.data(), d->data.data(), d->data.size());
  return out;
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_CLIENT_CLIENT_TEST_SUPPORT_H_
