// Copies to and from memory that another process may truncate under us: a
// client's shared-memory object, mapped MAP_SHARED (issue 21). Touching a
// page of such a mapping past the object's new end raises SIGBUS, which
// would end the whole server. CopyMappedMemory runs the copy with a SIGBUS
// handler armed for the calling thread, and turns the fault into an error
// for the one request whose memory it was.
//
// The handler is installed once per process (the first call). A SIGBUS on
// a thread that is not inside CopyMappedMemory goes to the handler that was
// there before (or the default action, which ends the process), as without
// it.
#ifndef MATMUL_COMMON_MAPPED_COPY_H_
#define MATMUL_COMMON_MAPPED_COPY_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace matmul {

// memcpy(dst, src, bytes); FAILED_PRECONDITION naming `what` if either side
// faulted (SIGBUS: the mapping behind it was truncated), in which case dst
// holds an unspecified part of the bytes. Thread-safe.
absl::Status CopyMappedMemory(void* dst, const void* src, size_t bytes,
                              absl::string_view what);

}  // namespace matmul

#endif  // MATMUL_COMMON_MAPPED_COPY_H_
