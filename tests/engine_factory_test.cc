// ParseEngineKind and ChoosesCudaEngine (gpu/engine_factory.h): the engine
// kind the server's --engine names, and whether it makes the CUDA engine
// (matmul-server copies into staging with streaming stores only then).
// Runs with or without a GPU, in builds with or without CUDA.
#include "gpu/engine_factory.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/engine.h"
#include "gtest/gtest.h"

namespace matmul {
namespace {

TEST(EngineFactoryTest, ParsesTheThreeKindsAndRefusesOthers) {
  EXPECT_EQ(*ParseEngineKind("auto"), EngineKind::kAuto);
  EXPECT_EQ(*ParseEngineKind("cuda"), EngineKind::kCuda);
  EXPECT_EQ(*ParseEngineKind("host"), EngineKind::kHost);
  for (const char* bad : {"", "CUDA", "gpu", "host "}) {
    EXPECT_EQ(ParseEngineKind(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << '"' << bad << '"';
  }
}

TEST(EngineFactoryTest, OnlyCudaOrAutoInACudaBuildChoosesTheCudaEngine) {
  EXPECT_FALSE(ChoosesCudaEngine(EngineKind::kHost));
  EXPECT_EQ(ChoosesCudaEngine(EngineKind::kCuda), CudaEngineBuilt());
  // auto takes the CUDA engine only where it was built (and a GPU is seen).
  if (!CudaEngineBuilt()) {
    EXPECT_FALSE(ChoosesCudaEngine(EngineKind::kAuto));
  }
  // What auto chooses is what CreateEngine makes: the host engine where
  // it does not choose the CUDA engine.
  if (!ChoosesCudaEngine(EngineKind::kAuto)) {
    EngineOptions options;
    options.kind = EngineKind::kAuto;
    options.streams_per_device = 1;
    absl::StatusOr<std::unique_ptr<Engine>> engine = CreateEngine(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->info().name, "host");
    (*engine)->Shutdown();
  }
}

}  // namespace
}  // namespace matmul
