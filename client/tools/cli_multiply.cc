// matmul-cli multiply: two .npy files or stored tensors, inline, streamed
// (--stream, --stripes) or through shared memory; the product to a .npy
// file or kept on the server.
#include <algorithm>
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

namespace matmul::cli {
namespace {

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

}  // namespace

int RunMultiply(const std::vector<std::string>& args) {
  FlagSpec spec;
  spec.valued = {"target",    "a",        "b",       "a-handle",
                 "b-handle",  "out",      "compute", "timeout",
                 "dtype",     "bf16-out", "ttl",     "client-id",
                 "chunk-mib", "grpc-arg", "stripes", "lb-policy"};
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
  // 0 (not given): the client library picks from the multiply's size.
  int64_t chunk_mib = 0;
  if (has("chunk-mib") &&
      (!absl::SimpleAtoi(flags->Get("chunk-mib"), &chunk_mib) ||
       chunk_mib < 1 || chunk_mib > 1024)) {
    return Usage(absl::StrCat("--chunk-mib takes 1 to 1024, got \"",
                              flags->Get("chunk-mib"), "\""));
  }
  if (!stream && has("stripes")) {
    return Usage("--stripes applies only with --stream");
  }
  int stripes = 0;
  if (has("stripes") && (!absl::SimpleAtoi(flags->Get("stripes"), &stripes) ||
                         stripes < 1 || stripes > kMaxStreamStripes)) {
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

  // One connection per stripe given (the library opens those a striped
  // call it plans itself needs).
  absl::StatusOr<std::unique_ptr<MatmulClient>> client =
      ClientFor(*flags, std::max(stripes, 1));
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
    // What the library chose: the same function of the bytes it moved.
    int64_t wire_bytes = static_cast<int64_t>(c->data.size());
    for (int i = 0; i < 2; ++i) {
      if (streamed_handle[i].empty()) {
        wire_bytes += static_cast<int64_t>(streamed[i].data.size());
      }
    }
    const StreamOptions used = StreamOptionsFor(wire_bytes, stream_options);
    absl::StatusOr<std::string> written_as =
        WriteResult(out_path, *std::move(c), *bf16_bits);
    if (!written_as.ok()) return Fail(written_as.status().message());
    absl::PrintF("%s: shape %s, %s, %.3f ms, streamed in %d MiB chunks%s\n",
                 out_path, ShapeString(c_shape), *written_as,
                 absl::ToDoubleMilliseconds(elapsed), used.chunk_bytes >> 20,
                 used.stripes > 1
                     ? absl::StrCat(" over ", used.stripes, " striped streams")
                     : "");
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

}  // namespace matmul::cli
