// A file system that fills up, for machines where the disk-full test cannot
// mount a tmpfs (not root, a container): an LD_PRELOAD library that makes
// every write to a file under OPGUARD_TEST_ENOSPC_DIR fail with ENOSPC once the
// bytes written there pass OPGUARD_TEST_ENOSPC_BYTES, as a full disk of that size
// would. Deleting a file there gives its bytes back (the recorder frees its
// space reserve that way). The budget is per process: the training process
// is the one that writes the step files.
//
// Interposed: write, pwrite, pwrite64, writev (HDF5's sec2 driver, the
// recorder), posix_fallocate, posix_fallocate64 (the space reserve), unlink,
// unlinkat. Everything else, and every file outside the directory, passes
// through untouched. The variables are OPGUARD_TEST_* so that opguard record
// passes them to the program it records.

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct Budget {
  std::string dir;  // with a trailing '/'
  uint64_t capacity = 0;
  std::atomic<uint64_t> used{0};

  Budget() {
    const char* d = std::getenv("OPGUARD_TEST_ENOSPC_DIR");
    const char* b = std::getenv("OPGUARD_TEST_ENOSPC_BYTES");
    if (d == nullptr || *d == '\0' || b == nullptr) return;
    char resolved[PATH_MAX];
    if (::realpath(d, resolved) == nullptr) return;
    dir = std::string(resolved) + "/";
    capacity = std::strtoull(b, nullptr, 10);
  }

  bool active() const { return !dir.empty(); }
  bool covers_path(const char* path) const {
    if (!active() || path == nullptr) return false;
    char resolved[PATH_MAX];
    // The file itself may be gone or not yet exist: resolve its directory.
    std::string p(path);
    const auto slash = p.rfind('/');
    std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
    if (::realpath(parent.c_str(), resolved) == nullptr) return false;
    return (std::string(resolved) + "/").rfind(dir, 0) == 0;
  }
  bool covers_fd(int fd) const {
    if (!active() || fd < 0) return false;
    char link[64], target[PATH_MAX];
    std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    const ssize_t n = ::readlink(link, target, sizeof(target) - 1);
    if (n <= 0) return false;
    target[n] = '\0';
    return std::string(target).rfind(dir, 0) == 0;
  }
  // Claims n bytes; false (the disk is full) if they do not fit.
  bool claim(uint64_t n) {
    uint64_t now = used.load();
    do {
      if (now + n > capacity) return false;
    } while (!used.compare_exchange_weak(now, now + n));
    return true;
  }
  // Whether a write of n bytes to fd fails because the budget is spent (it
  // claims the bytes when it does not).
  bool refuses(int fd, uint64_t n) { return n > 0 && covers_fd(fd) && !claim(n); }
  void give_back(uint64_t n) {
    uint64_t now = used.load();
    while (!used.compare_exchange_weak(now, now > n ? now - n : 0)) {
    }
  }
};

Budget& budget() {
  static Budget b;
  return b;
}

template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

uint64_t size_of(int dirfd, const char* path) {
  struct stat st {};
  if (::fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 0;
  return static_cast<uint64_t>(st.st_size);
}

ssize_t no_space() {
  errno = ENOSPC;
  return -1;
}

// Runs `remove` (the real unlink or unlinkat) and gives the file's bytes back
// when it removed a file of the budget's directory.
template <typename Remove>
int removing(bool ours, int dirfd, const char* path, Remove&& remove) {
  const uint64_t bytes = ours ? size_of(dirfd, path) : 0;
  const int rc = remove();
  if (rc == 0 && bytes > 0) budget().give_back(bytes);
  return rc;
}

}  // namespace

extern "C" {

ssize_t write(int fd, const void* buf, size_t n) {
  static auto real = next<ssize_t (*)(int, const void*, size_t)>("write");
  return budget().refuses(fd, n) ? no_space() : real(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) {
  static auto real = next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  return budget().refuses(fd, n) ? no_space() : real(fd, buf, n, offset);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t offset) {
  static auto real = next<ssize_t (*)(int, const void*, size_t, off64_t)>("pwrite64");
  return budget().refuses(fd, n) ? no_space() : real(fd, buf, n, offset);
}

ssize_t writev(int fd, const struct iovec* iov, int count) {
  static auto real = next<ssize_t (*)(int, const struct iovec*, int)>("writev");
  uint64_t n = 0;
  for (int i = 0; i < count; ++i) n += iov[i].iov_len;
  return budget().refuses(fd, n) ? no_space() : real(fd, iov, count);
}

int posix_fallocate(int fd, off_t offset, off_t len) {
  static auto real = next<int (*)(int, off_t, off_t)>("posix_fallocate");
  return len > 0 && budget().refuses(fd, static_cast<uint64_t>(len)) ? ENOSPC : real(fd, offset, len);
}

int posix_fallocate64(int fd, off64_t offset, off64_t len) {
  static auto real = next<int (*)(int, off64_t, off64_t)>("posix_fallocate64");
  return len > 0 && budget().refuses(fd, static_cast<uint64_t>(len)) ? ENOSPC : real(fd, offset, len);
}

int unlinkat(int dirfd, const char* path, int flags) {
  static auto real = next<int (*)(int, const char*, int)>("unlinkat");
  return removing(path[0] == '/' && budget().covers_path(path), dirfd, path, [&] { return real(dirfd, path, flags); });
}

int unlink(const char* path) {
  static auto real = next<int (*)(const char*)>("unlink");
  return removing(budget().covers_path(path), AT_FDCWD, path, [&] { return real(path); });
}

}  // extern "C"
