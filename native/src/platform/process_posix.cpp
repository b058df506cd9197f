// POSIX implementation of platform/process.h (Linux, macOS).
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/prctl.h>
#elif defined(__APPLE__)
#include <sys/event.h>
#endif

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "platform/process.h"

namespace redwing::platform {
namespace fs = std::filesystem;

std::string data_dir() {
  if (const char* home = std::getenv("REDWING_HOME"); home && *home) return home;
#if defined(__APPLE__)
  const char* user = std::getenv("HOME");
  return std::string(user ? user : ".") + "/Library/Application Support/Redwing";
#else
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && xdg[0] == '/')
    return std::string(xdg) + "/redwing";
  const char* user = std::getenv("HOME");
  return std::string(user ? user : ".") + "/.local/share/redwing";
#endif
}

std::string model_lock_path(const std::string& model_dir) {
  std::error_code ec;
  fs::path real = fs::weakly_canonical(fs::absolute(model_dir), ec);
  if (ec) real = fs::absolute(model_dir);
  std::string name = real.filename().string();
  if (name.empty()) name = "model";
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  // FNV-1a of the real path: stable across runs and processes.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : real.string()) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return data_dir() + "/locks/" + name + "-" + std::string(hex, 12) + ".lock";
}

FileLock FileLock::acquire(const std::string& path) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec)
    throw std::runtime_error("cannot create " + fs::path(path).parent_path().string() + ": " +
                             ec.message());
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error("cannot open lock file " + path + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    long owner = 0;
    char buf[32] = {};
    if (::pread(fd, buf, sizeof(buf) - 1, 0) > 0) owner = std::strtol(buf, nullptr, 10);
    ::close(fd);
    if (err == EWOULDBLOCK)
      throw LockHeld("the model is in use by another Redwing engine process (pid " +
                         std::to_string(owner) + "; lock file " + path + ")",
                     owner);
    throw std::runtime_error("cannot lock " + path + ": " + std::strerror(err));
  }
  // Write our pid only once the lock is ours, so the file always names the live owner.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error("cannot write lock file " + path + ": " + std::strerror(err));
  }
  FileLock lock;
  lock.fd_ = fd;
  lock.path_ = path;
  return lock;
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() { reset(); }

void FileLock::reset() noexcept {
  if (fd_ >= 0) {
    // Empty the file before unlocking so it never names a process that no longer owns it.
    if (::ftruncate(fd_, 0) != 0) {
    }
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  fd_ = -1;
}

void exit_with_parent(int poll_ms) {
  const pid_t parent = ::getppid();
#if defined(__linux__)
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
  // The parent may have died before prctl took effect: we were then reparented already.
  if (parent == 1 || ::getppid() != parent) _exit(0);
  std::thread([parent, poll_ms] {
#if defined(__APPLE__)
    int kq = ::kqueue();
    if (kq >= 0) {
      struct kevent change;
      EV_SET(&change, parent, EVFILT_PROC, EV_ADD | EV_ONESHOT, NOTE_EXIT, 0, nullptr);
      struct kevent event;
      struct timespec timeout = {poll_ms / 1000, (poll_ms % 1000) * 1000000L};
      if (::kevent(kq, &change, 1, nullptr, 0, nullptr) == 0) {
        while (::getppid() == parent) {
          if (::kevent(kq, nullptr, 0, &event, 1, &timeout) > 0) break;
        }
        _exit(0);
      }
    }
#endif
    while (::getppid() == parent) std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
    _exit(0);
  }).detach();
}

long current_pid() { return static_cast<long>(::getpid()); }

}  // namespace redwing::platform
