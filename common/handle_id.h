// Stored-tensor handle ids that name their server ("home"): the address the
// server advertises (--advertise-address) and the device the tensor lives
// on, ahead of the capability's random part, so that a client spreading its
// calls over many servers can send every call naming a handle to the one
// server that holds it.
//
//   h1.<address>.<device>.<32 lowercase hex digits>
//   e.g. h1.10.1.2.3:50051.0.5f0c...  h1.[fd00::7]:50051.-1.09ab...
//
// <address> is host:port (a DNS name, an IPv4 address or a bracketed IPv6
// one, then a decimal port) in the characters CheckAdvertiseAddress allows,
// none of which needs escaping; it may hold dots, so the id is parsed from
// the right. <device> is the engine's device index (-1 on the host engine).
// The random part is kCapabilityIdBits from the kernel (capability_id.h):
// the home adds nothing guessable and takes nothing away, so whoever holds
// the id may use it, as before. A server with no address to advertise
// issues "h-<32 hex>" ids (the format before homes), which clients send over
// their spread like any other call.
//
// Handles stay opaque to users: only the clients and the server read them.
#ifndef MATMUL_COMMON_HANDLE_ID_H_
#define MATMUL_COMMON_HANDLE_ID_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace matmul {

// The version tag of handle ids with a home.
inline constexpr char kHandleIdV1Prefix[] = "h1.";
// Ids without a home.
inline constexpr char kHandleIdNoHomePrefix[] = "h-";
// Longest advertised address.
inline constexpr size_t kMaxAdvertiseAddressLength = 255;

struct HandleHome {
  std::string address;  // host:port
  int device = -1;
};

// OK if `address` can go in a handle id: host:port, the host a DNS name
// (letters, digits, '-', '.', '_'), an IPv4 address or an IPv6 one in
// brackets, the port a decimal number in [1, 65535]; at most
// kMaxAdvertiseAddressLength characters. INVALID_ARGUMENT, saying why,
// otherwise.
absl::Status CheckAdvertiseAddress(absl::string_view address);

// h1.<address>.<device>.<random_hex>; `address` must pass
// CheckAdvertiseAddress and `random_hex` be 32 lowercase hex digits.
std::string ComposeHandleId(absl::string_view address, int device,
                            absl::string_view random_hex);

// The home an id names, if it is a well-formed h1 id; nullopt for any other
// string (an "h-" id, a malformed one, one from a future format), which a
// client sends over its spread.
std::optional<HandleHome> HandleHomeOf(absl::string_view id);

// The address a server advertises when given `given`: host:port as it is,
// or a host alone (a DNS name, an IPv4 address, an IPv6 one with or without
// brackets, as Kubernetes' status.podIP gives it) with `bound_port`
// ("fd00::5" and 50051 give "[fd00::5]:50051"). INVALID_ARGUMENT, from
// CheckAdvertiseAddress, for anything else.
absl::StatusOr<std::string> ResolveAdvertiseAddress(absl::string_view given,
                                                    int bound_port);

// The address a server advertises when none is given: listen_address's
// host with the bound port, if that host is a concrete IP address
// ("127.0.0.1:0" bound to port 41234 gives "127.0.0.1:41234"); nullopt for
// a wildcard host (0.0.0.0, ::, [::]), a name, or anything else, where
// clients elsewhere could not use the address.
std::optional<std::string> DefaultAdvertiseAddress(
    absl::string_view listen_address, int bound_port);

}  // namespace matmul

#endif  // MATMUL_COMMON_HANDLE_ID_H_
