// Interposed data calls. read/readv/recv/recvfrom/recvmsg/recvmmsg collapse to one receive
// and write/writev/send/sendto/sendmsg/sendmmsg/sendfile to one send, so each semantic is
// implemented once (in core's Stream) for accelerated sockets; plain TCP connections pass
// through to libc and are only counted.
#include <sys/sendfile.h>

#include <cerrno>
#include <cstring>

#include "core/stats.h"
#include "preload/export.h"
#include "preload/fd_table.h"
#include "preload/handshake.h"
#include "preload/libc.h"

using namespace slip;
using namespace slip::preload;

namespace {

ssize_t AccelRecv(SlipSocket* s, const iovec* iov, int iovcnt, int flags) noexcept {
  ssize_t n = s->stream->Recv(iov, iovcnt, flags, s->nonblocking.load(std::memory_order_relaxed));
  if (n > 0 && !(flags & MSG_PEEK)) StatsAddReceived(s->stats, uint64_t(n));
  return ToLibc(n);
}

ssize_t AccelSend(SlipSocket* s, const iovec* iov, int iovcnt, int flags) noexcept {
  ssize_t n = s->stream->Send(iov, iovcnt, flags, s->nonblocking.load(std::memory_order_relaxed));
  if (n > 0) StatsAddSent(s->stats, uint64_t(n));
  return ToLibc(n);
}

void RecordIfPending(const SocketRef& ref, int fd) noexcept {
  SlipSocket* s = ref.get();
  if (s && s->stats_pending.load(std::memory_order_acquire)) RecordPendingPlain(s, fd);
}

ssize_t CountReceived(const SocketRef& ref, int fd, ssize_t n) noexcept {
  if (n <= 0) return n;
  RecordIfPending(ref, fd);
  if (ref.counted()) StatsAddReceived(ref.get()->stats, uint64_t(n));
  return n;
}

ssize_t CountSent(const SocketRef& ref, int fd, ssize_t n) noexcept {
  if (n <= 0) return n;
  RecordIfPending(ref, fd);
  if (ref.counted()) StatsAddSent(ref.get()->stats, uint64_t(n));
  return n;
}

// TCP fills in no source address: report an empty one, as the kernel does.
void ClearName(sockaddr* addr, socklen_t* len) noexcept {
  if (addr && len) *len = 0;
}

}  // namespace

SLIP_EXPORT ssize_t read(int fd, void* buf, size_t n) {
  SocketRef ref(fd);
  if (ref.accelerated()) {
    iovec iov{buf, n};
    return AccelRecv(ref.get(), &iov, 1, 0);
  }
  return CountReceived(ref, fd, Libc().read(fd, buf, n));
}

SLIP_EXPORT ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen) {
  if (n > buflen) __builtin_trap();  // what glibc's checked variant does (via __chk_fail)
  return read(fd, buf, n);
}

SLIP_EXPORT ssize_t readv(int fd, const iovec* iov, int iovcnt) {
  SocketRef ref(fd);
  if (ref.accelerated()) return AccelRecv(ref.get(), iov, iovcnt, 0);
  return CountReceived(ref, fd, Libc().readv(fd, iov, iovcnt));
}

SLIP_EXPORT ssize_t recv(int fd, void* buf, size_t n, int flags) {
  SocketRef ref(fd);
  if (ref.accelerated()) {
    iovec iov{buf, n};
    return AccelRecv(ref.get(), &iov, 1, flags);
  }
  return CountReceived(ref, fd, Libc().recv(fd, buf, n, flags));
}

SLIP_EXPORT ssize_t __recv_chk(int fd, void* buf, size_t n, size_t buflen, int flags) {
  if (n > buflen) __builtin_trap();
  return recv(fd, buf, n, flags);
}

SLIP_EXPORT ssize_t recvfrom(int fd, void* buf, size_t n, int flags, sockaddr* addr,
                             socklen_t* len) {
  SocketRef ref(fd);
  if (ref.accelerated()) {
    iovec iov{buf, n};
    ClearName(addr, len);
    return AccelRecv(ref.get(), &iov, 1, flags);
  }
  return CountReceived(ref, fd, Libc().recvfrom(fd, buf, n, flags, addr, len));
}

SLIP_EXPORT ssize_t __recvfrom_chk(int fd, void* buf, size_t n, size_t buflen, int flags,
                                   sockaddr* addr, socklen_t* len) {
  if (n > buflen) __builtin_trap();
  return recvfrom(fd, buf, n, flags, addr, len);
}

SLIP_EXPORT ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  SocketRef ref(fd);
  if (ref.accelerated()) {
    msg->msg_namelen = 0;
    msg->msg_controllen = 0;
    msg->msg_flags = 0;
    return AccelRecv(ref.get(), msg->msg_iov, int(msg->msg_iovlen), flags);
  }
  return CountReceived(ref, fd, Libc().recvmsg(fd, msg, flags));
}

SLIP_EXPORT int recvmmsg(int fd, mmsghdr* msgs, unsigned vlen, int flags, timespec* timeout) {
  SocketRef ref(fd);
  if (!ref.accelerated()) return Libc().recvmmsg(fd, msgs, vlen, flags, timeout);
  // A stream has no message boundaries: fill entries while bytes are ready.
  unsigned i = 0;
  for (; i < vlen; ++i) {
    int f = (i > 0 || (flags & MSG_WAITFORONE)) && i > 0 ? (flags | MSG_DONTWAIT) : flags;
    f &= ~MSG_WAITFORONE;
    msgs[i].msg_hdr.msg_namelen = 0;
    msgs[i].msg_hdr.msg_controllen = 0;
    msgs[i].msg_hdr.msg_flags = 0;
    ssize_t n = AccelRecv(ref.get(), msgs[i].msg_hdr.msg_iov, int(msgs[i].msg_hdr.msg_iovlen), f);
    if (n < 0) return i > 0 ? int(i) : -1;
    msgs[i].msg_len = unsigned(n);
    if (n == 0) return int(i + 1);
  }
  return int(i);
}

SLIP_EXPORT ssize_t write(int fd, const void* buf, size_t n) {
  SocketRef ref(fd);
  if (ref.accelerated()) {
    iovec iov{const_cast<void*>(buf), n};
    return AccelSend(ref.get(), &iov, 1, 0);
  }
  return CountSent(ref, fd, Libc().write(fd, buf, n));
}

SLIP_EXPORT ssize_t writev(int fd, const iovec* iov, int iovcnt) {
  SocketRef ref(fd);
  if (ref.accelerated()) return AccelSend(ref.get(), iov, iovcnt, 0);
  return CountSent(ref, fd, Libc().writev(fd, iov, iovcnt));
}

SLIP_EXPORT ssize_t send(int fd, const void* buf, size_t n, int flags) {
  SocketRef ref(fd);
  if (ref.accelerated()) {
    iovec iov{const_cast<void*>(buf), n};
    return AccelSend(ref.get(), &iov, 1, flags);
  }
  return CountSent(ref, fd, Libc().send(fd, buf, n, flags));
}

SLIP_EXPORT ssize_t sendto(int fd, const void* buf, size_t n, int flags, const sockaddr* addr,
                           socklen_t len) {
  SocketRef ref(fd);
  if (ref.accelerated()) {
    iovec iov{const_cast<void*>(buf), n};
    return AccelSend(ref.get(), &iov, 1, flags);
  }
  return CountSent(ref, fd, Libc().sendto(fd, buf, n, flags, addr, len));
}

SLIP_EXPORT ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  SocketRef ref(fd);
  if (ref.accelerated()) return AccelSend(ref.get(), msg->msg_iov, int(msg->msg_iovlen), flags);
  return CountSent(ref, fd, Libc().sendmsg(fd, msg, flags));
}

SLIP_EXPORT int sendmmsg(int fd, mmsghdr* msgs, unsigned vlen, int flags) {
  SocketRef ref(fd);
  if (!ref.accelerated()) return Libc().sendmmsg(fd, msgs, vlen, flags);
  unsigned i = 0;
  for (; i < vlen; ++i) {
    ssize_t n =
        AccelSend(ref.get(), msgs[i].msg_hdr.msg_iov, int(msgs[i].msg_hdr.msg_iovlen), flags);
    if (n < 0) return i > 0 ? int(i) : -1;
    msgs[i].msg_len = unsigned(n);
  }
  return int(i);
}

namespace {

// sendfile into an accelerated socket: read the file through a per-thread bounce buffer
// (allocated once per thread, not per call) and send it like write().
ssize_t AccelSendfile(SlipSocket* s, int in_fd, off_t* offset, size_t count) noexcept {
  static thread_local char* buffer = nullptr;
  constexpr size_t kChunk = 64 * 1024;
  if (!buffer) buffer = static_cast<char*>(::operator new(kChunk, std::nothrow));
  if (!buffer) {
    errno = ENOMEM;
    return -1;
  }
  size_t done = 0;
  off_t pos = offset ? *offset : 0;
  while (done < count) {
    size_t want = count - done < kChunk ? count - done : kChunk;
    ssize_t got = offset ? pread(in_fd, buffer, want, pos) : Libc().read(in_fd, buffer, want);
    if (got < 0) {
      if (done > 0) break;
      return -1;
    }
    if (got == 0) break;
    iovec iov{buffer, size_t(got)};
    ssize_t sent = AccelSend(s, &iov, 1, 0);
    if (sent < 0) {
      if (!offset && done == 0) return -1;
      if (done == 0) return -1;
      break;
    }
    done += size_t(sent);
    pos += sent;
    if (sent < got) {
      // The ring took part of the chunk (non-blocking): rewind the file to match.
      if (!offset) lseek(in_fd, sent - got, SEEK_CUR);
      break;
    }
  }
  if (offset) *offset = pos;
  return ssize_t(done);
}

}  // namespace

SLIP_EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  SocketRef ref(out_fd);
  if (ref.accelerated()) return AccelSendfile(ref.get(), in_fd, offset, count);
  return CountSent(ref, out_fd, Libc().sendfile(out_fd, in_fd, offset, count));
}

SLIP_EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset, size_t count) {
  return sendfile(out_fd, in_fd, reinterpret_cast<off_t*>(offset), count);
}
