#include "common/build_info.h"

#include "absl/strings/str_cat.h"
#include "matmul_build_config.h"

namespace matmul {

absl::string_view ProjectVersion() { return MATMUL_BUILD_VERSION; }
absl::string_view GitCommit() { return MATMUL_BUILD_GIT_COMMIT; }
absl::string_view CudaVersion() { return MATMUL_BUILD_CUDA_VERSION; }
absl::string_view CublasVersion() { return MATMUL_BUILD_CUBLAS_VERSION; }

std::string VersionText(absl::string_view program) {
  std::string text = absl::StrCat(program, " ", ProjectVersion(), "\ncommit ",
                                  GitCommit(), "\n");
  if (CudaVersion() == "none") {
    absl::StrAppend(&text, "CUDA none (built without the CUDA engine)\n");
  } else {
    absl::StrAppend(&text, "CUDA runtime ", CudaVersion(), ", cuBLAS ",
                    CublasVersion(), "\n");
  }
  return text;
}

}  // namespace matmul
