// Test support: a channel connected before a test makes its first call.
//
// A fresh channel's first connect can fail on a sound loopback server: CI
// saw `UNKNOWN: ipv4:127.0.0.1:PORT: No such file or directory` under ASan
// (docs/RELIABILITY.md). A call made on the channel then fails with it.
// Waiting until the channel is ready rides such a failure out by gRPC's
// reconnect backoff (about 1 s, then longer), so tests that look at the
// server's answers wait first. Tests of connection behaviour do not.
#ifndef MATMUL_TESTS_CHANNEL_READY_H_
#define MATMUL_TESTS_CHANNEL_READY_H_

#include <grpcpp/channel.h>

#include <chrono>
#include <memory>
#include <utility>

#include "gtest/gtest.h"

namespace matmul::testing {

// Long enough for several reconnect attempts on a loaded machine under
// sanitizers; only a channel that cannot connect waits it out.
inline constexpr std::chrono::seconds kConnectTimeout{10};

// Waits (at most `timeout`) until `channel` is connected, and returns it. A
// channel still not connected by then is a test failure (the calls that
// follow would fail too, less clearly).
inline std::shared_ptr<grpc::Channel> Connected(
    std::shared_ptr<grpc::Channel> channel,
    std::chrono::seconds timeout = kConnectTimeout) {
  const bool ready =
      channel->WaitForConnected(std::chrono::system_clock::now() + timeout);
  EXPECT_TRUE(ready) << "the channel did not connect within " << timeout.count()
                     << " s";
  return channel;
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_CHANNEL_READY_H_
