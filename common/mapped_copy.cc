#include "common/mapped_copy.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace matmul {
namespace {

// Where the copy on this thread jumps back to on SIGBUS; null outside one.
thread_local sigjmp_buf* armed = nullptr;
struct sigaction previous;

void OnSigbus(int signal, siginfo_t* info, void* context) {
  if (sigjmp_buf* jump = armed; jump != nullptr) {
    armed = nullptr;
    siglongjmp(*jump, 1);
  }
  // Not a guarded copy: whoever handled SIGBUS before us does.
  if ((previous.sa_flags & SA_SIGINFO) != 0 &&
      previous.sa_sigaction != nullptr) {
    previous.sa_sigaction(signal, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN &&
      previous.sa_handler != nullptr) {
    previous.sa_handler(signal);
    return;
  }
  // The default action: put it back; returning re-runs the faulting
  // instruction, which then ends the process as it would have.
  sigaction(SIGBUS, &previous, nullptr);
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous);
  });
}

}  // namespace

absl::Status CopyMappedMemory(void* dst, const void* src, size_t bytes,
                              absl::string_view what) {
  InstallOnce();
  sigjmp_buf jump;
  // Restores the signal mask on the way back (savemask 1).
  if (sigsetjmp(jump, 1) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        ": the memory faulted while it was copied (its shared-memory "
        "object was truncated during the request)"));
  }
  // The fences keep the compiler from moving the copy out from between the
  // two stores (memcpy reads no globals, so without them it may drop the
  // first store as dead).
  armed = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  armed = nullptr;
  return absl::OkStatus();
}

}  // namespace matmul
