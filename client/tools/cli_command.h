// What every matmul-cli command shares: the flags its command line gave
// (FlagSpec, Args, ParseArgs), the ways out (Usage, Fail, FailRpc), the
// common flags' values (--timeout, --dtype, --bf16-out, --ttl), the client
// for --target, reading an operand, writing a product and a stored tensor's
// line. The flags themselves are Abseil flags defined in cli_main.cc, found
// here by name.
#ifndef MATMUL_CLIENT_TOOLS_CLI_COMMAND_H_
#define MATMUL_CLIENT_TOOLS_CLI_COMMAND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "common/dtype.h"

namespace matmul::cli {

struct FlagSpec {
  std::set<std::string> valued;
  std::set<std::string> switches;
  std::set<std::string> required;
};

// The flags a command line gave (with dashes): the values of those that
// take one, and the switches that are on.
struct Args {
  std::map<std::string, std::string> values;
  std::set<std::string> switches_on;

  // The flag's value, or its default when it was not given.
  std::string Get(const std::string& name) const {
    if (auto it = values.find(name); it != values.end()) return it->second;
    std::string flag = name;
    for (char& c : flag) {
      if (c == '-') c = '_';
    }
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(flag);
    return f == nullptr ? "" : f->DefaultValue();
  }
};

std::string Name(DType dtype);

// Parses a command's arguments (after the command) against `spec`; the
// error message names the problem.
absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& args,
                               const FlagSpec& spec);

// A usage error: one line, exit status 2.
int Usage(absl::string_view problem);
// An error that is not about the command line: exit status 1.
int Fail(absl::string_view message);
// An RPC's error, as `error: INVALID_ARGUMENT: <server message>`.
int FailRpc(const absl::Status& status);

// --timeout: infinite when absent.
absl::StatusOr<absl::Duration> ParseTimeout(const Args& flags);
// --dtype: nullopt for auto.
absl::StatusOr<std::optional<DType>> ParseDtypeFlag(const Args& flags);
// --bf16-out: true for raw bits.
absl::StatusOr<bool> ParseBf16Out(const Args& flags);
// --ttl: zero (the server's default) when absent.
absl::StatusOr<absl::Duration> ParseTtl(const Args& flags);

// "512 B", "1.5 MiB", ...
std::string HumanBytes(int64_t bytes);
// The name of a dtype as the API spells it, without the DTYPE_ prefix.
std::string ProtoDtypeName(int dtype);
// "host" or "device N".
std::string DeviceText(int device);
// "ID shape [..] DTYPE, N bytes, on DEVICE, expires TIME".
std::string StoredLine(const StoredTensor& stored);

// Reads one operand and brings it to `dtype` (nullopt: leave it as it is,
// but refuse raw uint16 bits, whose meaning needs --dtype bfloat16).
absl::StatusOr<HostTensor> LoadOperand(const std::string& flag,
                                       const std::string& path,
                                       std::optional<DType> dtype);
// Writes a result (or downloaded tensor) to `path`, bfloat16 widened to
// float32 unless `bf16_bits`; returns what it was written as.
absl::StatusOr<std::string> WriteResult(const std::string& path,
                                        HostTensor tensor, bool bf16_bits);

// The client for --target (and --client-id, --grpc-arg, --lb-policy), or the
// error to print.
absl::StatusOr<std::unique_ptr<MatmulClient>> ClientFor(const Args& flags,
                                                        int channels = 1);

// matmul-cli multiply (cli_multiply.cc).
int RunMultiply(const std::vector<std::string>& args);

}  // namespace matmul::cli

#endif  // MATMUL_CLIENT_TOOLS_CLI_COMMAND_H_
