// Paths that another local user may control: directories and files named by the
// environment (SLIP_RENDEZVOUS_DIR, SLIP_LOG_FILE, SLIP_STATS_FILE).
//
// A path is only as safe as every directory on it: whoever may write one of them can put a
// symbolic link, a FIFO or a hard link to somebody else's file where we expect our own. So
// a directory is trusted as OpenSSH's StrictModes and systemd trust one: each component,
// from the root down, is opened with O_NOFOLLOW (never through a link), and is owned by
// root or by this process's effective uid, and is writable by nobody else, except a
// sticky directory owned by root (/tmp, /dev/shm), in which nobody can remove or rename
// another user's entries. Once opened, the directory is used only through its descriptor
// (openat, fstatat, and for AF_UNIX names /proc/self/fd/<fd>/<name>), never by its path
// again, so what is checked is what is used. docs/SECURITY.md, "Files and directories".
#pragma once

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>

#include <cstddef>

namespace slip {

// Why a path is not trusted, for the one line that says so.
struct PathVerdict {
  char why[200] = {};
};

// A directory opened and checked as above. Move-only; closes its descriptor.
class TrustedDir {
 public:
  TrustedDir() noexcept = default;
  ~TrustedDir();
  TrustedDir(TrustedDir&& other) noexcept;
  TrustedDir& operator=(TrustedDir&& other) noexcept;
  TrustedDir(const TrustedDir&) = delete;
  TrustedDir& operator=(const TrustedDir&) = delete;

  // Opens `path` (absolute; a relative one is taken from the working directory, whose
  // ancestors are checked too) with its descriptor at or above `fd_floor` (close-on-exec).
  // False, with `verdict` saying which component failed and why, when any is untrusted,
  // missing or not a directory, or when the descriptor cannot be reached through
  // /proc/self/fd (no /proc).
  bool Open(const char* path, int fd_floor, PathVerdict* verdict) noexcept;

  bool is_open() const noexcept { return fd_ >= 0; }
  int fd() const noexcept { return fd_; }
  uid_t owner() const noexcept { return owner_; }
  // Writable by other users (a sticky directory of root's): any uid may create entries,
  // so an entry is believed only as its owner's.
  bool shared() const noexcept { return shared_; }
  // Whether the descriptor still names the directory that was checked (the same inode, not
  // removed since; a program that closed it and reused the number fails this) and the
  // directory itself would still pass: the same owner, nobody else newly allowed to write.
  bool StillValid() const noexcept;
  // A second handle on the same directory (its descriptor duplicated at or above
  // `fd_floor`), for an owner that keeps it. False when no descriptor is free.
  bool Duplicate(int fd_floor, TrustedDir* out) const noexcept;

  // The AF_UNIX address of entry `name` reached through the descriptor (bind and connect
  // take no directory descriptor). False when it does not fit a sockaddr_un.
  bool Address(const char* name, sockaddr_un* out, socklen_t* len) const noexcept;
  // fstatat of entry `name`, never following a link: 0 or -errno.
  int Stat(const char* name, struct stat* st) const noexcept;
  // Makes entry `name`, a socket this process just bound, accessible to every user (mode
  // 0666), without following a link: it must still be a socket of our uid. 0 or -errno.
  int OpenSocketToAll(const char* name) const noexcept;
  // Removes entry `name` if it is still the socket `inode` of our uid (0: any socket of
  // ours). True when it did.
  bool RemoveSocket(const char* name, ino_t inode) const noexcept;

 private:
  void TakeFacts(const TrustedDir& other) noexcept;  // all but the descriptor

  int fd_ = -1;
  uid_t owner_ = 0;
  bool shared_ = false;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Opens, for appending, the file at `path` (SLIP_LOG_FILE, SLIP_STATS_FILE): its directory
// must be trusted (TrustedDir), the file never a link, and either a regular file of this
// process's uid with no other name (a hard link would make us write into whatever file it
// names) or none, which is then created exclusively (mode 0644). Never blocks (a FIFO is
// refused, not waited on). Returns the descriptor (close-on-exec, wherever open put it:
// the caller moves it), or -1 with `verdict` saying why.
int OpenOwnFileForAppend(const char* path, PathVerdict* verdict) noexcept;

// Opens `path` for reading under the same rules (a regular file of our uid, one name,
// never a link, never blocking), for a file this process wrote before (slip-run's
// summary of its stats). -1 with `verdict` saying why.
int OpenOwnFileForRead(const char* path, PathVerdict* verdict) noexcept;

}  // namespace slip
