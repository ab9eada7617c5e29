// libslipfault.so: test-only fault injection for the stress suite (run.py, "faults.*").
// Never linked into the product: run.py preloads it before libslipstream.so,
//   LD_PRELOAD=".../libslipfault.so:.../libslipstream.so" SLIPFAULT=... PROGRAM
// and it makes calls that the shim itself issues fail, as the kernel or the allocator
// would when a resource runs out. Calls of the host program (and of libc, libstdc++ and
// other libraries) are never failed: a call is eligible only when its immediate caller
// (the return address) lies in libslipstream.so's executable segment, found once with
// dl_iterate_phdr. (The shim reaches the application's own calls through libc's
// functions, connect() and accept4() included, and issues its own descriptor work through
// syscall(): core/sys.h.)
//
// Fault classes (the shim's calls, each counted in its class, in call order):
//   fd     every call that allocates a descriptor: syscall(SYS_socket, SYS_socketpair,
//          SYS_accept4, SYS_fcntl with F_DUPFD or F_DUPFD_CLOEXEC, SYS_dup3 onto a number
//          that is not open: over an open one it needs no new descriptor), memfd_create,
//          epoll_create1, eventfd, and each descriptor that a recvmsg receives through
//          SCM_RIGHTS (the kernel installs them one by one: the call itself succeeds, the
//          descriptors from the failing one on are closed, the control message is cut to
//          those installed before, and MSG_CTRUNC is set, as the kernel does at the
//          limit). Fails with EMFILE.
//   memfd  memfd_create (ENOMEM), ftruncate of a memfd (EFBIG), fcntl F_ADD_SEALS (EBUSY).
//   mmap   mmap with MAP_SHARED of a memfd (the shared regions): ENOMEM. Every other
//          mapping (malloc's, the fd table's, the stats file's) is left alone.
//   alloc  operator new in all its forms (size, array, nothrow, aligned) and malloc,
//          calloc, realloc: a throwing form throws std::bad_alloc, the others return null.
//          Not in libslipfault-noalloc.so (SLIPFAULT_WITHOUT_ALLOC), the variant of the
//          sanitizer runs: there the sanitizer's allocator must see every allocation.
//   sock   syscall(SYS_connect) (EAGAIN: the rendezvous' backlog is full),
//          syscall(SYS_sendmsg) (ENOBUFS), syscall(SYS_bind) (EADDRINUSE: no port left).
// (memfd_create counts in both fd and memfd: it takes a descriptor and memory.)
//
// Control: SLIPFAULT, read once (no allocation), comma-separated key=value:
//   site=CLASS[+CLASS...] | all   which classes may fail (default: none; counting only)
//   nth=N      fail the N-th eligible call of each selected class (1-based) ...
//   count=K    ... and the K-1 after it too (default 1; 0: every call from the N-th on)
//   prob=P     or: each eligible call of a selected class fails with probability P ...
//   seed=S     ... drawn from a deterministic PRNG of (S, class, call number)
//   errno=E    the errno of every injected failure instead of the class's (number or name)
//   call=NAME  only the calls of that name (as the report writes it: accept4, socketpair,
//              "fcntl(F_DUPFD_CLOEXEC)", ...) count and may fail: nth counts those alone
//   thread=main|other  only the calls made on the main thread (the application's, in a
//              single-threaded program), or only those on the others (the shim's own)
// SLIPFAULT_REPORT=PATH: JSON lines are appended there, one per injection, as it happens
// (a process that dies of it has still said what it was):
//   {"pid", "injected": {"class", "n", "call", "arg", "errno", "frames": ["0xOFFSET", ...]}}
// where frames are return addresses inside libslipstream.so as offsets from its load
// address (innermost first; addr2line -f -C -i -e libslipstream.so turns them into the
// shim's functions), and one at exit (from a destructor: not after a crash or _exit):
//   {"pid", "exit": true, "lib", "calls": {CLASS: N}, "injected_total"}
// Each injection is also said on stderr: "slipfault: ...".
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>
#include <atomic>
#include <new>

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
}

namespace {

enum Class { kFd, kMemfd, kMmap, kAlloc, kSock, kClasses };
const char* const kClassNames[kClasses] = {"fd", "memfd", "mmap", "alloc", "sock"};

constexpr int kMaxFrames = 8;

struct Record {
  int cls;
  uint64_t n;
  const char* call;
  long arg;
  int err;
  int nframes;
  uintptr_t frames[kMaxFrames];
};

struct Config {
  unsigned mask = 0;  // classes that may fail
  uint64_t nth = 0;
  uint64_t count = 1;
  double prob = 0;
  uint64_t seed = 0;
  int err = 0;         // 0: the class's own
  char call[64] = "";  // only calls of this name count and fail (e.g. accept4)
  int thread = 0;      // 1: only calls on the main thread; 2: only on the others
  char spec[512] = "";
  char report[4096] = "";
};

Config g_cfg;
uintptr_t g_lo = 0, g_hi = 0, g_base = 0;  // libslipstream.so's text, its load address
char g_lib[4096] = "";
std::atomic<bool> g_ready{false};
pthread_once_t g_once = PTHREAD_ONCE_INIT;
std::atomic<uint64_t> g_calls[kClasses];
std::atomic<uint64_t> g_injected{0};

using SyscallFn = long (*)(long, ...);
using MemfdFn = int (*)(const char*, unsigned);
using FtruncateFn = int (*)(int, off_t);
using MmapFn = void* (*)(void*, size_t, int, int, int, off_t);
using IntFn = int (*)(int);
using EventfdFn = int (*)(unsigned, int);
using NewFn = void* (*)(size_t);
using NewNtFn = void* (*)(size_t, const std::nothrow_t&);
using NewAlFn = void* (*)(size_t, std::align_val_t);
using NewAlNtFn = void* (*)(size_t, std::align_val_t, const std::nothrow_t&);

SyscallFn real_syscall;
MemfdFn real_memfd_create;
FtruncateFn real_ftruncate;
MmapFn real_mmap;
IntFn real_epoll_create1;
EventfdFn real_eventfd;
NewFn real_new, real_new_array;
NewNtFn real_new_nt, real_new_array_nt;
NewAlFn real_new_al, real_new_array_al;
NewAlNtFn real_new_al_nt, real_new_array_al_nt;

// ---- set-up ---------------------------------------------------------------------------

int FindShim(dl_phdr_info* info, size_t, void*) {
  const char* name = info->dlpi_name ? info->dlpi_name : "";
  const char* base = strrchr(name, '/');
  base = base ? base + 1 : name;
  if (strcmp(base, "libslipstream.so") != 0) return 0;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (start < lo) lo = start;
    if (start + ph.p_memsz > hi) hi = start + ph.p_memsz;
  }
  if (hi == 0) return 0;
  g_lo = lo;
  g_hi = hi;
  g_base = info->dlpi_addr;
  snprintf(g_lib, sizeof(g_lib), "%s", name);
  return 1;
}

uint64_t ParseU64(const char* s, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n && s[i] >= '0' && s[i] <= '9'; ++i) v = v * 10 + uint64_t(s[i] - '0');
  return v;
}

bool Is(const char* s, size_t n, const char* word) {
  return strlen(word) == n && memcmp(s, word, n) == 0;
}

int ParseErrno(const char* v, size_t n) {
  static const struct {
    const char* name;
    int value;
  } kNames[] = {{"EMFILE", EMFILE},         {"ENFILE", ENFILE}, {"ENOMEM", ENOMEM},
                {"ENOBUFS", ENOBUFS},       {"EAGAIN", EAGAIN}, {"EFBIG", EFBIG},
                {"ENOSPC", ENOSPC},         {"EBUSY", EBUSY},   {"EINTR", EINTR},
                {"EADDRINUSE", EADDRINUSE}, {"EPERM", EPERM}};
  for (const auto& e : kNames)
    if (Is(v, n, e.name)) return e.value;
  return int(ParseU64(v, n));
}

void Complain(const char* what) {
  char line[700];
  const int len =
      snprintf(line, sizeof(line), "slipfault: %s in SLIPFAULT='%s'\n", what, g_cfg.spec);
  real_syscall(SYS_write, 2, line, len > 0 ? size_t(len) : 0);
}

void ParseSpec(const char* spec) {
  snprintf(g_cfg.spec, sizeof(g_cfg.spec), "%s", spec);
  const char* p = spec;
  while (*p) {
    const char* end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    const char* eq = static_cast<const char*>(memchr(p, '=', size_t(end - p)));
    if (eq) {
      const size_t kn = size_t(eq - p), vn = size_t(end - eq - 1);
      const char* v = eq + 1;
      if (Is(p, kn, "site")) {
        const char* s = v;
        while (s < end) {
          const char* plus = static_cast<const char*>(memchr(s, '+', size_t(end - s)));
          if (!plus) plus = end;
          bool known = false;
          if (Is(s, size_t(plus - s), "all")) {
            g_cfg.mask = (1u << kClasses) - 1;
            known = true;
          }
          for (int c = 0; c < kClasses; ++c) {
            if (Is(s, size_t(plus - s), kClassNames[c])) {
              g_cfg.mask |= 1u << c;
              known = true;
            }
          }
          if (!known) Complain("unknown site");
          s = plus + 1;
        }
      } else if (Is(p, kn, "nth")) {
        g_cfg.nth = ParseU64(v, vn);
      } else if (Is(p, kn, "count")) {
        g_cfg.count = ParseU64(v, vn);
      } else if (Is(p, kn, "prob")) {
        g_cfg.prob = strtod(v, nullptr);
      } else if (Is(p, kn, "seed")) {
        g_cfg.seed = ParseU64(v, vn);
      } else if (Is(p, kn, "errno")) {
        g_cfg.err = ParseErrno(v, vn);
      } else if (Is(p, kn, "call")) {
        snprintf(g_cfg.call, sizeof(g_cfg.call), "%.*s", int(vn), v);
      } else if (Is(p, kn, "thread")) {
        g_cfg.thread = Is(v, vn, "main") ? 1 : Is(v, vn, "other") ? 2 : 0;
        if (!g_cfg.thread) Complain("thread= takes main or other");
      } else {
        Complain("unknown key");
      }
    } else if (end > p) {
      Complain("not key=value");
    }
    p = *end ? end + 1 : end;
  }
}

template <typename F>
void Resolve(F& slot, const char* name) {
  slot = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

void Init() {
  Resolve(real_syscall, "syscall");
  Resolve(real_memfd_create, "memfd_create");
  Resolve(real_ftruncate, "ftruncate");
  Resolve(real_mmap, "mmap");
  Resolve(real_epoll_create1, "epoll_create1");
  Resolve(real_eventfd, "eventfd");
  Resolve(real_new, "_Znwm");
  Resolve(real_new_array, "_Znam");
  Resolve(real_new_nt, "_ZnwmRKSt9nothrow_t");
  Resolve(real_new_array_nt, "_ZnamRKSt9nothrow_t");
  Resolve(real_new_al, "_ZnwmSt11align_val_t");
  Resolve(real_new_array_al, "_ZnamSt11align_val_t");
  Resolve(real_new_al_nt, "_ZnwmSt11align_val_tRKSt9nothrow_t");
  Resolve(real_new_array_al_nt, "_ZnamSt11align_val_tRKSt9nothrow_t");
  dl_iterate_phdr(FindShim, nullptr);
  if (const char* spec = getenv("SLIPFAULT")) ParseSpec(spec);
  if (const char* report = getenv("SLIPFAULT_REPORT"))
    snprintf(g_cfg.report, sizeof(g_cfg.report), "%s", report);
  g_ready.store(true, std::memory_order_release);
}

inline void Ensure() {
  if (!g_ready.load(std::memory_order_acquire)) pthread_once(&g_once, Init);
}

inline bool FromShim(const void* ra) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ra);
  return a >= g_lo && a < g_hi;
}

// ---- the decision ---------------------------------------------------------------------

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Frames {
  int n = 0;
  uintptr_t pc[kMaxFrames];
};

_Unwind_Reason_Code Collect(_Unwind_Context* ctx, void* arg) {
  auto* f = static_cast<Frames*>(arg);
  const uintptr_t pc = _Unwind_GetIP(ctx);
  if (pc >= g_lo && pc < g_hi) {
    f->pc[f->n++] = pc - g_base;
    if (f->n == kMaxFrames) return _URC_END_OF_STACK;
  }
  return _URC_NO_REASON;
}

void Append(const char* line, size_t len) {
  if (!g_cfg.report[0]) return;
  const int fd = int(real_syscall(SYS_openat, AT_FDCWD, g_cfg.report,
                                  O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (fd < 0) return;
  real_syscall(SYS_write, fd, line, len);
  real_syscall(SYS_close, fd);
}

// One injection as a JSON object (no allocation).
size_t FormatRecord(const Record& r, char* buf, size_t size) {
  size_t len = 0;
  auto put = [&](const char* fmt, auto... args) {
    if (len >= size) return;
    const int n = snprintf(buf + len, size - len, fmt, args...);
    if (n > 0) len = std::min(size, len + size_t(n));
  };
  put("{\"class\":\"%s\",\"n\":%llu,\"call\":\"%s\",\"arg\":%ld,\"errno\":%d,\"frames\":[",
      kClassNames[r.cls], (unsigned long long)r.n, r.call, r.arg, r.err);
  for (int k = 0; k < r.nframes; ++k) put("%s\"0x%lx\"", k ? "," : "", (unsigned long)r.frames[k]);
  put("]}");
  return len;
}

// Counts one eligible call of class `cls`; true when it must fail (then errno is set).
bool Fail(Class cls, const char* call, long arg, int err) {
  if (g_cfg.call[0] && strcmp(g_cfg.call, call) != 0) return false;
  if (g_cfg.thread && (real_syscall(SYS_gettid) == getpid()) != (g_cfg.thread == 1)) return false;
  const uint64_t n = g_calls[cls].fetch_add(1, std::memory_order_relaxed) + 1;
  if (!(g_cfg.mask & (1u << cls))) return false;
  bool fail = false;
  if (g_cfg.nth) {
    fail = n >= g_cfg.nth && (g_cfg.count == 0 || n - g_cfg.nth < g_cfg.count);
  } else if (g_cfg.prob > 0) {
    const uint64_t draw = Mix(Mix(g_cfg.seed) ^ (uint64_t(cls) << 56) ^ n);
    fail = double(draw >> 11) * (1.0 / 9007199254740992.0) < g_cfg.prob;
  }
  if (!fail) return false;
  if (g_cfg.err) err = g_cfg.err;
  g_injected.fetch_add(1, std::memory_order_relaxed);
  Frames frames;
  _Unwind_Backtrace(Collect, &frames);
  Record r;
  r.cls = cls;
  r.n = n;
  r.call = call;
  r.arg = arg;
  r.err = err;
  r.nframes = frames.n;
  memcpy(r.frames, frames.pc, sizeof(uintptr_t) * size_t(frames.n));
  // At once, so that a process that dies of it still says what it was.
  char line[512];
  int len = snprintf(line, sizeof(line), "{\"pid\":%d,\"injected\":", int(getpid()));
  len += int(FormatRecord(r, line + len, sizeof(line) - size_t(len) - 3));
  len += snprintf(line + len, sizeof(line) - size_t(len), "}\n");
  Append(line, size_t(len));
  len = snprintf(line, sizeof(line),
                 "slipfault: pid %d: %s call %llu failed: %s (arg %ld), errno %d\n", int(getpid()),
                 kClassNames[cls], (unsigned long long)n, call, arg, err);
  real_syscall(SYS_write, 2, line, len > 0 ? size_t(len) : 0);
  errno = err;
  return true;
}

bool IsMemfd(int fd) {
  char path[64], target[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  const long n = real_syscall(SYS_readlink, path, target, sizeof(target) - 1);
  return n >= 7 && memcmp(target, "/memfd:", 7) == 0;
}

// recvmsg: the descriptors received are installed one by one; the first that "fails" and
// every one after it are closed, as if the kernel had stopped there.
void RecvmsgFds(msghdr* msg) {
  if (!msg || !msg->msg_control || msg->msg_controllen == 0) return;
  for (cmsghdr* cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const int count = int((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    int kept = count;
    for (int i = 0; i < count; ++i) {
      if (Fail(kFd, "recvmsg(SCM_RIGHTS)", i, EMFILE)) {
        kept = i;
        break;
      }
    }
    if (kept == count) continue;
    int* fds = reinterpret_cast<int*>(CMSG_DATA(cm));
    for (int i = kept; i < count; ++i) real_syscall(SYS_close, fds[i]);
    // The kernel writes the control message only if it installed one descriptor or more,
    // and nothing after it.
    if (kept > 0) {
      cm->cmsg_len = CMSG_LEN(sizeof(int) * size_t(kept));
      msg->msg_controllen =
          size_t(reinterpret_cast<char*>(cm) - static_cast<char*>(msg->msg_control)) +
          CMSG_SPACE(sizeof(int) * size_t(kept));
    } else {
      msg->msg_controllen =
          size_t(reinterpret_cast<char*>(cm) - static_cast<char*>(msg->msg_control));
    }
    msg->msg_flags |= MSG_CTRUNC;
    return;
  }
}

// At exit: the counts (the injections were written as they happened).
void WriteReport() {
  if (!g_ready.load(std::memory_order_acquire) || !g_cfg.report[0]) return;
  char buf[4096 + 1024];
  size_t len = 0;
  auto put = [&](const char* fmt, auto... args) {
    if (len >= sizeof(buf)) return;
    const int n = snprintf(buf + len, sizeof(buf) - len, fmt, args...);
    if (n > 0) len = std::min(sizeof(buf), len + size_t(n));
  };
  put("{\"pid\":%d,\"exit\":true,\"lib\":\"%s\",\"calls\":{", int(getpid()), g_lib);
  for (int c = 0; c < kClasses; ++c)
    put("%s\"%s\":%llu", c ? "," : "", kClassNames[c],
        (unsigned long long)g_calls[c].load(std::memory_order_relaxed));
  put("},\"injected_total\":%llu}\n",
      (unsigned long long)g_injected.load(std::memory_order_relaxed));
  if (len < sizeof(buf)) Append(buf, len);
}

__attribute__((destructor)) void AtExit() {
  WriteReport();
}

}  // namespace

// ---- the interposed calls -------------------------------------------------------------

extern "C" {

__attribute__((visibility("default"))) long syscall(long nr, ...) noexcept {
  const void* ra = __builtin_return_address(0);
  va_list ap;
  va_start(ap, nr);
  long a[6];
  for (long& x : a) x = va_arg(ap, long);
  va_end(ap);
  Ensure();
  if (FromShim(ra)) {
    switch (nr) {
      case SYS_socket:
        if (Fail(kFd, "socket", a[0], EMFILE)) return -1;
        break;
      case SYS_socketpair:
        if (Fail(kFd, "socketpair", a[0], EMFILE)) return -1;
        break;
      case SYS_accept4:
        if (Fail(kFd, "accept4", a[0], EMFILE)) return -1;
        break;
      case SYS_dup3:
        // Onto an open number (the shim's kept slots, the application's socket) dup3 takes
        // no new descriptor, and the kernel cannot fail it for want of one: only a dup3
        // that would open a number counts.
        if (real_syscall(SYS_fcntl, a[1], F_GETFD, 0) < 0 && Fail(kFd, "dup3", a[1], EMFILE))
          return -1;
        break;
      case SYS_fcntl:
        if (a[1] == F_DUPFD && Fail(kFd, "fcntl(F_DUPFD)", a[2], EMFILE)) return -1;
        if (a[1] == F_DUPFD_CLOEXEC && Fail(kFd, "fcntl(F_DUPFD_CLOEXEC)", a[2], EMFILE)) return -1;
        if (a[1] == F_ADD_SEALS && Fail(kMemfd, "fcntl(F_ADD_SEALS)", a[2], EBUSY)) return -1;
        break;
      case SYS_connect:
        if (Fail(kSock, "connect", a[0], EAGAIN)) return -1;
        break;
      case SYS_bind:
        if (Fail(kSock, "bind", a[0], EADDRINUSE)) return -1;
        break;
      case SYS_sendmsg:
        if (Fail(kSock, "sendmsg", a[0], ENOBUFS)) return -1;
        break;
      case SYS_recvmsg: {
        const long n = real_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
        if (n >= 0) {
          const int saved = errno;
          RecvmsgFds(reinterpret_cast<msghdr*>(a[1]));
          errno = saved;
        }
        return n;
      }
      default:
        break;
    }
  }
  return real_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

__attribute__((visibility("default"))) int memfd_create(const char* name, unsigned flags) noexcept {
  const void* ra = __builtin_return_address(0);
  Ensure();
  if (FromShim(ra)) {
    if (Fail(kFd, "memfd_create", long(flags), EMFILE)) return -1;
    if (Fail(kMemfd, "memfd_create", long(flags), ENOMEM)) return -1;
  }
  return real_memfd_create(name, flags);
}

__attribute__((visibility("default"))) int ftruncate(int fd, off_t length) noexcept {
  const void* ra = __builtin_return_address(0);
  Ensure();
  if (FromShim(ra) && IsMemfd(fd) && Fail(kMemfd, "ftruncate", long(length), EFBIG)) return -1;
  return real_ftruncate(fd, length);
}

// mmap and mmap64 are called before anything is set up too: a sanitizer's runtime, which
// the sanitizer runs preload after this library, maps memory through them while it starts
// (its symbolizer), when neither pthread_once nor dl_iterate_phdr may be called yet. Only a
// shared mapping of a descriptor can be the shim's region: any other goes straight on.
namespace {

MmapFn NextMmap() {
  static std::atomic<MmapFn> next{nullptr};
  MmapFn f = next.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<MmapFn>(dlsym(RTLD_NEXT, "mmap"));
    next.store(f, std::memory_order_release);
  }
  return f;
}

void* MapOrFail(const void* ra, void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (!(flags & MAP_SHARED) || fd < 0) return NextMmap()(addr, len, prot, flags, fd, off);
  Ensure();
  if (FromShim(ra) && IsMemfd(fd) && Fail(kMmap, "mmap(MAP_SHARED memfd)", long(len), ENOMEM))
    return MAP_FAILED;
  return real_mmap(addr, len, prot, flags, fd, off);
}

}  // namespace

__attribute__((visibility("default"))) void* mmap(void* addr, size_t len, int prot, int flags,
                                                  int fd, off_t off) noexcept {
  return MapOrFail(__builtin_return_address(0), addr, len, prot, flags, fd, off);
}

__attribute__((visibility("default"))) void* mmap64(void* addr, size_t len, int prot, int flags,
                                                    int fd, off_t off) noexcept {
  return MapOrFail(__builtin_return_address(0), addr, len, prot, flags, fd, off);
}

__attribute__((visibility("default"))) int epoll_create1(int flags) noexcept {
  const void* ra = __builtin_return_address(0);
  Ensure();
  if (FromShim(ra) && Fail(kFd, "epoll_create1", flags, EMFILE)) return -1;
  return real_epoll_create1(flags);
}

__attribute__((visibility("default"))) int eventfd(unsigned initval, int flags) noexcept {
  const void* ra = __builtin_return_address(0);
  Ensure();
  if (FromShim(ra) && Fail(kFd, "eventfd", flags, EMFILE)) return -1;
  return real_eventfd(initval, flags);
}

#if !defined(SLIPFAULT_WITHOUT_ALLOC)
// malloc and friends: the shim calls none of them directly today (its allocations go
// through operator new); covered so that one that appears is failed too. Forwarded to
// glibc's own entry points, so that nothing here needs dlsym before it is ready.
__attribute__((visibility("default"))) void* malloc(size_t n) noexcept {
  const void* ra = __builtin_return_address(0);
  if (g_ready.load(std::memory_order_acquire) && FromShim(ra) &&
      Fail(kAlloc, "malloc", long(n), ENOMEM))
    return nullptr;
  return __libc_malloc(n);
}

__attribute__((visibility("default"))) void* calloc(size_t n, size_t size) noexcept {
  const void* ra = __builtin_return_address(0);
  if (g_ready.load(std::memory_order_acquire) && FromShim(ra) &&
      Fail(kAlloc, "calloc", long(n * size), ENOMEM))
    return nullptr;
  return __libc_calloc(n, size);
}

__attribute__((visibility("default"))) void* realloc(void* p, size_t n) noexcept {
  const void* ra = __builtin_return_address(0);
  if (g_ready.load(std::memory_order_acquire) && FromShim(ra) && n != 0 &&
      Fail(kAlloc, "realloc", long(n), ENOMEM))
    return nullptr;
  return __libc_realloc(p, n);
}

#endif  // !SLIPFAULT_WITHOUT_ALLOC

}  // extern "C"

#if !defined(SLIPFAULT_WITHOUT_ALLOC)
// operator new, every form. The caller of operator new is the code that allocates (the
// shim's own, inlined std:: containers included); libstdc++'s nothrow forms call the
// throwing one, whose caller is then libstdc++: never counted twice.
#define SLIPFAULT_ELIGIBLE(name) \
  (Ensure(), FromShim(__builtin_return_address(0)) && Fail(kAlloc, name, long(n), ENOMEM))

__attribute__((visibility("default"))) void* operator new(size_t n) {
  if (SLIPFAULT_ELIGIBLE("operator new")) throw std::bad_alloc();
  return real_new(n);
}
__attribute__((visibility("default"))) void* operator new[](size_t n) {
  if (SLIPFAULT_ELIGIBLE("operator new[]")) throw std::bad_alloc();
  return real_new_array(n);
}
__attribute__((visibility("default"))) void* operator new(size_t n, std::align_val_t al) {
  if (SLIPFAULT_ELIGIBLE("operator new(aligned)")) throw std::bad_alloc();
  return real_new_al(n, al);
}
__attribute__((visibility("default"))) void* operator new[](size_t n, std::align_val_t al) {
  if (SLIPFAULT_ELIGIBLE("operator new[](aligned)")) throw std::bad_alloc();
  return real_new_array_al(n, al);
}
__attribute__((visibility("default"))) void* operator new(size_t n,
                                                          const std::nothrow_t& nt) noexcept {
  if (SLIPFAULT_ELIGIBLE("operator new(nothrow)")) return nullptr;
  return real_new_nt(n, nt);
}
__attribute__((visibility("default"))) void* operator new[](size_t n,
                                                            const std::nothrow_t& nt) noexcept {
  if (SLIPFAULT_ELIGIBLE("operator new[](nothrow)")) return nullptr;
  return real_new_array_nt(n, nt);
}
__attribute__((visibility("default"))) void* operator new(size_t n, std::align_val_t al,
                                                          const std::nothrow_t& nt) noexcept {
  if (SLIPFAULT_ELIGIBLE("operator new(aligned, nothrow)")) return nullptr;
  return real_new_al_nt(n, al, nt);
}
__attribute__((visibility("default"))) void* operator new[](size_t n, std::align_val_t al,
                                                            const std::nothrow_t& nt) noexcept {
  if (SLIPFAULT_ELIGIBLE("operator new[](aligned, nothrow)")) return nullptr;
  return real_new_array_al_nt(n, al, nt);
}
#endif  // !SLIPFAULT_WITHOUT_ALLOC
