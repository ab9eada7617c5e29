// stdio on an accelerated socket: fdopen, dprintf, vdprintf.
//
// glibc's stdio reads and writes through its own internal read and write, past the
// interposed ones: a FILE made by fdopen on an accelerated socket would read the proxy's
// wake-up bytes and write into the proxy, where nobody takes the bytes to the peer. So
// fdopen of one makes a FILE whose reads and writes are the interposed read and write
// (fopencookie), with the descriptor's number as its fileno; dprintf formats first and
// writes through the interposed write. A FILE opened on a socket before it was connected
// (and so accelerated) still uses glibc's own (docs/COMPATIBILITY.md).
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>

#include "preload/export.h"
#include "preload/fd_table.h"
#include "preload/libc.h"

using namespace slip::preload;

namespace {

int FdOf(void* cookie) noexcept {
  return int(reinterpret_cast<intptr_t>(cookie));
}

ssize_t CookieRead(void* cookie, char* buf, size_t size) {
  const ssize_t n = read(FdOf(cookie), buf, size);
  return n;  // (-1 with errno: stdio marks the error, as for its own read)
}

ssize_t CookieWrite(void* cookie, const char* buf, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(FdOf(cookie), buf + done, size - done);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // (stdio keeps the rest buffered and reports the error)
  }
  return ssize_t(done);
}

int CookieClose(void* cookie) {
  return close(FdOf(cookie));
}

// Writes all of `buf` through the interposed write; -1 when it could not.
int WriteWhole(int fd, const char* buf, size_t len) noexcept {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = write(fd, buf + done, len - done);
    if (n > 0) {
      done += size_t(n);
    } else if (!(n < 0 && errno == EINTR)) {
      return -1;
    }
  }
  return int(len);
}

}  // namespace

SLIP_EXPORT FILE* fdopen(int fd, const char* mode) {
  if (!SocketRef(fd).accelerated()) return Libc().fdopen(fd, mode);
  cookie_io_functions_t io{CookieRead, CookieWrite, nullptr, CookieClose};
  FILE* file = fopencookie(reinterpret_cast<void*>(intptr_t(fd)), mode, io);
  // (fileno() answers the socket's number, as for glibc's own: programs poll it.)
  if (file) file->_fileno = fd;
  return file;
}

SLIP_EXPORT int vdprintf(int fd, const char* format, va_list args) {
  if (!SocketRef(fd).accelerated()) return Libc().vdprintf(fd, format, args);
  char small[1024];
  va_list again;
  va_copy(again, args);
  const int len = vsnprintf(small, sizeof(small), format, args);
  if (len < 0) {
    va_end(again);
    return -1;
  }
  if (size_t(len) < sizeof(small)) {
    va_end(again);
    return WriteWhole(fd, small, size_t(len));
  }
  char* big = static_cast<char*>(malloc(size_t(len) + 1));
  if (!big) {
    va_end(again);
    errno = ENOMEM;
    return -1;
  }
  vsnprintf(big, size_t(len) + 1, format, again);
  va_end(again);
  const int rc = WriteWhole(fd, big, size_t(len));
  free(big);
  return rc;
}

SLIP_EXPORT int dprintf(int fd, const char* format, ...) {
  va_list args;
  va_start(args, format);
  const int rc = vdprintf(fd, format, args);
  va_end(args);
  return rc;
}
