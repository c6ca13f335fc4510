#include "server/shutdown_signals.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace matmul {
namespace {

// The pipe's write end, for the handler; -1 until Install.
std::atomic<int> write_fd{-1};

// The one instance. It lives as long as the process (the handler may run
// until exit); held here so that leak checkers see it reachable.
ShutdownSignals* installed = nullptr;

// Runs on whichever thread the kernel picked: only async-signal-safe calls.
extern "C" void OnShutdownSignal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  const int fd = write_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    // A full pipe (64 KiB of unread signals) drops this one; nothing else
    // can go wrong that the handler could act on.
    [[maybe_unused]] const ssize_t written = write(fd, &byte, 1);
  }
  errno = saved_errno;
}

absl::Status ErrnoError(absl::string_view call) {
  return absl::InternalError(absl::StrCat(call, ": ", strerror(errno)));
}

void ShutdownSet(sigset_t* set) {
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGINT);
}

}  // namespace

absl::StatusOr<ShutdownSignals*> ShutdownSignals::Install() {
  if (write_fd.load() >= 0) {
    return absl::FailedPreconditionError(
        "ShutdownSignals::Install: already installed");
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return ErrnoError("pipe2");
  sigset_t set;
  ShutdownSet(&set);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) {
    return ErrnoError("pthread_sigmask");
  }
  write_fd.store(fds[1]);
  struct sigaction action = {};
  action.sa_handler = OnShutdownSignal;
  action.sa_mask = set;  // one handler at a time per thread
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGTERM, &action, nullptr) != 0 ||
      sigaction(SIGINT, &action, nullptr) != 0) {
    return ErrnoError("sigaction");
  }
  installed = new ShutdownSignals(fds[0], fds[1]);
  return installed;
}

int ShutdownSignals::Next() {
  // While waiting, this thread takes the signals too (so that one arrives
  // even when no other thread has them unblocked); ppoll restores the mask.
  sigset_t waiting;
  pthread_sigmask(SIG_SETMASK, nullptr, &waiting);
  sigdelset(&waiting, SIGTERM);
  sigdelset(&waiting, SIGINT);
  for (;;) {
    unsigned char byte = 0;
    if (read(read_fd_, &byte, 1) == 1) return byte;
    pollfd readable = {read_fd_, POLLIN, 0};
    // EINTR when the handler ran on this thread: the byte is there now.
    ppoll(&readable, 1, nullptr, &waiting);
  }
}

void ShutdownSignals::Wake() {
  const unsigned char byte = kWoken;
  [[maybe_unused]] const ssize_t written = write(write_fd_, &byte, 1);
}

}  // namespace matmul
