// NewCapabilityId: an id that grants what it names to whoever holds it
// (stored-tensor handles, shared-memory region ids), so it must be
// unguessable: 128 bits from the kernel's cryptographic generator
// (getrandom(2), which blocks only until the kernel's pool is first
// seeded at boot), never from a general-purpose generator such as
// absl::BitGen, which Abseil documents as unfit for secrets.
//
// Thread-safe; no state of its own.
#ifndef MATMUL_COMMON_CAPABILITY_ID_H_
#define MATMUL_COMMON_CAPABILITY_ID_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace matmul {

// Random bits in an id.
inline constexpr int kCapabilityIdBits = 128;

// `prefix` followed by kCapabilityIdBits bits from getrandom(2) as
// lowercase hex (32 digits). UNAVAILABLE, with the error's text, if the
// kernel refuses; never a weaker fallback.
absl::StatusOr<std::string> NewCapabilityId(absl::string_view prefix);

}  // namespace matmul

#endif  // MATMUL_COMMON_CAPABILITY_ID_H_
