// Paths another local user may control (core/trusted_path.h).
#include "core/trusted_path.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/sys.h"

namespace slip {

namespace {

void Say(PathVerdict* verdict, const char* fmt, ...) noexcept {
  if (!verdict) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(verdict->why, sizeof(verdict->why), fmt, ap);
  va_end(ap);
}

// Whether a directory owned by `st` may hold what we trust: root's or ours, and writable
// by nobody else unless it is root's and sticky.
const char* UntrustedBecause(const struct stat& st, uid_t self) noexcept {
  if (st.st_uid != 0 && st.st_uid != self) return "owned by another user";
  const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (others_write && !((st.st_mode & S_ISVTX) && st.st_uid == 0)) return "writable by other users";
  return nullptr;
}

// Splits `path` into its directory (into `out`: "." when it has none) and its last
// component. False when the directory does not fit.
bool SplitPath(const char* path, char* out, size_t out_len, const char** name) noexcept {
  const char* slash = strrchr(path, '/');
  *name = slash ? slash + 1 : path;
  if (!slash) {
    std::strcpy(out, ".");
    return true;
  }
  const size_t dir_len = slash == path ? 1 : size_t(slash - path);  // ("/x": the root)
  if (dir_len + 1 > out_len) return false;
  std::memcpy(out, path, dir_len);
  out[dir_len] = '\0';
  return true;
}

// Opens a file of `dir` for `flags` (O_WRONLY|O_APPEND or O_RDONLY), never through a link
// and never blocking, creating it exclusively when `create` and it is not there; then
// requires a regular file of our uid with one name.
int OpenOwnFile(const char* path, int flags, bool create, PathVerdict* verdict) noexcept {
  char dir_path[PATH_MAX];
  const char* name = nullptr;
  if (!path || !*path || !SplitPath(path, dir_path, sizeof(dir_path), &name)) {
    Say(verdict, "the path is empty or too long");
    return -1;
  }
  if (!*name || std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) {
    Say(verdict, "\"%s\" names a directory, not a file", path);
    return -1;
  }
  TrustedDir dir;
  if (!dir.Open(dir_path, 0, verdict)) return -1;
  // Not even opened unless it is a regular file (opening a device can act on it); what
  // is opened is looked at again, since the entry may change in between.
  struct stat st;
  if (fstatat(dir.fd(), name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
    Say(verdict, "%s", S_ISLNK(st.st_mode) ? "it is a symbolic link" : "it is not a regular file");
    errno = EPERM;
    return -1;
  }
  const int base = flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  int fd = openat(dir.fd(), name, base);
  // Several processes may create it at once (a server's workers write their stats at
  // exit together): the one that loses the exclusive create opens the winner's file.
  for (int tries = 0; fd < 0 && errno == ENOENT && create && tries < 3; ++tries) {
    fd = openat(dir.fd(), name, base | O_CREAT | O_EXCL, 0644);
    if (fd < 0 && errno == EEXIST) fd = openat(dir.fd(), name, base);
  }
  if (fd < 0) {
    const int err = errno;
    // (O_NOFOLLOW's ELOOP, and O_NONBLOCK's ENXIO for a FIFO nobody reads, say what it is.)
    Say(verdict, "%s",
        err == ELOOP   ? "it is a symbolic link"
        : err == ENXIO ? "it is a FIFO or a device, not a regular file"
                       : strerror(err));
    errno = err;
    return -1;
  }
  const char* bad = nullptr;
  if (fstat(fd, &st) != 0)
    bad = "it cannot be examined";
  else if (!S_ISREG(st.st_mode))
    bad = "it is not a regular file";
  else if (st.st_uid != geteuid())
    bad = "it belongs to another user";
  else if (st.st_nlink != 1)
    bad = "it has other names (hard links)";
  if (bad) {
    Say(verdict, "%s", bad);
    sys::close(fd);
    errno = EPERM;
    return -1;
  }
  // (A regular file never blocks; leaving O_NONBLOCK set changes nothing for it.)
  return fd;
}

}  // namespace

TrustedDir::~TrustedDir() {
  if (fd_ >= 0) sys::close(fd_);
}

TrustedDir::TrustedDir(TrustedDir&& other) noexcept {
  *this = std::move(other);
}

TrustedDir& TrustedDir::operator=(TrustedDir&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) sys::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    TakeFacts(other);
  }
  return *this;
}

void TrustedDir::TakeFacts(const TrustedDir& other) noexcept {
  owner_ = other.owner_;
  shared_ = other.shared_;
  dev_ = other.dev_;
  ino_ = other.ino_;
}

bool TrustedDir::Open(const char* path, int fd_floor, PathVerdict* verdict) noexcept {
  // `rest` holds what is left to walk (a link's target is put in front of it), `shown` the
  // directories walked so far, for the verdict.
  char rest[PATH_MAX];
  char shown[PATH_MAX] = "";
  if (!path || !*path) {
    Say(verdict, "the path is empty");
    return false;
  }
  if (path[0] == '/') {
    if (strlen(path) >= sizeof(rest)) {
      Say(verdict, "the path is too long");
      return false;
    }
    std::strcpy(rest, path);
  } else if (!getcwd(rest, sizeof(rest)) || strlen(rest) + 1 + strlen(path) >= sizeof(rest)) {
    Say(verdict, "the working directory cannot be named");
    return false;
  } else {
    std::strcat(rest, "/");
    std::strcat(rest, path);
  }
  const uid_t self = geteuid();
  struct stat st;
  int fd = -1;
  int links = 0;
  size_t at = 0;  // rest[at...] is still to walk
  bool walked = false;
  for (;;) {
    if (at == 0 && rest[0] == '/') {  // (from the root: the path, or an absolute link's target)
      if (fd >= 0) sys::close(fd);
      fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
      shown[0] = '\0';
      if (fd < 0 || fstat(fd, &st) != 0) {
        Say(verdict, "/ cannot be opened: %s", strerror(errno));
        break;
      }
      if (const char* bad = UntrustedBecause(st, self)) {
        Say(verdict, "/ is %s", bad);
        break;
      }
    }
    while (rest[at] == '/') ++at;
    if (!rest[at]) {
      walked = true;
      break;
    }
    char* name = rest + at;
    char* end = strchr(name, '/');
    at = end ? size_t(end - rest) : strlen(rest);
    if (end) *end = '\0';
    if (std::strcmp(name, ".") == 0) {
      if (end) *end = '/';
      continue;
    }
    // Each component is opened without following a link: what it is, it is.
    const int next = openat(fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 || fstat(next, &st) != 0) {
      Say(verdict, "%s/%s cannot be opened: %s", shown, name, strerror(errno));
      if (next >= 0) sys::close(next);
      break;
    }
    if (std::strcmp(name, "..") == 0) {
      char* last = strrchr(shown, '/');
      if (last) *last = '\0';
    } else if (strlen(shown) + 1 + strlen(name) < sizeof(shown)) {
      std::strcat(shown, "/");
      std::strcat(shown, name);
    }
    if (S_ISLNK(st.st_mode)) {
      // A link is followed only as a trusted user made it (the directory holding it is
      // trusted; in a sticky one anybody may make links, so the link's owner counts too),
      // and its target is walked under the same rules: /var/run -> /run stays usable.
      char target[PATH_MAX];
      const ssize_t n = readlinkat(next, "", target, sizeof(target) - 1);
      sys::close(next);
      if (st.st_uid != 0 && st.st_uid != self) {
        Say(verdict, "%s is a symbolic link of another user", shown);
        break;
      }
      if (n <= 0 || ++links > 40) {
        Say(verdict, "%s is a symbolic link that cannot be followed", shown);
        break;
      }
      target[n] = '\0';
      if (end) *end = '/';
      const size_t left = strlen(rest + at);
      if (size_t(n) + 1 + left >= sizeof(rest)) {
        Say(verdict, "%s leads to a path too long", shown);
        break;
      }
      // rest := target + "/" + what was left after the link.
      std::memmove(rest + n + 1, rest + at, left + 1);
      std::memcpy(rest, target, size_t(n));
      rest[n] = '/';
      at = 0;
      char* last = strrchr(shown, '/');
      if (last) *last = '\0';  // (a relative target is walked from the link's directory)
      continue;
    }
    if (end) *end = '/';
    sys::close(fd);
    fd = next;
    if (!S_ISDIR(st.st_mode)) {
      Say(verdict, "%s is not a directory", shown);
      break;
    }
    if (const char* bad = UntrustedBecause(st, self)) {
      Say(verdict, "%s is %s (uid %u, mode %04o)", shown, bad, unsigned(st.st_uid),
          unsigned(st.st_mode & 07777));
      break;
    }
  }
  if (!walked) {
    if (fd >= 0) sys::close(fd);
    return false;
  }
  fd = sys::MoveAbove(fd, fd_floor);
  if (fd < 0) {
    Say(verdict, "no descriptor is free for it");
    return false;
  }
  if (fd_ >= 0) sys::close(fd_);
  fd_ = fd;
  owner_ = st.st_uid;
  shared_ = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  // AF_UNIX names are reached through /proc/self/fd: it must lead to this very directory.
  char proc[32];
  snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd_);
  struct stat via;
  if (stat(proc, &via) != 0 || via.st_dev != dev_ || via.st_ino != ino_) {
    Say(verdict, "it cannot be reached through /proc/self/fd (is /proc mounted?)");
    sys::close(fd_);
    fd_ = -1;
    return false;
  }
  return true;
}

bool TrustedDir::StillValid() const noexcept {
  struct stat st;
  // Its owner and mode are looked at again too: a directory handed to another user, or
  // opened to other users' writes, since it was checked is no longer trusted.
  return fd_ >= 0 && fstat(fd_, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_ &&
         st.st_nlink > 0 && st.st_uid == owner_ &&
         ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) == shared_ &&
         UntrustedBecause(st, geteuid()) == nullptr;
}

bool TrustedDir::Duplicate(int fd_floor, TrustedDir* out) const noexcept {
  if (fd_ < 0) return false;
  const int fd = sys::DupAbove(fd_, fd_floor);
  if (fd < 0) return false;
  TrustedDir copy;
  copy.fd_ = fd;
  copy.TakeFacts(*this);
  *out = std::move(copy);
  return true;
}

bool TrustedDir::Address(const char* name, sockaddr_un* out, socklen_t* len) const noexcept {
  if (fd_ < 0) return false;
  std::memset(out, 0, sizeof(*out));
  out->sun_family = AF_UNIX;
  const int n = snprintf(out->sun_path, sizeof(out->sun_path), "/proc/self/fd/%d/%s", fd_, name);
  if (n <= 0 || size_t(n) >= sizeof(out->sun_path)) return false;
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + size_t(n) + 1);
  return true;
}

int TrustedDir::Stat(const char* name, struct stat* st) const noexcept {
  return fstatat(fd_, name, st, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}

int TrustedDir::OpenSocketToAll(const char* name) const noexcept {
  // chmod(2) by name would follow a link that replaced the socket (and make whatever it
  // names world-writable); through an O_PATH descriptor of the entry itself, it cannot.
  const int entry = openat(fd_, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (entry < 0) return -errno;
  struct stat st;
  int rc = 0;
  if (fstat(entry, &st) != 0)
    rc = -errno;
  else if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
    rc = -EPERM;
  if (rc == 0) {
    char proc[32];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", entry);
    if (chmod(proc, 0666) != 0) rc = -errno;
  }
  sys::close(entry);
  return rc;
}

bool TrustedDir::RemoveSocket(const char* name, ino_t inode) const noexcept {
  struct stat st;
  if (fd_ < 0 || Stat(name, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != geteuid() ||
      (inode != 0 && st.st_ino != inode))
    return false;
  return unlinkat(fd_, name, 0) == 0;
}

int OpenOwnFileForAppend(const char* path, PathVerdict* verdict) noexcept {
  return OpenOwnFile(path, O_WRONLY | O_APPEND, /*create=*/true, verdict);
}

int OpenOwnFileForRead(const char* path, PathVerdict* verdict) noexcept {
  return OpenOwnFile(path, O_RDONLY, /*create=*/false, verdict);
}

}  // namespace slip
