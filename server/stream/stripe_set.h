// StripeSet: the streams that carry one striped multiply, as its owner
// keeps them: stripe 0 is the owner's own call, 1 .. K-1 the joining calls
// in the order their joins matched. It says when every stream has joined
// (the result header waits for that), when the multiply is starved (every
// stream joined and closed its side with operand bytes still missing: a
// stream that never joins keeps it waiting, for the client's deadline or
// cancel to end), and which stream each product chunk goes on (the one
// with the fewest unwritten, then the fewest given). No gRPC: `Peer` is
// what the owner keeps of each joining call (its fields are the stripe's).
//
// Not thread-safe: the owner serializes.
#ifndef MATMUL_SERVER_STREAM_STRIPE_SET_H_
#define MATMUL_SERVER_STREAM_STRIPE_SET_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace matmul {

template <typename Peer>
class StripeSet {
 public:
  struct Stripe : Peer {
    uint64_t request_id = 0;   // its start's or join's, on its call
    bool joined = false;       // [0] from the start
    bool side_closed = false;  // the client closed that call's side
    int chunks_out = 0;        // product chunks given it, not yet written
    int64_t chunks_sent = 0;   // product chunks given it
  };

  // Not striped: no stripes.
  StripeSet() = default;
  // `stripes` streams; the owner's start is `request_id`.
  StripeSet(int stripes, uint64_t request_id) : stripes_(stripes) {
    stripes_[0].request_id = request_id;
    stripes_[0].joined = true;
  }

  int size() const { return static_cast<int>(stripes_.size()); }
  Stripe& operator[](int s) { return stripes_[s]; }
  const Stripe& operator[](int s) const { return stripes_[s]; }
  auto begin() { return stripes_.begin(); }
  auto end() { return stripes_.end(); }

  // Stripe `s` (1 .. size() - 1) joined under `request_id`.
  void Join(int s, uint64_t request_id, Peer peer) {
    static_cast<Peer&>(stripes_[s]) = std::move(peer);
    stripes_[s].request_id = request_id;
    stripes_[s].joined = true;
    ++joins_;
  }
  // Joins matched so far (a stream that joined and ended still counts).
  int joins() const { return joins_; }
  bool all_joined() const { return joins_ >= size() - 1; }

  void SideClosed(int s) { stripes_[s].side_closed = true; }
  // With operand bytes missing (`complete` false): whether none can come.
  bool Starved(bool complete) const {
    if (complete || !all_joined()) return false;
    for (const Stripe& s : stripes_) {
      if (!s.side_closed) return false;
    }
    return true;
  }

  // The stripe the next product chunk goes on, counted as given to it.
  int GiveChunk() {
    int to = 0;
    for (int s = 1; s < size(); ++s) {
      const Stripe& a = stripes_[s];
      const Stripe& best = stripes_[to];
      if (a.chunks_out < best.chunks_out ||
          (a.chunks_out == best.chunks_out &&
           a.chunks_sent < best.chunks_sent)) {
        to = s;
      }
    }
    ++stripes_[to].chunks_out;
    ++stripes_[to].chunks_sent;
    return to;
  }
  // A chunk given to stripe `s` was written (or dropped).
  void ChunkWritten(int s) {
    if (s >= 0 && s < size()) --stripes_[s].chunks_out;
  }

 private:
  std::vector<Stripe> stripes_;
  int joins_ = 0;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_STREAM_STRIPE_SET_H_
