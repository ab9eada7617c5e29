// Interposed data calls. read/readv/recv/recvfrom/recvmsg/recvmmsg collapse to one receive
// and write/writev/send/sendto/sendmsg/sendmmsg/sendfile (and splice, both ways) to one send, so
// each semantic is implemented once (in core's Stream) for accelerated sockets; plain TCP
// connections pass through to libc and are only counted.
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/stats.h"
#include "core/sys.h"
#include "preload/export.h"
#include "preload/fd_table.h"
#include "preload/hand_back.h"
#include "preload/handshake.h"
#include "preload/libc.h"

using namespace slip;
using namespace slip::preload;

namespace {

// The connection was handed back to TCP while this call was inside the stream
// (preload/hand_back.h): once the hand-back has put the TCP socket at the program's
// numbers (it holds `s->mu` until then), the call is the kernel's.
void AwaitHandBack(SlipSocket* s) noexcept {
  std::lock_guard<std::mutex> lock(s->mu);
}

msghdr Msg(const iovec* iov, int iovcnt) noexcept {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = size_t(iovcnt);
  return m;
}

ssize_t AccelRecv(SlipSocket* s, int fd, const iovec* iov, int iovcnt, int flags) noexcept {
  if (flags & MSG_ERRQUEUE) {
    // The socket's error queue is the TCP connection's (empty: nothing is sent there with
    // MSG_ZEROCOPY or timestamps), never the stream.
    msghdr m = Msg(iov, iovcnt);
    return Libc().recvmsg(s->anchor_fd, &m, flags);
  }
  ssize_t n = s->stream->Recv(iov, iovcnt, flags, s->nonblocking.load(std::memory_order_relaxed));
  if (n == Stream::kHandedBack) {
    AwaitHandBack(s);
    msghdr m = Msg(iov, iovcnt);
    return Libc().recvmsg(fd, &m, flags);  // (counted by the plain socket's stats from here)
  }
  if (n > 0 && !(flags & MSG_PEEK)) StatsAddReceived(s->stats, uint64_t(n));
  return ToLibc(n);
}

ssize_t AccelSend(SlipSocket* s, int fd, const iovec* iov, int iovcnt, int flags) noexcept {
  ssize_t n = s->stream->Send(iov, iovcnt, flags, s->nonblocking.load(std::memory_order_relaxed));
  if (n == Stream::kHandedBack) {
    AwaitHandBack(s);
    msghdr m = Msg(iov, iovcnt);
    return Libc().sendmsg(fd, &m, flags);
  }
  if (n > 0) StatsAddSent(s->stats, uint64_t(n));
  return ToLibc(n);
}

// A MSG_ZEROCOPY send on a connection with SO_ZEROCOPY (its own or its listener's): the
// connection goes back to TCP first (preload/hand_back.h), and the send is the kernel's.
// Without SO_ZEROCOPY the kernel ignores the flag, and so does the ring.
bool HandedBackForZeroCopy(const SocketRef& ref, int fd, int flags) noexcept {
  if (!(flags & MSG_ZEROCOPY) || !ref->kernel_only.load(std::memory_order_relaxed)) return false;
  PrepareForKernelOption(ref.get(), fd);  // (fails with the connection reset)
  return ref->kind != SockKind::kAccel;
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
    return AccelRecv(ref.get(), fd, &iov, 1, 0);
  }
  return CountReceived(ref, fd, Libc().read(fd, buf, n));
}

SLIP_EXPORT ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen) {
  if (n > buflen) __builtin_trap();  // what glibc's checked variant does (via __chk_fail)
  return read(fd, buf, n);
}

SLIP_EXPORT ssize_t readv(int fd, const iovec* iov, int iovcnt) {
  SocketRef ref(fd);
  if (ref.accelerated()) return AccelRecv(ref.get(), fd, iov, iovcnt, 0);
  return CountReceived(ref, fd, Libc().readv(fd, iov, iovcnt));
}

SLIP_EXPORT ssize_t recv(int fd, void* buf, size_t n, int flags) {
  SocketRef ref(fd);
  if (ref.accelerated()) {
    iovec iov{buf, n};
    return AccelRecv(ref.get(), fd, &iov, 1, flags);
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
    return AccelRecv(ref.get(), fd, &iov, 1, flags);
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
    if (flags & MSG_ERRQUEUE) return Libc().recvmsg(ref.get()->anchor_fd, msg, flags);
    msg->msg_namelen = 0;
    msg->msg_controllen = 0;
    msg->msg_flags = 0;
    const ssize_t n = AccelRecv(ref.get(), fd, msg->msg_iov, int(msg->msg_iovlen), flags);
    if (n >= 0 && (flags & MSG_OOB)) msg->msg_flags = MSG_OOB;
    return n;
  }
  return CountReceived(ref, fd, Libc().recvmsg(fd, msg, flags));
}

SLIP_EXPORT int recvmmsg(int fd, mmsghdr* msgs, unsigned vlen, int flags, timespec* timeout) {
  SocketRef ref(fd);
  if (!ref.accelerated()) return Libc().recvmmsg(fd, msgs, vlen, flags, timeout);
  // A stream has no message boundaries: one receive per entry, as the kernel does it (each
  // may wait, unless MSG_WAITFORONE after the first; the timeout is looked at after each).
  const uint64_t deadline = timeout
                                ? sys::MonotonicNs() + uint64_t(timeout->tv_sec) * 1000000000ull +
                                      uint64_t(timeout->tv_nsec)
                                : 0;
  unsigned i = 0;
  for (; i < vlen; ++i) {
    if (timeout && i > 0 && sys::MonotonicNs() >= deadline) break;
    int f = (flags & MSG_WAITFORONE) && i > 0 ? (flags | MSG_DONTWAIT) : flags;
    f &= ~MSG_WAITFORONE;
    msgs[i].msg_hdr.msg_namelen = 0;
    msgs[i].msg_hdr.msg_controllen = 0;
    msgs[i].msg_hdr.msg_flags = 0;
    ssize_t n =
        AccelRecv(ref.get(), fd, msgs[i].msg_hdr.msg_iov, int(msgs[i].msg_hdr.msg_iovlen), f);
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
    return AccelSend(ref.get(), fd, &iov, 1, 0);
  }
  return CountSent(ref, fd, Libc().write(fd, buf, n));
}

SLIP_EXPORT ssize_t writev(int fd, const iovec* iov, int iovcnt) {
  SocketRef ref(fd);
  if (ref.accelerated()) return AccelSend(ref.get(), fd, iov, iovcnt, 0);
  return CountSent(ref, fd, Libc().writev(fd, iov, iovcnt));
}

SLIP_EXPORT ssize_t send(int fd, const void* buf, size_t n, int flags) {
  SocketRef ref(fd);
  if (ref.accelerated() && !HandedBackForZeroCopy(ref, fd, flags)) {
    iovec iov{const_cast<void*>(buf), n};
    return AccelSend(ref.get(), fd, &iov, 1, flags);
  }
  return CountSent(ref, fd, Libc().send(fd, buf, n, flags));
}

SLIP_EXPORT ssize_t sendto(int fd, const void* buf, size_t n, int flags, const sockaddr* addr,
                           socklen_t len) {
  SocketRef ref(fd);
  if (ref.accelerated() && !HandedBackForZeroCopy(ref, fd, flags)) {
    iovec iov{const_cast<void*>(buf), n};
    return AccelSend(ref.get(), fd, &iov, 1, flags);
  }
  return CountSent(ref, fd, Libc().sendto(fd, buf, n, flags, addr, len));
}

SLIP_EXPORT ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  SocketRef ref(fd);
  if (ref.accelerated() && !HandedBackForZeroCopy(ref, fd, flags))
    return AccelSend(ref.get(), fd, msg->msg_iov, int(msg->msg_iovlen), flags);
  return CountSent(ref, fd, Libc().sendmsg(fd, msg, flags));
}

SLIP_EXPORT int sendmmsg(int fd, mmsghdr* msgs, unsigned vlen, int flags) {
  SocketRef ref(fd);
  if (!ref.accelerated() || HandedBackForZeroCopy(ref, fd, flags))
    return Libc().sendmmsg(fd, msgs, vlen, flags);
  unsigned i = 0;
  for (; i < vlen; ++i) {
    ssize_t n =
        AccelSend(ref.get(), fd, msgs[i].msg_hdr.msg_iov, int(msgs[i].msg_hdr.msg_iovlen), flags);
    if (n < 0) return i > 0 ? int(i) : -1;
    msgs[i].msg_len = unsigned(n);
  }
  return int(i);
}

namespace {

// The per-thread bounce buffer of sendfile and splice (allocated once per thread, not per
// call), kChunk bytes; nullptr with errno ENOMEM when there is no memory for it.
constexpr size_t kChunk = 64 * 1024;

char* BounceBuffer() noexcept {
  static thread_local char* buffer = nullptr;
  if (!buffer) buffer = static_cast<char*>(::operator new(kChunk, std::nothrow));
  if (!buffer) errno = ENOMEM;
  return buffer;
}

// sendfile into an accelerated socket: read the file through the bounce buffer and send it
// like write().
ssize_t AccelSendfile(SlipSocket* s, int out_fd, int in_fd, off_t* offset, size_t count) noexcept {
  char* buffer = BounceBuffer();
  if (!buffer) return -1;
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
    ssize_t sent = AccelSend(s, out_fd, &iov, 1, 0);
    if (sent < 0) {
      // Nothing of this chunk went: the file's own position goes back to before it, or
      // the caller's retry would skip it.
      if (!offset) {
        const int saved = errno;
        lseek(in_fd, -got, SEEK_CUR);
        errno = saved;
      }
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

// splice(2) names a pipe at one end; at the other, an accelerated socket's number refers
// to its proxy, past the ring: the kernel would move the bytes into (or out of) a socket
// pair whose bytes are wake-up tokens, and the peer would never see them. So they go
// through the bounce buffer, and never more leave the source than the destination takes.
bool IsPipe(int fd) noexcept {
  struct stat st;
  return ::syscall(SYS_fstat, fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

bool PipeNonblocking(int pipe, unsigned flags) noexcept {
  const int fl = sys::fcntl(pipe, F_GETFL);
  return (flags & SPLICE_F_NONBLOCK) || (fl >= 0 && (fl & O_NONBLOCK));
}

// From the pipe into the ring: a non-blocking socket reads only what the ring has room
// for; what was read is sent whole (a remainder another thread's send took the room of
// waits for room: bytes taken out of the pipe are never dropped).
ssize_t AccelSpliceIn(SlipSocket* s, int fd, int pipe, size_t len, unsigned flags) noexcept {
  char* buffer = BounceBuffer();
  if (!buffer) return -1;
  size_t want = len < kChunk ? len : kChunk;
  if (s->nonblocking.load(std::memory_order_relaxed) || (flags & SPLICE_F_NONBLOCK)) {
    const size_t ring = s->stream->channel()->ring_size();
    const size_t used = s->stream->UnconsumedBytes();
    const size_t room = used < ring ? ring - used : 0;
    if (room == 0) {
      errno = EAGAIN;
      return -1;
    }
    if (want > room) want = room;
  }
  if (PipeNonblocking(pipe, flags)) {
    int queued = 0;
    if (sys::ioctl(pipe, FIONREAD, &queued) == 0 && queued == 0) {
      // (Empty: EAGAIN, or 0 when no writer is left, as splice says.)
      pollfd p{pipe, POLLIN, 0};
      if (sys::poll(&p, 1, 0) == 1 && (p.revents & POLLHUP) && !(p.revents & POLLIN)) return 0;
      errno = EAGAIN;
      return -1;
    }
  }
  const ssize_t got = sys::read(pipe, buffer, want);  // (blocks for a blocking pipe)
  if (got <= 0) return got;
  size_t sent = 0;
  while (sent < size_t(got)) {
    iovec iov{buffer + sent, size_t(got) - sent};
    ssize_t n = s->stream->Send(&iov, 1, 0, /*nonblocking=*/false);
    if (n == Stream::kHandedBack) {
      // (The bytes already taken from the pipe go on the TCP socket now at the number.)
      AwaitHandBack(s);
      n = Libc().send(fd, iov.iov_base, iov.iov_len, 0);
      if (n < 0) n = -errno;
    }
    if (n < 0) {
      if (sent > 0) break;
      errno = int(-n);
      return -1;
    }
    sent += size_t(n);
  }
  StatsAddSent(s->stats, sent);
  return ssize_t(sent);
}

// From the ring into the pipe: only what the pipe has room for is peeked, written, and
// then consumed.
ssize_t AccelSpliceOut(SlipSocket* s, int pipe, size_t len, unsigned flags) noexcept {
  char* buffer = BounceBuffer();
  if (!buffer) return -1;
  size_t room = 0;
  for (;;) {
    const int size = sys::fcntl(pipe, F_GETPIPE_SZ);
    int queued = 0;
    if (size < 0 || sys::ioctl(pipe, FIONREAD, &queued) != 0) return -1;
    room = queued < size ? size_t(size - queued) : 0;
    if (room > 0) break;
    if (PipeNonblocking(pipe, flags)) {
      errno = EAGAIN;
      return -1;
    }
    pollfd p{pipe, POLLOUT, 0};
    if (sys::poll(&p, 1, -1) < 0) return -1;  // (EINTR: the caller's to see)
  }
  size_t want = len < kChunk ? len : kChunk;
  if (want > room) want = room;
  const bool nonblocking =
      s->nonblocking.load(std::memory_order_relaxed) || (flags & SPLICE_F_NONBLOCK);
  iovec iov{buffer, want};
  const ssize_t peeked = s->stream->Recv(&iov, 1, MSG_PEEK, nonblocking);
  if (peeked == Stream::kHandedBack) {
    // Nothing was taken: the caller's retry finds the TCP socket at the number.
    AwaitHandBack(s);
    errno = EINTR;
    return -1;
  }
  if (peeked <= 0) return ToLibc(peeked);
  const ssize_t written = sys::write(pipe, buffer, size_t(peeked));
  if (written <= 0) return written;
  iov.iov_len = size_t(written);
  const ssize_t taken = s->stream->Recv(&iov, 1, 0, /*nonblocking=*/true);
  if (taken > 0) StatsAddReceived(s->stats, uint64_t(taken));
  return taken < 0 ? ToLibc(taken) : taken;
}

}  // namespace

SLIP_EXPORT ssize_t splice(int fd_in, off64_t* off_in, int fd_out, off64_t* off_out, size_t len,
                           unsigned int flags) {
  SocketRef in(fd_in);
  SocketRef out(fd_out);
  if (!in.accelerated() && !out.accelerated())
    return Libc().splice(fd_in, off_in, fd_out, off_out, len, flags);
  // As the kernel answers: the other end must be a pipe, and a pipe has no offset.
  const int pipe = in.accelerated() ? fd_out : fd_in;
  if (in.accelerated() == out.accelerated() || !IsPipe(pipe)) {
    errno = EINVAL;
    return -1;
  }
  if ((in.accelerated() ? off_out : off_in) != nullptr) {
    errno = ESPIPE;
    return -1;
  }
  if (len == 0) return 0;
  return in.accelerated() ? AccelSpliceOut(in.get(), pipe, len, flags)
                          : AccelSpliceIn(out.get(), fd_out, pipe, len, flags);
}

SLIP_EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  SocketRef ref(out_fd);
  if (ref.accelerated()) return AccelSendfile(ref.get(), out_fd, in_fd, offset, count);
  return CountSent(ref, out_fd, Libc().sendfile(out_fd, in_fd, offset, count));
}

SLIP_EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset, size_t count) {
  return sendfile(out_fd, in_fd, reinterpret_cast<off_t*>(offset), count);
}
