// Test support: POSIX shared-memory objects under fresh names, and the
// leftovers of dead test processes. A process that dies inside a test (a
// death test's child, a crash, a ctest timeout's kill) runs no destructor
// and leaves its names in /dev/shm, and pids come round again (pid_max is
// 32768 here): a later process given the same pid then found its first
// name taken, and a test that went on through MAP_FAILED crashed
// (mapped_copy_test, e0720f2). So objects are created O_EXCL under the
// first name that is free, a name that exists is skipped (never reused or
// unlinked), and a create that fails is a test failure.
#ifndef MATMUL_TESTS_SHM_NAMES_H_
#define MATMUL_TESTS_SHM_NAMES_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace matmul::testing {

// The names one kind of test object tries: `prefix` followed by 0, 1, 2...
// Each construction takes the next name (Next, handed to
// CreateUnderFreshName) and goes on past those that exist; Ahead(k) is the
// name the construction k from now tries first, where a test plants
// leftovers. Used on the test's main thread only.
class NameSequence {
 public:
  explicit NameSequence(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Ahead(int ahead) const {
    return prefix_ + std::to_string(next_ + ahead);
  }
  std::string Next() { return prefix_ + std::to_string(next_++); }

 private:
  const std::string prefix_;
  int next_ = 0;
};

// How many names CreateUnderFreshName tries.
inline constexpr int kFreshNameAttempts = 64;

// Creates an empty object (read-write, 0600) under the first name
// `next_name` gives that does not exist yet, asking it for at most
// kFreshNameAttempts names; `*name` is the last name tried. Returns the
// open descriptor, or -1 after a test failure.
inline int CreateUnderFreshName(const std::function<std::string()>& next_name,
                                std::string* name) {
  int error = 0;
  for (int attempt = 0; attempt < kFreshNameAttempts; ++attempt) {
    *name = next_name();
    const int fd =
        shm_open(name->c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    error = errno;
    if (error != EEXIST) break;
  }
  ADD_FAILURE() << "shm_open(" << *name << "): " << std::strerror(error);
  return -1;
}

// Shared-memory objects that a test creates as a dead process would have
// left them and, at its end, unlinks (also when an ASSERT ends it early).
class StaleNames {
 public:
  StaleNames() = default;
  StaleNames(const StaleNames&) = delete;
  StaleNames& operator=(const StaleNames&) = delete;
  ~StaleNames() {
    for (const std::string& name : names_) shm_unlink(name.c_str());
  }
  // Creates `name`, empty. A name that exists already (a leftover like
  // those this stands for) does as well, and is left as it was.
  bool Leave(const std::string& name) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return errno == EEXIST;
    close(fd);
    names_.push_back(name);
    return true;
  }
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
};

// Plants a leftover under each of the `count` names `names` gives next;
// false, after a test failure naming it, where one cannot be made.
inline bool LeaveNamesAhead(StaleNames& stale, const NameSequence& names,
                            int count) {
  for (int ahead = 0; ahead < count; ++ahead) {
    const std::string name = names.Ahead(ahead);
    if (!stale.Leave(name)) {
      ADD_FAILURE() << name << ": " << std::strerror(errno);
      return false;
    }
  }
  return true;
}

// Whether an object named `name` exists.
inline bool ShmExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  const int error = errno;
  if (fd >= 0) close(fd);
  return fd >= 0 || error != ENOENT;
}

// The size of the object named `name`, or -1 where there is none.
inline int64_t ShmObjectSize(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return -1;
  struct stat st;
  const int rc = fstat(fd, &st);
  close(fd);
  return rc == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// Every leftover is as it was planted: there, and empty.
inline void ExpectLeftAsTheyWere(const StaleNames& stale) {
  for (const std::string& name : stale.names()) {
    EXPECT_EQ(ShmObjectSize(name), 0) << name;
  }
}

// The first name from names.Ahead(from) on that no object has, within
// kFreshNameAttempts: where a construction that skips `from` leftovers
// lands, past any other leftover.
inline std::string FirstFreeNameAhead(const NameSequence& names, int from) {
  int ahead = from;
  while (ahead < kFreshNameAttempts && ShmExists(names.Ahead(ahead))) ++ahead;
  return names.Ahead(ahead);
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_SHM_NAMES_H_
