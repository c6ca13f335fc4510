// multiply: the installed C++ client in a program of its own. Multiplies two
// small float32 matrices on a matmul server and prints the product.
//
//   multiply ADDRESS [A B]
//
// ADDRESS is a gRPC target (127.0.0.1:50051); A and B are matrices written
// as rows separated by ';' and values by spaces ("1 2 3; 4 5 6"). Without
// them it multiplies a 2x3 by a 3x2 matrix. Prints "C = A.B (MxN)" and then
// C, one row per line.
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"

namespace {

// "1 2; 3 4" as a rows x cols float32 HostTensor; nullopt if the rows are
// ragged, empty or not numbers.
std::optional<matmul::HostTensor> ParseMatrix(const std::string& text) {
  std::vector<float> values;
  int64_t rows = 0;
  int64_t cols = -1;
  std::istringstream row_stream(text);
  std::string row;
  while (std::getline(row_stream, row, ';')) {
    std::istringstream value_stream(row);
    int64_t n = 0;
    float v = 0;
    while (value_stream >> v) {
      values.push_back(v);
      ++n;
    }
    if (!value_stream.eof() || n == 0 || (cols >= 0 && n != cols)) {
      return std::nullopt;
    }
    cols = n;
    ++rows;
  }
  if (rows == 0) return std::nullopt;
  matmul::HostTensor t;
  t.shape = {rows, cols};
  t.dtype = matmul::DType::kFloat32;
  t.data.resize(values.size() * sizeof(float));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr,
                 "usage: %s ADDRESS [\"1 2 3; 4 5 6\" \"1 2; 3 4; 5 6\"]\n",
                 argv[0]);
    return 2;
  }
  const std::optional<matmul::HostTensor> a =
      ParseMatrix(argc == 4 ? argv[2] : "1 2 3; 4 5 6");
  const std::optional<matmul::HostTensor> b =
      ParseMatrix(argc == 4 ? argv[3] : "7 8; 9 10; 11 12");
  if (!a || !b) {
    std::fprintf(stderr, "a matrix is rows of numbers separated by ';'\n");
    return 2;
  }

  absl::StatusOr<std::unique_ptr<matmul::MatmulClient>> client =
      matmul::MatmulClient::Create(argv[1]);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  matmul::MultiplyOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<matmul::HostTensor> c = (*client)->Multiply(*a, *b, options);
  if (!c.ok()) {
    std::fprintf(stderr, "Multiply: %s\n", c.status().ToString().c_str());
    return 1;
  }

  const int64_t rows = c->shape[0];
  const int64_t cols = c->shape[1];
  std::vector<float> values(rows * cols);
  std::memcpy(values.data(), c->data.data(), values.size() * sizeof(float));
  std::printf("C = A.B (%lldx%lld)\n", static_cast<long long>(rows),
              static_cast<long long>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      std::printf("%s%.9g", j == 0 ? "" : " ", values[i * cols + j]);
    }
    std::printf("\n");
  }
  return 0;
}
