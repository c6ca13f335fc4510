// What this binary was built from: the project version (project() in the
// top-level CMakeLists.txt), the git commit and the CUDA toolkit and cuBLAS
// versions of the CUDA engine. The one source of the version that --version,
// GetServerInfo and matmul_build_info report.
//
// Thread-safe.
#ifndef MATMUL_COMMON_BUILD_INFO_H_
#define MATMUL_COMMON_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace matmul {

// "0.1.0".
absl::string_view ProjectVersion();
// The short commit hash at configure time, or "unknown".
absl::string_view GitCommit();
// The CUDA toolkit (runtime) version, "13.0.88", or "none" without a CUDA
// engine.
absl::string_view CudaVersion();
// The cuBLAS version, "13.1.0", or "none" without a CUDA engine.
absl::string_view CublasVersion();

// What `program --version` prints, newline-terminated:
//   matmul-server 0.1.0
//   commit 9f80cce
//   CUDA runtime 13.0.88, cuBLAS 13.1.0   (or: CUDA none)
std::string VersionText(absl::string_view program);

}  // namespace matmul

#endif  // MATMUL_COMMON_BUILD_INFO_H_
