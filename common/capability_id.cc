#include "common/capability_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace matmul {

absl::StatusOr<std::string> NewCapabilityId(absl::string_view prefix) {
  char bits[kCapabilityIdBits / 8];
  size_t got = 0;
  while (got < sizeof(bits)) {
    // The libc wrapper, not syscall(): tests interpose it to see that ids
    // come from here (tests/capability_id_test.cc).
    const ssize_t n = getrandom(bits + got, sizeof(bits) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat(
          "getrandom for a capability id: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return absl::StrCat(prefix,
                      absl::BytesToHexString(absl::string_view(bits, got)));
}

}  // namespace matmul
