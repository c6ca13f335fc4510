// Striped MultiplyStream multiplies end to end: a real MatmulServer on
// 127.0.0.1:0 (the host engine, or the one MATMUL_TEST_ENGINE names) and K
// real MultiplyStream calls, each on its own channel (distinct channel
// arguments, so they do not share a connection), carrying one multiply.
#include <grpcpp/create_channel.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/matmul_client.h"
#include "gmock/gmock.h"
#include "gpu/engine_factory.h"
#include "gtest/gtest.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "proto/dtype_mapping.h"
#include "server/matmul_server.h"
#include "tests/engine_under_test.h"
#include "tests/reference_gemm.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;
using Stream = grpc::ClientReaderWriter<v1::MultiplyStreamRequest,
                                        v1::MultiplyStreamResponse>;

// The join timeout of a test whose joins must all find their start: a
// join may reach the server before its start does, and waits for it; no
// stall of a loaded machine or a sanitizer build comes near this.
constexpr int64_t kJoinTimeoutMs = 10000;
// The join timeout of a test whose joins must time out (kept short).
constexpr int64_t kShortJoinTimeoutMs = 400;

std::unique_ptr<MatmulServer> StartServer(
    int64_t join_timeout_ms = kJoinTimeoutMs) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.drain_timeout = absl::Seconds(10);
  options.limits.stripe_join_timeout_ms = join_timeout_ms;
  absl::StatusOr<std::unique_ptr<MatmulServer>> server =
      MatmulServer::Start(options, testing::EngineUnderTestProvider(3));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

HostTensor Random(DType dtype, std::vector<int64_t> shape, absl::BitGen& gen) {
  HostTensor t;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.data = testing::RandomBytes(dtype, n, gen);
  return t;
}

void ExpectProduct(const HostTensor& a, const HostTensor& b,
                   const std::string& c) {
  const MatmulSpec spec = testing::MakeSpec(
      a.dtype, 1, 1, a.shape[0], b.shape[1], a.shape[1], false, false, false);
  ASSERT_EQ(static_cast<int64_t>(c.size()), spec.c_bytes());
  const std::vector<double> ref = testing::ReferenceGemm(
      spec, testing::ToDoubles(a.dtype, a.data.data(), spec.a_elements()),
      testing::ToDoubles(b.dtype, b.data.data(), spec.b_elements()));
  EXPECT_LT(testing::RelativeError(
                testing::ToDoubles(a.dtype, c.data(), spec.c_elements()), ref),
            testing::Tolerance(a.dtype, spec.compute));
}

std::string Key(absl::BitGen& gen) {
  std::string key(absl::Uniform(gen, 16, 65), '\0');
  for (char& c : key) c = static_cast<char>(absl::Uniform<int>(gen, 0, 256));
  return key;
}

v1::MultiplyStreamRequest Start(uint64_t id, const HostTensor& a,
                                const HostTensor& b, int64_t result_chunk,
                                const std::string& key, int stripes) {
  v1::MultiplyStreamRequest m;
  m.set_request_id(id);
  v1::MultiplyRequest* r = m.mutable_start()->mutable_request();
  for (int64_t d : a.shape) r->mutable_a()->add_shape(d);
  r->mutable_a()->set_dtype(DTypeToProto(a.dtype));
  for (int64_t d : b.shape) r->mutable_b()->add_shape(d);
  r->mutable_b()->set_dtype(DTypeToProto(b.dtype));
  m.mutable_start()->set_result_chunk_bytes(result_chunk);
  m.mutable_start()->set_stripe_key(key);
  m.mutable_start()->set_stripes(stripes);
  return m;
}

v1::MultiplyStreamRequest Join(uint64_t id, const std::string& key) {
  v1::MultiplyStreamRequest m;
  m.set_request_id(id);
  m.mutable_join()->set_stripe_key(key);
  return m;
}

// An operand's chunks (request id 0: the sender sets its own).
std::vector<v1::MultiplyStreamRequest> Chunks(v1::Operand op,
                                              const HostTensor& t,
                                              int64_t chunk) {
  std::vector<v1::MultiplyStreamRequest> out;
  for (int64_t at = 0; at < static_cast<int64_t>(t.data.size()); at += chunk) {
    v1::MultiplyStreamRequest m;
    m.mutable_chunk()->set_operand(op);
    m.mutable_chunk()->set_offset(at);
    m.mutable_chunk()->set_data(t.data.substr(at, chunk));
    out.push_back(std::move(m));
  }
  return out;
}

// What one call got for one request id.
struct Answer {
  bool described = false;
  int64_t bytes = 0;   // the product's, from the header
  std::string handle;  // a kept product's
  std::vector<std::pair<int64_t, std::string>> chunks;
  std::optional<v1::MultiplyStreamError> error;
};

// One MultiplyStream call on its own channel, read by its own thread until
// the server ends it.
class Call {
 public:
  Call(int port, int channel, const std::string& client) {
    grpc::ChannelArguments args;
    args.SetInt("matmul.test_channel", channel);
    stub_ = v1::MatmulService::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                  grpc::InsecureChannelCredentials(), args));
    context_.AddMetadata("x-matmul-client", client);
    stream_ = stub_->MultiplyStream(&context_);
    reader_ = std::thread([this] {
      v1::MultiplyStreamResponse r;
      while (stream_->Read(&r)) {
        absl::MutexLock lock(&mu_);
        Answer& a = answers_[r.request_id()];
        if (r.has_error()) {
          EXPECT_FALSE(a.error.has_value()) << "two errors";
          a.error = r.error();
        } else if (r.has_result()) {
          EXPECT_FALSE(a.described) << "two result headers";
          a.described = true;
          a.bytes = r.result().bytes();
          a.handle = r.result().c_handle().id();
        } else if (r.has_chunk()) {
          EXPECT_TRUE(a.described) << "a chunk before its result";
          a.chunks.emplace_back(r.chunk().offset(), r.chunk().data());
        }
      }
    });
  }
  ~Call() {
    if (reader_.joinable()) {
      context_.TryCancel();
      reader_.join();
    }
  }

  bool Write(const v1::MultiplyStreamRequest& m) { return stream_->Write(m); }
  void WritesDone() { stream_->WritesDone(); }
  void Cancel() { context_.TryCancel(); }
  // Waits (bounded) for an error for `id`.
  bool WaitForError(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = answers_.find(id);
      return it != answers_.end() && it->second.error.has_value();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&has), absl::Seconds(10));
  }
  // Waits for the server to end the call; its answers, by request id.
  std::map<uint64_t, Answer> Finish(grpc::Status* status = nullptr) {
    reader_.join();
    const grpc::Status s = stream_->Finish();
    if (status != nullptr) *status = s;
    absl::MutexLock lock(&mu_);
    return std::move(answers_);
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<v1::MatmulService::Stub> stub_;
  std::unique_ptr<Stream> stream_;
  std::thread reader_;
  absl::Mutex mu_;
  std::map<uint64_t, Answer> answers_ ABSL_GUARDED_BY(mu_);
};

// Waits (bounded) until `done` holds.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 1000 && !done(); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

// Reassembles the product from every call's chunks, checking that each
// byte came exactly once.
std::string Assemble(const std::vector<const Answer*>& answers, int64_t bytes) {
  std::string c(static_cast<size_t>(bytes), '\0');
  std::vector<bool> seen(static_cast<size_t>(bytes), false);
  for (const Answer* a : answers) {
    for (const auto& [offset, data] : a->chunks) {
      EXPECT_LE(offset + static_cast<int64_t>(data.size()), bytes);
      if (offset + static_cast<int64_t>(data.size()) > bytes) continue;
      for (size_t i = 0; i < data.size(); ++i) {
        EXPECT_FALSE(seen[offset + i]) << "byte " << offset + i << " twice";
        seen[offset + i] = true;
      }
      c.replace(offset, data.size(), data);
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), bytes);
  return c;
}

TEST(MultiplyStreamStripeTest, StripedProductsMatchTheReference) {
  std::unique_ptr<MatmulServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  struct Case {
    int k;
    int64_t m, kdim, n, result_chunk;
  };
  // The last one's A (1 MiB) goes in row panels.
  for (const Case& c :
       {Case{2, 67, 45, 53, 4 * 97}, Case{3, 67, 45, 53, 4 * 97},
        Case{4, 67, 45, 53, 4 * 97}, Case{3, 512, 512, 40, 4 * 1000}}) {
    const int k = c.k;
    SCOPED_TRACE(absl::StrCat(k, " stripes, m=", c.m));
    const HostTensor a = Random(DType::kFloat32, {c.m, c.kdim}, gen);
    const HostTensor b = Random(DType::kFloat32, {c.kdim, c.n}, gen);
    const int64_t c_bytes = c.m * c.n * 4;
    const std::string key = Key(gen);
    std::vector<std::unique_ptr<Call>> calls;
    for (int i = 0; i < k; ++i) {
      calls.push_back(std::make_unique<Call>(server->port(), i, "striper"));
    }
    // Each call its own request id; chunks of both operands, shuffled,
    // spread round-robin.
    auto id = [](int i) { return static_cast<uint64_t>(100 + 7 * i); };
    ASSERT_TRUE(calls[0]->Write(Start(id(0), a, b, c.result_chunk, key, k)));
    for (int i = 1; i < k; ++i) ASSERT_TRUE(calls[i]->Write(Join(id(i), key)));
    std::vector<v1::MultiplyStreamRequest> chunks;
    if (c.m < 100) {
      chunks = Chunks(v1::OPERAND_A, a, 4 * 61);
      for (auto& m : Chunks(v1::OPERAND_B, b, 4 * 43)) chunks.push_back(m);
      std::shuffle(chunks.begin(), chunks.end(), gen);
    } else {
      // B first, then A in order: the way row panels go fastest.
      chunks = Chunks(v1::OPERAND_B, b, 4 * 1001);
      for (auto& m : Chunks(v1::OPERAND_A, a, 4 * 4099)) chunks.push_back(m);
    }
    for (size_t j = 0; j < chunks.size(); ++j) {
      const int i = static_cast<int>(j % k);
      chunks[j].set_request_id(id(i));
      ASSERT_TRUE(calls[i]->Write(chunks[j]));
    }
    for (auto& call : calls) call->WritesDone();
    std::vector<std::map<uint64_t, Answer>> answers;
    for (auto& call : calls) {
      grpc::Status status;
      answers.push_back(call->Finish(&status));
      EXPECT_TRUE(status.ok()) << status.error_message();
    }
    std::vector<const Answer*> parts;
    for (int i = 0; i < k; ++i) {
      ASSERT_EQ(answers[i].size(), 1u);
      const Answer& got = answers[i][id(i)];
      ASSERT_FALSE(got.error.has_value()) << got.error->message();
      ASSERT_TRUE(got.described);
      EXPECT_EQ(got.bytes, c_bytes);
      // 37 or 21 product chunks: every stream carries some.
      EXPECT_FALSE(got.chunks.empty()) << "stripe " << i;
      parts.push_back(&got);
    }
    ExpectProduct(a, b, Assemble(parts, c_bytes));
  }
  EXPECT_EQ(server->service().stripes().opened(), 4);
  EXPECT_EQ(server->service().stripes().joined(), 1 + 2 + 3 + 2);
  EXPECT_EQ(server->service().metrics()->stripes(false), 4u);
  EXPECT_EQ(server->service().metrics()->stripes(true), 1u + 2u + 3u + 2u);
  EXPECT_EQ(server->service().inflight_requests(), 0);
}

// Several striped multiplies at once over the same three calls, each
// started on a different one (so every call owns one and joins others),
// their chunks interleaved: each product is whole and right.
TEST(MultiplyStreamStripeTest, StripedMultipliesShareTheirCalls) {
  std::unique_ptr<MatmulServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  constexpr int kCalls = 3, kMultiplies = 6;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::make_unique<Call>(server->port(), i, "sharer"));
  }
  // Multiply j's request id on call i.
  auto id = [](int j, int i) { return static_cast<uint64_t>(1000 * j + i); };
  std::vector<HostTensor> as, bs;
  std::vector<v1::MultiplyStreamRequest> chunks;
  for (int j = 0; j < kMultiplies; ++j) {
    as.push_back(Random(DType::kFloat32, {30 + j, 40}, gen));
    bs.push_back(Random(DType::kFloat32, {40, 20 + 2 * j}, gen));
    const std::string key = Key(gen);
    const int owner = j % kCalls;
    ASSERT_TRUE(calls[owner]->Write(
        Start(id(j, owner), as[j], bs[j], 4 * 50, key, kCalls)));
    for (int i = 0; i < kCalls; ++i) {
      if (i == owner) continue;
      ASSERT_TRUE(calls[i]->Write(Join(id(j, i), key)));
    }
    int n = 0;
    for (auto op : {v1::OPERAND_A, v1::OPERAND_B}) {
      for (auto& m : Chunks(op, op == v1::OPERAND_A ? as[j] : bs[j], 4 * 33)) {
        m.set_request_id(id(j, n++ % kCalls));  // the call is id % 1000
        chunks.push_back(std::move(m));
      }
    }
  }
  std::shuffle(chunks.begin(), chunks.end(), gen);
  for (const auto& m : chunks) {
    ASSERT_TRUE(calls[m.request_id() % 1000]->Write(m));
  }
  for (auto& call : calls) call->WritesDone();
  std::vector<std::map<uint64_t, Answer>> got;
  for (auto& call : calls) {
    grpc::Status status;
    got.push_back(call->Finish(&status));
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  for (int j = 0; j < kMultiplies; ++j) {
    SCOPED_TRACE(j);
    std::vector<const Answer*> parts;
    for (int i = 0; i < kCalls; ++i) {
      const Answer& a = got[i][id(j, i)];
      ASSERT_FALSE(a.error.has_value()) << a.error->message();
      ASSERT_TRUE(a.described);
      parts.push_back(&a);
    }
    ExpectProduct(as[j], bs[j],
                  Assemble(parts, as[j].shape[0] * bs[j].shape[1] * 4));
  }
  EXPECT_EQ(server->service().inflight_requests(), 0);
}

// A join that comes before its start waits for it (its stream reads on
// only then); the start's own stream may send no chunks at all.
TEST(MultiplyStreamStripeTest, AJoinBeforeItsStartWaitsForIt) {
  std::unique_ptr<MatmulServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  const HostTensor a = Random(DType::kFloat32, {20, 30}, gen);
  const HostTensor b = Random(DType::kFloat32, {30, 10}, gen);
  const std::string key = Key(gen);
  Call owner(server->port(), 0, "early");
  Call joiner(server->port(), 1, "early");
  ASSERT_TRUE(joiner.Write(Join(5, key)));
  for (auto& m : Chunks(v1::OPERAND_A, a, 100)) {
    m.set_request_id(5);
    ASSERT_TRUE(joiner.Write(m));
  }
  for (auto& m : Chunks(v1::OPERAND_B, b, 100)) {
    m.set_request_id(5);
    ASSERT_TRUE(joiner.Write(m));
  }
  joiner.WritesDone();
  ASSERT_TRUE(
      Eventually([&] { return server->service().stripes().waiting() == 1; }));
  ASSERT_TRUE(owner.Write(Start(9, a, b, 0, key, 2)));
  owner.WritesDone();
  std::map<uint64_t, Answer> got_owner = owner.Finish();
  std::map<uint64_t, Answer> got_joiner = joiner.Finish();
  ASSERT_FALSE(got_owner[9].error.has_value()) << got_owner[9].error->message();
  ASSERT_FALSE(got_joiner[5].error.has_value())
      << got_joiner[5].error->message();
  EXPECT_TRUE(got_owner[9].described);
  EXPECT_TRUE(got_joiner[5].described);
  ExpectProduct(a, b, Assemble({&got_owner[9], &got_joiner[5]}, 20 * 10 * 4));
}

// A join whose start never comes, or that names another client's key,
// fails NOT_FOUND after the join timeout (the key's owner is not
// revealed); its stream goes on. A join past `stripes - 1` fails at once.
TEST(MultiplyStreamStripeTest, JoinsThatFindNothingFailNotFound) {
  std::unique_ptr<MatmulServer> server = StartServer(kShortJoinTimeoutMs);
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  const HostTensor a = Random(DType::kFloat32, {8, 8}, gen);
  const std::string key = Key(gen);
  Call alice(server->port(), 0, "alice");
  Call alice2(server->port(), 1, "alice");
  Call alice3(server->port(), 2, "alice");
  Call alice4(server->port(), 3, "alice");
  Call mallory(server->port(), 4, "mallory");
  ASSERT_TRUE(alice.Write(Start(1, a, a, 0, key, 2)));
  ASSERT_TRUE(
      Eventually([&] { return server->service().stripes().opened() == 1; }));
  // Another client, the same key: not found, after the timeout.
  const absl::Time before = absl::Now();
  ASSERT_TRUE(mallory.Write(Join(2, key)));
  // An unknown key: not found too.
  ASSERT_TRUE(alice3.Write(Join(3, Key(gen))));
  // The rightful join, then one too many.
  ASSERT_TRUE(alice2.Write(Join(4, key)));
  ASSERT_TRUE(
      Eventually([&] { return server->service().stripes().joined() == 1; }));
  ASSERT_TRUE(alice4.Write(Join(6, key)));
  ASSERT_TRUE(alice4.WaitForError(6));
  for (auto& m : Chunks(v1::OPERAND_A, a, 64)) {
    m.set_request_id(1);
    ASSERT_TRUE(alice.Write(m));
  }
  for (auto& m : Chunks(v1::OPERAND_B, a, 64)) {
    m.set_request_id(4);
    ASSERT_TRUE(alice2.Write(m));
  }
  // After its error, mallory's stream serves an ordinary multiply.
  v1::MultiplyStreamRequest plain = Start(7, a, a, 0, "", 0);
  ASSERT_TRUE(mallory.Write(plain));
  for (auto op : {v1::OPERAND_A, v1::OPERAND_B}) {
    for (auto& m : Chunks(op, a, 4 * 64)) {
      m.set_request_id(7);
      ASSERT_TRUE(mallory.Write(m));
    }
  }
  for (Call* c : {&alice, &alice2, &alice3, &alice4, &mallory}) {
    c->WritesDone();
  }
  std::map<uint64_t, Answer> got_alice = alice.Finish();
  std::map<uint64_t, Answer> got_alice2 = alice2.Finish();
  std::map<uint64_t, Answer> got_alice3 = alice3.Finish();
  std::map<uint64_t, Answer> got_alice4 = alice4.Finish();
  std::map<uint64_t, Answer> got_mallory = mallory.Finish();
  EXPECT_GE(absl::Now() - before, absl::Milliseconds(kShortJoinTimeoutMs));

  ASSERT_TRUE(got_mallory[2].error.has_value());
  EXPECT_EQ(got_mallory[2].error->code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(got_mallory[2].error->message(),
              HasSubstr("no striped multiply of this client"));
  ASSERT_FALSE(got_mallory[7].error.has_value());
  ExpectProduct(a, a, Assemble({&got_mallory[7]}, 8 * 8 * 4));
  ASSERT_TRUE(got_alice3[3].error.has_value());
  EXPECT_EQ(got_alice3[3].error->code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(got_alice4[6].error.has_value());
  EXPECT_EQ(got_alice4[6].error->code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(got_alice4[6].error->message(),
              HasSubstr("already has its 2 streams"));
  ASSERT_FALSE(got_alice[1].error.has_value()) << got_alice[1].error->message();
  ASSERT_FALSE(got_alice2[4].error.has_value());
  ExpectProduct(a, a, Assemble({&got_alice[1], &got_alice2[4]}, 8 * 8 * 4));
  EXPECT_EQ(server->service().stripes().waiting(), 0);
}

// Bad starts and chunks: a duplicate key of an open multiply, stripes out
// of range, and chunks that overlap across streams fail with a precise
// INVALID_ARGUMENT on every stream of the multiply.
TEST(MultiplyStreamStripeTest, BadStartsAndChunksFailOnEveryStream) {
  std::unique_ptr<MatmulServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  const HostTensor a = Random(DType::kFloat32, {16, 8}, gen);
  const std::string key = Key(gen);
  Call c0(server->port(), 0, "bad");
  Call c1(server->port(), 1, "bad");
  const HostTensor b = Random(DType::kFloat32, {8, 4}, gen);
  ASSERT_TRUE(c0.Write(Start(1, a, b, 0, key, 2)));
  ASSERT_TRUE(
      Eventually([&] { return server->service().stripes().opened() == 1; }));
  // The same key again while it is open (same client, another stream).
  ASSERT_TRUE(c1.Write(Start(2, a, b, 0, key, 2)));
  // Out of range.
  ASSERT_TRUE(c1.Write(Start(3, a, b, 0, key.substr(0, 15), 2)));
  ASSERT_TRUE(c1.Write(Start(4, a, b, 0, Key(gen), 17)));
  ASSERT_TRUE(c1.Write(Start(5, a, b, 0, "", 3)));
  // The join, then an A chunk on each stream that overlaps the other.
  ASSERT_TRUE(c1.Write(Join(6, key)));
  std::vector<v1::MultiplyStreamRequest> chunks = Chunks(v1::OPERAND_A, a, 256);
  chunks[0].set_request_id(1);
  ASSERT_TRUE(c0.Write(chunks[0]));
  // Staged before the other stream's chunk comes.
  ASSERT_TRUE(Eventually(
      [&] { return server->service().copied_operand_bytes() >= 256; }));
  v1::MultiplyStreamRequest overlap = Chunks(v1::OPERAND_A, a, 64)[3];
  overlap.set_request_id(6);
  ASSERT_TRUE(c1.Write(overlap));
  c0.WritesDone();
  c1.WritesDone();
  std::map<uint64_t, Answer> got0 = c0.Finish();
  std::map<uint64_t, Answer> got1 = c1.Finish();
  auto expect_error = [](std::map<uint64_t, Answer>& got, uint64_t id,
                         grpc::StatusCode code, const std::string& text) {
    SCOPED_TRACE(id);
    ASSERT_TRUE(got[id].error.has_value());
    EXPECT_EQ(got[id].error->code(), code);
    EXPECT_THAT(got[id].error->message(), HasSubstr(text));
    EXPECT_FALSE(got[id].described);
  };
  expect_error(got1, 2, grpc::StatusCode::ALREADY_EXISTS,
               "already has an open striped multiply");
  expect_error(got1, 3, grpc::StatusCode::INVALID_ARGUMENT,
               "start.stripe_key: expected 16 to 64 bytes, got 15");
  expect_error(got1, 4, grpc::StatusCode::INVALID_ARGUMENT,
               "start.stripes: expected 2 to 16 with a stripe_key, got 17");
  expect_error(got1, 5, grpc::StatusCode::INVALID_ARGUMENT,
               "start.stripes: expected 0 or 1 without a stripe_key, got 3");
  const std::string overlaps =
      "operand a: the chunk of bytes [192, 256) overlaps bytes [0, 256)";
  expect_error(got0, 1, grpc::StatusCode::INVALID_ARGUMENT, overlaps);
  expect_error(got1, 6, grpc::StatusCode::INVALID_ARGUMENT, overlaps);
  EXPECT_EQ(server->service().inflight_requests(), 0);
}

// When one stripe's call is cancelled mid-multiply (the owner's or a
// joiner's), the others get CANCELLED naming it, every call ends, nothing
// stays held, and the server serves the next striped multiply.
TEST(MultiplyStreamStripeTest, ACancelledStripeFailsTheOthers) {
  std::unique_ptr<MatmulServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  const HostTensor a = Random(DType::kFloat32, {64, 64}, gen);
  for (int cancelled : {2, 0}) {
    SCOPED_TRACE(absl::StrCat("stripe ", cancelled, " cancelled"));
    const std::string key = Key(gen);
    std::vector<std::unique_ptr<Call>> calls;
    for (int i = 0; i < 3; ++i) {
      calls.push_back(std::make_unique<Call>(server->port(), i, "cancel"));
    }
    const int64_t joined = server->service().stripes().joined();
    ASSERT_TRUE(calls[0]->Write(Start(10, a, a, 0, key, 3)));
    ASSERT_TRUE(calls[1]->Write(Join(11, key)));
    ASSERT_TRUE(calls[2]->Write(Join(12, key)));
    std::vector<v1::MultiplyStreamRequest> chunks =
        Chunks(v1::OPERAND_A, a, 1024);
    for (int i = 0; i < 3; ++i) {
      chunks[i].set_request_id(10 + i);
      ASSERT_TRUE(calls[i]->Write(chunks[i]));
    }
    ASSERT_TRUE(Eventually([&] {
      return server->service().stripes().joined() == joined + 2 &&
             server->service().inflight_requests() == 1;
    }));
    calls[cancelled]->Cancel();
    for (int i = 0; i < 3; ++i) {
      if (i == cancelled) continue;
      calls[i]->WritesDone();
      grpc::Status status;
      std::map<uint64_t, Answer> got = calls[i]->Finish(&status);
      EXPECT_TRUE(status.ok()) << status.error_message();
      ASSERT_TRUE(got[10 + i].error.has_value()) << "stripe " << i;
      EXPECT_EQ(got[10 + i].error->code(), grpc::StatusCode::CANCELLED);
      EXPECT_THAT(got[10 + i].error->message(),
                  HasSubstr(absl::StrCat("(request_id ", 10 + cancelled,
                                         " there) ended (CANCELLED)")));
    }
    grpc::Status status;
    calls[cancelled]->Finish(&status);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
    calls.clear();
    EXPECT_TRUE(Eventually([&] {
      return server->service().inflight_requests() == 0 &&
             server->service().calls_in_progress() == 0;
    }));
  }
  // The server goes on: a striped multiply over two fresh calls.
  const std::string key = Key(gen);
  Call c0(server->port(), 7, "cancel");
  Call c1(server->port(), 8, "cancel");
  ASSERT_TRUE(c0.Write(Start(1, a, a, 4096, key, 2)));
  ASSERT_TRUE(c1.Write(Join(2, key)));
  for (auto& m : Chunks(v1::OPERAND_A, a, 4096)) {
    m.set_request_id(1);
    ASSERT_TRUE(c0.Write(m));
  }
  for (auto& m : Chunks(v1::OPERAND_B, a, 4096)) {
    m.set_request_id(2);
    ASSERT_TRUE(c1.Write(m));
  }
  c0.WritesDone();
  c1.WritesDone();
  std::map<uint64_t, Answer> got0 = c0.Finish();
  std::map<uint64_t, Answer> got1 = c1.Finish();
  ASSERT_FALSE(got0[1].error.has_value()) << got0[1].error->message();
  ASSERT_FALSE(got1[2].error.has_value()) << got1[2].error->message();
  ExpectProduct(a, a, Assemble({&got0[1], &got1[2]}, 64 * 64 * 4));
}

// When every stream of a striped multiply has closed its side with operand
// bytes missing, it fails on all of them.
TEST(MultiplyStreamStripeTest, MissingBytesFailOnceEveryStreamHasClosed) {
  std::unique_ptr<MatmulServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  const HostTensor a = Random(DType::kFloat32, {8, 8}, gen);
  const std::string key = Key(gen);
  Call c0(server->port(), 0, "short");
  Call c1(server->port(), 1, "short");
  ASSERT_TRUE(c0.Write(Start(1, a, a, 0, key, 2)));
  ASSERT_TRUE(c1.Write(Join(2, key)));
  v1::MultiplyStreamRequest chunk = Chunks(v1::OPERAND_A, a, 64)[0];
  chunk.set_request_id(2);
  ASSERT_TRUE(c1.Write(chunk));
  c0.WritesDone();
  c1.WritesDone();
  std::map<uint64_t, Answer> got0 = c0.Finish();
  std::map<uint64_t, Answer> got1 = c1.Finish();
  for (const Answer* got : {&got0[1], &got1[2]}) {
    ASSERT_TRUE(got->error.has_value());
    EXPECT_EQ(got->error->code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(got->error->message(),
                HasSubstr("the client closed all 2 streams of striped request "
                          "1 before operand a arrived: 64 of 256 bytes"));
  }
  EXPECT_EQ(server->service().inflight_requests(), 0);
}

// keep_result: every stream gets the header, with the same handle, and no
// chunks follow.
TEST(MultiplyStreamStripeTest, AKeptProductAnswersEveryStreamWithItsHandle) {
  std::unique_ptr<MatmulServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  const HostTensor a = Random(DType::kFloat32, {12, 10}, gen);
  const HostTensor b = Random(DType::kFloat32, {10, 6}, gen);
  const std::string key = Key(gen);
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::make_unique<Call>(server->port(), i, "keeper"));
  }
  v1::MultiplyStreamRequest start = Start(1, a, b, 0, key, 3);
  start.mutable_start()->mutable_request()->set_keep_result(true);
  ASSERT_TRUE(calls[0]->Write(start));
  ASSERT_TRUE(calls[1]->Write(Join(2, key)));
  ASSERT_TRUE(calls[2]->Write(Join(3, key)));
  for (auto& m : Chunks(v1::OPERAND_A, a, 4 * 10)) {
    m.set_request_id(3);
    ASSERT_TRUE(calls[2]->Write(m));
  }
  for (auto& m : Chunks(v1::OPERAND_B, b, 4 * 6)) {
    m.set_request_id(2);
    ASSERT_TRUE(calls[1]->Write(m));
  }
  for (auto& call : calls) call->WritesDone();
  std::string handle;
  for (int i = 0; i < 3; ++i) {
    grpc::Status status;
    std::map<uint64_t, Answer> got = calls[i]->Finish(&status);
    EXPECT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(got.size(), 1u);
    const Answer& answer = got[1 + i];
    ASSERT_FALSE(answer.error.has_value()) << answer.error->message();
    EXPECT_TRUE(answer.described);
    EXPECT_TRUE(answer.chunks.empty());
    ASSERT_FALSE(answer.handle.empty());
    if (i == 0) handle = answer.handle;
    EXPECT_EQ(answer.handle, handle);
  }
  EXPECT_EQ(server->service().inflight_requests(), 0);
}

// A drain lets a striped multiply that is open finish on all its streams,
// then ends each of them UNAVAILABLE.
TEST(MultiplyStreamStripeTest, ADrainFinishesAStripedMultiplyFirst) {
  std::unique_ptr<MatmulServer> server = StartServer();  // 10 s drain
  ASSERT_NE(server, nullptr);
  absl::BitGen gen;
  const HostTensor a = Random(DType::kFloat32, {256, 256}, gen);
  const HostTensor b = Random(DType::kFloat32, {256, 128}, gen);
  const std::string key = Key(gen);
  Call c0(server->port(), 0, "drained");
  Call c1(server->port(), 1, "drained");
  ASSERT_TRUE(c0.Write(Start(1, a, b, 16 << 10, key, 2)));
  ASSERT_TRUE(c1.Write(Join(2, key)));
  std::vector<v1::MultiplyStreamRequest> chunks =
      Chunks(v1::OPERAND_A, a, 32 << 10);
  for (auto& m : Chunks(v1::OPERAND_B, b, 32 << 10)) chunks.push_back(m);
  for (size_t j = 0; j < chunks.size(); ++j) {
    chunks[j].set_request_id(1 + j % 2);
    ASSERT_TRUE((j % 2 == 0 ? c0 : c1).Write(chunks[j]));
  }
  const int64_t operands = static_cast<int64_t>(a.data.size() + b.data.size());
  ASSERT_TRUE(Eventually(
      [&] { return server->service().copied_operand_bytes() == operands; }));
  std::thread shutdown([&] { server->Shutdown(); });
  grpc::Status s0, s1;
  std::map<uint64_t, Answer> got0 = c0.Finish(&s0);
  std::map<uint64_t, Answer> got1 = c1.Finish(&s1);
  shutdown.join();
  EXPECT_EQ(s0.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s1.error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_FALSE(got0[1].error.has_value()) << got0[1].error->message();
  ASSERT_FALSE(got1[2].error.has_value()) << got1[2].error->message();
  ExpectProduct(a, b, Assemble({&got0[1], &got1[2]}, 256 * 128 * 4));
}

}  // namespace
}  // namespace matmul
