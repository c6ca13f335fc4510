// Names a thread, so that `top -H`, `ps -L`, perf and gdb tell a program's
// threads apart (the CUDA engine's lane dispatchers, completion threads and
// poller, for one).
#ifndef MATMUL_COMMON_THREAD_NAME_H_
#define MATMUL_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <string>
#include <thread>

namespace matmul {

// Linux keeps the first 15 bytes of `name`; longer names are cut there.
// Best effort: a name the system refuses changes nothing else. Named by
// its creator, a thread has its name before the creator goes on.
inline void NameThread(std::thread& thread, const std::string& name) {
  const std::string cut = name.substr(0, 15);
  pthread_setname_np(thread.native_handle(), cut.c_str());
}

}  // namespace matmul

#endif  // MATMUL_COMMON_THREAD_NAME_H_
