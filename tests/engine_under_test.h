// The engine the in-process server tests run against: the host engine by
// default, or the one MATMUL_TEST_ENGINE names ("cuda" on a GPU host, where
// the same tests then run on the GPU).
#ifndef MATMUL_TESTS_ENGINE_UNDER_TEST_H_
#define MATMUL_TESTS_ENGINE_UNDER_TEST_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/engine_factory.h"
#include "server/matmul_server.h"

namespace matmul::testing {

// "host" unless MATMUL_TEST_ENGINE names another.
inline std::string EngineUnderTest() {
  const char* name = std::getenv("MATMUL_TEST_ENGINE");
  return name == nullptr ? "host" : name;
}

// That engine with `streams` streams (host engine: worker lanes) and
// `staging_bytes` of pinned staging per device.
inline MatmulServer::EngineProvider EngineUnderTestProvider(
    int streams, int64_t staging_bytes = int64_t{256} << 20) {
  return [streams, staging_bytes]() -> absl::StatusOr<std::unique_ptr<Engine>> {
    absl::StatusOr<EngineKind> kind = ParseEngineKind(EngineUnderTest());
    if (!kind.ok()) return kind.status();
    EngineOptions options;
    options.kind = *kind;
    options.streams_per_device = streams;
    options.pinned_pool_bytes = staging_bytes;
    return CreateEngine(options);
  };
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_ENGINE_UNDER_TEST_H_
