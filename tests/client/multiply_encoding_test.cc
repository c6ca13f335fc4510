// EncodeMultiplyRequest: the bytes are a MultiplyRequest that protobuf and
// the server's own decoder both read back as the original, and the operands
// go out from the request's memory without a copy.
#include "client/lib/multiply_encoding.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "server/rpc/multiply_wire.h"

namespace matmul {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i)
    s[i] = static_cast<char>((i * 31 + seed) & 0xff);
  return s;
}

v1::MultiplyRequest FullRequest() {
  v1::MultiplyRequest r;
  r.mutable_a()->add_shape(3);
  r.mutable_a()->add_shape(40);
  r.mutable_a()->add_shape(50);
  r.mutable_a()->set_dtype(v1::DTYPE_FLOAT32);
  r.mutable_a()->set_data(Pattern(3 * 40 * 50 * 4, 1));
  r.mutable_b()->add_shape(50);
  r.mutable_b()->add_shape(20);
  r.mutable_b()->set_dtype(v1::DTYPE_FLOAT32);
  r.mutable_b()->set_data(Pattern(50 * 20 * 4, 2));
  r.set_transpose_a(true);
  r.set_transpose_b(true);
  r.set_compute_mode(v1::COMPUTE_MODE_TF32);
  r.set_keep_result(true);
  r.set_result_ttl_seconds(600);
  return r;
}

void ExpectRoundTrip(const v1::MultiplyRequest& original) {
  const grpc::ByteBuffer encoded = EncodeMultiplyRequest(original);
  const std::string bytes = Flatten(encoded);
  v1::MultiplyRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(parsed, original))
      << parsed.ShortDebugString().substr(0, 500);

  // The server's decoder, on the bytes split everywhere at once.
  std::vector<ByteChunk> chunks;
  for (size_t i = 0; i < bytes.size(); i += 7) {
    chunks.emplace_back(reinterpret_cast<const uint8_t*>(bytes.data()) + i,
                        std::min<size_t>(7, bytes.size() - i));
  }
  absl::StatusOr<WireMultiplyRequest> wire = DecodeMultiplyRequest(chunks);
  ASSERT_TRUE(wire.ok()) << wire.status();
  const WireTensor* tensors[2] = {&wire->a, &wire->b};
  const v1::Tensor* expected[2] = {&original.a(), &original.b()};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(tensors[i]->present,
              i == 0 ? original.has_a() : original.has_b());
    EXPECT_EQ(tensors[i]->shape,
              std::vector<int64_t>(expected[i]->shape().begin(),
                                   expected[i]->shape().end()));
    std::string data(static_cast<size_t>(tensors[i]->data_bytes), '\0');
    CopyPieces(tensors[i]->data, reinterpret_cast<std::byte*>(data.data()));
    EXPECT_EQ(data, expected[i]->data());
  }
  EXPECT_EQ(wire->transpose_a, original.transpose_a());
  EXPECT_EQ(wire->compute_mode, original.compute_mode());
  EXPECT_EQ(wire->a_handle, original.a_handle());
  EXPECT_EQ(wire->keep_result, original.keep_result());
  EXPECT_EQ(wire->result_ttl_seconds, original.result_ttl_seconds());
}

TEST(MultiplyEncodingTest, InlineOperandsReadBackAsTheOriginal) {
  ExpectRoundTrip(FullRequest());
}

TEST(MultiplyEncodingTest, HandlesAndEmptyOperandsReadBackAsTheOriginal) {
  v1::MultiplyRequest handles = FullRequest();
  handles.clear_a();
  handles.set_a_handle("t-123");
  ExpectRoundTrip(handles);
  handles.clear_b();
  handles.set_b_handle("t-456");
  ExpectRoundTrip(handles);

  v1::MultiplyRequest empty;  // a 0 x 5 operand: present, no data
  empty.mutable_a()->add_shape(0);
  empty.mutable_a()->add_shape(5);
  empty.mutable_b()->add_shape(5);
  empty.mutable_b()->add_shape(2);
  empty.mutable_b()->set_data(Pattern(40, 3));
  ExpectRoundTrip(empty);
  ExpectRoundTrip(v1::MultiplyRequest());
}

TEST(MultiplyEncodingTest, OperandsAreSentFromTheirOwnMemory) {
  v1::MultiplyRequest request = FullRequest();
  const char* a = request.a().data().data();
  const char* b = request.b().data().data();
  const size_t a_size = request.a().data().size();
  const size_t b_size = request.b().data().size();
  grpc::ByteBuffer encoded = EncodeMultiplyRequest(std::move(request));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(encoded.Dump(&slices).ok());
  int found = 0;
  size_t copied = 0;  // bytes in slices other than the operands'
  for (const grpc::Slice& s : slices) {
    const char* begin = reinterpret_cast<const char*>(s.begin());
    if ((begin == a && s.size() == a_size) ||
        (begin == b && s.size() == b_size)) {
      ++found;
    } else {
      copied += s.size();
    }
  }
  EXPECT_EQ(found, 2);
  EXPECT_LT(copied, 64u);  // the header: shapes, dtypes, options, framing

  // A copy of the buffer outlives the original and still reads right (ASan
  // would see a use after free).
  grpc::ByteBuffer copy = encoded;
  encoded.Clear();
  slices.clear();
  v1::MultiplyRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(copy)));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      parsed, FullRequest()));
}

TEST(MultiplyEncodingTest, ViewSendsCallerMemoryAndHoldsTheOwner) {
  const v1::MultiplyRequest original = FullRequest();
  // The caller's memory (a NumPy array's buffer in the Python extension).
  const std::string a = original.a().data();
  const std::string b = original.b().data();
  v1::MultiplyRequest header = original;
  header.mutable_a()->clear_data();
  header.mutable_b()->clear_data();
  auto owner = std::make_shared<int>(0);
  std::weak_ptr<int> watch = owner;
  grpc::ByteBuffer encoded =
      EncodeMultiplyRequestView(header, a, b, std::move(owner));
  EXPECT_FALSE(watch.expired());  // the slices hold it

  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(encoded.Dump(&slices).ok());
  int found = 0;
  for (const grpc::Slice& s : slices) {
    const char* begin = reinterpret_cast<const char*>(s.begin());
    if ((begin == a.data() && s.size() == a.size()) ||
        (begin == b.data() && s.size() == b.size())) {
      ++found;
    }
  }
  EXPECT_EQ(found, 2);
  v1::MultiplyRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(encoded)));
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(parsed, original));

  slices.clear();
  encoded.Clear();
  EXPECT_TRUE(watch.expired());  // released with the last slice
}

TEST(MultiplyEncodingTest, OperandChunkReadsBackAndSendsCallerMemory) {
  const std::string data = Pattern(1000, 4);
  for (const int64_t offset : {int64_t{0}, int64_t{4}, int64_t{1} << 33}) {
    auto owner = std::make_shared<int>(0);
    std::weak_ptr<int> watch = owner;
    grpc::ByteBuffer encoded =
        EncodeOperandChunk(300, v1::OPERAND_B, offset, data, std::move(owner));
    EXPECT_FALSE(watch.expired());  // the data's slice holds it
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(encoded.Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);  // framing, then the caller's bytes
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), data.data());
    EXPECT_EQ(slices[1].size(), data.size());

    const std::string bytes = Flatten(encoded);
    v1::MultiplyStreamRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(bytes));
    EXPECT_EQ(parsed.request_id(), 300u);
    ASSERT_TRUE(parsed.has_chunk());
    EXPECT_EQ(parsed.chunk().operand(), v1::OPERAND_B);
    EXPECT_EQ(parsed.chunk().offset(), offset);
    EXPECT_EQ(parsed.chunk().data(), data);

    // The server's decoder reads the same.
    std::vector<ByteChunk> chunks;
    for (size_t i = 0; i < bytes.size(); i += 5) {
      chunks.emplace_back(reinterpret_cast<const uint8_t*>(bytes.data()) + i,
                          std::min<size_t>(5, bytes.size() - i));
    }
    absl::StatusOr<WireStreamRequest> wire =
        DecodeMultiplyStreamRequest(chunks);
    ASSERT_TRUE(wire.ok()) << wire.status();
    EXPECT_EQ(wire->request_id, 300u);
    EXPECT_EQ(wire->kind, WireStreamRequest::Kind::kChunk);
    EXPECT_EQ(wire->operand, v1::OPERAND_B);
    EXPECT_EQ(wire->offset, offset);
    std::string read(static_cast<size_t>(wire->data_bytes), '\0');
    CopyPieces(wire->data, reinterpret_cast<std::byte*>(read.data()));
    EXPECT_EQ(read, data);

    slices.clear();
    encoded.Clear();
    EXPECT_TRUE(watch.expired());  // released with the last slice
  }
}

// `bytes` as a ByteBuffer of slices of `piece` bytes (the last shorter).
grpc::ByteBuffer Split(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.substr(i, piece));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const ResultChunkView& view) {
  std::string out;
  for (absl::string_view piece : view.data) {
    out.append(piece.data(), piece.size());
  }
  return out;
}

TEST(MultiplyEncodingTest, ResultChunksAreReadInPlaceAndTheRestLeftToProtobuf) {
  const std::string data = Pattern(3000, 5);
  v1::MultiplyStreamResponse response;
  response.set_request_id(77);
  response.mutable_chunk()->set_offset(int64_t{1} << 35);
  response.mutable_chunk()->set_data(data);
  const std::string bytes = response.SerializeAsString();
  // Any split, down to one byte a slice: the header's varints cross slices.
  for (size_t piece : {size_t{1}, size_t{3}, size_t{64}, bytes.size()}) {
    SCOPED_TRACE(piece);
    ResultChunkView view;
    ASSERT_TRUE(DecodeResultChunk(Split(bytes, piece), &view));
    EXPECT_EQ(view.request_id, 77u);
    EXPECT_EQ(view.offset, int64_t{1} << 35);
    EXPECT_EQ(view.data_bytes, 3000);
    EXPECT_EQ(Joined(view), data);
  }
  // The server's framing: a prefix, then the data in slices of its own.
  const std::string prefix = FrameResultChunk(9, 4096, 3000);
  std::vector<grpc::Slice> slices = {grpc::Slice(prefix),
                                     grpc::Slice(data.substr(0, 1000)),
                                     grpc::Slice(data.substr(1000))};
  ResultChunkView view;
  ASSERT_TRUE(DecodeResultChunk(grpc::ByteBuffer(slices.data(), 3), &view));
  EXPECT_EQ(view.request_id, 9u);
  EXPECT_EQ(view.offset, 4096);
  EXPECT_EQ(view.data.size(), 2u);  // one piece per slice: not copied
  EXPECT_EQ(Joined(view), data);
  // An empty chunk at offset 0 (protobuf writes neither field).
  v1::MultiplyStreamResponse empty;
  empty.mutable_chunk();
  ASSERT_TRUE(DecodeResultChunk(Split(empty.SerializeAsString(), 100), &view));
  EXPECT_EQ(view.offset, 0);
  EXPECT_EQ(view.data_bytes, 0);

  // Not a chunk, or not one this reader follows: protobuf's.
  v1::MultiplyStreamResponse result;
  result.set_request_id(1);
  result.mutable_result()->set_bytes(400);
  v1::MultiplyStreamResponse error;
  error.mutable_error()->set_code(3);
  std::string twice = bytes + bytes;  // two chunks: protobuf merges them
  std::string truncated = bytes.substr(0, bytes.size() - 1);
  for (const std::string& other :
       {result.SerializeAsString(), error.SerializeAsString(), twice, truncated,
        std::string()}) {
    EXPECT_FALSE(DecodeResultChunk(Split(other, 7), &view));
  }
}

}  // namespace
}  // namespace matmul
