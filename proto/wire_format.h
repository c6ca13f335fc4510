// Protobuf's wire format, for the code that reads and writes matmul.v1
// messages without the protobuf runtime in the data path (the server's
// server/rpc/multiply_wire.cc, the client's client/lib/multiply_encoding.cc).
#ifndef MATMUL_PROTO_WIRE_FORMAT_H_
#define MATMUL_PROTO_WIRE_FORMAT_H_

#include <cstdint>
#include <string>

namespace matmul::wire {

// Wire types.
inline constexpr int kVarint = 0;
inline constexpr int kFixed64 = 1;
inline constexpr int kLengthDelimited = 2;
inline constexpr int kStartGroup = 3;
inline constexpr int kEndGroup = 4;
inline constexpr int kFixed32 = 5;

// Appends `v` as a base-128 varint.
inline void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Bytes PutVarint writes for `v`.
inline int VarintSize(uint64_t v) {
  int size = 1;
  for (; v >= 0x80; v >>= 7) ++size;
  return size;
}

// A field's key: its number and wire type.
inline uint64_t Key(int field, int wire_type) {
  return static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type);
}
inline void PutKey(std::string& out, int field, int wire_type) {
  PutVarint(out, Key(field, wire_type));
}

}  // namespace matmul::wire

#endif  // MATMUL_PROTO_WIRE_FORMAT_H_
