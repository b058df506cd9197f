// Process-level services for the decode service: the data directory, a per-model ownership lock,
// exiting with the parent. (Memory figures: platform/memory.h.)
//
// The implementation (process_posix.cpp) covers Linux and macOS; a Windows port adds
// process_win32.cpp behind the same interface.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace redwing::platform {

// Redwing's per-user data directory: $REDWING_HOME, else $XDG_DATA_HOME/redwing (Linux, when
// set and absolute, as core/paths.ts), else ~/Library/Application Support/Redwing (macOS) or
// ~/.local/share/redwing. Not created here.
std::string data_dir();

// The model is held by another live process. `owner_pid` is the pid written in the lock file
// (0 if it could not be read).
class LockHeld : public std::runtime_error {
 public:
  LockHeld(const std::string& message, long owner_pid)
      : std::runtime_error(message), owner_pid(owner_pid) {}
  long owner_pid;
};

// An exclusive advisory lock (flock) on a file, holding the owner's pid. The kernel drops the lock
// when the owning process dies, however it dies, so a stale file never blocks a new owner.
// Move-only; released (the file is left in place, unlocked) on destruction.
class FileLock {
 public:
  // Creates the parent directory if needed. Throws LockHeld if another open file description
  // holds the lock (another process, or another FileLock in this one), std::runtime_error on I/O
  // failure.
  static FileLock acquire(const std::string& path);
  FileLock() = default;
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  void reset() noexcept;
  int fd_ = -1;
  std::string path_;
};

// The lock file for a model directory: <data_dir>/locks/<basename>-<hash of the real path>.lock
// (the hash keeps two models with the same folder name apart).
std::string model_lock_path(const std::string& model_dir);

// Ends this process (SIGTERM semantics: _exit after `on_exit`, if given) when its parent process
// goes away. Linux: prctl(PR_SET_PDEATHSIG) plus a getppid() check (the parent may already be
// gone, and PDEATHSIG fires on the parent *thread's* exit); macOS: kqueue NOTE_EXIT on the parent
// pid; both: a watcher thread that polls getppid() every `poll_ms` as a backstop.
void exit_with_parent(int poll_ms = 500);

long current_pid();

}  // namespace redwing::platform
