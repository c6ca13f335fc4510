// ShutdownSignals: SIGTERM and SIGINT, taken in one place for the whole
// process.
//
// Install() runs first thing in main, before the server starts a thread. It
// blocks both signals in the calling thread, so that every thread started
// after it inherits the mask, and installs a handler for the threads that
// libraries started before main (OpenBLAS starts its thread pool when it is
// loaded, with every signal unblocked): on whichever thread a signal lands,
// the handler only writes its number into a pipe. Without the handler such a
// thread takes the default action and the process dies at once (status -15),
// which is what a second SIGTERM during a drain used to do.
//
// Next() waits for the next signal (unblocking both in the waiting thread
// only while it waits) or for Wake(), which another thread calls to end the
// wait (the drain is over).
//
// One per process; Install() twice is an error. Next() is for one thread
// at a time; Wake() is async-signal-safe and thread-safe.
#ifndef MATMUL_SERVER_SHUTDOWN_SIGNALS_H_
#define MATMUL_SERVER_SHUTDOWN_SIGNALS_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace matmul {

class ShutdownSignals {
 public:
  // What Next() returns when Wake() ended the wait.
  static constexpr int kWoken = 0;

  static absl::StatusOr<ShutdownSignals*> Install();

  // SIGTERM or SIGINT, once one arrives; kWoken after a Wake(). Signals
  // and wakes that arrive while nobody waits are kept, in order.
  int Next();

  void Wake();

 private:
  ShutdownSignals(int read_fd, int write_fd)
      : read_fd_(read_fd), write_fd_(write_fd) {}

  const int read_fd_;
  const int write_fd_;
};

}  // namespace matmul

#endif  // MATMUL_SERVER_SHUTDOWN_SIGNALS_H_
