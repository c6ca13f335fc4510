// What every matmul-cli command shares (cli_command.h).
#include "client/tools/cli_command.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/lib/dtype_conversion.h"
#include "client/lib/host_tensor.h"
#include "client/lib/matmul_client.h"
#include "client/lib/tensor_proto.h"
#include "client/tools/npy.h"
#include "client/tools/shared_memory_multiply.h"
#include "common/build_info.h"
#include "common/command_line.h"
#include "common/dtype.h"
#include "common/mutex_mode.h"

namespace matmul::cli {

std::string Name(DType dtype) { return std::string(DTypeName(dtype)); }

namespace {

std::string Underscored(std::string name) {
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

}  // namespace

// Parses a command's arguments (after the command) against `spec`; the
// error message names the problem.
absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& args,
                               const FlagSpec& spec) {
  FlagParseOptions options;
  for (const auto* names : {&spec.valued, &spec.switches}) {
    for (const std::string& name : *names) {
      options.allowed.insert(Underscored(name));
    }
  }
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(args, options);
  if (!parsed.ok()) return parsed.status();
  Args flags;
  for (const std::string& name : spec.valued) {
    const std::string flag = Underscored(name);
    if (!parsed->Given(flag)) continue;
    flags.values[name] = absl::FindCommandLineFlag(flag)->CurrentValue();
  }
  for (const std::string& name : spec.switches) {
    const absl::CommandLineFlag* flag =
        absl::FindCommandLineFlag(Underscored(name));
    if (flag->CurrentValue() == "true") flags.switches_on.insert(name);
  }
  for (const std::string& name : spec.required) {
    if (flags.values.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is required"));
    }
  }
  if (auto it = flags.values.find("client-id"); it != flags.values.end()) {
    if (absl::Status s = CheckClientId(it->second); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--client-id: ", s.message()));
    }
  }
  return flags;
}

int Usage(absl::string_view problem) {
  return UsageError("matmul-cli", problem);
}

// An error that is not about the command line.
int Fail(absl::string_view message) {
  absl::FPrintF(stderr, "error: %s\n", message);
  return 1;
}

// An RPC's error, as `error: INVALID_ARGUMENT: <server message>`.
int FailRpc(const absl::Status& status) {
  absl::FPrintF(stderr, "error: %s: %s\n",
                absl::StatusCodeToString(status.code()), status.message());
  return 1;
}

absl::StatusOr<absl::Duration> ParseTimeout(const Args& flags) {
  auto it = flags.values.find("timeout");
  if (it == flags.values.end()) return absl::InfiniteDuration();
  double seconds = 0;
  if (!absl::SimpleAtod(it->second, &seconds) || !std::isfinite(seconds) ||
      seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout takes a positive number of seconds, got \"",
                     it->second, "\""));
  }
  return absl::Seconds(seconds);
}

std::string HumanBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

// The name of a dtype as the API spells it, without the DTYPE_ prefix.
std::string ProtoDtypeName(int dtype) {
  std::optional<DType> d = DTypeFromProto(static_cast<v1::Dtype>(dtype));
  return d.has_value() ? Name(*d) : absl::StrCat("dtype(", dtype, ")");
}

// Reads one operand and brings it to `dtype` (nullopt: leave it as it is,
// but refuse raw uint16 bits, whose meaning needs --dtype bfloat16).
absl::StatusOr<HostTensor> LoadOperand(const std::string& flag,
                                       const std::string& path,
                                       std::optional<DType> dtype) {
  NpyReadOptions read;
  read.integers_as = dtype;
  absl::StatusOr<NpyArray> array = ReadNpy(path, read);
  if (!array.ok()) {
    return absl::Status(
        array.status().code(),
        absl::StrCat("reading --", flag, " ", array.status().message()));
  }
  if (array->raw_uint16 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " ", path,
        " holds uint16 values, which matmul-cli takes as raw bfloat16 bits "
        "only with --dtype bfloat16 (and as integers with --dtype float32, "
        "float64 or float16)"));
  }
  if (!dtype.has_value() || array->tensor.dtype == *dtype) {
    return std::move(array->tensor);
  }
  return ConvertDType(array->tensor, *dtype);
}

// --dtype: nullopt for auto.
absl::StatusOr<std::optional<DType>> ParseDtypeFlag(const Args& flags) {
  const std::string text = flags.Get("dtype");
  if (text == "auto") return std::nullopt;
  if (text == "float32") return DType::kFloat32;
  if (text == "float64") return DType::kFloat64;
  if (text == "float16") return DType::kFloat16;
  if (text == "bfloat16") return DType::kBFloat16;
  return absl::InvalidArgumentError(absl::StrCat(
      "--dtype takes auto, float32, float64, float16 or bfloat16, got \"", text,
      "\""));
}

// --bf16-out: true for raw bits.
absl::StatusOr<bool> ParseBf16Out(const Args& flags) {
  const std::string text = flags.Get("bf16-out");
  if (text != "float32" && text != "bits") {
    return absl::InvalidArgumentError(
        absl::StrCat("--bf16-out takes float32 or bits, got \"", text, "\""));
  }
  return text == "bits";
}

// --ttl: zero (the server's default) when absent.
absl::StatusOr<absl::Duration> ParseTtl(const Args& flags) {
  auto it = flags.values.find("ttl");
  if (it == flags.values.end()) return absl::ZeroDuration();
  int64_t seconds = 0;
  if (!absl::SimpleAtoi(it->second, &seconds) || seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ttl takes a positive whole number of seconds, got \"",
                     it->second, "\""));
  }
  return absl::Seconds(seconds);
}

// The client for --target (and --client-id, --grpc-arg, --lb-policy), or the
// error to print.
absl::StatusOr<std::unique_ptr<MatmulClient>> ClientFor(const Args& flags,
                                                        int channels) {
  ClientOptions options;
  options.channels = channels;
  options.client_id = flags.Get("client-id");
  options.load_balancing_policy = flags.Get("lb-policy");
  if (options.load_balancing_policy != "round_robin" &&
      options.load_balancing_policy != "pick_first") {
    return absl::InvalidArgumentError(
        absl::StrCat("--lb-policy takes round_robin or pick_first, got \"",
                     options.load_balancing_policy, "\""));
  }
  absl::StatusOr<GrpcArgs> grpc_args = ParseGrpcArgs(flags.Get("grpc-arg"));
  if (!grpc_args.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-arg: ", grpc_args.status().message()));
  }
  options.channel_args = *std::move(grpc_args);
  return MatmulClient::Create(flags.values.at("target"), options);
}

std::string DeviceText(int device) {
  return device < 0 ? "host" : absl::StrCat("device ", device);
}

// "ID shape [..] DTYPE, N bytes, on DEVICE, expires TIME".
std::string StoredLine(const StoredTensor& stored) {
  return absl::StrCat(stored.id, " shape ", ShapeString(stored.shape), " ",
                      Name(stored.dtype), ", ", stored.bytes, " bytes, on ",
                      DeviceText(stored.device), ", expires ",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", stored.expire_time,
                                       absl::UTCTimeZone()),
                      "\n");
}

// Writes a result (or downloaded tensor) to `path`, bfloat16 widened to
// float32 unless `bf16_bits`; returns what it was written as.
absl::StatusOr<std::string> WriteResult(const std::string& path,
                                        HostTensor tensor, bool bf16_bits) {
  std::string written_as = Name(tensor.dtype);
  if (tensor.dtype == DType::kBFloat16) {
    if (!bf16_bits) {
      absl::StatusOr<HostTensor> widened =
          ConvertDType(tensor, DType::kFloat32);
      if (!widened.ok()) return widened.status();
      tensor = *std::move(widened);
      written_as = "bfloat16, written as float32";
    } else {
      written_as = "bfloat16, written as raw uint16 bits";
    }
  }
  if (absl::Status s = WriteNpy(path, tensor); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("writing --out ", s.message()));
  }
  return written_as;
}

}  // namespace matmul::cli
