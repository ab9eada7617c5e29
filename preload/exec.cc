// exec: what an accelerated descriptor becomes in the program that replaces this one.
//
// The new image knows nothing of rings, proxies or control threads, so an inherited
// descriptor (no FD_CLOEXEC) of an accelerated connection would be a proxy with nobody
// behind it: reads would block forever, or return wake-up tokens as data. Before exec,
// each such connection that only this process holds goes back to its TCP socket at the
// byte the application read up to (Stream::HandBack; docs/DESIGN.md, "Exec"), and the TCP
// socket takes the application's numbers: the new program continues the stream on plain
// TCP. Where that cannot be done, the program gets a socket that reports ECONNRESET
// instead, never a silently different stream:
// - another process holds the connection too (fork): that process keeps it, only this
//   image's numbers change, and they are put back if exec fails;
// - the hand-back failed (the peer is gone or did not answer; verbs connections cannot
//   yet): the connection is reset, since bytes may be missing.
// A vfork child shares the parent's memory and runs no fork handlers: nothing is touched.
#include "preload/exec.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <vector>

#include "core/log.h"
#include "core/stats.h"
#include "core/sys.h"
#include "preload/accel_list.h"
#include "preload/connector.h"
#include "preload/control.h"
#include "preload/export.h"
#include "preload/fd_table.h"
#include "preload/hand_back.h"
#include "preload/libc.h"
#include "preload/runtime.h"
#include "preload/transports.h"

using namespace slip;
using namespace slip::preload;

namespace slip::preload {

// The inherited connections of one exec call.
struct ExecPlan {
  struct Entry {
    int fd;
    SlipSocket* s;  // a reference is held until exec fails (or for good)
    bool cloexec;
  };
  // Numbers that got a reset socket for a connection another process holds: put back if
  // exec fails.
  struct Saved {
    int fd;
    int proxy;  // a hidden duplicate of what the number referred to
    bool cloexec;
  };
  std::vector<Entry> fds;
  std::vector<Saved> saved;
};

namespace {

std::atomic<pid_t> g_pid{0};

// How long exec waits for a process it just forked from to close its copy (the
// pre-forking server, socat's fork+exec) before treating the connection as shared.
constexpr uint64_t kHolderWaitMs = 200;

void Collect(int fd, SlipSocket* s, void* ctx) noexcept {
  if (s->kind != SockKind::kAccel) return;
  int flags = sys::fcntl(fd, F_GETFD);
  if (flags < 0) return;
  Acquire(s);
  try {
    static_cast<ExecPlan*>(ctx)->fds.push_back({fd, s, (flags & FD_CLOEXEC) != 0});
  } catch (...) {
    Release(s);
  }
}

void Put(int what, int fd, bool cloexec) noexcept {
  sys::dup3(what, fd, cloexec ? O_CLOEXEC : 0);
}

bool WaitSoleHolder(const ChannelControl* channel) noexcept {
  const uint64_t deadline = sys::MonotonicMs() + kHolderWaitMs;
  while (channel->SharedWithOtherProcess()) {
    if (sys::MonotonicMs() >= deadline) return false;
    usleep(2000);
  }
  return true;
}

// Another process holds the connection: this image's inheritable numbers get a reset
// socket, the connection stays as it is for the other holder.
void LeaveToOtherHolder(SlipSocket* s, ExecPlan* plan) noexcept {
  int reset = MakeResetSocket();
  for (const ExecPlan::Entry& e : plan->fds) {
    if (e.s != s || e.cloexec) continue;
    int proxy = reset < 0 ? -1 : sys::DupAbove(e.fd, sys::HiddenFdFloor());
    if (proxy < 0) continue;
    try {
      plan->saved.push_back({e.fd, proxy, e.cloexec});
    } catch (...) {
      sys::close(proxy);
      continue;
    }
    Put(reset, e.fd, false);
    SLIP_LOG(kWarn,
             "fd %d: exec with a connection that another process also holds: that process "
             "keeps it, the new program gets a reset socket in its place",
             e.fd);
  }
  if (reset >= 0) sys::close(reset);
}

// Only this process holds the connection: hand it back to TCP, or reset it.
void HandBackOrReset(SlipSocket* s, ExecPlan* plan) noexcept {
  std::vector<ProgramNumber> numbers;
  try {
    for (const ExecPlan::Entry& e : plan->fds) {
      if (e.s == s) numbers.push_back({e.fd, e.cloexec});
    }
  } catch (...) {
    numbers.clear();
  }
  if (!numbers.empty() && HandBackToTcp(s, numbers.data(), numbers.size(), Reason::kExec)) {
    for (const ProgramNumber& n : numbers)
      SLIP_LOG(kInfo, "fd %d: handed back to TCP for exec", n.fd);
    return;
  }
  for (const ProgramNumber& n : numbers) {
    SLIP_LOG(kWarn,
             "fd %d: cannot hand the connection back to TCP for exec; it is reset (the "
             "program gets a reset socket)",
             n.fd);
  }
  // (The plan's references keep the socket until exec is over.)
  ResetConnection(s, numbers.data(), numbers.size());
}

}  // namespace

void ExecNoteProcess() noexcept {
  g_pid.store(pid_t(syscall(SYS_getpid)), std::memory_order_relaxed);
}

pid_t NotedProcessId() noexcept {
  return g_pid.load(std::memory_order_relaxed);
}

bool InVforkChild() noexcept {
  const pid_t pid = g_pid.load(std::memory_order_relaxed);
  return pid != 0 && pid_t(syscall(SYS_getpid)) != pid;
}

ExecGuard::ExecGuard() noexcept {
  if (!TableInUse() || InVforkChild()) return;
  // A socket still connecting is a placeholder the new program could never use: let the
  // connects in flight settle first (bounded), as fork does.
  ConnectorForkPrepare();
  if (AccelListNonEmpty()) HandBackAll();
  // Then what no exit of this image will clean up (after the hand-backs, which may need it).
  for (size_t i = 0; i < Transports().size(); ++i) Transports()[i]->BeforeExec();
}

void ExecGuard::HandBackAll() noexcept {
  // So must connections that are still settling: only a settled one can be handed back.
  ControlWaitSettled(2 * uint64_t(GetRuntime().config.handshake_timeout_ms) + 1000);
  auto* plan = new (std::nothrow) ExecPlan();
  if (!plan) return;
  plan_ = plan;
  ForEachTrackedFd(Collect, plan);
  for (const ExecPlan::Entry& e : plan->fds) {
    if (e.cloexec) continue;
    SlipSocket* s = e.s;
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->kind != SockKind::kAccel || !s->stream) continue;  // done for an earlier number
    if (WaitSoleHolder(s->stream->control()))
      HandBackOrReset(s, plan);
    else
      LeaveToOtherHolder(s, plan);
  }
}

ExecGuard::~ExecGuard() {
  // Only reached when exec failed: this image goes on.
  if (!plan_) return;
  const int err = errno;
  for (const ExecPlan::Saved& saved : plan_->saved) {
    Put(saved.proxy, saved.fd, saved.cloexec);
    sys::close(saved.proxy);
  }
  for (const ExecPlan::Entry& e : plan_->fds) Release(e.s);
  delete plan_;
  errno = err;
}

}  // namespace slip::preload

namespace {

// Runs `call(argv, envp)` with execl's variadic arguments as an argv array (and, for
// execle, the environment that follows them).
template <typename Call>
int WithArgv(const char* arg0, va_list ap, bool with_env, Call call) noexcept {
  std::vector<char*> argv;
  try {
    argv.push_back(const_cast<char*>(arg0));
    while (argv.back() != nullptr) argv.push_back(va_arg(ap, char*));
  } catch (...) {
    errno = ENOMEM;
    return -1;
  }
  char** envp = with_env ? va_arg(ap, char**) : nullptr;
  return call(argv.data(), envp);
}

}  // namespace

SLIP_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  ExecGuard guard;
  return Libc().execve(path, argv, envp);
}

SLIP_EXPORT int execveat(int dirfd, const char* path, char* const argv[], char* const envp[],
                         int flags) {
  ExecGuard guard;
  return Libc().execveat(dirfd, path, argv, envp, flags);
}

SLIP_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  ExecGuard guard;
  return Libc().fexecve(fd, argv, envp);
}

SLIP_EXPORT int execv(const char* path, char* const argv[]) {
  ExecGuard guard;
  return Libc().execv(path, argv);
}

SLIP_EXPORT int execvp(const char* file, char* const argv[]) {
  ExecGuard guard;
  return Libc().execvp(file, argv);
}

SLIP_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  ExecGuard guard;
  return Libc().execvpe(file, argv, envp);
}

SLIP_EXPORT int execl(const char* path, const char* arg0, ...) {
  va_list ap;
  va_start(ap, arg0);
  int rc = WithArgv(arg0, ap, false, [path](char** argv, char**) { return execv(path, argv); });
  va_end(ap);
  return rc;
}

SLIP_EXPORT int execlp(const char* file, const char* arg0, ...) {
  va_list ap;
  va_start(ap, arg0);
  int rc = WithArgv(arg0, ap, false, [file](char** argv, char**) { return execvp(file, argv); });
  va_end(ap);
  return rc;
}

SLIP_EXPORT int execle(const char* path, const char* arg0, ...) {
  va_list ap;
  va_start(ap, arg0);
  int rc = WithArgv(arg0, ap, true,
                    [path](char** argv, char** envp) { return execve(path, argv, envp); });
  va_end(ap);
  return rc;
}
