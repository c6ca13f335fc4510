#include "common/handle_id.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/capability_id.h"

namespace matmul {
namespace {

constexpr size_t kRandomHexDigits = kCapabilityIdBits / 4;

bool IsLowerHex(absl::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A decimal port in [1, 65535], no sign, no leading zero.
bool IsPort(absl::string_view s) {
  if (s.empty() || s.size() > 5 || s[0] == '0') return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  int port = 0;
  return absl::SimpleAtoi(s, &port) && port >= 1 && port <= 65535;
}

bool IsDnsNameOrIpv4(absl::string_view host) {
  if (host.empty()) return false;
  for (char c : host) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '.' && c != '_') {
      return false;
    }
  }
  return host.front() != '.' && host.front() != '-';
}

bool IsBracketedIpv6(absl::string_view host) {
  if (host.size() < 4 || host.front() != '[' || host.back() != ']') {
    return false;
  }
  for (char c : host.substr(1, host.size() - 2)) {
    if (!absl::ascii_isxdigit(c) && c != ':' && c != '.') return false;
  }
  return true;
}

// Host and port of "host:port" (the port after the last colon); false if
// there is no colon.
bool SplitHostPort(absl::string_view address, absl::string_view* host,
                   absl::string_view* port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  return true;
}

bool IsIpv4Literal(absl::string_view host) {
  int parts = 0;
  for (absl::string_view rest = host;;) {
    const size_t dot = rest.find('.');
    const absl::string_view part = rest.substr(0, dot);
    int value = 0;
    if (part.empty() || part.size() > 3 || !absl::SimpleAtoi(part, &value) ||
        value < 0 || value > 255) {
      return false;
    }
    for (char c : part) {
      if (!absl::ascii_isdigit(c)) return false;
    }
    ++parts;
    if (dot == absl::string_view::npos) break;
    rest = rest.substr(dot + 1);
  }
  return parts == 4;
}

}  // namespace

absl::Status CheckAdvertiseAddress(absl::string_view address) {
  if (address.size() > kMaxAdvertiseAddressLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("the advertised address is ", address.size(),
                     " characters, more than ", kMaxAdvertiseAddressLength));
  }
  absl::string_view host;
  absl::string_view port;
  if (!SplitHostPort(address, &host, &port) || !IsPort(port)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the advertised address \"", absl::CHexEscape(address),
        "\" is not host:port with a port in [1, 65535] (e.g. 10.0.0.5:50051, "
        "[fd00::5]:50051 or matmul-0.matmul:50051)"));
  }
  if (!IsDnsNameOrIpv4(host) && !IsBracketedIpv6(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the advertised address \"", absl::CHexEscape(address),
        "\": the host must be a DNS name, an IPv4 address or an IPv6 address "
        "in brackets"));
  }
  return absl::OkStatus();
}

std::string ComposeHandleId(absl::string_view address, int device,
                            absl::string_view random_hex) {
  return absl::StrCat(kHandleIdV1Prefix, address, ".", device, ".", random_hex);
}

std::optional<HandleHome> HandleHomeOf(absl::string_view id) {
  if (!absl::ConsumePrefix(&id, kHandleIdV1Prefix)) return std::nullopt;
  // From the right: the random part, then the device; the rest is the
  // address (which may hold dots).
  const size_t random_dot = id.rfind('.');
  if (random_dot == absl::string_view::npos) return std::nullopt;
  const absl::string_view random = id.substr(random_dot + 1);
  if (random.size() != kRandomHexDigits || !IsLowerHex(random)) {
    return std::nullopt;
  }
  id = id.substr(0, random_dot);
  const size_t device_dot = id.rfind('.');
  if (device_dot == absl::string_view::npos) return std::nullopt;
  const absl::string_view device_text = id.substr(device_dot + 1);
  int device = 0;
  if (device_text.empty() || device_text.size() > 6 ||
      !absl::SimpleAtoi(device_text, &device) || device < -1) {
    return std::nullopt;
  }
  if (device_text != absl::StrCat(device)) return std::nullopt;  // canonical
  const absl::string_view address = id.substr(0, device_dot);
  if (!CheckAdvertiseAddress(address).ok()) return std::nullopt;
  return HandleHome{std::string(address), device};
}

absl::StatusOr<std::string> ResolveAdvertiseAddress(absl::string_view given,
                                                    int bound_port) {
  const absl::Status as_given = CheckAdvertiseAddress(given);
  if (as_given.ok()) return std::string(given);
  std::string with_port;
  if (!given.empty() && given.front() == '[' && given.back() == ']') {
    with_port = absl::StrCat(given, ":", bound_port);
  } else if (given.find(':') != absl::string_view::npos) {
    with_port = absl::StrCat("[", given, "]:", bound_port);  // bare IPv6
  } else {
    with_port = absl::StrCat(given, ":", bound_port);
  }
  if (CheckAdvertiseAddress(with_port).ok()) return with_port;
  return as_given;
}

std::optional<std::string> DefaultAdvertiseAddress(
    absl::string_view listen_address, int bound_port) {
  absl::string_view host;
  absl::string_view port;
  if (bound_port <= 0 || !SplitHostPort(listen_address, &host, &port)) {
    return std::nullopt;
  }
  if (IsIpv4Literal(host)) {
    if (host == "0.0.0.0") return std::nullopt;
  } else if (IsBracketedIpv6(host)) {
    const absl::string_view inside = host.substr(1, host.size() - 2);
    // The unspecified address, however spelled (::, 0::0, ...).
    bool unspecified = true;
    for (char c : inside) {
      if (c != ':' && c != '0') unspecified = false;
    }
    if (unspecified) return std::nullopt;
  } else {
    return std::nullopt;
  }
  std::string address = absl::StrCat(host, ":", bound_port);
  if (!CheckAdvertiseAddress(address).ok()) return std::nullopt;
  return address;
}

}  // namespace matmul
