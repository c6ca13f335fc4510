// matmul-cli: multiplies two .npy files (or stored tensors) on a matmul
// server, stores, fetches and frees tensors there, or describes the server.
// The flags are Abseil flags, each written `--flag value` or `--flag=value`
// (dashes or underscores); each command takes the ones its usage line shows
// (common/command_line.h parses them).
//
// Exit status: 0 on success (and for --help, --version); 1 when a file, the
// data or the RPC fails (the RPC's error is printed as `error: CODE_NAME:
// message`); 2 for a usage error (one line: `matmul-cli: PROBLEM; see
// --help`).
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

// Every command's flags; each command takes those of its usage line.
ABSL_FLAG(std::string, target, "",
          "The server: any gRPC target (127.0.0.1:50051, "
          "dns:///matmul.example:50051, unix:/run/matmul.sock)");
ABSL_FLAG(std::string, timeout, "",
          "Deadline of the call, seconds (default: none)");
ABSL_FLAG(std::string, client_id, "",
          "Name the server charges stored tensors to, sent as x-matmul-client "
          "metadata (default: this machine's address)");
ABSL_FLAG(std::string, grpc_arg, "",
          "Extra gRPC channel arguments, NAME=INT[,NAME=INT...]");
ABSL_FLAG(std::string, a, "", "Operand A: a .npy file");
ABSL_FLAG(std::string, b, "", "Operand B: a .npy file");
ABSL_FLAG(std::string, a_handle, "", "Operand A: a stored tensor's id");
ABSL_FLAG(std::string, b_handle, "", "Operand B: a stored tensor's id");
ABSL_FLAG(std::string, out, "", "Where to write the product (.npy)");
ABSL_FLAG(bool, keep, false,
          "Keep the product on the server and print its line (not with "
          "--out)");
ABSL_FLAG(std::string, ttl, "",
          "Lifetime of a stored tensor, whole seconds (default: the "
          "server's)");
ABSL_FLAG(std::string, handle, "", "A stored tensor's id");
ABSL_FLAG(std::string, device, "",
          "Device to store on (see info; default: the least loaded)");
ABSL_FLAG(bool, transpose_a, false,
          "Multiply by A with its last two axes swapped");
ABSL_FLAG(bool, transpose_b, false,
          "Multiply by B with its last two axes swapped");
ABSL_FLAG(std::string, compute, "strict",
          "strict, or tf32 (float32 inputs may be rounded to TF32)");
ABSL_FLAG(std::string, dtype, "auto",
          "auto (the inputs' dtype), float32, float64, float16 or bfloat16: "
          "convert the .npy inputs (floating-point or integer) to it");
ABSL_FLAG(std::string, bf16_out, "float32",
          "A bfloat16 product written as float32, or as raw uint16 bits");
ABSL_FLAG(bool, stream, false,
          "Send the multiply over MultiplyStream, in chunks: no message size "
          "bounds the operands or the product");
ABSL_FLAG(std::string, chunk_mib, "4",
          "--stream's chunk size, MiB (1 to 1024)");
ABSL_FLAG(std::string, stripes, "1",
          "--stream over this many MultiplyStream calls, each on its own "
          "connection (1 to 16)");
ABSL_FLAG(bool, shared_memory, false,
          "Hand A, B and C to the server through a shared-memory region "
          "(a unix: target on the server's host)");

namespace matmul {
namespace {

const std::vector<FlagGroup>& CliFlags() {
  static const auto* groups = new std::vector<FlagGroup>{
      {"Server",
       {"target=HOST:PORT", "timeout=SECONDS", "client_id=NAME",
        "grpc_arg=NAME=INT,..."}},
      {"Operands and product",
       {"a=A.npy", "b=B.npy", "a_handle=ID", "b_handle=ID", "out=C.npy", "keep",
        "ttl=SECONDS", "handle=ID", "device=N"}},
      {"Computation",
       {"transpose_a", "transpose_b", "compute=strict|tf32", "dtype=DTYPE",
        "bf16_out=float32|bits"}},
      {"Streaming", {"stream", "chunk_mib=N", "stripes=K"}},
      {"Same host", {"shared_memory"}},
  };
  return *groups;
}

constexpr char kUsage[] =
    R"(usage:
  matmul-cli multiply --target HOST:PORT (--a A.npy | --a-handle ID)
             (--b B.npy | --b-handle ID) (--out C.npy | --keep [--ttl SECONDS])
             [--transpose-a] [--transpose-b] [--compute strict|tf32]
             [--timeout SECONDS] [--client-id NAME]
             [--dtype auto|float32|float64|float16|bfloat16]
             [--bf16-out float32|bits]
             [--stream [--chunk-mib N] [--stripes K]]
             [--shared-memory] [--grpc-arg NAME=INT[,NAME=INT...]]
  matmul-cli upload --target HOST:PORT --a A.npy [--device N] [--ttl SECONDS]
             [--dtype auto|float32|float64|float16|bfloat16]
             [--timeout SECONDS] [--client-id NAME]
  matmul-cli download --target HOST:PORT --handle ID --out C.npy
             [--bf16-out float32|bits] [--timeout SECONDS]
  matmul-cli delete --target HOST:PORT --handle ID [--timeout SECONDS]
  matmul-cli info --target HOST:PORT [--timeout SECONDS]
  matmul-cli help | --help | --version

multiply computes C = op(A) . op(B) as numpy.matmul does, for 2-D
[rows, cols] and 3-D [batch, rows, cols] operands (a 2-D operand, or a 3-D
one of batch 1, is broadcast over the batch); op(X) swaps X's last two axes
when --transpose-x is given. The target is any gRPC target:
127.0.0.1:50051, dns:///matmul.example:50051, unix:/run/matmul.sock.

Stored tensors: upload keeps A.npy on the server (on --device N, or the
least loaded device) and prints one line that starts with the handle id:
  ID shape [R, C] DTYPE, BYTES bytes, on DEVICE, expires TIME
multiply takes --a-handle / --b-handle instead of a file, and with --keep
leaves the product on the server and prints its line (instead of writing
--out). download writes a stored tensor to a .npy file; delete frees it.
Unless deleted, a stored tensor expires after --ttl seconds (default: the
server's; see info). The server charges stored tensors to --client-id
(sent as x-matmul-client metadata), or else to this machine's address.

--dtype auto (the default) computes in the inputs' dtype (float32, float64
or float16; both must agree). Any other --dtype converts the .npy inputs to
it first, rounding to nearest even (a stored operand keeps its dtype, which
the other operand must have); integer inputs (int8..int64, uint8..uint64,
what numpy.arange makes) are read only so. bool and complex inputs are
refused. NumPy has no bfloat16, so with --dtype bfloat16 float and integer
.npy inputs are rounded to bfloat16, uint16 ('<u2') inputs are taken as raw
bfloat16 bits, and a bfloat16 result (or download) is written as float32
(exact) or, with --bf16-out bits, as raw bits in a '<u2' .npy.

--stream sends the multiply over MultiplyStream: operands and product travel
in chunks of --chunk-mib MiB (default 4), so no message size bounds them
(a 16384 x 16384 float32 product needs it), and the server copies each
chunk to the GPU while the next one is on the wire. --stripes K (2 to 16)
stripes the multiply over K MultiplyStream calls, each on its own
connection: the chunks go out round-robin over them and the product comes
back over all of them, so one connection's rate does not bound it (the
server must support striping).

--shared-memory (a unix:PATH target, on the server's host, same user)
registers a POSIX shared-memory region with the server, puts A and B in it,
and has the server read them there and write C there: no operand or product
byte goes through the socket. Not with --keep, --stream or handles.
)";

// A command's flags (with dashes): those that take a value and the boolean
// switches.
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

std::string Name(DType dtype) { return std::string(DTypeName(dtype)); }

std::string Underscored(std::string name) {
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

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

// The client for --target (and --client-id), or the error to print.
absl::StatusOr<std::unique_ptr<MatmulClient>> ClientFor(const Args& flags,
                                                        int channels = 1) {
  ClientOptions options;
  options.channels = channels;
  options.client_id = flags.Get("client-id");
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

// The largest message gRPC (and protobuf) can carry.
constexpr int64_t kMaxGrpcMessageBytes = 2147483647;

// A unary multiply the server refused for a message's size, with what to do
// about it: "request is over N bytes; use --stream", N the server's limit
// (GetServerInfo.limits). Any other error is returned as it is.
absl::Status WithStreamHint(MatmulClient& client, int64_t request_bytes,
                            bool keep, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  // The server's own check of the product's size (request_validation.cc).
  if (absl::StrContains(status.message(), "max message size") && !keep) {
    return absl::Status(status.code(),
                        absl::StrCat(status.message(), "; use --stream"));
  }
  absl::StatusOr<v1::GetServerInfoResponse> info =
      client.GetServerInfo(absl::Seconds(10));
  if (!info.ok()) return status;
  const int64_t limit = info->limits().max_message_bytes();
  if (limit <= 0 || request_bytes <= limit) return status;
  return absl::Status(
      status.code(),
      absl::StrCat("request is over ", limit, " bytes; use --stream (it is ",
                   request_bytes, " bytes; ", limit,
                   " is the server's message limit)"));
}

int RunMultiply(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target", "a",         "b",         "a-handle", "b-handle",
                 "out",    "compute",   "timeout",   "dtype",    "bf16-out",
                 "ttl",    "client-id", "chunk-mib", "grpc-arg", "stripes"};
  spec.switches = {"transpose-a", "transpose-b", "keep", "stream",
                   "shared-memory"};
  spec.required = {"target"};
  absl::StatusOr<Args> flags = ParseArgs(args, spec);
  if (!flags.ok()) return Usage(flags.status().message());
  const auto has = [&](const char* name) {
    return flags->values.count(name) > 0;
  };
  for (const char* x : {"a", "b"}) {
    const std::string handle = absl::StrCat(x, "-handle");
    if (has(x) && has(handle.c_str())) {
      return Usage(
          absl::StrCat("--", x, " and --", handle, " exclude each other"));
    }
    if (!has(x) && !has(handle.c_str())) {
      return Usage(absl::StrCat("--", x, " is required (or --", handle, ")"));
    }
  }
  const bool keep = flags->switches_on.count("keep") > 0;
  if (keep && has("out")) return Usage("--out and --keep exclude each other");
  if (!keep && !has("out")) return Usage("--out is required (or --keep)");
  if (!keep && has("ttl")) return Usage("--ttl applies only with --keep");
  const bool stream = flags->switches_on.count("stream") > 0;
  if (stream && keep) return Usage("--stream returns data: drop --keep");
  const bool shared = flags->switches_on.count("shared-memory") > 0;
  if (shared && (keep || stream || has("a-handle") || has("b-handle"))) {
    return Usage(
        "--shared-memory takes --a and --b files and --out: not --keep, "
        "--stream or handles");
  }
  if (!stream && has("chunk-mib")) {
    return Usage("--chunk-mib applies only with --stream");
  }
  int64_t chunk_mib = 0;
  if (!absl::SimpleAtoi(flags->Get("chunk-mib"), &chunk_mib) || chunk_mib < 1 ||
      chunk_mib > 1024) {
    return Usage(absl::StrCat("--chunk-mib takes 1 to 1024, got \"",
                              flags->Get("chunk-mib"), "\""));
  }
  if (!stream && has("stripes")) {
    return Usage("--stripes applies only with --stream");
  }
  int stripes = 0;
  if (!absl::SimpleAtoi(flags->Get("stripes"), &stripes) || stripes < 1 ||
      stripes > kMaxStreamStripes) {
    return Usage(absl::StrCat("--stripes takes 1 to ", kMaxStreamStripes,
                              ", got \"", flags->Get("stripes"), "\""));
  }

  MultiplyOptions options;
  options.transpose_a = flags->switches_on.count("transpose-a") > 0;
  options.transpose_b = flags->switches_on.count("transpose-b") > 0;
  const std::string compute = flags->Get("compute");
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
  absl::StatusOr<absl::Duration> ttl = ParseTtl(*flags);
  if (!ttl.ok()) return Usage(ttl.status().message());
  options.keep_result = keep;
  options.result_ttl = *ttl;

  absl::StatusOr<std::optional<DType>> dtype = ParseDtypeFlag(*flags);
  if (!dtype.ok()) return Usage(dtype.status().message());
  absl::StatusOr<bool> bf16_bits = ParseBf16Out(*flags);
  if (!bf16_bits.ok()) return Usage(bf16_bits.status().message());
  const bool any_handle = has("a-handle") || has("b-handle");
  if (has("bf16-out") && *dtype != DType::kBFloat16 && !any_handle) {
    return Usage(
        "--bf16-out applies only with --dtype bfloat16 or a stored operand");
  }
  if (has("bf16-out") && keep) {
    return Usage("--bf16-out applies only with --out");
  }

  // Operands from files are moved into the request, not copied: they can be
  // large. Stored ones are named by their handles.
  v1::MultiplyRequest request;
  std::optional<DType> file_dtype;
  std::string file_flag;
  HostTensor streamed[2];  // --stream: the operands from files
  std::string streamed_handle[2];
  for (const char* x : {"a", "b"}) {
    const bool is_a = x[0] == 'a';
    if (!has(x)) {
      const std::string id = flags->values.at(absl::StrCat(x, "-handle"));
      if (id.empty()) {
        return Usage(absl::StrCat("--", x, "-handle is empty"));
      }
      streamed_handle[is_a ? 0 : 1] = id;
      if (is_a) {
        request.set_a_handle(id);
      } else {
        request.set_b_handle(id);
      }
      continue;
    }
    const std::string path = flags->values.at(x);
    absl::StatusOr<HostTensor> t = LoadOperand(x, path, *dtype);
    if (!t.ok()) return Fail(t.status().message());
    if (file_dtype.has_value() && *file_dtype != t->dtype) {
      return Fail(absl::StrCat("--a ", flags->values.at("a"), " is ",
                               Name(*file_dtype), " but --b ", path, " is ",
                               Name(t->dtype),
                               "; pass --dtype to convert both to one dtype"));
    }
    file_dtype = t->dtype;
    file_flag = x;
    if (stream || shared) {
      streamed[is_a ? 0 : 1] = *std::move(t);
      continue;
    }
    v1::Tensor* out = is_a ? request.mutable_a() : request.mutable_b();
    if (absl::Status s = ToProto(*std::move(t), out); !s.ok()) {
      return Fail(absl::StrCat("--", x, " ", path, ": ", s.message()));
    }
  }
  request.set_transpose_a(options.transpose_a);
  request.set_transpose_b(options.transpose_b);
  request.set_compute_mode(ComputeModeToProto(options.compute));
  if (keep) {
    absl::StatusOr<int64_t> seconds = TtlSeconds(options.result_ttl, "--ttl");
    if (!seconds.ok()) return Usage(seconds.status().message());
    request.set_keep_result(true);
    request.set_result_ttl_seconds(*seconds);
  }

  // One connection per stripe.
  absl::StatusOr<std::unique_ptr<MatmulClient>> client =
      ClientFor(*flags, stripes);
  if (!client.ok()) return Fail(client.status().message());
  if (shared) {
    absl::StatusOr<SharedMultiplyResult> result = MultiplyThroughSharedMemory(
        **client, streamed[0], streamed[1], options);
    if (!result.ok()) return FailRpc(result.status());
    const std::string out_path = flags->values.at("out");
    const std::vector<int64_t> c_shape = result->c.shape;
    absl::StatusOr<std::string> written_as =
        WriteResult(out_path, std::move(result->c), *bf16_bits);
    if (!written_as.ok()) return Fail(written_as.status().message());
    absl::PrintF(
        "%s: shape %s, %s, %.3f ms, through a %s shared-memory region\n",
        out_path, ShapeString(c_shape), *written_as,
        absl::ToDoubleMilliseconds(result->multiply_time),
        HumanBytes(result->region_bytes));
    return 0;
  }
  const absl::Time start = absl::Now();
  if (stream) {
    auto operand = [&](int i) {
      return streamed_handle[i].empty() ? Operand(streamed[i])
                                        : Operand::Handle(streamed_handle[i]);
    };
    StreamOptions stream_options;
    stream_options.chunk_bytes = chunk_mib << 20;
    stream_options.stripes = stripes;
    absl::StatusOr<HostTensor> c = (*client)->MultiplyStreamed(
        operand(0), operand(1), options, stream_options);
    const absl::Duration elapsed = absl::Now() - start;
    if (!c.ok()) return FailRpc(c.status());
    const std::string out_path = flags->values.at("out");
    const std::vector<int64_t> c_shape = c->shape;
    absl::StatusOr<std::string> written_as =
        WriteResult(out_path, *std::move(c), *bf16_bits);
    if (!written_as.ok()) return Fail(written_as.status().message());
    absl::PrintF(
        "%s: shape %s, %s, %.3f ms, streamed in %d MiB chunks%s\n", out_path,
        ShapeString(c_shape), *written_as, absl::ToDoubleMilliseconds(elapsed),
        chunk_mib,
        stripes > 1 ? absl::StrCat(" over ", stripes, " striped streams") : "");
    return 0;
  }
  const int64_t request_bytes = static_cast<int64_t>(request.ByteSizeLong());
  if (request_bytes > kMaxGrpcMessageBytes) {
    return FailRpc(absl::ResourceExhaustedError(
        absl::StrCat("request is over ", kMaxGrpcMessageBytes,
                     " bytes; use --stream (it is ", request_bytes,
                     " bytes, over gRPC's largest message)")));
  }
  absl::StatusOr<v1::MultiplyResponse> response =
      (*client)->MultiplyRaw(request, options);
  const absl::Duration elapsed = absl::Now() - start;
  if (!response.ok()) {
    return FailRpc(
        WithStreamHint(**client, request_bytes, keep, response.status()));
  }

  const v1::Placement placement = response->placement();
  const std::string where = placement.device() < 0
                                ? absl::StrCat("host lane ", placement.stream())
                                : absl::StrCat("device ", placement.device(),
                                               " stream ", placement.stream());
  if (keep) {
    if (!response->has_c_handle()) {
      return Fail(
          "the server returned the product instead of keeping it: it does "
          "not support stored tensors");
    }
    absl::StatusOr<StoredTensor> stored =
        StoredTensorFromProto(response->c_handle());
    if (!stored.ok()) return Fail(stored.status().message());
    std::fputs(StoredLine(*stored).c_str(), stdout);
    absl::FPrintF(stderr, "kept the product: %.3f ms, on %s\n",
                  absl::ToDoubleMilliseconds(elapsed), where);
    return 0;
  }
  absl::StatusOr<HostTensor> c = FromProto(std::move(*response->mutable_c()));
  if (!c.ok()) {
    return Fail(absl::StrCat("the server's result is malformed: ",
                             c.status().message()));
  }
  if (file_dtype.has_value() && c->dtype != *file_dtype) {
    return Fail(absl::StrCat("the server answered in ", Name(c->dtype),
                             ", not in the request's ", Name(*file_dtype)));
  }
  const std::string out_path = flags->values.at("out");
  const std::vector<int64_t> c_shape = c->shape;
  absl::StatusOr<std::string> written_as =
      WriteResult(out_path, *std::move(c), *bf16_bits);
  if (!written_as.ok()) return Fail(written_as.status().message());
  absl::PrintF("%s: shape %s, %s, %.3f ms, on %s\n", out_path,
               ShapeString(c_shape), *written_as,
               absl::ToDoubleMilliseconds(elapsed), where);
  return 0;
}

int RunUpload(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target", "a",       "device",   "ttl",
                 "dtype",  "timeout", "client-id"};
  spec.required = {"target", "a"};
  absl::StatusOr<Args> flags = ParseArgs(args, spec);
  if (!flags.ok()) return Usage(flags.status().message());
  UploadOptions options;
  absl::StatusOr<absl::Duration> timeout = ParseTimeout(*flags);
  if (!timeout.ok()) return Usage(timeout.status().message());
  options.timeout = *timeout;
  absl::StatusOr<absl::Duration> ttl = ParseTtl(*flags);
  if (!ttl.ok()) return Usage(ttl.status().message());
  options.ttl = *ttl;
  if (auto it = flags->values.find("device"); it != flags->values.end()) {
    int device = 0;
    if (!absl::SimpleAtoi(it->second, &device) || device < -1) {
      return Usage(
          absl::StrCat("--device takes a device index (see info), got \"",
                       it->second, "\""));
    }
    options.device = device;
  }
  absl::StatusOr<std::optional<DType>> dtype = ParseDtypeFlag(*flags);
  if (!dtype.ok()) return Usage(dtype.status().message());

  const std::string path = flags->values.at("a");
  absl::StatusOr<HostTensor> tensor = LoadOperand("a", path, *dtype);
  if (!tensor.ok()) return Fail(tensor.status().message());
  if (tensor->shape.size() != 2 && tensor->shape.size() != 3) {
    return Fail(absl::StrCat("--a ", path, " has shape ",
                             ShapeString(tensor->shape),
                             "; a stored tensor is 2-D or 3-D"));
  }
  absl::StatusOr<std::unique_ptr<MatmulClient>> client = ClientFor(*flags);
  if (!client.ok()) return Fail(client.status().message());
  absl::StatusOr<StoredTensor> stored = (*client)->Upload(*tensor, options);
  if (!stored.ok()) return FailRpc(stored.status());
  std::fputs(StoredLine(*stored).c_str(), stdout);
  return 0;
}

int RunDownload(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target", "handle", "out", "bf16-out", "timeout"};
  spec.required = {"target", "handle", "out"};
  absl::StatusOr<Args> flags = ParseArgs(args, spec);
  if (!flags.ok()) return Usage(flags.status().message());
  absl::StatusOr<absl::Duration> timeout = ParseTimeout(*flags);
  if (!timeout.ok()) return Usage(timeout.status().message());
  absl::StatusOr<bool> bf16_bits = ParseBf16Out(*flags);
  if (!bf16_bits.ok()) return Usage(bf16_bits.status().message());
  const std::string id = flags->values.at("handle");
  if (id.empty()) return Usage("--handle is empty");
  absl::StatusOr<std::unique_ptr<MatmulClient>> client = ClientFor(*flags);
  if (!client.ok()) return Fail(client.status().message());
  absl::StatusOr<HostTensor> tensor = (*client)->Download(id, *timeout);
  if (!tensor.ok()) return FailRpc(tensor.status());
  const std::string out_path = flags->values.at("out");
  const std::vector<int64_t> shape = tensor->shape;
  absl::StatusOr<std::string> written_as =
      WriteResult(out_path, *std::move(tensor), *bf16_bits);
  if (!written_as.ok()) return Fail(written_as.status().message());
  absl::PrintF("%s: shape %s, %s\n", out_path, ShapeString(shape), *written_as);
  return 0;
}

int RunDelete(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target", "handle", "timeout"};
  spec.required = {"target", "handle"};
  absl::StatusOr<Args> flags = ParseArgs(args, spec);
  if (!flags.ok()) return Usage(flags.status().message());
  absl::StatusOr<absl::Duration> timeout = ParseTimeout(*flags);
  if (!timeout.ok()) return Usage(timeout.status().message());
  const std::string id = flags->values.at("handle");
  if (id.empty()) return Usage("--handle is empty");
  absl::StatusOr<std::unique_ptr<MatmulClient>> client = ClientFor(*flags);
  if (!client.ok()) return Fail(client.status().message());
  if (absl::Status s = (*client)->Delete(id, *timeout); !s.ok()) {
    return FailRpc(s);
  }
  absl::PrintF("deleted %s\n", id);
  return 0;
}

int RunInfo(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target", "timeout"};
  spec.required = {"target"};
  absl::StatusOr<Args> flags = ParseArgs(args, spec);
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
  if (limits.max_handles_per_client() > 0 ||
      limits.max_stored_bytes_per_client() > 0) {
    absl::StrAppend(&text, "  stored per client:        ",
                    limits.max_stored_bytes_per_client(), " bytes (",
                    HumanBytes(limits.max_stored_bytes_per_client()), "), ",
                    limits.max_handles_per_client(), " tensors\n",
                    "  stored, all clients:      ", limits.max_stored_bytes(),
                    " bytes (", HumanBytes(limits.max_stored_bytes()), ")\n",
                    "  stored tensor TTL:        default ",
                    limits.default_handle_ttl_seconds(), " s, max ",
                    limits.max_handle_ttl_seconds(), " s\n");
  }
  std::fputs(text.c_str(), stdout);
  return 0;
}

int Main(int argc, char** argv) {
  SkipMutexDeadlockDetection();  // common/mutex_mode.h
  const std::vector<std::string> all(argv + std::min(argc, 1), argv + argc);
  switch (FindInfoRequest(all)) {
    case InfoRequest::kHelp:
      std::fputs(
          absl::StrCat(kUsage, "\nflags (--flag VALUE or --flag=VALUE):\n\n",
                       FlagsHelp(CliFlags()))
              .c_str(),
          stdout);
      return 0;
    case InfoRequest::kVersion:
      std::fputs(VersionText("matmul-cli").c_str(), stdout);
      return 0;
    case InfoRequest::kNone:
      break;
  }
  if (all.empty()) return Usage("no command given");
  const std::string& command = all[0];
  const std::vector<std::string> args(all.begin() + 1, all.end());
  if (command == "multiply") return RunMultiply(args);
  if (command == "upload") return RunUpload(args);
  if (command == "download") return RunDownload(args);
  if (command == "delete") return RunDelete(args);
  if (command == "info") return RunInfo(args);
  if (command == "help") {
    std::fputs(
        absl::StrCat(kUsage, "\nflags (--flag VALUE or --flag=VALUE):\n\n",
                     FlagsHelp(CliFlags()))
            .c_str(),
        stdout);
    return 0;
  }
  return Usage(absl::StrCat("unknown command \"", command, "\""));
}

}  // namespace
}  // namespace matmul

int main(int argc, char** argv) { return matmul::Main(argc, argv); }
