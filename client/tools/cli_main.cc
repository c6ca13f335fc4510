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
#include "client/tools/cli_command.h"
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
ABSL_FLAG(std::string, lb_policy, "round_robin",
          "round_robin: calls spread over every address the target resolves "
          "to; pick_first: all on one");
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
ABSL_FLAG(std::string, near, "",
          "upload: store beside this stored tensor (its server and device)");
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
ABSL_FLAG(std::string, chunk_mib, "",
          "--stream's chunk size, MiB (1 to 1024; default: from the size)");
ABSL_FLAG(std::string, stripes, "",
          "--stream over this many MultiplyStream calls, each on its own "
          "connection (1 to 16; default: from the size)");
ABSL_FLAG(bool, shared_memory, false,
          "Hand A, B and C to the server through a shared-memory region "
          "(a unix: target on the server's host)");

namespace matmul {
namespace cli {
namespace {

const std::vector<FlagGroup>& CliFlags() {
  static const auto* groups = new std::vector<FlagGroup>{
      {"Server",
       {"target=HOST:PORT", "timeout=SECONDS", "client_id=NAME",
        "grpc_arg=NAME=INT,...", "lb_policy=round_robin|pick_first"}},
      {"Operands and product",
       {"a=A.npy", "b=B.npy", "a_handle=ID", "b_handle=ID", "out=C.npy", "keep",
        "ttl=SECONDS", "handle=ID", "device=N", "near=ID"}},
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
             [--lb-policy round_robin|pick_first]
  matmul-cli upload --target HOST:PORT --a A.npy [--device N] [--near ID]
             [--ttl SECONDS]
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
Through a target of several servers, calls naming a handle go to the server
holding it; upload --near ID stores A beside that tensor (its server, and
its device unless --device says otherwise), so that the two can be
multiplied together.
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
in chunks of --chunk-mib MiB, so no message size bounds them (a 16384 x
16384 float32 product needs it), and the server copies each chunk to the
GPU while the next one is on the wire. --stripes K (1 to 16) stripes the
multiply over K MultiplyStream calls, each on its own connection: the
chunks go out round-robin over them and the product comes back over all of
them, so one connection's rate does not bound it. By default both come from
the multiply's size: one call and 4 MiB chunks up to 96 MiB on the wire,
one more call per 96 MiB above (at most 8), 16 MiB chunks from 512 MiB.

--shared-memory (a unix:PATH target, on the server's host, same user)
registers a POSIX shared-memory region with the server, puts A and B in it,
and has the server read them there and write C there: no operand or product
byte goes through the socket. Not with --keep, --stream or handles.
)";

// A command's flags (with dashes): those that take a value and the boolean
// switches.
int RunUpload(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target", "a",       "device",    "near",     "ttl",
                 "dtype",  "timeout", "client-id", "lb-policy"};
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
  if (auto it = flags->values.find("near"); it != flags->values.end()) {
    options.near = it->second;
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
  spec.valued = {"target", "handle", "out", "bf16-out", "timeout", "lb-policy"};
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
  spec.valued = {"target", "handle", "timeout", "lb-policy"};
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
  spec.valued = {"target", "timeout", "lb-policy"};
  spec.required = {"target"};
  absl::StatusOr<Args> flags = ParseArgs(args, spec);
  if (!flags.ok()) return Usage(flags.status().message());
  absl::StatusOr<absl::Duration> timeout = ParseTimeout(*flags);
  if (!timeout.ok()) return Usage(timeout.status().message());

  const std::string target = flags->values.at("target");
  absl::StatusOr<std::unique_ptr<MatmulClient>> client = ClientFor(*flags);
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
}  // namespace cli
}  // namespace matmul

int main(int argc, char** argv) { return matmul::cli::Main(argc, argv); }
