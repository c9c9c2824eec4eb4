// The lock of a run directory: DIR/.fp4train.lock, held with flock by the one process that
// trains into DIR (fp4::train) or rewrites its files (`fp4train compact`). The kernel releases
// it when the process ends, however it ends, so a killed run never leaves a stale lock.
#pragma once
#include <filesystem>
#include <string>

namespace fp4 {

/// An exclusive advisory lock on DIR/.fp4train.lock while the object lives.
class RunDirLock {
 public:
  /// Take the lock without waiting. `busy_hint` ends the error when another process holds
  /// it ("<dir> is in use by another fp4train process (it holds <file>); <busy_hint>").
  /// `create`: create the lock file when missing (a process about to train); false: a
  /// directory without one is not locked (no training ever ran there) and none is created.
  /// Throws fp4::UserError when the file cannot be opened or locked, or is held.
  RunDirLock(const std::filesystem::path& dir, const std::string& busy_hint, bool create = true);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace fp4
