#include "preload/libc.h"

#include <dlfcn.h>

namespace slip::preload {

namespace {

template <typename F>
void Resolve(F*& slot, const char* name) noexcept {
  slot = reinterpret_cast<F*>(dlsym(RTLD_NEXT, name));
}

LibcCalls Load() noexcept {
  LibcCalls c{};
  Resolve(c.socket, "socket");
  Resolve(c.socketpair, "socketpair");
  Resolve(c.bind, "bind");
  Resolve(c.listen, "listen");
  Resolve(c.accept, "accept");
  Resolve(c.accept4, "accept4");
  Resolve(c.connect, "connect");
  Resolve(c.read, "read");
  Resolve(c.write, "write");
  Resolve(c.readv, "readv");
  Resolve(c.writev, "writev");
  Resolve(c.recv, "recv");
  Resolve(c.send, "send");
  Resolve(c.recvfrom, "recvfrom");
  Resolve(c.sendto, "sendto");
  Resolve(c.recvmsg, "recvmsg");
  Resolve(c.sendmsg, "sendmsg");
  Resolve(c.recvmmsg, "recvmmsg");
  Resolve(c.sendmmsg, "sendmmsg");
  Resolve(c.sendfile, "sendfile");
  Resolve(c.splice, "splice");
  Resolve(c.fdopen, "fdopen");
  Resolve(c.vdprintf, "vdprintf");
  Resolve(c.close, "close");
  Resolve(c.closefrom, "closefrom");
  Resolve(c.fstat, "fstat");
  Resolve(c.fstat64, "fstat64");
  Resolve(c.shutdown, "shutdown");
  Resolve(c.fcntl, "fcntl");
  Resolve(c.ioctl, "ioctl");
  Resolve(c.getsockopt, "getsockopt");
  Resolve(c.setsockopt, "setsockopt");
  Resolve(c.getsockname, "getsockname");
  Resolve(c.getpeername, "getpeername");
  Resolve(c.dup, "dup");
  Resolve(c.dup2, "dup2");
  Resolve(c.dup3, "dup3");
  Resolve(c.epoll_create, "epoll_create");
  Resolve(c.epoll_create1, "epoll_create1");
  Resolve(c.eventfd, "eventfd");
  Resolve(c.pipe, "pipe");
  Resolve(c.pipe2, "pipe2");
  Resolve(c.epoll_ctl, "epoll_ctl");
  Resolve(c.epoll_wait, "epoll_wait");
  Resolve(c.epoll_pwait, "epoll_pwait");
  Resolve(c.epoll_pwait2, "epoll_pwait2");
  Resolve(c.poll, "poll");
  Resolve(c.ppoll, "ppoll");
  Resolve(c.select, "select");
  Resolve(c.pselect, "pselect");
  Resolve(c.execve, "execve");
  Resolve(c.execveat, "execveat");
  Resolve(c.fexecve, "fexecve");
  Resolve(c.execv, "execv");
  Resolve(c.execvp, "execvp");
  Resolve(c.execvpe, "execvpe");
  return c;
}

}  // namespace

const LibcCalls& Libc() noexcept {
  static const LibcCalls calls = Load();  // thread-safe one-time initialisation
  return calls;
}

}  // namespace slip::preload
