// The lock of a run directory (fp4/train/run_lock.h).
#include "fp4/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fp4/base/error.h"

namespace fp4 {
namespace fs = std::filesystem;

RunDirLock::RunDirLock(const fs::path& dir, const std::string& busy_hint, bool create) {
  const fs::path p = dir / ".fp4train.lock";
  if (!create && !fs::exists(p)) return;
  fd_ = create ? ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644) : ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw UserError("cannot open " + p.string() + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK)
      throw UserError(dir.string() + " is in use by another fp4train process (it holds " +
                      p.string() + "); " + busy_hint);
    throw UserError("cannot lock " + p.string() + ": " + std::strerror(e));
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace fp4
