// matmul-cli: multiplies two .npy files on a matmul server, or describes the
// server. Arguments are parsed by hand (no flag library) so that the tool
// has exactly the flags below, each as `--flag value` or `--flag=value`.
//
// Exit status: 0 on success; 1 when a file, the data or the RPC fails (the
// RPC's error is printed as `error: CODE_NAME: message`); 2 for a usage
// error.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/dtype_conversion.h"
#include "client/host_tensor.h"
#include "client/matmul_client.h"
#include "client/npy.h"
#include "client/tensor_proto.h"
#include "common/dtype.h"

namespace matmul {
namespace {

constexpr char kUsage[] =
    R"(usage:
  matmul-cli multiply --target HOST:PORT --a A.npy --b B.npy --out C.npy
             [--transpose-a] [--transpose-b] [--compute strict|tf32]
             [--timeout SECONDS]
             [--dtype auto|float32|float64|float16|bfloat16]
             [--bf16-out float32|bits]
  matmul-cli info --target HOST:PORT [--timeout SECONDS]
  matmul-cli help

multiply computes C = op(A) . op(B) as numpy.matmul does, for 2-D
[rows, cols] and 3-D [batch, rows, cols] operands (a 2-D operand, or a 3-D
one of batch 1, is broadcast over the batch); op(X) swaps X's last two axes
when --transpose-x is given. The target is any gRPC target:
127.0.0.1:50051, dns:///matmul.example:50051, unix:/run/matmul.sock.

--dtype auto (the default) computes in the inputs' dtype (float32, float64
or float16; both must agree). Any other --dtype converts both inputs to it
first, rounding to nearest even. NumPy has no bfloat16, so with --dtype
bfloat16 float .npy inputs are rounded to bfloat16, uint16 ('<u2') inputs
are taken as raw bfloat16 bits, and the result is written as float32 (exact)
or, with --bf16-out bits, as raw bits in a '<u2' .npy.
)";

// A command's flags: those that take a value and the boolean switches.
struct FlagSpec {
  std::set<std::string> valued;
  std::set<std::string> switches;
  std::set<std::string> required;
};

struct ParsedFlags {
  std::map<std::string, std::string> values;
  std::set<std::string> switches_on;

  std::string Get(const std::string& name, const std::string& fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
};

std::string Name(DType dtype) { return std::string(DTypeName(dtype)); }

absl::StatusOr<bool> ParseBool(const std::string& flag,
                               const std::string& text) {
  if (text == "true" || text == "1" || text == "yes") return true;
  if (text == "false" || text == "0" || text == "no") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, " takes no value, or true/false; got \"", text, "\""));
}

// Parses argv[first..] against `spec`; the error message names the problem.
absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const FlagSpec& spec) {
  ParsedFlags flags;
  std::set<std::string> seen;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", arg, "\""));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is given more than once"));
    }
    if (spec.switches.count(name) > 0) {
      bool on = true;
      if (value.has_value()) {
        absl::StatusOr<bool> parsed = ParseBool(name, *value);
        if (!parsed.ok()) return parsed.status();
        on = *parsed;
      }
      if (on) flags.switches_on.insert(name);
    } else if (spec.valued.count(name) > 0) {
      if (!value.has_value()) {
        if (i + 1 == args.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " needs a value"));
        }
        value = args[++i];
      }
      flags.values[name] = *value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  for (const std::string& name : spec.required) {
    if (flags.values.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is required"));
    }
  }
  return flags;
}

int Usage(absl::string_view problem) {
  absl::FPrintF(stderr, "matmul-cli: %s\n\n%s", problem, kUsage);
  return 2;
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

absl::StatusOr<absl::Duration> ParseTimeout(const ParsedFlags& flags) {
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
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  if (!array.ok()) {
    return absl::Status(
        array.status().code(),
        absl::StrCat("reading --", flag, " ", array.status().message()));
  }
  if (array->raw_uint16 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " ", path,
        " holds uint16 values, which matmul-cli takes as raw bfloat16 bits "
        "only with --dtype bfloat16"));
  }
  if (!dtype.has_value() || array->tensor.dtype == *dtype) {
    return std::move(array->tensor);
  }
  return ConvertDType(array->tensor, *dtype);
}

int RunMultiply(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target",  "a",       "b",     "out",
                 "compute", "timeout", "dtype", "bf16-out"};
  spec.switches = {"transpose-a", "transpose-b"};
  spec.required = {"target", "a", "b", "out"};
  absl::StatusOr<ParsedFlags> flags = ParseFlags(args, spec);
  if (!flags.ok()) return Usage(flags.status().message());

  MultiplyOptions options;
  options.transpose_a = flags->switches_on.count("transpose-a") > 0;
  options.transpose_b = flags->switches_on.count("transpose-b") > 0;
  const std::string compute = flags->Get("compute", "strict");
  if (compute == "strict") {
    options.compute = ComputeMode::kStrict;
  } else if (compute == "tf32") {
    options.compute = ComputeMode::kTf32;
  } else {
    return Usage(
        absl::StrCat("--compute takes strict or tf32, got \"", compute, "\""));
  }
  absl::StatusOr<absl::Duration> timeout = ParseTimeout(*flags);
  if (!timeout.ok()) return Usage(timeout.status().message());
  options.timeout = *timeout;

  const std::string dtype_flag = flags->Get("dtype", "auto");
  std::optional<DType> dtype;
  if (dtype_flag == "float32") {
    dtype = DType::kFloat32;
  } else if (dtype_flag == "float64") {
    dtype = DType::kFloat64;
  } else if (dtype_flag == "float16") {
    dtype = DType::kFloat16;
  } else if (dtype_flag == "bfloat16") {
    dtype = DType::kBFloat16;
  } else if (dtype_flag != "auto") {
    return Usage(absl::StrCat(
        "--dtype takes auto, float32, float64, float16 or bfloat16, got \"",
        dtype_flag, "\""));
  }
  const std::string bf16_out = flags->Get("bf16-out", "float32");
  if (bf16_out != "float32" && bf16_out != "bits") {
    return Usage(absl::StrCat("--bf16-out takes float32 or bits, got \"",
                              bf16_out, "\""));
  }
  if (flags->values.count("bf16-out") > 0 && dtype != DType::kBFloat16) {
    return Usage("--bf16-out applies only with --dtype bfloat16");
  }

  const std::string a_path = flags->values.at("a");
  const std::string b_path = flags->values.at("b");
  const std::string out_path = flags->values.at("out");
  absl::StatusOr<HostTensor> a = LoadOperand("a", a_path, dtype);
  if (!a.ok()) return Fail(a.status().message());
  absl::StatusOr<HostTensor> b = LoadOperand("b", b_path, dtype);
  if (!b.ok()) return Fail(b.status().message());
  if (a->dtype != b->dtype) {
    return Fail(absl::StrCat("--a ", a_path, " is ", Name(a->dtype),
                             " but --b ", b_path, " is ", Name(b->dtype),
                             "; pass --dtype to convert both to one dtype"));
  }
  const DType request_dtype = a->dtype;

  // The operands are moved into the request, not copied: they can be large.
  v1::MultiplyRequest request;
  if (absl::Status s = ToProto(*std::move(a), request.mutable_a()); !s.ok()) {
    return Fail(absl::StrCat("--a ", a_path, ": ", s.message()));
  }
  if (absl::Status s = ToProto(*std::move(b), request.mutable_b()); !s.ok()) {
    return Fail(absl::StrCat("--b ", b_path, ": ", s.message()));
  }
  request.set_transpose_a(options.transpose_a);
  request.set_transpose_b(options.transpose_b);
  request.set_compute_mode(ComputeModeToProto(options.compute));

  absl::StatusOr<std::unique_ptr<MatmulClient>> client =
      MatmulClient::Create(flags->values.at("target"));
  if (!client.ok()) return Fail(client.status().message());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::MultiplyResponse> response =
      (*client)->MultiplyRaw(request, options);
  const absl::Duration elapsed = absl::Now() - start;
  if (!response.ok()) return FailRpc(response.status());

  const v1::Placement placement = response->placement();
  absl::StatusOr<HostTensor> c = FromProto(std::move(*response->mutable_c()));
  if (!c.ok()) {
    return Fail(absl::StrCat("the server's result is malformed: ",
                             c.status().message()));
  }
  if (c->dtype != request_dtype) {
    return Fail(absl::StrCat("the server answered in ", Name(c->dtype),
                             ", not in the request's ", Name(request_dtype)));
  }
  std::string written_as = Name(c->dtype);
  if (c->dtype == DType::kBFloat16) {
    if (bf16_out == "float32") {
      absl::StatusOr<HostTensor> widened = ConvertDType(*c, DType::kFloat32);
      if (!widened.ok()) return Fail(widened.status().message());
      c = std::move(widened);
      written_as = "bfloat16, written as float32";
    } else {
      written_as = "bfloat16, written as raw uint16 bits";
    }
  }
  if (absl::Status s = WriteNpy(out_path, *c); !s.ok()) {
    return Fail(absl::StrCat("writing --out ", s.message()));
  }
  const std::string where = placement.device() < 0
                                ? absl::StrCat("host lane ", placement.stream())
                                : absl::StrCat("device ", placement.device(),
                                               " stream ", placement.stream());
  absl::PrintF("%s: shape %s, %s, %.3f ms, on %s\n", out_path,
               ShapeString(c->shape), written_as,
               absl::ToDoubleMilliseconds(elapsed), where);
  return 0;
}

int RunInfo(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target", "timeout"};
  spec.required = {"target"};
  absl::StatusOr<ParsedFlags> flags = ParseFlags(args, spec);
  if (!flags.ok()) return Usage(flags.status().message());
  absl::StatusOr<absl::Duration> timeout = ParseTimeout(*flags);
  if (!timeout.ok()) return Usage(timeout.status().message());

  const std::string target = flags->values.at("target");
  absl::StatusOr<std::unique_ptr<MatmulClient>> client =
      MatmulClient::Create(target);
  if (!client.ok()) return Fail(client.status().message());
  absl::StatusOr<v1::GetServerInfoResponse> info =
      (*client)->GetServerInfo(*timeout);
  if (!info.ok()) return FailRpc(info.status());

  std::vector<std::string> dtypes;
  for (int d : info->dtypes()) dtypes.push_back(ProtoDtypeName(d));
  std::string text =
      absl::StrCat("server:             ", target, "\n",
                   "engine:             ", info->engine(), "\n",
                   "version:            ", info->version(), "\n",
                   "streams per device: ", info->streams_per_device(), "\n",
                   "dtypes:             ", absl::StrJoin(dtypes, ", "), "\n",
                   "devices:            ", info->devices_size(), "\n");
  for (const v1::Device& d : info->devices()) {
    absl::StrAppend(&text, "  [", d.index(), "] ", d.name(), "\n");
    if (!d.uuid().empty())
      absl::StrAppend(&text, "      uuid ", d.uuid(), "\n");
    if (d.memory_bytes() > 0) {
      absl::StrAppend(&text, "      memory ", HumanBytes(d.memory_bytes()),
                      ", compute capability ", d.compute_capability(), ", ",
                      d.multiprocessors(), " SMs, ", d.copy_engines(),
                      " copy engines\n");
    } else {
      absl::StrAppend(&text, "      ", d.multiprocessors(), " CPU cores\n");
    }
    if (d.staging_bytes() > 0) {
      absl::StrAppend(&text, "      pinned staging ",
                      HumanBytes(d.staging_bytes()), "\n");
    }
  }
  const v1::Limits& limits = info->limits();
  absl::StrAppend(
      &text, "limits:\n",
      "  max message:              ", limits.max_message_bytes(), " bytes (",
      HumanBytes(limits.max_message_bytes()), ")\n",
      "  max elements per operand: ", limits.max_elements_per_operand(), "\n",
      "  max dimension:            ", limits.max_dimension(), "\n",
      "  max in flight:            ", limits.max_inflight_bytes(), " bytes (",
      HumanBytes(limits.max_inflight_bytes()), ")\n");
  std::fputs(text.c_str(), stdout);
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 2) return Usage("no command given");
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (command == "multiply") return RunMultiply(args);
  if (command == "info") return RunInfo(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  return Usage(absl::StrCat("unknown command \"", command, "\""));
}

}  // namespace
}  // namespace matmul

int main(int argc, char** argv) { return matmul::Main(argc, argv); }
