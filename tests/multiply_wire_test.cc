#include "server/rpc/multiply_wire.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul {
namespace {

using ::testing::ElementsAreArray;

// Splits `bytes` into chunks at random points (some empty).
std::vector<ByteChunk> Split(const std::string& bytes, std::mt19937& gen) {
  std::vector<ByteChunk> chunks;
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t n = std::min<size_t>(gen() % 40, bytes.size() - pos);
    chunks.emplace_back(data + pos, n);
    pos += n;
  }
  if (gen() % 2) chunks.emplace_back(data + pos, 0);
  return chunks;
}

std::string Data(const WireTensor& t) {
  std::string out(static_cast<size_t>(t.data_bytes), '\0');
  CopyPieces(t.data, reinterpret_cast<std::byte*>(out.data()));
  return out;
}

// The decoder agrees with protobuf on `bytes`: both fail, or both succeed
// with the same fields.
void ExpectSameAsProtobuf(const std::string& bytes, std::mt19937& gen) {
  v1::MultiplyRequest message;
  const bool protobuf_ok = message.ParseFromString(bytes);
  const std::vector<ByteChunk> chunks = Split(bytes, gen);
  absl::StatusOr<WireMultiplyRequest> wire = DecodeMultiplyRequest(chunks);
  std::string hex;
  for (unsigned char c : bytes) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02x ", c);
    hex += buf;
  }
  ASSERT_EQ(wire.ok(), protobuf_ok) << wire.status() << " bytes: " << hex;
  if (!protobuf_ok) {
    EXPECT_EQ(wire.status().code(), absl::StatusCode::kInvalidArgument);
    return;
  }
  auto same_tensor = [](const WireTensor& w, bool has, const v1::Tensor& t) {
    EXPECT_EQ(w.present, has);
    EXPECT_THAT(w.shape, ElementsAreArray(t.shape()));
    EXPECT_EQ(w.dtype, t.dtype());
    EXPECT_EQ(w.data_bytes, static_cast<int64_t>(t.data().size()));
    EXPECT_EQ(Data(w), t.data());
    EXPECT_EQ(w.shared.present, t.has_shared());
    EXPECT_EQ(w.shared.region_id, t.shared().region_id());
    EXPECT_EQ(w.shared.offset, t.shared().offset());
  };
  same_tensor(wire->a, message.has_a(), message.a());
  same_tensor(wire->b, message.has_b(), message.b());
  EXPECT_EQ(wire->transpose_a, message.transpose_a());
  EXPECT_EQ(wire->transpose_b, message.transpose_b());
  EXPECT_EQ(wire->compute_mode, message.compute_mode());
  EXPECT_EQ(wire->a_handle, message.a_handle());
  EXPECT_EQ(wire->b_handle, message.b_handle());
  EXPECT_EQ(wire->keep_result, message.keep_result());
  EXPECT_EQ(wire->result_ttl_seconds, message.result_ttl_seconds());
  EXPECT_EQ(wire->c_shared.present, message.has_c_shared());
  EXPECT_EQ(wire->c_shared.region_id, message.c_shared().region_id());
  EXPECT_EQ(wire->c_shared.offset, message.c_shared().offset());
}

v1::MultiplyRequest RandomRequest(std::mt19937& gen) {
  v1::MultiplyRequest r;
  for (v1::Tensor* t : {r.mutable_a(), r.mutable_b()}) {
    if (gen() % 5 == 0) continue;
    const int rank = gen() % 5;
    for (int i = 0; i < rank; ++i) {
      // Mostly small, sometimes huge or negative (validation's business).
      const int kind = gen() % 10;
      t->add_shape(kind == 0   ? -static_cast<int64_t>(gen())
                   : kind == 1 ? (int64_t{1} << 62) + gen()
                               : gen() % 300);
    }
    t->set_dtype(static_cast<v1::Dtype>(gen() % 6 == 5 ? -7 : gen() % 5));
    t->set_data(std::string(gen() % 200, static_cast<char>(gen())));
    if (gen() % 4 == 0) {
      t->mutable_shared()->set_region_id(gen() % 2 ? "r-1" : "r-\xc3\xa9");
      t->mutable_shared()->set_offset(gen() % 3 == 0 ? -1 : gen() % 4096);
    }
  }
  if (gen() % 5 == 0) r.clear_a();
  r.set_transpose_a(gen() % 2);
  r.set_transpose_b(gen() % 2);
  r.set_compute_mode(static_cast<v1::ComputeMode>(gen() % 4));
  if (gen() % 3 == 0) r.set_a_handle("h-0123456789abcdef");
  if (gen() % 3 == 0) r.set_b_handle(gen() % 2 ? "h-\xc3\xa9" : "");
  r.set_keep_result(gen() % 2);
  r.set_result_ttl_seconds(gen() % 4 == 0 ? -5 : gen() % 100);
  if (gen() % 4 == 0) {
    r.mutable_c_shared()->set_region_id("r-2");
    r.mutable_c_shared()->set_offset(gen() % 100000);
  }
  return r;
}

TEST(MultiplyWireTest, AgreesWithProtobufOnRandomMessages) {
  std::mt19937 gen(1);
  for (int i = 0; i < 2000; ++i) {
    ExpectSameAsProtobuf(RandomRequest(gen).SerializeAsString(), gen);
  }
}

TEST(MultiplyWireTest, AgreesWithProtobufOnEveryTruncation) {
  std::mt19937 gen(2);
  for (int i = 0; i < 40; ++i) {
    const std::string bytes = RandomRequest(gen).SerializeAsString();
    for (size_t n = 0; n <= bytes.size(); ++n) {
      ExpectSameAsProtobuf(bytes.substr(0, n), gen);
    }
  }
}

TEST(MultiplyWireTest, AgreesWithProtobufOnCorruptedBytes) {
  std::mt19937 gen(3);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = RandomRequest(gen).SerializeAsString();
    if (bytes.empty()) continue;
    for (int flips = 1 + gen() % 4; flips > 0; --flips) {
      bytes[gen() % bytes.size()] = static_cast<char>(gen());
    }
    ExpectSameAsProtobuf(bytes, gen);
  }
}

// Concatenated messages merge (protobuf semantics), unpacked shapes, unknown
// fields of every wire type (groups too) and mismatched wire types.
TEST(MultiplyWireTest, MergesAndSkipsAsProtobufDoes) {
  std::mt19937 gen(4);
  v1::MultiplyRequest first;
  first.mutable_a()->add_shape(3);
  first.mutable_a()->set_data("first");
  first.mutable_a()->set_dtype(v1::DTYPE_FLOAT32);
  first.set_transpose_a(true);
  v1::MultiplyRequest second;
  second.mutable_a()->add_shape(4);
  second.mutable_a()->set_data("second");
  second.set_compute_mode(v1::COMPUTE_MODE_TF32);
  ExpectSameAsProtobuf(first.SerializeAsString() + second.SerializeAsString(),
                       gen);

  std::string unpacked;
  unpacked += "\x0a\x06";          // a: 6 bytes
  unpacked += "\x08\x05\x08\x07";  // shape 5, shape 7 (unpacked)
  unpacked += "\x10\x01";          // dtype FLOAT32
  ExpectSameAsProtobuf(unpacked, gen);

  std::string unknown = first.SerializeAsString();
  unknown += std::string("\xa0\x06\x2a", 3);  // field 100 varint
  unknown += std::string("\xa9\x06", 2) + std::string(8, 'x');  // fixed64
  unknown += std::string("\xad\x06", 2) + std::string(4, 'y');  // fixed32
  unknown += std::string("\xa2\x06\x03zzz", 6);                 // bytes
  unknown += std::string("\xa3\x06\x08\x01\xa4\x06", 6);        // group
  unknown += std::string("\x18\x05\x00\x00\x00\x00", 6);  // wrong wire type
  ExpectSameAsProtobuf(unknown, gen);

  ExpectSameAsProtobuf(std::string("\x00\x01", 2), gen);  // field number 0
  ExpectSameAsProtobuf(std::string("\xa4\x06", 2), gen);  // stray end group
  ExpectSameAsProtobuf(std::string(11, '\xff'), gen);     // overlong varint
}

TEST(MultiplyWireTest, DataIsNotCopied) {
  v1::MultiplyRequest r;
  r.mutable_a()->set_data(std::string(1000, 'a'));
  const std::string bytes = r.SerializeAsString();
  const ByteChunk chunk(reinterpret_cast<const uint8_t*>(bytes.data()),
                        bytes.size());
  absl::StatusOr<WireMultiplyRequest> wire =
      DecodeMultiplyRequest(absl::MakeConstSpan(&chunk, 1));
  ASSERT_TRUE(wire.ok());
  ASSERT_EQ(wire->a.data.size(), 1u);
  // The piece points into the received bytes themselves.
  EXPECT_GE(wire->a.data[0].data(), chunk.data());
  EXPECT_LE(wire->a.data[0].data() + 1000, chunk.data() + chunk.size());
}

TEST(MultiplyWireTest, ResponseFramingParsesAsAMultiplyResponse) {
  for (int device : {-1, 0, 3}) {
    for (int stream : {0, 2}) {
      const std::string data(24, '\x7f');
      const int64_t shape[] = {2, 3};
      ResponseFraming framing = FrameMultiplyResponse(
          shape, v1::DTYPE_FLOAT32, static_cast<int64_t>(data.size()), device,
          stream);
      v1::MultiplyResponse response;
      ASSERT_TRUE(
          response.ParseFromString(framing.prefix + data + framing.suffix));
      EXPECT_THAT(response.c().shape(), ElementsAreArray(shape));
      EXPECT_EQ(response.c().dtype(), v1::DTYPE_FLOAT32);
      EXPECT_EQ(response.c().data(), data);
      EXPECT_EQ(response.placement().device(), device);
      EXPECT_EQ(response.placement().stream(), stream);
    }
  }
}

v1::MultiplyStreamRequest RandomStreamRequest(std::mt19937& gen) {
  v1::MultiplyStreamRequest message;
  message.set_request_id(gen() % 3 == 0 ? 0 : gen());
  // Stripe keys: empty, short, or 16-64 arbitrary bytes (not UTF-8).
  auto key = [&gen]() {
    std::string k(gen() % 4 == 0 ? 0 : gen() % 70, '\0');
    for (char& c : k) c = static_cast<char>(gen());
    return k;
  };
  switch (gen() % 4) {
    case 0:
      break;  // no member
    case 1: {
      v1::MultiplyStreamStart* start = message.mutable_start();
      *start->mutable_request() = RandomRequest(gen);
      start->set_result_chunk_bytes(gen() % 5000);
      if (gen() % 2) start->set_stripe_key(key());
      // Mostly 0-16, sometimes negative or huge (validation's business).
      const int kind = gen() % 8;
      start->set_stripes(kind == 0   ? -static_cast<int32_t>(gen() % 1000)
                         : kind == 1 ? static_cast<int32_t>(gen() >> 1)
                                     : static_cast<int32_t>(gen() % 17));
      break;
    }
    case 2:
      message.mutable_chunk()->set_operand(static_cast<v1::Operand>(gen() % 3));
      message.mutable_chunk()->set_offset(gen() % 100000);
      message.mutable_chunk()->set_data(
          std::string(gen() % 300, static_cast<char>(gen())));
      break;
    case 3:
      message.mutable_join();  // present even with an empty key
      if (gen() % 4 != 0) message.mutable_join()->set_stripe_key(key());
      break;
  }
  return message;
}

// The stream decoder agrees with protobuf on `bytes`: both fail, or both
// succeed with the same member and fields.
void ExpectStreamSameAsProtobuf(const std::string& bytes, std::mt19937& gen) {
  v1::MultiplyStreamRequest message;
  const bool protobuf_ok = message.ParseFromString(bytes);
  absl::StatusOr<WireStreamRequest> wire =
      DecodeMultiplyStreamRequest(Split(bytes, gen));
  ASSERT_EQ(wire.ok(), protobuf_ok) << wire.status();
  if (!protobuf_ok) {
    EXPECT_EQ(wire.status().code(), absl::StatusCode::kInvalidArgument);
    return;
  }
  EXPECT_EQ(wire->request_id, message.request_id());
  switch (message.kind_case()) {
    case v1::MultiplyStreamRequest::kStart:
      ASSERT_EQ(wire->kind, WireStreamRequest::Kind::kStart);
      EXPECT_EQ(wire->result_chunk_bytes, message.start().result_chunk_bytes());
      EXPECT_EQ(wire->stripe_key, message.start().stripe_key());
      EXPECT_EQ(wire->stripes, message.start().stripes());
      EXPECT_EQ(wire->start.transpose_a,
                message.start().request().transpose_a());
      EXPECT_EQ(
          wire->start.a.data_bytes,
          static_cast<int64_t>(message.start().request().a().data().size()));
      EXPECT_EQ(wire->start.b_handle, message.start().request().b_handle());
      break;
    case v1::MultiplyStreamRequest::kChunk: {
      ASSERT_EQ(wire->kind, WireStreamRequest::Kind::kChunk);
      EXPECT_EQ(wire->operand, message.chunk().operand());
      EXPECT_EQ(wire->offset, message.chunk().offset());
      std::string data(static_cast<size_t>(wire->data_bytes), '\0');
      CopyPieces(wire->data, reinterpret_cast<std::byte*>(data.data()));
      EXPECT_EQ(data, message.chunk().data());
      break;
    }
    case v1::MultiplyStreamRequest::kJoin:
      ASSERT_EQ(wire->kind, WireStreamRequest::Kind::kJoin);
      EXPECT_EQ(wire->stripe_key, message.join().stripe_key());
      break;
    case v1::MultiplyStreamRequest::KIND_NOT_SET:
      EXPECT_EQ(wire->kind, WireStreamRequest::Kind::kNone);
      break;
  }
}

TEST(MultiplyWireTest, StreamRequestsDecodeAsProtobufDoes) {
  std::mt19937 gen(11);
  for (int i = 0; i < 600; ++i) {
    v1::MultiplyStreamRequest message = RandomStreamRequest(gen);
    std::string bytes = message.SerializeAsString();
    if (i % 5 == 0) {
      // A repeated member merges into the first, as in protobuf.
      v1::MultiplyStreamRequest more;
      if (message.has_start()) {
        more.mutable_start()->mutable_request()->set_transpose_a(true);
        if (i % 2) more.mutable_start()->set_stripes(3);
      } else if (message.has_join()) {
        more.mutable_join()->set_stripe_key(std::string(20, 'k'));
      } else {
        more.mutable_chunk()->set_offset(7);
      }
      bytes += more.SerializeAsString();
    }
    if (i % 7 == 0) {
      // Another member follows and replaces it.
      bytes += RandomStreamRequest(gen).SerializeAsString();
    }
    ExpectStreamSameAsProtobuf(bytes, gen);
  }
  // A member that follows another replaces it.
  v1::MultiplyStreamRequest first;
  first.mutable_start()->mutable_request()->set_a_handle("h");
  first.mutable_start()->set_stripe_key(std::string(16, 'x'));
  first.mutable_start()->set_stripes(4);
  v1::MultiplyStreamRequest second;
  second.mutable_chunk()->set_offset(3);
  v1::MultiplyStreamRequest third;
  third.mutable_join();
  absl::StatusOr<WireStreamRequest> wire = DecodeMultiplyStreamRequest(
      Split(first.SerializeAsString() + second.SerializeAsString(), gen));
  ASSERT_TRUE(wire.ok());
  EXPECT_EQ(wire->kind, WireStreamRequest::Kind::kChunk);
  ExpectStreamSameAsProtobuf(first.SerializeAsString() +
                                 third.SerializeAsString() +
                                 first.SerializeAsString(),
                             gen);
  ExpectStreamSameAsProtobuf(
      first.SerializeAsString() + third.SerializeAsString(), gen);
  // Malformed bytes are INVALID_ARGUMENT.
  const std::string bad = "\x1a\x05\x18\xff";
  EXPECT_EQ(DecodeMultiplyStreamRequest(Split(bad, gen)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string bad_join = "\x22\x03\x0a\x05x";  // key runs past
  EXPECT_EQ(DecodeMultiplyStreamRequest(Split(bad_join, gen)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MultiplyWireTest, StreamRequestsAgreeWithProtobufOnCorruptedBytes) {
  std::mt19937 gen(12);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = RandomStreamRequest(gen).SerializeAsString();
    if (bytes.empty()) continue;
    if (i % 10 == 0) {
      bytes.resize(gen() % bytes.size());  // truncated
    } else {
      for (int flips = 1 + gen() % 4; flips > 0; --flips) {
        bytes[gen() % bytes.size()] = static_cast<char>(gen());
      }
    }
    ExpectStreamSameAsProtobuf(bytes, gen);
  }
}

TEST(MultiplyWireTest, ResultChunkFramingParsesAsAStreamResponse) {
  for (int64_t offset : {int64_t{0}, int64_t{5}, int64_t{1} << 33}) {
    for (uint64_t id : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
      const std::string data(offset == 5 ? 0 : 1000, 'x');
      const std::string bytes =
          FrameResultChunk(id, offset, static_cast<int64_t>(data.size())) +
          data;
      v1::MultiplyStreamResponse response;
      ASSERT_TRUE(response.ParseFromString(bytes));
      EXPECT_EQ(response.request_id(), id);
      ASSERT_TRUE(response.has_chunk());
      EXPECT_EQ(response.chunk().offset(), offset);
      EXPECT_EQ(response.chunk().data(), data);
    }
  }
}

}  // namespace
}  // namespace matmul
