// MatmulClient's streamed multiply (MultiplyStreamed, MultiplyStreamedView):
// one multiply over one MultiplyStream call, or striped over several on as
// many connections (matmul.v1 MultiplyStreamStart.stripe_key): operand
// chunks framed in place from the caller's memory (EncodeOperandChunk),
// product chunks read from gRPC's slices (DecodeResultChunk), a writer
// thread and a reader per call. The rest of the client is matmul_client.cc.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <sys/mman.h>
#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/lib/matmul_client.h"
#include "client/lib/multiply_encoding.h"
#include "common/status_macros.h"
#include "proto/dtype_mapping.h"

namespace matmul {
namespace {

// MultiplyStream, sent to with encoded requests (EncodeOperandChunk).
const char kMultiplyStreamMethod[] = "/matmul.v1.MatmulService/MultiplyStream";
// madvise's MADV_POPULATE_WRITE (Linux 5.14), where the headers lack it.
#ifdef MADV_POPULATE_WRITE
constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kPopulateWrite = 23;
#endif
// Bytes of a striped multiply's key (the protocol takes 16 to 64).
constexpr size_t kStripeKeyBytes = 16;

// Both ways raw: chunks are framed by EncodeOperandChunk and read by
// DecodeResultChunk, the rest goes through protobuf.
using StreamCall = grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

// The product's bytes, where both operands are here with 2 or 3 dimensions
// (as the server will compute it: op(A)'s rows by op(B)'s columns, the
// larger batch, A's element size); else none.
std::optional<int64_t> ProductBytes(const StreamedOperand& a,
                                    const StreamedOperand& b,
                                    const MultiplyOptions& options) {
  if (!a.handle.empty() || !b.handle.empty()) return std::nullopt;
  const std::vector<int64_t>& as = a.shape;
  const std::vector<int64_t>& bs = b.shape;
  if ((as.size() != 2 && as.size() != 3) ||
      (bs.size() != 2 && bs.size() != 3)) {
    return std::nullopt;
  }
  const int64_t m = options.transpose_a ? as.back() : as[as.size() - 2];
  const int64_t n = options.transpose_b ? bs[bs.size() - 2] : bs.back();
  const int64_t batch = std::max(as.size() == 3 ? as[0] : int64_t{1},
                                 bs.size() == 3 ? bs[0] : int64_t{1});
  const double bytes = static_cast<double>(batch) * static_cast<double>(m) *
                       static_cast<double>(n) *
                       static_cast<double>(DTypeSize(a.dtype));
  if (!(bytes > 0) || bytes > static_cast<double>(INT64_MAX / 2)) {
    return std::nullopt;
  }
  return static_cast<int64_t>(bytes);
}

// A random stripe key, from the kernel's random source.
absl::StatusOr<std::string> RandomStripeKey() {
  std::string key(kStripeKeyBytes, '\0');
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = getrandom(key.data() + got, key.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("getrandom for a stripe key: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return key;
}

// Sizes `data` to `size` zero bytes. A large buffer's pages are first
// faulted in by the kernel (MADV_POPULATE_WRITE), as transparent huge pages
// where the system allows them (MADV_HUGEPAGE), from several threads: page
// by page, the product of a 16384 x 16384 float32 multiply (1 GiB) took the
// client ~0.7 s on the H200 host. Where the kernel refuses either advice
// (before Linux 5.14, THP off) the zeroing faults the pages in as before.
void AllocateZeroed(std::string& data, size_t size) {
  constexpr size_t kLarge = size_t{64} << 20;
  constexpr uintptr_t kPage = 4096;
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  if (size >= kLarge) {
    data.reserve(size);
    const uintptr_t at = reinterpret_cast<uintptr_t>(data.data());
    const uintptr_t begin = (at + kPage - 1) & ~(kPage - 1);
    const uintptr_t end = (at + size) & ~(kPage - 1);
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    const unsigned threads =
        std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u);
    // Pieces of whole huge pages, one per thread.
    const uintptr_t piece =
        ((end - begin) / threads + kHugePage - 1) & ~(kHugePage - 1);
    std::vector<std::thread> populate;
    for (uintptr_t from = begin; from < end; from += piece) {
      const uintptr_t to = std::min(end, from + piece);
      populate.emplace_back([from, to] {
        madvise(reinterpret_cast<void*>(from), to - from, kPopulateWrite);
      });
    }
    for (std::thread& t : populate) t.join();
  }
  data.assign(size, '\0');
}

// `message` serialized into a ByteBuffer.
grpc::ByteBuffer SerializeMessage(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

// A blocking call's hold on its caller's canceller: for the call's
// duration the canceller may cancel the call's context; the destructor waits
// until no Cancel is using it.
class CallCanceller::Borrowed {
 public:
  Borrowed(CallCanceller* canceller, grpc::ClientContext* context) {
    if (canceller == nullptr) return;
    context_ = std::shared_ptr<grpc::ClientContext>(
        context, [this](grpc::ClientContext*) { released_.Notify(); });
    canceller->Attach(context_);
  }
  ~Borrowed() {
    if (context_ == nullptr) return;
    context_.reset();
    released_.WaitForNotification();  // no Cancel uses the context now
  }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;

 private:
  absl::Notification released_;
  std::shared_ptr<grpc::ClientContext> context_;
};

StreamOptions StreamOptionsFor(int64_t wire_bytes, StreamOptions given) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  // Measured on an H100 with 16384^2 float32 (3 GiB on the wire): one call
  // 1.85 s, four 0.64 s, eight 0.53 s, 16 MiB chunks ahead of 4 MiB; below
  // about 100 MiB a second connection costs more than it carries.
  constexpr int64_t kBytesPerStripe = 96 * kMiB;
  if (given.stripes == 0) {
    given.stripes = static_cast<int>(
        std::clamp<int64_t>(wire_bytes / kBytesPerStripe, 1, 8));
  }
  if (given.chunk_bytes == 0) {
    given.chunk_bytes = wire_bytes >= 512 * kMiB ? 16 * kMiB : 4 * kMiB;
  }
  return given;
}

absl::StatusOr<HostTensor> MatmulClient::MultiplyStreamed(
    const Operand& a, const Operand& b, const MultiplyOptions& options,
    int64_t chunk_bytes) {
  StreamOptions stream;
  stream.chunk_bytes = chunk_bytes;
  if (chunk_bytes != 0) stream.stripes = 1;
  return MultiplyStreamed(a, b, options, stream);
}

absl::StatusOr<HostTensor> MatmulClient::MultiplyStreamed(
    const Operand& a, const Operand& b, const MultiplyOptions& options,
    const StreamOptions& stream) {
  StreamedOperand views[2];
  const Operand* operands[2] = {&a, &b};
  for (int op = 0; op < 2; ++op) {
    if (operands[op]->is_handle()) {
      if (operands[op]->handle().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(op == 0 ? "a" : "b", ": the handle id is empty"));
      }
      views[op].handle = operands[op]->handle();
      continue;
    }
    const HostTensor& t = *operands[op]->tensor();
    views[op].shape = t.shape;
    views[op].dtype = t.dtype;
    views[op].data = t.data;
  }
  return MultiplyStreamedView(views[0], views[1], options, stream);
}

absl::StatusOr<HostTensor> MatmulClient::MultiplyStreamedView(
    const StreamedOperand& a, const StreamedOperand& b,
    const MultiplyOptions& options, const StreamOptions& stream) {
  if (options.keep_result) {
    return absl::InvalidArgumentError(
        "MultiplyOptions.keep_result is set: MultiplyStreamed returns data");
  }
  if (stream.chunk_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: expected a positive size (or 0: from the "
                     "multiply's size), got ",
                     stream.chunk_bytes));
  }
  if (stream.stripes < 0 || stream.stripes > kMaxStreamStripes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StreamOptions.stripes: expected 1 to ", kMaxStreamStripes,
        " MultiplyStream calls (or 0: from the multiply's size), got ",
        stream.stripes));
  }
  RETURN_IF_ERROR(CheckClientId(options.client_id));
  // To the stored operands' server, if their handles name one.
  ASSIGN_OR_RETURN(const HandleRoute route, RouteHandles(a.handle, b.handle));
  const StreamedOperand* operands[2] = {&a, &b};
  int64_t wire_bytes = 0;
  for (const StreamedOperand* t : operands) {
    if (t->handle.empty()) wire_bytes += static_cast<int64_t>(t->data.size());
  }
  const std::optional<int64_t> product_bytes = ProductBytes(a, b, options);
  const StreamOptions plan =
      StreamOptionsFor(wire_bytes + product_bytes.value_or(0), stream);
  const int64_t chunk_bytes = plan.chunk_bytes;
  const int stripes = plan.stripes;
  v1::MultiplyStreamRequest start;
  start.set_request_id(1);
  v1::MultiplyRequest* request = start.mutable_start()->mutable_request();
  start.mutable_start()->set_result_chunk_bytes(chunk_bytes);
  for (int op = 0; op < 2; ++op) {
    const StreamedOperand& t = *operands[op];
    if (!t.handle.empty()) {
      (op == 0 ? request->mutable_a_handle() : request->mutable_b_handle())
          ->assign(t.handle);
      continue;
    }
    ASSIGN_OR_RETURN(const int64_t bytes, NumBytes(t.shape, t.dtype));
    if (static_cast<uint64_t>(bytes) != t.data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op == 0 ? "a" : "b", ": shape ", ShapeString(t.shape),
                       " of ", DTypeName(t.dtype), " needs ", bytes,
                       " bytes of data, got ", t.data.size()));
    }
    v1::Tensor* header = op == 0 ? request->mutable_a() : request->mutable_b();
    for (int64_t d : t.shape) header->add_shape(d);
    header->set_dtype(DTypeToProto(t.dtype));
  }
  request->set_transpose_a(options.transpose_a);
  request->set_transpose_b(options.transpose_b);
  request->set_compute_mode(ComputeModeToProto(options.compute));
  v1::MultiplyStreamRequest join;
  if (stripes > 1) {
    ASSIGN_OR_RETURN(std::string key, RandomStripeKey());
    start.mutable_start()->set_stripe_key(key);
    start.mutable_start()->set_stripes(stripes);
    join.set_request_id(1);
    join.mutable_join()->set_stripe_key(std::move(key));
  }

  // The operands' chunks, B's then A's, in offset order; chunk i goes on
  // call i % stripes. B goes first because the server multiplies A's rows
  // in panels as they arrive once all of B is on the device, and sends
  // their product rows while the rest of A is still on the wire.
  struct Piece {
    v1::Operand operand;
    int64_t offset;
    absl::string_view data;
  };
  std::vector<Piece> pieces;
  for (const int op : {1, 0}) {
    if (!operands[op]->handle.empty()) continue;
    const StreamedOperand& t = *operands[op];
    const int64_t elem = static_cast<int64_t>(DTypeSize(t.dtype));
    const int64_t step = std::max(elem, chunk_bytes / elem * elem);
    const int64_t size = static_cast<int64_t>(t.data.size());
    for (int64_t at = 0; at < size; at += step) {
      pieces.push_back(
          {op == 0 ? v1::OPERAND_A : v1::OPERAND_B, at,
           t.data.substr(static_cast<size_t>(at), static_cast<size_t>(step))});
    }
  }

  // The chunks' slices point into the operands, which the caller may free
  // once this returns: it returns only after gRPC let go of every slice
  // (the last reference to `owner`), which it does once the calls are over
  // and their bytes written (or dropped).
  absl::Notification released;
  absl::Cleanup wait_released = [&released] { released.WaitForNotification(); };
  std::shared_ptr<const void> owner(
      nullptr, [&released](const void*) { released.Notify(); });

  // The product's buffer is allocated (its pages touched) while the operands
  // are on the wire, not after the server answers: on the H200 a 1 GiB
  // buffer took the client ~0.7 s, during which the server's result chunks
  // waited on flow control. Only when both operands are here to size it.
  HostTensor c;
  std::thread allocator;
  absl::Cleanup join_allocator = [&allocator] {
    if (allocator.joinable()) allocator.join();
  };
  if (product_bytes.has_value() && *product_bytes > 0 &&
      *product_bytes <= int64_t{4} << 30) {
    allocator = std::thread([&c, size = static_cast<size_t>(*product_bytes)] {
      AllocateZeroed(c.data, size);
    });
  }

  // One MultiplyStream call per stripe, each on its own connection.
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<StreamCall> stream;
  };
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  if (stripes == 1) {
    channels.push_back(route.channel());
  } else {
    channels = StripeChannels(stripes, options.timeout, route.home());
  }
  std::vector<std::unique_ptr<Call>> calls;
  for (int s = 0; s < stripes; ++s) {
    calls.push_back(std::make_unique<Call>());
    PrepareContext(calls.back()->context, options.timeout, options.client_id);
    // A join rides a connection that may be opened just now: if its first
    // connect fails, it waits for the channel's reconnect (bounded by the
    // deadline; call 0's end cancels it) instead of failing the multiply
    // UNAVAILABLE at once. Call 0 fails fast as any call does.
    if (s > 0) calls.back()->context.set_wait_for_ready(true);
  }
  // options.canceller cancels call 0; its end (CANCELLED) then cancels the
  // others like any error. Let go of before the contexts are.
  std::optional<CallCanceller::Borrowed> cancellable;
  cancellable.emplace(options.canceller.get(), &calls[0]->context);

  absl::Mutex mu;
  absl::Status failed;     // the first error, guarded by mu
  bool described = false;  // guarded by mu
  int64_t expected = 0;    // the product's bytes, once described
  std::atomic<int64_t> received{0};
  std::atomic<bool> stop{false};  // a call failed: send no more
  // Records the first error; a striped multiply is over with it, so the
  // other calls are cancelled. (One call is left to end by itself: the
  // server closes it once the client's side is closed.)
  const auto fail = [&](absl::Status status) {
    {
      absl::MutexLock lock(&mu);
      if (failed.ok()) failed = std::move(status);
    }
    stop.store(true);
    if (stripes > 1) {
      for (const std::unique_ptr<Call>& call : calls) call->context.TryCancel();
    }
  };
  const grpc::internal::RpcMethod method(
      kMultiplyStreamMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
  const grpc::ByteBuffer first_message[2] = {SerializeMessage(start),
                                             SerializeMessage(join)};
  // Call `s`: opens it, sends its share from a writer thread and reads
  // what comes back here.
  const auto run = [&](int s) {
    Call& call = *calls[s];
    call.stream.reset(
        grpc::internal::ClientReaderWriterFactory<
            grpc::ByteBuffer, grpc::ByteBuffer>::Create(channels[s].get(),
                                                        method, &call.context));
    StreamCall& stream = *call.stream;
    std::thread writer([&, s] {
      bool ok = stream.Write(first_message[s == 0 ? 0 : 1]);
      for (size_t i = s; i < pieces.size() && ok && !stop.load();
           i += stripes) {
        const Piece& piece = pieces[i];
        ok = stream.Write(EncodeOperandChunk(1, piece.operand, piece.offset,
                                             piece.data, owner));
      }
      stream.WritesDone();
    });
    char* base = nullptr;  // the product's bytes, once this call described it
    int64_t size = 0;
    // Writes a product chunk where it goes: from gRPC's slices (pieces),
    // one copy.
    const auto place = [&](int64_t at, int64_t n,
                           absl::Span<const absl::string_view> pieces) {
      if (base == nullptr || at < 0 || at > size || n > size - at) {
        fail(absl::DataLossError(absl::StrCat(
            "the server sent a product chunk of ", n, " bytes at offset ", at,
            " outside the ", size, "-byte product")));
        return;
      }
      char* to = base + at;
      for (absl::string_view piece : pieces) {
        std::memcpy(to, piece.data(), piece.size());
        to += piece.size();
      }
      received.fetch_add(n);
    };
    grpc::ByteBuffer message;
    ResultChunkView chunk;
    v1::MultiplyStreamResponse response;
    while (stream.Read(&message)) {
      if (DecodeResultChunk(message, &chunk)) {
        place(chunk.offset, chunk.data_bytes, chunk.data);
        chunk.slices.clear();
        continue;
      }
      chunk.slices.clear();
      if (!grpc::GenericDeserialize<grpc::ProtoBufferReader,
                                    v1::MultiplyStreamResponse>(&message,
                                                                &response)
               .ok()) {
        fail(absl::InternalError(
            "the server sent a MultiplyStreamResponse that does not parse"));
        continue;
      }
      if (response.has_error()) {
        fail(
            absl::Status(static_cast<absl::StatusCode>(response.error().code()),
                         response.error().message()));
      } else if (response.has_result()) {
        const std::optional<DType> dtype =
            DTypeFromProto(response.result().dtype());
        if (!dtype.has_value() || response.result().bytes() < 0) {
          fail(absl::InternalError("the server described no valid product"));
          continue;
        }
        absl::Status mismatch;
        {
          absl::MutexLock lock(&mu);
          if (!described) {
            if (allocator.joinable()) allocator.join();
            c.shape.assign(response.result().shape().begin(),
                           response.result().shape().end());
            c.dtype = *dtype;
            expected = response.result().bytes();
            if (static_cast<int64_t>(c.data.size()) != expected) {
              c.data.assign(static_cast<size_t>(expected), '\0');
            }
            described = true;
          } else if (expected != response.result().bytes() ||
                     c.dtype != *dtype) {
            mismatch = absl::DataLossError(
                absl::StrCat("the server described the product as ", expected,
                             " bytes on one stream and as ",
                             response.result().bytes(), " bytes on another"));
          }
          base = c.data.data();
          size = expected;
        }
        if (!mismatch.ok()) fail(std::move(mismatch));
      } else if (response.has_chunk()) {  // one DecodeResultChunk left
        const std::string& data = response.chunk().data();
        const absl::string_view piece(data);
        place(response.chunk().offset(), static_cast<int64_t>(data.size()),
              absl::MakeConstSpan(&piece, 1));
      }
    }
    writer.join();
    const grpc::Status finished = stream.Finish();
    if (!finished.ok()) fail(FromGrpcStatus(finished));
  };
  std::vector<std::thread> others;
  for (int s = 1; s < stripes; ++s) others.emplace_back(run, s);
  run(0);
  for (std::thread& t : others) t.join();
  cancellable.reset();  // no Cancel uses call 0's context past here
  calls.clear();        // the calls are over: gRPC may let go of the slices
  owner.reset();

  absl::MutexLock lock(&mu);
  if (!failed.ok()) return route.Finish(failed);
  if (!described || received.load() != expected) {
    return absl::DataLossError(absl::StrCat("the streams ended with ",
                                            received.load(), " of ", expected,
                                            " product bytes"));
  }
  RETURN_IF_ERROR(CheckHostTensor(c));
  return c;
}

}  // namespace matmul
