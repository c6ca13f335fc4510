// StagingCopier: every byte lands where it belongs whether the caller
// copies alone or helpers take part, with many callers at once, and with
// pieces of every size across chunk edges.
#include "server/staging_copier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace matmul {
namespace {

using Piece = StagingCopier::Piece;

// A message of `sizes` pieces, filled with bytes that tell each source
// offset apart (by `seed`).
struct Message {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<Piece> pieces;
  std::vector<uint8_t> joined;  // what the copy must produce
};

Message MakeMessage(const std::vector<size_t>& sizes, uint32_t seed) {
  Message m;
  std::mt19937 rng(seed);
  for (size_t size : sizes) {
    std::vector<uint8_t> bytes(size);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    m.joined.insert(m.joined.end(), bytes.begin(), bytes.end());
    m.storage.push_back(std::move(bytes));
  }
  for (const auto& s : m.storage) m.pieces.emplace_back(s.data(), s.size());
  return m;
}

// Copies `m` into a buffer with guard bytes around it and checks the bytes
// and that nothing outside was written.
void CopyAndCheck(StagingCopier& copier, const Message& m) {
  constexpr size_t kGuard = 64;
  std::vector<std::byte> out(m.joined.size() + 2 * kGuard, std::byte{0x5a});
  copier.Copy(m.pieces, out.data() + kGuard);
  ASSERT_EQ(std::memcmp(out.data() + kGuard, m.joined.data(), m.joined.size()),
            0);
  for (size_t i = 0; i < kGuard; ++i) {
    ASSERT_EQ(out[i], std::byte{0x5a});
    ASSERT_EQ(out[out.size() - 1 - i], std::byte{0x5a});
  }
}

TEST(StagingCopierTest, WithoutHelpersTheCallerCopiesEveryByte) {
  StagingCopier copier(StagingCopyOptions{0, 1024, 4096});
  EXPECT_EQ(copier.helpers(), 0);
  CopyAndCheck(copier, MakeMessage({100000, 3, 0, 70000}, 1));
  EXPECT_EQ(copier.shared_copies(), 0);
  EXPECT_EQ(copier.helper_bytes(), 0);
}

TEST(StagingCopierTest, ACopyBelowTheSplitIsNotShared) {
  StagingCopier copier(StagingCopyOptions{2, 1 << 20, 4096});
  CopyAndCheck(copier, MakeMessage({300000, 200000}, 2));
  EXPECT_EQ(copier.shared_copies(), 0);
}

TEST(StagingCopierTest, SharedCopiesPutEveryByteInPlace) {
  StagingCopier copier(StagingCopyOptions{3, 8192, 4096});
  // Piece sizes on, around and between chunk edges, one empty, and one
  // message in a single piece.
  const std::vector<std::vector<size_t>> messages = {
      {1 << 20},
      {4096, 4095, 4097, 0, 1, 65536 + 17},
      {524288, 524288},
      {8192},
      {3, 5, 7, 100000, 8191, 8193}};
  for (int round = 0; round < 50; ++round) {
    for (size_t i = 0; i < messages.size(); ++i) {
      CopyAndCheck(copier, MakeMessage(messages[i], round * 10 + i));
    }
  }
  EXPECT_EQ(copier.shared_copies(), 50 * 5);
  // Helpers wake as they can: whether they took part is not asserted
  // here; WhenTheHelpersWakeTheyTakeChunks below waits for them to.
}

TEST(StagingCopierTest, StreamingStoresPutEveryByteInPlace) {
  // The streaming copy stores 64 bytes at a time from the destination's
  // first 16-byte boundary: pieces of every length from every alignment,
  // copied alone and shared, with guards around them.
  for (int helpers : {0, 2}) {
    StagingCopyOptions options{helpers, 8192, 4096};
    options.streaming_stores = true;
    StagingCopier copier(options);
    for (uint32_t round = 0; round < 20; ++round) {
      CopyAndCheck(copier, MakeMessage({1, 15, 16, 17, 63, 64, 65, 127, 4095,
                                        4097, 70000, 0, 31},
                                       100 + round));
      CopyAndCheck(copier, MakeMessage({524288, 524288 - 5}, 200 + round));
      CopyAndCheck(copier, MakeMessage({3}, 300 + round));
    }
    if (helpers > 0) {
      EXPECT_GT(copier.shared_copies(), 0);
    }
  }
  // And into a destination that starts off a 16-byte boundary.
  StagingCopyOptions options{0, 8192, 4096};
  options.streaming_stores = true;
  StagingCopier copier(options);
  const Message m = MakeMessage({100000, 77}, 400);
  std::vector<std::byte> out(m.joined.size() + 64, std::byte{0x5a});
  for (size_t offset : {1, 7, 8, 15}) {
    std::fill(out.begin(), out.end(), std::byte{0x5a});
    copier.Copy(m.pieces, out.data() + offset);
    ASSERT_EQ(
        std::memcmp(out.data() + offset, m.joined.data(), m.joined.size()), 0)
        << "offset " << offset;
    for (size_t i = 0; i < offset; ++i) ASSERT_EQ(out[i], std::byte{0x5a});
    for (size_t i = offset + m.joined.size(); i < out.size(); ++i) {
      ASSERT_EQ(out[i], std::byte{0x5a});
    }
  }
}

TEST(StagingCopierTest, PartsGoToTheirOwnPlaces) {
  StagingCopier copier(StagingCopyOptions{2, 4096, 4096});
  const Message a = MakeMessage({70000, 30000}, 7);
  const Message b = MakeMessage({50000}, 8);
  std::vector<std::byte> staging(a.joined.size() + 1000 + b.joined.size(),
                                 std::byte{0});
  std::byte* b_at = staging.data() + a.joined.size() + 1000;
  const StagingCopier::Part parts[2] = {{a.pieces, staging.data()},
                                        {b.pieces, b_at}};
  copier.Copy(parts);
  EXPECT_EQ(std::memcmp(staging.data(), a.joined.data(), a.joined.size()), 0);
  EXPECT_EQ(std::memcmp(b_at, b.joined.data(), b.joined.size()), 0);
  for (size_t i = a.joined.size(); i < a.joined.size() + 1000; ++i) {
    ASSERT_EQ(staging[i], std::byte{0}) << "written between the parts at " << i;
  }
}

TEST(StagingCopierTest, WhenTheHelpersWakeTheyTakeChunks) {
  StagingCopier copier(StagingCopyOptions{2, 4096, 4096});
  // 16 MiB in 4 KiB chunks: the caller cannot copy 4096 chunks before a
  // helper wakes every time; bounded, so the test ends whatever happens.
  const Message m = MakeMessage({16 << 20}, 9);
  for (int i = 0; i < 20 && copier.helper_bytes() == 0; ++i) {
    CopyAndCheck(copier, m);
  }
  EXPECT_GT(copier.helper_bytes(), 0);
  EXPECT_LE(copier.helper_bytes(), static_cast<int64_t>(20 * m.joined.size()));
}

TEST(StagingCopierTest, ManyCallersAtOnceEachGetTheirOwnBytes) {
  StagingCopier copier(StagingCopyOptions{3, 4096, 4096});
  std::vector<std::thread> callers;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const Message m = MakeMessage(
            {static_cast<size_t>(20000 + 3000 * t), 5000, 12345}, t * 100 + i);
        std::vector<std::byte> out(m.joined.size());
        copier.Copy(m.pieces, out.data());
        if (std::memcmp(out.data(), m.joined.data(), out.size()) != 0) {
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& c : callers) c.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(failures[t], 0) << "caller " << t;
  // One copy holds the helpers at a time; the rest were their callers'.
  EXPECT_LE(copier.shared_copies(), 8 * 40);
}

TEST(StagingCopierTest, TheDefaultLeavesSmallMachinesAlone) {
  const int cores = UsableCores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(
                       std::max(1u, std::thread::hardware_concurrency())));
  const int helpers = DefaultStagingCopyHelpers();
  EXPECT_EQ(helpers, std::clamp(cores / 4, 0, 3));
  if (cores < 4) {
    EXPECT_EQ(helpers, 0);
  }
}

}  // namespace
}  // namespace matmul
