// Socket semantics of a TCP connection, checked through the socket API: run under
// Slipstream, an accelerated connection must behave exactly like kernel TCP.
//
// usage: semantics server PORT        (listens on 127.0.0.1:PORT, or $SLIP_TEST_HOST:PORT)
//        semantics client HOST PORT
//
// The two processes run the sub-tests of SUBTESTS in order, twice: in the first round the
// client is the tester and the server the helper, in the second the other way round, so
// every check runs on a connected and on an accepted socket. Each sub-test gets a fresh
// data connection. The tester runs the checks and drives the helper over a control
// connection (opened first, kept for the whole run) with one-line commands, executed in
// order, each answered "ok [text]" or "fail REASON":
//   send LEN SEED OFF [PIECES GAP_MS [AFTER_MS]]  send pattern bytes OFF..OFF+LEN of SEED,
//                                    after AFTER_MS, in PIECES pieces GAP_MS apart
//   recv LEN SEED OFF                receive exactly those bytes and check them
//   eof                              poll shows POLLIN|POLLRDHUP (no POLLHUP), recv gives 0
//   quiet MS                         nothing arrives (no data, no EOF) for MS ms
//   shutwr, close                    shutdown(SHUT_WR), close()
//   duplex LEN SEND_SEED RECV_SEED   send and receive LEN bytes at once (two threads)
//   names                            answer "ok LOCAL PEER" (getsockname, getpeername)
//   urgent LEN SEED BYTE             bytes 0..LEN+2 of SEED, the last two in a send(MSG_OOB)
//                                    that ends with BYTE (urgent), then bytes LEN+2..2LEN+2
//   bounded SEED                     SO_SNDBUF 4 KiB, then bytes of SEED until EAGAIN;
//                                    answer "ok WRITTEN SNDBUF"
// The data are a seeded pattern addressed by stream offset, so every byte is checked.
//
// Every wait is bounded: WAIT_MS for what must happen, QUIET_MS watches for what must not,
// data sockets carry SO_RCVTIMEO/SO_SNDTIMEO of WAIT_MS unless a sub-test says otherwise,
// and a watchdog ends the process if a sub-test runs past SUBTEST_LIMIT_MS.
// The tester prints "PASS ROLE/NAME" or "FAIL ROLE/NAME: reason" per sub-test (ROLE: the
// tester's side); the last line of stdout is a JSON summary; the exit status is 1 if any
// sub-test failed (or the run could not go on).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
// After sys/ioctl.h: SIOCINQ.
#include <linux/sockios.h>

enum {
  WAIT_MS = 3000,            // anything that must happen happens within this
  QUIET_MS = 50,             // how long "nothing happens" is watched
  CTL_MS = 15000,            // a control message must arrive within this
  SUBTEST_LIMIT_MS = 12000,  // the watchdog's limit for one sub-test
  CHUNK = 64 * 1024,
  MAX_OWNED = 8,
  MAX_PENDING = 8,
  LINE_MAX_LEN = 1200,
};
#define FILL_LIMIT (256ull << 20)  // a send must meet EAGAIN before this much is queued

// ------------------------------------------------------------------------ the context

// A thread's context: each thread that moves data has its own (with its own failure and I/O
// buffer); the main thread's also holds the connections.
struct ctx {
  bool is_server;
  int port;      // the server's listening port
  int listener;  // server only
  struct sockaddr_in server_addr;
  int ctl;                        // the control connection
  int fd;                         // this sub-test's data connection; -1 once closed
  int owned[MAX_OWNED];           // more descriptors to close after the sub-test (-1: none)
  int connections;                // TCP connections this process opened or accepted
  char why[600];                  // the first failure of the sub-test (or of a helper command)
  char reply[200];                // the text of the helper's last "ok" answer
  char pending[MAX_PENDING][80];  // commands sent to the helper and not yet answered
  int npending;
  bool helper_failed;  // a "fail" answer is already part of `why`
  char ctl_buf[8192];  // control bytes received and not yet consumed
  size_t ctl_len;
  uint8_t io[CHUNK];  // the I/O buffer of the thread that owns this context
};

// Records the first failure (with the line of the check) and returns -1.
// The address both ends use: loopback, or rxe0's address in the Soft-RoCE guest (tests/vm).
static const char* test_host(void) {
  const char* host = getenv("SLIP_TEST_HOST");
  return host && *host ? host : "127.0.0.1";
}

// Debugging a rare failure: SLIP_TEST_ON_FAIL is a shell command run once, at this
// process's first failed check, with SLIP_IT_PID set to its pid (e.g. to take every
// thread's stack with gdb while the failure is still there).
static void on_first_failure(void) {
  static atomic_bool ran;
  const char* cmd = getenv("SLIP_TEST_ON_FAIL");
  if (cmd == NULL || atomic_exchange(&ran, true)) return;
  char line[1024];
  snprintf(line, sizeof line, "SLIP_IT_PID=%d %s", (int)getpid(), cmd);
  if (system(line) != 0) fprintf(stderr, "SLIP_TEST_ON_FAIL: `%s` failed\n", cmd);
}

static int fail(struct ctx* c, int line, const char* fmt, ...) {
  if (c->why[0] != '\0') return -1;
  on_first_failure();
  int n = snprintf(c->why, sizeof c->why, "line %d: ", line);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why + n, sizeof c->why - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

#define CHECK(cond, ...)                                \
  do {                                                  \
    if (!(cond)) return fail(c, __LINE__, __VA_ARGS__); \
  } while (0)
#define TRY(call)              \
  do {                         \
    if ((call) < 0) return -1; \
  } while (0)

static void fatal(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL semantics: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  exit(1);
}

// "returned 5" or "-1 (EAGAIN)": the outcome of a call, given errno after it.
static const char* res_e(ssize_t n, int err) {
  static _Thread_local char bufs[4][64];
  static _Thread_local unsigned next;
  char* b = bufs[next++ % 4];
  if (n < 0) {
    const char* name = strerrorname_np(err);
    snprintf(b, 64, "-1 (%s)", name ? name : "unknown errno");
  } else {
    snprintf(b, 64, "returned %zd", n);
  }
  return b;
}

static const char* res(ssize_t n) {
  return res_e(n, errno);
}

// "IN|RDHUP": poll or epoll event bits (the same values).
static const char* events_str(unsigned ev) {
  static _Thread_local char b[128];
  static const struct {
    unsigned bit;
    const char* name;
  } names[] = {{POLLIN, "IN"},   {POLLPRI, "PRI"},   {POLLOUT, "OUT"},    {POLLERR, "ERR"},
               {POLLHUP, "HUP"}, {POLLNVAL, "NVAL"}, {POLLRDHUP, "RDHUP"}};
  b[0] = '\0';
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (ev & names[i].bit) {
      if (b[0]) strcat(b, "|");
      strcat(b, names[i].name);
    }
  }
  return b[0] ? b : "none";
}

// ------------------------------------------------------------------------ time, waits

static long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// poll() on one descriptor: its revents, 0 on timeout, -1 on error. Signals do not cut
// the wait short.
static int poll_one(int fd, short events, int timeout_ms) {
  long deadline = now_ms() + timeout_ms;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    long left = deadline - now_ms();
    int n = poll(&p, 1, left < 0 ? 0 : (int)left);
    if (n > 0) return p.revents;
    if (n == 0) return 0;
    if (errno != EINTR) return -1;
  }
}

// epoll_wait for at most one event: the number of events (0 or 1), its bits in *ev.
static int epoll_one(int ep, int timeout_ms, uint32_t* ev) {
  struct epoll_event e[4];
  int n;
  do {
    n = epoll_wait(ep, e, 4, timeout_ms);
  } while (n < 0 && errno == EINTR);
  *ev = n > 0 ? e[0].events : 0;
  return n;
}

static int set_timeout(int fd, int option, int ms) {
  struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
  return setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}

static int get_int(int fd, int level, int name, int* value) {
  socklen_t len = sizeof *value;
  return getsockopt(fd, level, name, value, &len);
}

static int set_int(int fd, int level, int name, int value) {
  return setsockopt(fd, level, name, &value, sizeof value);
}

// ------------------------------------------------------------------------ the data pattern

static uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Byte `off` of the stream of `seed`.
static uint8_t pattern_at(uint32_t seed, uint64_t off) {
  return (uint8_t)(mix(((uint64_t)seed << 40) ^ (off >> 3)) >> ((off & 7) * 8));
}

static void pattern(uint8_t* buf, size_t len, uint32_t seed, uint64_t off) {
  for (size_t i = 0; i < len; i++) buf[i] = pattern_at(seed, off + i);
}

// The index of the first byte of buf that differs from the stream at `off`, or -1.
static long long mismatch(const uint8_t* buf, size_t len, uint32_t seed, uint64_t off) {
  for (size_t i = 0; i < len; i++) {
    if (buf[i] != pattern_at(seed, off + i)) return (long long)i;
  }
  return -1;
}

static int check_data(struct ctx* c, int line, const uint8_t* buf, size_t len, uint32_t seed,
                      uint64_t off, const char* what) {
  long long i = mismatch(buf, len, seed, off);
  if (i < 0) return 0;
  return fail(c, line, "%s: byte %llu of the stream is 0x%02x, expected 0x%02x (%zu B checked)",
              what, (unsigned long long)off + (unsigned long long)i, buf[i],
              pattern_at(seed, off + (uint64_t)i), len);
}
#define CHECK_DATA(buf, len, seed, off, what) \
  TRY(check_data(c, __LINE__, buf, len, seed, off, what))

// Sends bytes off..off+len of the stream of `seed` (each wait bounded by WAIT_MS).
static int send_pattern(struct ctx* c, int line, int fd, uint64_t len, uint32_t seed, uint64_t off,
                        const char* what) {
  uint8_t* buf = c->io;
  uint64_t done = 0;
  while (done < len) {
    size_t piece = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
    pattern(buf, piece, seed, off + done);
    size_t sent = 0;
    while (sent < piece) {
      int rev = poll_one(fd, POLLOUT, WAIT_MS);
      if (rev <= 0) {
        return fail(c, line, "%s: %s after %llu of %llu B", what,
                    rev == 0 ? "not writable within the wait" : res(rev),
                    (unsigned long long)(done + sent), (unsigned long long)len);
      }
      ssize_t n = send(fd, buf + sent, piece - sent, MSG_NOSIGNAL);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        return fail(c, line, "%s: send %s after %llu of %llu B", what, res(n),
                    (unsigned long long)(done + sent), (unsigned long long)len);
      }
      sent += (size_t)n;
    }
    done += piece;
  }
  return 0;
}
#define SEND_PATTERN(fd, len, seed, off, what) \
  TRY(send_pattern(c, __LINE__, fd, len, seed, off, what))

// Receives exactly bytes off..off+len of the stream of `seed` and checks them (each wait
// bounded by WAIT_MS).
static int expect_data(struct ctx* c, int line, int fd, uint64_t len, uint32_t seed, uint64_t off,
                       const char* what) {
  uint8_t* buf = c->io;
  uint64_t got = 0;
  while (got < len) {
    int rev = poll_one(fd, POLLIN, WAIT_MS);
    if (rev <= 0) {
      // Readable at once after the wait said nothing: a lost wake-up, not a late arrival.
      ssize_t late = recv(fd, buf, 1, MSG_DONTWAIT | MSG_PEEK);
      return fail(c, line, "%s: %s after %llu of %llu B (then recv at once: %s)", what,
                  rev == 0 ? "nothing more within the wait" : res(rev), (unsigned long long)got,
                  (unsigned long long)len, res(late));
    }
    size_t want = len - got < CHUNK ? (size_t)(len - got) : CHUNK;
    ssize_t n = recv(fd, buf, want, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      return fail(c, line, "%s: recv %s after %llu of %llu B", what, n == 0 ? "EOF" : res(n),
                  (unsigned long long)got, (unsigned long long)len);
    }
    TRY(check_data(c, line, buf, (size_t)n, seed, off + got, what));
    got += (uint64_t)n;
  }
  return 0;
}
#define EXPECT_DATA(fd, len, seed, off, what) \
  TRY(expect_data(c, __LINE__, fd, len, seed, off, what))

// Sends the stream of `seed` from *off until send fails with EAGAIN, and once more after a
// pause (what was in flight has settled by then): the socket is full when this returns.
// `flags` is 0 for a nonblocking socket, MSG_DONTWAIT otherwise; either way no single send
// may block.
static int fill(struct ctx* c, int line, int fd, int flags, uint32_t seed, uint64_t* off) {
  uint8_t* buf = c->io;
  for (int round = 0; round < 2; round++) {
    if (round > 0) sleep_ms(QUIET_MS);
    for (;;) {
      pattern(buf, CHUNK, seed, *off);
      long t0 = now_ms();
      ssize_t n = send(fd, buf, CHUNK, flags | MSG_NOSIGNAL);
      int err = errno;
      long ms = now_ms() - t0;
      if (ms > 500) {
        return fail(c, line, "filling: a nonblocking send blocked for %ld ms (%s)", ms,
                    res_e(n, err));
      }
      if (n < 0 && err == EAGAIN) break;
      if (n <= 0) {
        return fail(c, line, "filling: send %s after %llu B", res_e(n, err),
                    (unsigned long long)*off);
      }
      *off += (uint64_t)n;
      if (*off > FILL_LIMIT) {
        return fail(c, line, "filling: %llu B sent and no EAGAIN while the peer is not reading",
                    (unsigned long long)*off);
      }
    }
  }
  return 0;
}
#define FILL(fd, flags, seed, off) TRY(fill(c, __LINE__, fd, flags, seed, off))

// Keeps a descriptor to be closed when the sub-test ends.
static int own(struct ctx* c, int fd) {
  for (int i = 0; fd >= 0 && i < MAX_OWNED; i++) {
    if (c->owned[i] < 0) {
      c->owned[i] = fd;
      return fd;
    }
  }
  return fd;
}

// Closes an owned descriptor now.
static int close_owned(struct ctx* c, int fd) {
  for (int i = 0; i < MAX_OWNED; i++) {
    if (c->owned[i] == fd) c->owned[i] = -1;
  }
  return close(fd);
}

static void close_all(struct ctx* c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  for (int i = 0; i < MAX_OWNED; i++) {
    if (c->owned[i] >= 0) close(c->owned[i]);
    c->owned[i] = -1;
  }
}

static int address_text(const struct sockaddr_in* a, char* out, size_t size) {
  char ip[INET_ADDRSTRLEN];
  if (a->sin_family != AF_INET || !inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip)) return -1;
  snprintf(out, size, "%s:%u", ip, ntohs(a->sin_port));
  return 0;
}

// "IP:PORT IP:PORT": getsockname and getpeername of fd.
static int names_text(int fd, char* out, size_t size) {
  struct sockaddr_in local, peer;
  socklen_t llen = sizeof local, plen = sizeof peer;
  char l[64], p[64];
  if (getsockname(fd, (struct sockaddr*)&local, &llen) != 0 ||
      getpeername(fd, (struct sockaddr*)&peer, &plen) != 0 || llen != sizeof local ||
      plen != sizeof peer || address_text(&local, l, sizeof l) != 0 ||
      address_text(&peer, p, sizeof p) != 0)
    return -1;
  snprintf(out, size, "%s %s", l, p);
  return 0;
}

// ------------------------------------------------------------------------ the control connection

static pthread_mutex_t ctl_mu = PTHREAD_MUTEX_INITIALIZER;

static void ctl_send(struct ctx* c, const char* fmt, ...) {
  char line[LINE_MAX_LEN];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  for (int i = 0; i < n; i++) {
    if (line[i] == '\n') line[i] = ' ';
  }
  line[n++] = '\n';
  pthread_mutex_lock(&ctl_mu);
  for (int done = 0; done < n;) {
    ssize_t sent = send(c->ctl, line + done, (size_t)(n - done), MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) fatal("control connection: send %s", res(sent));
    done += (int)sent;
  }
  pthread_mutex_unlock(&ctl_mu);
}

// The next line from the control connection, without its newline. The run cannot go on
// without it: no line within timeout_ms ends the process.
static void ctl_line(struct ctx* c, char* line, size_t size, int timeout_ms) {
  long deadline = now_ms() + timeout_ms;
  for (;;) {
    char* nl = memchr(c->ctl_buf, '\n', c->ctl_len);
    if (nl != NULL) {
      size_t len = (size_t)(nl - c->ctl_buf);
      snprintf(line, size, "%.*s", (int)len, c->ctl_buf);
      memmove(c->ctl_buf, nl + 1, c->ctl_len - len - 1);
      c->ctl_len -= len + 1;
      return;
    }
    if (c->ctl_len == sizeof c->ctl_buf) fatal("control connection: line too long");
    long left = deadline - now_ms();
    int rev = poll_one(c->ctl, POLLIN, left < 0 ? 0 : (int)left);
    if (rev == 0) fatal("control connection: the peer said nothing for %d ms", timeout_ms);
    ssize_t n = recv(c->ctl, c->ctl_buf + c->ctl_len, sizeof c->ctl_buf - c->ctl_len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fatal("control connection: recv %s (the peer ended)", n == 0 ? "EOF" : res(n));
    c->ctl_len += (size_t)n;
  }
}

// Sends a command to the helper; its answer is collected by helper_wait, in order.
static void helper_start(struct ctx* c, const char* fmt, ...) {
  char cmd[80];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  if (c->npending < MAX_PENDING) snprintf(c->pending[c->npending++], sizeof cmd, "%s", cmd);
  ctl_send(c, "%s", cmd);
}

// Waits for the answer to the oldest unanswered command: 0 for "ok" (its text in c->reply),
// the helper's reason otherwise.
static int helper_wait(struct ctx* c, int line) {
  char cmd[80] = "?";
  if (c->npending > 0) {
    snprintf(cmd, sizeof cmd, "%s", c->pending[0]);
    memmove(c->pending[0], c->pending[1], sizeof c->pending[0] * (size_t)--c->npending);
  }
  char answer[LINE_MAX_LEN];
  ctl_line(c, answer, sizeof answer, CTL_MS);
  if (strcmp(answer, "ok") == 0 || strncmp(answer, "ok ", 3) == 0) {
    snprintf(c->reply, sizeof c->reply, "%.*s", (int)sizeof c->reply - 1,
             answer[2] ? answer + 3 : "");
    return 0;
  }
  c->helper_failed = true;
  return fail(c, line, "helper `%s`: %s", cmd,
              strncmp(answer, "fail ", 5) == 0 ? answer + 5 : answer);
}
#define AWAIT_HELPER() TRY(helper_wait(c, __LINE__))
#define HELP(...)                 \
  do {                            \
    helper_start(c, __VA_ARGS__); \
    AWAIT_HELPER();               \
  } while (0)

// ------------------------------------------------------------------------ signals, watchdog

static atomic_int sigpipes, usr1s;
static void on_sigpipe(int sig) {
  (void)sig;
  atomic_fetch_add(&sigpipes, 1);
}
static void on_usr1(int sig) {
  (void)sig;
  atomic_fetch_add(&usr1s, 1);
}

// A crash reporter's handler: the default action, at once.
static void on_fault(int sig) {
  signal(sig, SIG_DFL);
  raise(sig);
}

static _Atomic long watchdog_deadline;  // CLOCK_MONOTONIC ms; 0: disarmed
static char watchdog_name[128];

static void* watchdog_main(void* arg) {
  (void)arg;
  for (;;) {
    sleep_ms(50);
    long deadline = atomic_load(&watchdog_deadline);
    if (deadline != 0 && now_ms() > deadline) {
      char msg[256];
      int n = snprintf(msg, sizeof msg,
                       "FAIL %s: still running after %d ms (watchdog: a call that should have "
                       "returned did not)\n",
                       watchdog_name, SUBTEST_LIMIT_MS);
      if (write(STDOUT_FILENO, msg, (size_t)n) < 0) _exit(2);
      _exit(1);
    }
  }
  return NULL;
}

// A thread that takes none of the process's signals.
static void start_quiet_thread(void* (*main)(void*), void* arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t thread;
  if (pthread_create(&thread, NULL, main, arg) != 0) fatal("pthread_create failed");
  pthread_detach(thread);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

// ------------------------------------------------------------------------ threads

// One direction of a transfer: `len` bytes of the stream of `seed`, in random-size calls.
struct xfer {
  struct ctx c;  // this thread's failure and buffer
  int fd;
  uint64_t len;
  uint32_t seed;
  bool send;
};

static int xfer_run(struct xfer* x) {
  struct ctx* c = &x->c;
  uint8_t* buf = c->io;
  uint64_t rng = x->seed * 2654435761u + 1;
  for (uint64_t done = 0; done < x->len;) {
    rng = mix(rng);
    size_t want = 1 + (size_t)(rng % CHUNK);
    if (want > x->len - done) want = (size_t)(x->len - done);
    ssize_t n;
    if (x->send) {
      pattern(buf, want, x->seed, done);
      n = send(x->fd, buf, want, MSG_NOSIGNAL);
    } else {
      n = recv(x->fd, buf, want, 0);
    }
    if (n < 0 && errno == EINTR) continue;
    CHECK(n > 0, "%s after %llu of %llu B: %s", x->send ? "send" : "recv", (unsigned long long)done,
          (unsigned long long)x->len, n == 0 ? "EOF" : res(n));
    if (!x->send) CHECK_DATA(buf, (size_t)n, x->seed, done, "received");
    done += (uint64_t)n;
  }
  return 0;
}

static void* xfer_main(void* arg) {
  xfer_run(arg);
  return NULL;
}

// Sends and receives at once on one socket, from two threads; blocking calls, bounded by
// the socket's timeouts.
static int duplex(struct ctx* c, int line, uint64_t len, uint32_t send_seed, uint32_t recv_seed) {
  static struct xfer tx, rx;  // one duplex() at a time in a process
  tx = (struct xfer){.fd = c->fd, .len = len, .seed = send_seed, .send = true};
  rx = (struct xfer){.fd = c->fd, .len = len, .seed = recv_seed, .send = false};
  pthread_t threads[2];
  if (pthread_create(&threads[0], NULL, xfer_main, &tx) != 0 ||
      pthread_create(&threads[1], NULL, xfer_main, &rx) != 0)
    fatal("pthread_create failed");
  pthread_join(threads[0], NULL);
  pthread_join(threads[1], NULL);
  if (tx.c.why[0]) return fail(c, line, "sending thread: %s", tx.c.why);
  if (rx.c.why[0]) return fail(c, line, "receiving thread: %s", rx.c.why);
  return 0;
}

// ------------------------------------------------------------------------ extra connections
//
// Sub-tests that need more connections than their one data connection open them on the
// same listener (so that every connection is on the test port and counted in the stats).

// A new connection: accept4(flags) on the server, socket(SOCK_STREAM | flags) and connect
// on the client (nonblocking: EINPROGRESS, then POLLOUT and SO_ERROR 0). Counted in
// c->connections. The descriptor, or -1 with the failure noted.
static int open_extra(struct ctx* c, int line, int flags) {
  int fd;
  if (c->is_server) {
    int rev = poll_one(c->listener, POLLIN, WAIT_MS);
    if (rev <= 0) {
      return fail(c, line, "nothing to accept within %d ms (%s)", WAIT_MS,
                  rev < 0 ? res(rev) : "timeout");
    }
    fd = accept4(c->listener, NULL, NULL, flags);
    if (fd < 0) return fail(c, line, "accept4: %s", res(fd));
  } else {
    fd = socket(AF_INET, SOCK_STREAM | flags, 0);
    if (fd < 0) return fail(c, line, "socket: %s", res(fd));
    if (connect(fd, (struct sockaddr*)&c->server_addr, sizeof c->server_addr) != 0) {
      int err = errno, rev = 0, so = -1;
      if ((flags & SOCK_NONBLOCK) && err == EINPROGRESS) {
        rev = poll_one(fd, POLLOUT, WAIT_MS);
        if (rev > 0) get_int(fd, SOL_SOCKET, SO_ERROR, &so);
      }
      if (so != 0) {
        close(fd);
        return fail(c, line, "connect: %s (then poll %s, SO_ERROR %d)", res_e(-1, err),
                    rev > 0 ? events_str((unsigned)rev) : "nothing", so);
      }
    }
  }
  c->connections++;
  return fd;
}

static int send_all(struct ctx* c, int line, int fd, const void* buf, size_t len) {
  for (size_t done = 0; done < len;) {
    ssize_t n = send(fd, (const char*)buf + done, len - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(c, line, "send: %s after %zu of %zu B", res(n), done, len);
    done += (size_t)n;
  }
  return 0;
}

// One exchange on an extra connection. The client sends a 4-byte index and `len` bytes of
// the stream SEED+index; the server checks them, answers with `len` bytes of the stream
// SEED+1000+index and closes; the client checks the answer and the EOF after it.
static int exchange_client(struct ctx* c, int fd, uint32_t index, uint64_t len, uint32_t seed) {
  TRY(send_all(c, __LINE__, fd, &index, sizeof index));
  SEND_PATTERN(fd, len, seed + index, 0, "request");
  EXPECT_DATA(fd, len, seed + 1000 + index, 0, "answer");
  int rev = poll_one(fd, POLLIN, WAIT_MS);
  uint8_t b;
  ssize_t n = rev > 0 ? recv(fd, &b, 1, 0) : -1;
  CHECK(n == 0, "connection %u: no EOF after the answer (poll %s, recv %s)", index,
        rev > 0 ? events_str((unsigned)rev) : "nothing", res(n));
  return 0;
}

// The server's side; seen[index] counts how often connection `index` was accepted.
static int exchange_server(struct ctx* c, int fd, uint64_t len, uint32_t seed, atomic_int* seen,
                           uint32_t count) {
  uint32_t index = UINT32_MAX;
  ssize_t n = recv(fd, &index, sizeof index, MSG_WAITALL);
  CHECK(n == sizeof index && index < count, "accepted connection: index %s, value %u (of %u)",
        res(n), index, count);
  CHECK(atomic_fetch_add(&seen[index], 1) == 0, "connection %u accepted twice", index);
  EXPECT_DATA(fd, len, seed + index, 0, "request");
  SEND_PATTERN(fd, len, seed + 1000 + index, 0, "answer");
  return 0;
}

// ------------------------------------------------------------------------ the helper

static int helper_eof(struct ctx* c) {
  int rev = poll_one(c->fd, POLLIN | POLLRDHUP, WAIT_MS);
  CHECK(rev > 0, "no EOF within %d ms (poll %s)", WAIT_MS, res(rev));
  CHECK((rev & (POLLIN | POLLRDHUP)) == (POLLIN | POLLRDHUP) && !(rev & POLLHUP),
        "poll at the peer's EOF reports %s, expected IN|RDHUP without HUP (this side is still "
        "open)",
        events_str((unsigned)rev));
  uint8_t b[16];
  ssize_t n = recv(c->fd, b, sizeof b, 0);
  CHECK(n == 0, "recv at EOF: %s", res(n));
  n = recv(c->fd, b, sizeof b, MSG_DONTWAIT);
  CHECK(n == 0, "a second recv at EOF: %s", res(n));
  return 0;
}

// The first recv after the peer's abortive close (SO_LINGER {1, 0}), its result and errno:
// Linux TCP reports ECONNRESET once (Slipstream: the control thread sees the anchor's RST).
static int reset_outcome(struct ctx* c, int line, ssize_t n, int err, const char* what) {
  if (n == -1 && err == ECONNRESET) {
    snprintf(c->reply, sizeof c->reply, "ECONNRESET");
    return 0;
  }
  return fail(c, line, "%s: %s, expected ECONNRESET", what, res_e(n, err));
}

// The peer closed abortively: the first recv reports ECONNRESET (see reset_outcome), the
// next EOF, and a send fails with EPIPE.
static int helper_reset(struct ctx* c) {
  int rev = poll_one(c->fd, POLLIN | POLLRDHUP, WAIT_MS);
  CHECK(rev > 0, "nothing within %d ms after the peer's abortive close", WAIT_MS);
  uint8_t b[16];
  ssize_t n = recv(c->fd, b, sizeof b, 0);
  TRY(reset_outcome(c, __LINE__, n, errno, "recv after the peer's abortive close"));
  n = recv(c->fd, b, sizeof b, MSG_DONTWAIT);
  CHECK(n == 0, "a second recv after the reset: %s, expected EOF", res(n));
  n = send(c->fd, b, 1, MSG_NOSIGNAL);
  CHECK(n == -1 && errno == EPIPE, "send after the reset: %s, expected EPIPE", res(n));
  return 0;
}

static int helper_command(struct ctx* c, const char* cmd) {
  unsigned long long len, off;
  unsigned seed, seed2;
  int pieces = 1, gap = 0, after = 0, ms;
  if (sscanf(cmd, "send %llu %u %llu %d %d %d", &len, &seed, &off, &pieces, &gap, &after) >= 3) {
    sleep_ms(after);
    for (int p = 0; p < pieces; p++) {
      uint64_t from = len * (uint64_t)p / (uint64_t)pieces;
      uint64_t to = len * (uint64_t)(p + 1) / (uint64_t)pieces;
      if (p > 0) sleep_ms(gap);
      SEND_PATTERN(c->fd, to - from, seed, off + from, "send");
    }
    return 0;
  }
  if (sscanf(cmd, "recv %llu %u %llu", &len, &seed, &off) == 3) {
    EXPECT_DATA(c->fd, len, seed, off, "recv");
    return 0;
  }
  if (strcmp(cmd, "eof") == 0) return helper_eof(c);
  if (sscanf(cmd, "quiet %d", &ms) == 1) {
    int rev = poll_one(c->fd, POLLIN | POLLRDHUP, ms);
    CHECK(rev == 0, "expected nothing for %d ms, poll reports %s", ms,
          rev < 0 ? res(rev) : events_str((unsigned)rev));
    return 0;
  }
  if (strcmp(cmd, "shutwr") == 0) {
    CHECK(shutdown(c->fd, SHUT_WR) == 0, "shutdown(SHUT_WR): %s", res(-1));
    return 0;
  }
  if (strcmp(cmd, "close") == 0) {
    int rc = close(c->fd);
    c->fd = -1;
    CHECK(rc == 0, "close: %s", res(rc));
    return 0;
  }
  if (sscanf(cmd, "duplex %llu %u %u", &len, &seed, &seed2) == 3) {
    return duplex(c, __LINE__, len, seed, seed2);
  }
  if (strcmp(cmd, "names") == 0) {
    CHECK(names_text(c->fd, c->reply, sizeof c->reply) == 0, "getsockname/getpeername: %s",
          res(-1));
    return 0;
  }
  if (strcmp(cmd, "reconnect") == 0) {  // a new data connection in place of this one
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    int fd = open_extra(c, __LINE__, SOCK_CLOEXEC);
    if (fd < 0) return -1;
    c->fd = fd;
    CHECK(set_timeout(fd, SO_RCVTIMEO, WAIT_MS) == 0 && set_timeout(fd, SO_SNDTIMEO, WAIT_MS) == 0,
          "SO_RCVTIMEO/SO_SNDTIMEO: %s", res(-1));
    return 0;
  }
  unsigned count;
  if (sscanf(cmd, "connect %u %llu %u", &count, &len, &seed) == 3 && count <= 64) {
    int fds[64];
    for (unsigned i = 0; i < count; i++) {
      fds[i] = open_extra(c, __LINE__, SOCK_CLOEXEC);
      if (fds[i] >= 0) {
        set_timeout(fds[i], SO_RCVTIMEO, WAIT_MS);
        set_timeout(fds[i], SO_SNDTIMEO, WAIT_MS);
      }
    }
    int rc = 0;
    for (unsigned i = 0; i < count; i++) {
      if (rc == 0 && fds[i] >= 0) rc = exchange_client(c, fds[i], i, len, seed);
      if (fds[i] >= 0) close(fds[i]);
    }
    return c->why[0] ? -1 : rc;
  }
  if (sscanf(cmd, "accept %u %llu %u", &count, &len, &seed) == 3 && count <= 64) {
    static atomic_int seen[64];
    for (unsigned i = 0; i < count; i++) atomic_store(&seen[i], 0);
    for (unsigned i = 0; i < count; i++) {
      int fd = open_extra(c, __LINE__, SOCK_CLOEXEC);
      if (fd < 0) return -1;
      set_timeout(fd, SO_RCVTIMEO, WAIT_MS);
      set_timeout(fd, SO_SNDTIMEO, WAIT_MS);
      int rc = exchange_server(c, fd, len, seed, seen, count);
      close(fd);
      TRY(rc);
    }
    return 0;
  }
  if (strcmp(cmd, "abort") == 0) {  // an abortive close: SO_LINGER {1, 0}
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    CHECK(setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER: %s", res(-1));
    int rc = close(c->fd);
    c->fd = -1;
    CHECK(rc == 0, "close: %s", res(rc));
    return 0;
  }
  if (strcmp(cmd, "reset") == 0) return helper_reset(c);
  unsigned byte;
  if (sscanf(cmd, "urgent %llu %u %u", &len, &seed, &byte) == 3 && len <= CHUNK) {
    // Bytes 0..len+2 of the stream, the last two in one send(MSG_OOB) with the urgent
    // byte after them (the last byte of such a send is the urgent one); then len more.
    SEND_PATTERN(c->fd, len, seed, 0, "before the urgent send");
    uint8_t three[3];
    pattern(three, 2, seed, len);
    three[2] = (uint8_t)byte;
    ssize_t n = send(c->fd, three, 3, MSG_OOB);
    CHECK(n == 3, "send(3 bytes, MSG_OOB): %s", res(n));
    SEND_PATTERN(c->fd, len, seed, len + 2, "after the urgent send");
    return 0;
  }
  if (sscanf(cmd, "bounded %u", &seed) == 1) {
    // With SO_SNDBUF at 4 KiB, write ahead without waiting until the socket refuses (once
    // more after 50 ms); answer "ok WRITTEN SNDBUF".
    CHECK(set_int(c->fd, SOL_SOCKET, SO_SNDBUF, 4096) == 0, "SO_SNDBUF: %s", res(-1));
    int snd = 0;
    CHECK(get_int(c->fd, SOL_SOCKET, SO_SNDBUF, &snd) == 0, "SO_SNDBUF: %s", res(-1));
    sleep_ms(100);  // (the reader's buffer size reaches this end apart from this command)
    uint64_t off = 0;
    bool retried = false;
    while (off < (8u << 20)) {
      pattern(c->io, 1000, seed, off);
      ssize_t n = send(c->fd, c->io, 1000, MSG_DONTWAIT);
      if (n > 0) {
        off += (uint64_t)n;
        continue;
      }
      CHECK(n < 0 && errno == EAGAIN, "send(MSG_DONTWAIT) after %llu bytes: %s",
            (unsigned long long)off, res(n));
      if (retried) break;
      retried = true;
      sleep_ms(50);
    }
    snprintf(c->reply, sizeof c->reply, "%llu %d", (unsigned long long)off, snd);
    return 0;
  }
  return fail(c, __LINE__, "unknown command");
}

// ------------------------------------------------------------------------ the sub-tests
//
// Each runs on the tester's side with the fresh connection c->fd, drives the helper with
// HELP (command and answer) or helper_start/AWAIT_HELPER (the answer later), and returns 0
// or the failure recorded by CHECK.

static uint8_t scratch[CHUNK];  // the tester's main thread's buffer

// Urgent data, as TCP has it: the receiver gets POLLPRI and its owner SIGURG; reads stop
// at the mark; at it, sockatmark() says 1 and the urgent byte is recv(MSG_OOB)'s alone (out
// of line) or the next ordinary byte (SO_OOBINLINE). Over an accelerated connection the
// mark travels apart from the bytes: a read that crossed it, or an urgent byte read as
// data, would show here.
static atomic_int sigurgs;
static void on_sigurg(int sig) {
  (void)sig;
  atomic_fetch_add(&sigurgs, 1);
}

static int urgent_case(struct ctx* c, bool in_line) {
  uint8_t* b = scratch;
  const unsigned seed = in_line ? 32 : 31, byte = in_line ? 90 : 165;
  struct sigaction sa = {.sa_handler = on_sigurg, .sa_flags = SA_RESTART}, old;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGURG, &sa, &old);
  atomic_store(&sigurgs, 0);
  CHECK(fcntl(c->fd, F_SETOWN, getpid()) == 0, "fcntl(F_SETOWN): %s", res(-1));
  if (in_line) CHECK(set_int(c->fd, SOL_SOCKET, SO_OOBINLINE, 1) == 0, "SO_OOBINLINE: %s", res(-1));
  char cmd[64];
  snprintf(cmd, sizeof cmd, "urgent 1000 %u %u", seed, byte);
  HELP("%s", cmd);
  int rev = poll_one(c->fd, POLLPRI, WAIT_MS);
  CHECK(rev > 0 && (rev & POLLPRI), "poll(POLLPRI) once urgent data was sent: %s",
        rev < 0 ? res(rev) : events_str((unsigned)rev));
  for (long deadline = now_ms() + WAIT_MS; !atomic_load(&sigurgs) && now_ms() < deadline;)
    sleep_ms(1);
  CHECK(atomic_load(&sigurgs) > 0, "no SIGURG for the socket's owner (F_SETOWN)");
  size_t got = 0;
  while (got < 1002) {
    ssize_t n = recv(c->fd, b + got, CHUNK - got, 0);
    CHECK(n > 0, "recv before the urgent mark: %s after %zu bytes", res(n), got);
    got += (size_t)n;
  }
  CHECK(got == 1002, "a read crossed the urgent mark: %zu bytes before it, expected 1002", got);
  CHECK_DATA(b, 1002, seed, 0, "before the mark");
  CHECK(sockatmark(c->fd) == 1, "sockatmark() at the mark: %d", sockatmark(c->fd));
  uint8_t u = 0;
  ssize_t n = recv(c->fd, &u, 1, MSG_OOB | MSG_PEEK);
  if (in_line) {
    CHECK(n == -1 && errno == EINVAL, "recv(MSG_OOB) with SO_OOBINLINE: %s", res(n));
    n = recv(c->fd, b, 1, 0);
    CHECK(n == 1 && b[0] == byte, "the urgent byte in line: %s, byte %u (expected %u)", res(n),
          b[0], byte);
  } else {
    CHECK(n == 1 && u == byte, "recv(MSG_OOB|MSG_PEEK): %s, byte %u (expected %u)", res(n), u,
          byte);
    u = 0;
    n = recv(c->fd, &u, 1, MSG_OOB);
    CHECK(n == 1 && u == byte, "recv(MSG_OOB): %s, byte %u (expected %u)", res(n), u, byte);
    n = recv(c->fd, &u, 1, MSG_OOB);
    CHECK(n == -1 && errno == EINVAL, "a second recv(MSG_OOB): %s", res(n));
  }
  EXPECT_DATA(c->fd, 1000, seed, 1002, "after the mark");
  CHECK(sockatmark(c->fd) == 0, "sockatmark() past the mark: %d", sockatmark(c->fd));
  sigaction(SIGURG, &old, NULL);
  return 0;
}

static int t_urgent(struct ctx* c) {
  return urgent_case(c, false);
}

static int t_urgent_inline(struct ctx* c) {
  return urgent_case(c, true);
}

// recvmmsg on a stream: one receive per entry, each of which may wait, unless
// MSG_WAITFORONE makes those after the first non-blocking. And recvmsg(MSG_ERRQUEUE).
static int t_recvmmsg(struct ctx* c) {
  uint8_t* b = scratch;
  struct iovec v[2] = {{b, 100}, {b + 100, 100}};
  struct mmsghdr m[2];
  memset(m, 0, sizeof m);
  m[0].msg_hdr.msg_iov = &v[0];
  m[1].msg_hdr.msg_iov = &v[1];
  m[0].msg_hdr.msg_iovlen = m[1].msg_hdr.msg_iovlen = 1;
  helper_start(c, "send 200 41 0 2 300");
  int n = recvmmsg(c->fd, m, 2, MSG_WAITFORONE, NULL);
  CHECK(n == 1 && m[0].msg_len == 100,
        "recvmmsg(2 entries, MSG_WAITFORONE) of 100 B, 100 more 300 ms later: %d (%u B)", n,
        n > 0 ? m[0].msg_len : 0);
  CHECK_DATA(b, 100, 41, 0, "the first entry");
  EXPECT_DATA(c->fd, 100, 41, 100, "the second piece");
  AWAIT_HELPER();
  helper_start(c, "send 200 42 0 2 300");
  long t0 = now_ms();
  n = recvmmsg(c->fd, m, 2, 0, NULL);
  long ms = now_ms() - t0;
  AWAIT_HELPER();
  CHECK(n == 2 && m[0].msg_len == 100 && m[1].msg_len == 100,
        "recvmmsg(2 entries) of 100 B, 100 more 300 ms later: %d (%u B, %u B) after %ld ms", n,
        n > 0 ? m[0].msg_len : 0, n > 1 ? m[1].msg_len : 0, ms);
  CHECK_DATA(b, 200, 42, 0, "both entries");
  // The error queue is not the stream: empty, EAGAIN, and the stream's bytes stay.
  HELP("send 100 43 0");
  struct msghdr eq = {.msg_iov = &v[0], .msg_iovlen = 1};
  ssize_t r = recvmsg(c->fd, &eq, MSG_ERRQUEUE);
  CHECK(r == -1 && errno == EAGAIN, "recvmsg(MSG_ERRQUEUE) with stream bytes queued: %s", res(r));
  EXPECT_DATA(c->fd, 100, 43, 0, "the bytes after MSG_ERRQUEUE");
  return 0;
}

// Buffer sizes: a sender whose SO_SNDBUF and whose reader's SO_RCVBUF are small can write
// only about their sum ahead of the reader, as over TCP (where a program's own flow
// control, or its peer's close with bytes unread resetting it, relies on that); an
// accelerated stream's ring alone would take a megabyte.
static int t_buffer_bound(struct ctx* c) {
  CHECK(set_int(c->fd, SOL_SOCKET, SO_RCVBUF, 4096) == 0, "SO_RCVBUF: %s", res(-1));
  int rcv = 0;
  CHECK(get_int(c->fd, SOL_SOCKET, SO_RCVBUF, &rcv) == 0, "SO_RCVBUF: %s", res(-1));
  // An accelerated peer learns the size from a WINDOW on the TCP connection, which its
  // control thread reads: on a loaded host (or under a sanitizer) that may take longer
  // than the helper's command on its own socket, so it is given the time, as a TCP
  // peer learns a smaller window only from the segments that follow.
  usleep(200 * 1000);
  HELP("bounded 51");
  unsigned long long written = 0;
  int snd = 0;
  CHECK(sscanf(c->reply, "%llu %d", &written, &snd) == 2, "the helper's answer: %s", c->reply);
  // TCP on loopback takes a few times the sum (its window was opened before the change).
  const unsigned long long bound = 4ull * (unsigned)(rcv + snd) + 65536;
  CHECK(written > 0 && written <= bound,
        "a sender with SO_SNDBUF %d wrote %llu bytes ahead of a reader with SO_RCVBUF %d "
        "(more than %llu)",
        snd, written, rcv, bound);
  EXPECT_DATA(c->fd, written, 51, 0, "what the sender wrote ahead");
  return 0;
}

static int t_peek(struct ctx* c) {
  uint8_t* b = scratch;
  HELP("send 1000 11 0");
  // Peek until the whole message is there: a peek must never consume it.
  ssize_t n = -1;
  for (long deadline = now_ms() + WAIT_MS; now_ms() < deadline; sleep_ms(1)) {
    if ((n = recv(c->fd, b, 1000, MSG_PEEK | MSG_DONTWAIT)) == 1000) break;
  }
  CHECK(n == 1000, "recv(MSG_PEEK) of a 1000-byte message: %s", res(n));
  CHECK_DATA(b, 1000, 11, 0, "peeked");
  memset(b, 0, 1000);
  n = recv(c->fd, b, 100, MSG_PEEK);
  CHECK(n == 100, "a second recv(MSG_PEEK, 100): %s", res(n));
  CHECK_DATA(b, 100, 11, 0, "peeked again");
  n = recv(c->fd, b, 400, 0);
  CHECK(n == 400, "recv(400) after peeking: %s", res(n));
  CHECK_DATA(b, 400, 11, 0, "read after peeking");
  n = recv(c->fd, b, 1000, MSG_PEEK);
  CHECK(n == 600, "recv(MSG_PEEK, 1000) with 600 B left: %s", res(n));
  CHECK_DATA(b, 600, 11, 400, "peek of the rest");
  n = recv(c->fd, b, 1000, 0);
  CHECK(n == 600, "recv(1000) of the rest: %s", res(n));
  CHECK_DATA(b, 600, 11, 400, "the rest");
  n = recv(c->fd, b, 1000, MSG_PEEK | MSG_DONTWAIT);
  CHECK(n == -1 && errno == EAGAIN, "recv(MSG_PEEK|MSG_DONTWAIT) once all is read: %s", res(n));
  return 0;
}

// Linux TCP: MSG_PEEK|MSG_WAITALL waits for the whole length, and still consumes nothing.
static int t_peek_waitall(struct ctx* c) {
  uint8_t* b = scratch;
  helper_start(c, "send 3000 12 0 3 60");
  long t0 = now_ms();
  ssize_t n = recv(c->fd, b, 3000, MSG_PEEK | MSG_WAITALL);
  int err = errno;
  long ms = now_ms() - t0;
  AWAIT_HELPER();
  CHECK(n == 3000, "recv(MSG_PEEK|MSG_WAITALL, 3000) of 3 pieces 60 ms apart: %s after %ld ms",
        res_e(n, err), ms);
  CHECK_DATA(b, 3000, 12, 0, "peeked");
  n = recv(c->fd, b, 3000, MSG_DONTWAIT);
  CHECK(n == 3000, "recv after the peek: %s (the peek consumed bytes?)", res(n));
  CHECK_DATA(b, 3000, 12, 0, "read after the peek");
  return 0;
}

static int t_waitall(struct ctx* c) {
  uint8_t* b = scratch;
  helper_start(c, "send 3000 13 0 3 60");
  long t0 = now_ms();
  ssize_t n = recv(c->fd, b, 3000, MSG_WAITALL);
  int err = errno;
  long ms = now_ms() - t0;
  AWAIT_HELPER();
  CHECK(n == 3000, "recv(MSG_WAITALL, 3000) of 3 pieces 60 ms apart: %s after %ld ms",
        res_e(n, err), ms);
  CHECK_DATA(b, 3000, 13, 0, "received");
  // At EOF, MSG_WAITALL returns what there is, then 0.
  HELP("send 100 14 0");
  HELP("shutwr");
  n = recv(c->fd, b, 1000, MSG_WAITALL);
  CHECK(n == 100, "recv(MSG_WAITALL, 1000) of 100 B then EOF: %s", res(n));
  CHECK_DATA(b, 100, 14, 0, "received before EOF");
  n = recv(c->fd, b, 1000, MSG_WAITALL);
  CHECK(n == 0, "recv(MSG_WAITALL) at EOF: %s", res(n));
  return 0;
}

static int t_dontwait(struct ctx* c) {
  uint8_t* b = scratch;
  long t0 = now_ms();
  ssize_t n = recv(c->fd, b, 100, MSG_DONTWAIT);
  int err = errno;
  long ms = now_ms() - t0;
  CHECK(n == -1 && err == EAGAIN && ms < 500,
        "recv(MSG_DONTWAIT) on an empty socket: %s after %ld ms", res_e(n, err), ms);
  int flags = fcntl(c->fd, F_GETFL);
  CHECK(flags >= 0 && !(flags & O_NONBLOCK),
        "MSG_DONTWAIT left the socket nonblocking (F_GETFL %#x)", (unsigned)flags);
  HELP("send 100 15 0");
  CHECK(poll_one(c->fd, POLLIN, WAIT_MS) > 0, "no POLLIN within %d ms", WAIT_MS);
  n = recv(c->fd, b, 100, MSG_DONTWAIT);
  CHECK(n == 100, "recv(MSG_DONTWAIT) with 100 B queued: %s", res(n));
  CHECK_DATA(b, 100, 15, 0, "received");
  n = recv(c->fd, b, 100, MSG_DONTWAIT);
  CHECK(n == -1 && errno == EAGAIN, "recv(MSG_DONTWAIT) once all is read: %s", res(n));
  pattern(b, 100, 16, 0);
  n = send(c->fd, b, 100, MSG_DONTWAIT);
  CHECK(n == 100, "send(MSG_DONTWAIT) of 100 B: %s", res(n));
  HELP("recv 100 16 0");
  return 0;
}

enum nonblock_method { BY_FCNTL, BY_IOCTL };

static int set_nonblocking(int fd, enum nonblock_method how, bool on) {
  if (how == BY_IOCTL) {
    int value = on;
    return ioctl(fd, FIONBIO, &value);
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return -1;
  return fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
}

// A nonblocking socket: EAGAIN on recv, and on send once the peer stops reading; POLLOUT
// again once the peer drains; back to blocking when the mode is cleared.
static int nonblocking(struct ctx* c, enum nonblock_method how) {
  const char* m = how == BY_FCNTL ? "fcntl(O_NONBLOCK)" : "ioctl(FIONBIO)";
  uint8_t* b = scratch;
  CHECK(set_nonblocking(c->fd, how, true) == 0, "%s: %s", m, res(-1));
  CHECK(fcntl(c->fd, F_GETFL) & O_NONBLOCK, "after %s, F_GETFL shows no O_NONBLOCK", m);
  long t0 = now_ms();
  ssize_t n = recv(c->fd, b, 100, 0);
  int err = errno;
  long ms = now_ms() - t0;
  CHECK(n == -1 && err == EAGAIN && ms < 500, "recv on an empty socket after %s: %s after %ld ms",
        m, res_e(n, err), ms);
  uint64_t queued = 0;
  FILL(c->fd, 0, 21, &queued);
  int rev = poll_one(c->fd, POLLOUT, QUIET_MS);
  CHECK(rev == 0, "poll reports %s on a full socket (%llu B queued, the peer not reading)",
        events_str((unsigned)rev), (unsigned long long)queued);
  helper_start(c, "recv %llu 21 0", (unsigned long long)queued);
  t0 = now_ms();
  rev = poll_one(c->fd, POLLOUT, WAIT_MS);
  ms = now_ms() - t0;
  CHECK(rev > 0 && (rev & POLLOUT), "poll while the peer drains %llu B: %s after %ld ms",
        (unsigned long long)queued, rev > 0 ? events_str((unsigned)rev) : "no POLLOUT", ms);
  AWAIT_HELPER();
  pattern(b, 100, 21, queued);
  n = send(c->fd, b, 100, 0);
  CHECK(n == 100, "send of 100 B once writable again: %s", res(n));
  HELP("recv 100 21 %llu", (unsigned long long)queued);
  // Blocking again: recv waits for SO_RCVTIMEO instead of failing at once.
  CHECK(set_nonblocking(c->fd, how, false) == 0, "clearing %s: %s", m, res(-1));
  CHECK(!(fcntl(c->fd, F_GETFL) & O_NONBLOCK),
        "nonblocking mode cleared, F_GETFL shows O_NONBLOCK");
  CHECK(set_timeout(c->fd, SO_RCVTIMEO, 100) == 0, "SO_RCVTIMEO: %s", res(-1));
  t0 = now_ms();
  n = recv(c->fd, b, 100, 0);
  err = errno;
  ms = now_ms() - t0;
  CHECK(n == -1 && err == EAGAIN && ms >= 80,
        "recv after clearing %s (100 ms SO_RCVTIMEO, no data): %s after %ld ms", m, res_e(n, err),
        ms);
  return 0;
}

static int t_nonblock_fcntl(struct ctx* c) {
  return nonblocking(c, BY_FCNTL);
}
static int t_nonblock_ioctl(struct ctx* c) {
  return nonblocking(c, BY_IOCTL);
}

static int t_fionread(struct ctx* c) {
  uint8_t* b = scratch;
  int q = -1, inq = -1;
  CHECK(ioctl(c->fd, FIONREAD, &q) == 0 && q == 0, "FIONREAD on an empty socket: %d", q);
  HELP("send 3500 31 0 3 0");
  for (long deadline = now_ms() + WAIT_MS; now_ms() < deadline; sleep_ms(1)) {
    CHECK(ioctl(c->fd, FIONREAD, &q) == 0, "FIONREAD: %s", res(-1));
    CHECK(q <= 3500, "FIONREAD reports %d B, the peer sent 3500", q);
    if (q == 3500) break;
  }
  CHECK(q == 3500, "FIONREAD reports %d B, the peer sent 3500", q);
  CHECK(ioctl(c->fd, SIOCINQ, &inq) == 0 && inq == 3500, "SIOCINQ reports %d, FIONREAD 3500", inq);
  ssize_t n = recv(c->fd, b, 1000, 0);
  CHECK(n == 1000, "recv(1000): %s", res(n));
  CHECK_DATA(b, 1000, 31, 0, "received");
  CHECK(ioctl(c->fd, FIONREAD, &q) == 0 && q == 2500, "FIONREAD after reading 1000 of 3500: %d", q);
  n = recv(c->fd, b, 100, MSG_PEEK);
  CHECK(n == 100, "recv(MSG_PEEK, 100): %s", res(n));
  CHECK(ioctl(c->fd, FIONREAD, &q) == 0 && q == 2500, "FIONREAD after a peek: %d, expected 2500",
        q);
  EXPECT_DATA(c->fd, 2500, 31, 1000, "the rest");
  CHECK(ioctl(c->fd, FIONREAD, &q) == 0 && q == 0, "FIONREAD once all is read: %d", q);
  return 0;
}

// The option reads back as set (the kernel keeps it in jiffies: allow a few ms).
static int check_timeout(struct ctx* c, int line, int option, int ms) {
  struct timeval tv;
  socklen_t len = sizeof tv;
  if (getsockopt(c->fd, SOL_SOCKET, option, &tv, &len) != 0) {
    return fail(c, line, "getsockopt: %s", res(-1));
  }
  long got = tv.tv_sec * 1000L + tv.tv_usec / 1000;
  if (got < ms - 10 || got > ms + 10) return fail(c, line, "set to %d ms, reads %ld ms", ms, got);
  return 0;
}

static int t_rcvtimeo(struct ctx* c) {
  uint8_t* b = scratch;
  CHECK(set_timeout(c->fd, SO_RCVTIMEO, 200) == 0, "SO_RCVTIMEO: %s", res(-1));
  TRY(check_timeout(c, __LINE__, SO_RCVTIMEO, 200));
  long t0 = now_ms();
  ssize_t n = recv(c->fd, b, 64, 0);
  int err = errno;
  long ms = now_ms() - t0;
  CHECK(n == -1 && err == EAGAIN && ms >= 180 && ms < 1500,
        "recv with a 200 ms SO_RCVTIMEO and no data: %s after %ld ms", res_e(n, err), ms);
  t0 = now_ms();
  n = read(c->fd, b, 64);
  err = errno;
  ms = now_ms() - t0;
  CHECK(n == -1 && err == EAGAIN && ms >= 180 && ms < 1500,
        "read with a 200 ms SO_RCVTIMEO and no data: %s after %ld ms", res_e(n, err), ms);
  HELP("send 64 41 0");
  n = recv(c->fd, b, 64, MSG_WAITALL);
  CHECK(n == 64, "recv(MSG_WAITALL, 64) of 64 B sent before: %s", res(n));
  CHECK_DATA(b, 64, 41, 0, "received");
  return 0;
}

static int t_sndtimeo(struct ctx* c) {
  uint8_t* b = scratch;
  CHECK(set_timeout(c->fd, SO_SNDTIMEO, 200) == 0, "SO_SNDTIMEO: %s", res(-1));
  TRY(check_timeout(c, __LINE__, SO_SNDTIMEO, 200));
  uint64_t queued = 0;
  FILL(c->fd, MSG_DONTWAIT, 51, &queued);
  pattern(b, CHUNK, 51, queued);
  long t0 = now_ms();
  ssize_t n = send(c->fd, b, CHUNK, MSG_NOSIGNAL);
  int err = errno;
  long ms = now_ms() - t0;
  CHECK(n == -1 && err == EAGAIN && ms >= 180 && ms < 1500,
        "blocking send with a 200 ms SO_SNDTIMEO on a full socket (%llu B queued): %s after %ld "
        "ms",
        (unsigned long long)queued, res_e(n, err), ms);
  HELP("recv %llu 51 0", (unsigned long long)queued);
  // Room again: the blocking send goes through.
  n = send(c->fd, b, CHUNK, MSG_NOSIGNAL);
  CHECK(n == CHUNK, "blocking send of %d B once the peer drained: %s", CHUNK, res(n));
  HELP("recv %d 51 %llu", CHUNK, (unsigned long long)queued);
  return 0;
}

static int t_halfclose(struct ctx* c) {
  uint8_t* b = scratch;
  SEND_PATTERN(c->fd, 5000, 61, 0, "request");
  CHECK(shutdown(c->fd, SHUT_WR) == 0, "shutdown(SHUT_WR): %s", res(-1));
  HELP("recv 5000 61 0");
  HELP("eof");
  ssize_t n = send(c->fd, b, 16, MSG_NOSIGNAL);
  CHECK(n == -1 && errno == EPIPE, "send after shutdown(SHUT_WR): %s, expected EPIPE", res(n));
  HELP("send 7000 62 0");
  EXPECT_DATA(c->fd, 7000, 62, 0, "the answer after our shutdown(SHUT_WR)");
  HELP("close");
  int rev = poll_one(c->fd, POLLIN | POLLRDHUP, WAIT_MS);
  CHECK(rev > 0 && (rev & (POLLIN | POLLRDHUP | POLLHUP)) == (POLLIN | POLLRDHUP | POLLHUP),
        "poll at EOF, both directions shut: %s, expected IN|RDHUP|HUP",
        rev > 0 ? events_str((unsigned)rev) : res(rev));
  n = recv(c->fd, b, 16, 0);
  CHECK(n == 0, "recv at EOF: %s", res(n));
  return 0;
}

static int t_epipe(struct ctx* c) {
  uint8_t* b = scratch;
  pattern(b, 100, 71, 0);
  HELP("close");
  int before = atomic_load(&sigpipes);
  // The first sends may still succeed (the close is not known yet) or report the peer's
  // reset (ECONNRESET); then EPIPE, and never a signal with MSG_NOSIGNAL.
  ssize_t n;
  for (long deadline = now_ms() + WAIT_MS;; sleep_ms(5)) {
    n = send(c->fd, b, 100, MSG_NOSIGNAL);
    if (n == -1 && errno == EPIPE) break;
    CHECK(n == 100 || (n == -1 && errno == ECONNRESET), "send(MSG_NOSIGNAL) to a closed peer: %s",
          res(n));
    CHECK(now_ms() < deadline, "send to a peer that closed still succeeds after %d ms", WAIT_MS);
  }
  CHECK(atomic_load(&sigpipes) == before, "%d SIGPIPE despite MSG_NOSIGNAL",
        atomic_load(&sigpipes) - before);
  n = send(c->fd, b, 100, 0);
  CHECK(n == -1 && errno == EPIPE, "send without MSG_NOSIGNAL: %s", res(n));
  CHECK(atomic_load(&sigpipes) == before + 1, "send without MSG_NOSIGNAL raised %d SIGPIPE",
        atomic_load(&sigpipes) - before);
  n = write(c->fd, b, 100);
  CHECK(n == -1 && errno == EPIPE, "write: %s", res(n));
  CHECK(atomic_load(&sigpipes) == before + 2, "write raised %d SIGPIPE",
        atomic_load(&sigpipes) - before - 1);
  n = send(c->fd, b, 100, MSG_NOSIGNAL);
  CHECK(n == -1 && errno == EPIPE, "send(MSG_NOSIGNAL) after EPIPE: %s", res(n));
  CHECK(atomic_load(&sigpipes) == before + 2, "SIGPIPE despite MSG_NOSIGNAL");
  return 0;
}

static int t_sockopts(struct ctx* c) {
  int v = -1;
  CHECK(get_int(c->fd, SOL_SOCKET, SO_ERROR, &v) == 0 && v == 0, "SO_ERROR: %d", v);
  CHECK(get_int(c->fd, SOL_SOCKET, SO_TYPE, &v) == 0 && v == SOCK_STREAM, "SO_TYPE: %d", v);
  CHECK(get_int(c->fd, SOL_SOCKET, SO_DOMAIN, &v) == 0 && v == AF_INET, "SO_DOMAIN: %d", v);
  CHECK(get_int(c->fd, SOL_SOCKET, SO_PROTOCOL, &v) == 0 && v == IPPROTO_TCP, "SO_PROTOCOL: %d", v);
  CHECK(get_int(c->fd, SOL_SOCKET, SO_ACCEPTCONN, &v) == 0 && v == 0, "SO_ACCEPTCONN: %d", v);
  CHECK(get_int(c->fd, IPPROTO_TCP, TCP_NODELAY, &v) == 0 && v == 0, "TCP_NODELAY default: %d", v);
  for (int want = 1; want >= 0; want--) {
    CHECK(set_int(c->fd, IPPROTO_TCP, TCP_NODELAY, want) == 0, "set TCP_NODELAY: %s", res(-1));
    CHECK(get_int(c->fd, IPPROTO_TCP, TCP_NODELAY, &v) == 0 && v == want,
          "TCP_NODELAY set to %d reads %d", want, v);
  }
  CHECK(set_int(c->fd, SOL_SOCKET, SO_KEEPALIVE, 1) == 0, "set SO_KEEPALIVE: %s", res(-1));
  CHECK(get_int(c->fd, SOL_SOCKET, SO_KEEPALIVE, &v) == 0 && v == 1, "SO_KEEPALIVE reads %d", v);
  struct tcp_info info = {0};
  socklen_t len = sizeof info;
  CHECK(getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
            info.tcpi_state == TCP_ESTABLISHED,
        "TCP_INFO: state %d, expected %d (ESTABLISHED)", info.tcpi_state, TCP_ESTABLISHED);
  // The addresses: loopback both ends, the server's port, and what the peer sees mirrored.
  char ours[128];
  CHECK(names_text(c->fd, ours, sizeof ours) == 0, "getsockname/getpeername: %s", res(-1));
  char local[64], peer[64];
  unsigned lport, pport;
  CHECK(sscanf(ours, "%63[^:]:%u %63[^:]:%u", local, &lport, peer, &pport) == 4 &&
            strcmp(local, test_host()) == 0 && strcmp(peer, test_host()) == 0 &&
            (int)(c->is_server ? lport : pport) == c->port,
        "getsockname/getpeername: %s, expected %s both ends and the %s port %d", ours,
        test_host(), c->is_server ? "local" : "peer", c->port);
  HELP("names");
  char mirrored[160];
  snprintf(mirrored, sizeof mirrored, "%s:%u %s:%u", peer, pport, local, lport);
  CHECK(strcmp(c->reply, mirrored) == 0, "the peer's local and peer addresses are %s, ours %s",
        c->reply, ours);
  // The connection still carries data both ways.
  SEND_PATTERN(c->fd, 10, 81, 0, "ping");
  HELP("recv 10 81 0");
  HELP("send 10 82 0");
  EXPECT_DATA(c->fd, 10, 82, 0, "pong");
  return 0;
}

static int new_epoll(struct ctx* c, int line, int fd, uint32_t events) {
  int ep = own(c, epoll_create1(EPOLL_CLOEXEC));
  struct epoll_event ev = {.events = events, .data.fd = fd};
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return fail(c, line, "epoll_create1/epoll_ctl: %s", res(-1));
  }
  return ep;
}

// epoll_wait on `ep` reports (events & mask) == want within timeout_ms; want 0: no event.
static int expect_epoll(struct ctx* c, int line, int ep, int timeout_ms, uint32_t mask,
                        uint32_t want, const char* what) {
  uint32_t ev;
  int n = epoll_one(ep, timeout_ms, &ev);
  if (n < 0) return fail(c, line, "%s: epoll_wait %s", what, res(n));
  if (want == 0 && n != 0) {
    return fail(c, line, "%s: expected no event for %d ms, epoll_wait reports %s", what, timeout_ms,
                events_str(ev));
  }
  if (want != 0 && (n != 1 || (ev & mask) != want)) {
    return fail(c, line, "%s: expected %s within %d ms, epoll_wait reports %s", what,
                events_str(want), timeout_ms, n == 0 ? "nothing" : events_str(ev));
  }
  return 0;
}
#define EXPECT_EPOLL(ep, ms, mask, want, what) \
  TRY(expect_epoll(c, __LINE__, ep, ms, mask, want, what))

// Reads until EAGAIN: exactly `len` bytes at `off` of the stream of `seed` must come.
static int read_until_eagain(struct ctx* c, int line, uint64_t len, uint32_t seed, uint64_t off) {
  uint64_t got = 0;
  for (;;) {
    ssize_t n = recv(c->fd, c->io, CHUNK, MSG_DONTWAIT);
    if (n == -1 && errno == EAGAIN) break;
    if (n <= 0) return fail(c, line, "reading until EAGAIN: recv %s", n == 0 ? "EOF" : res(n));
    TRY(check_data(c, line, c->io, (size_t)n, seed, off + got, "read until EAGAIN"));
    got += (uint64_t)n;
  }
  if (got != len) {
    return fail(c, line, "read %llu B until EAGAIN, expected %llu", (unsigned long long)got,
                (unsigned long long)len);
  }
  return 0;
}
#define READ_UNTIL_EAGAIN(len, seed, off) TRY(read_until_eagain(c, __LINE__, len, seed, off))

static int t_epoll_lt(struct ctx* c) {
  int ep;
  TRY(ep = new_epoll(c, __LINE__, c->fd, EPOLLIN));
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "idle connection");
  HELP("send 100 91 0");
  EXPECT_EPOLL(ep, WAIT_MS, EPOLLIN, EPOLLIN, "100 B arrived");
  EXPECT_DATA(c->fd, 10, 91, 0, "first 10 B");
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, EPOLLIN, "90 B left");
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, EPOLLIN, "90 B still left");
  EXPECT_DATA(c->fd, 90, 91, 10, "the other 90 B");
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "all read");
  return 0;
}

static int t_epoll_et(struct ctx* c) {
  const uint32_t in = EPOLLIN | EPOLLRDHUP;
  int ep;
  TRY(ep = new_epoll(c, __LINE__, c->fd, EPOLLIN | EPOLLRDHUP | EPOLLET));
  EXPECT_EPOLL(ep, QUIET_MS, in, 0, "idle connection");
  HELP("send 100 92 0");
  EXPECT_EPOLL(ep, WAIT_MS, in, EPOLLIN, "first arrival");
  EXPECT_EPOLL(ep, QUIET_MS, in, 0, "no new data, nothing read");
  HELP("send 200 92 100");
  EXPECT_EPOLL(ep, WAIT_MS, in, EPOLLIN, "second arrival, the first still unread");
  EXPECT_EPOLL(ep, QUIET_MS, in, 0, "no new data after the second arrival");
  READ_UNTIL_EAGAIN(300, 92, 0);
  EXPECT_EPOLL(ep, QUIET_MS, in, 0, "read until EAGAIN, no new data");
  HELP("send 50 92 300");
  EXPECT_EPOLL(ep, WAIT_MS, in, EPOLLIN, "third arrival");
  READ_UNTIL_EAGAIN(50, 92, 300);
  HELP("shutwr");
  EXPECT_EPOLL(ep, WAIT_MS, in, EPOLLIN | EPOLLRDHUP, "the peer's FIN");
  ssize_t n = recv(c->fd, scratch, 16, 0);
  CHECK(n == 0, "recv at EOF: %s", res(n));
  EXPECT_EPOLL(ep, QUIET_MS, in, 0, "after EOF was read");
  return 0;
}

static int t_epoll_two_sets(struct ctx* c) {
  int lt, et;
  TRY(lt = new_epoll(c, __LINE__, c->fd, EPOLLIN));
  TRY(et = new_epoll(c, __LINE__, c->fd, EPOLLIN | EPOLLET));
  HELP("send 64 93 0");
  EXPECT_EPOLL(lt, WAIT_MS, EPOLLIN, EPOLLIN, "level-triggered set, data arrived");
  EXPECT_EPOLL(et, WAIT_MS, EPOLLIN, EPOLLIN, "edge-triggered set, data arrived");
  EXPECT_EPOLL(lt, QUIET_MS, EPOLLIN, EPOLLIN, "level-triggered set, data unread");
  EXPECT_EPOLL(et, QUIET_MS, EPOLLIN, 0, "edge-triggered set, no new data");
  EXPECT_DATA(c->fd, 64, 93, 0, "received");
  EXPECT_EPOLL(lt, QUIET_MS, EPOLLIN, 0, "level-triggered set, all read");
  EXPECT_EPOLL(et, QUIET_MS, EPOLLIN, 0, "edge-triggered set, all read");
  HELP("send 32 93 64");
  EXPECT_EPOLL(et, WAIT_MS, EPOLLIN, EPOLLIN, "edge-triggered set, new data");
  EXPECT_EPOLL(lt, WAIT_MS, EPOLLIN, EPOLLIN, "level-triggered set, new data");
  EXPECT_DATA(c->fd, 32, 93, 64, "received");
  return 0;
}

static int t_epoll_out(struct ctx* c) {
  CHECK(set_nonblocking(c->fd, BY_FCNTL, true) == 0, "O_NONBLOCK: %s", res(-1));
  int lt, et;
  TRY(lt = new_epoll(c, __LINE__, c->fd, EPOLLOUT));
  TRY(et = new_epoll(c, __LINE__, c->fd, EPOLLOUT | EPOLLET));
  EXPECT_EPOLL(lt, WAIT_MS, EPOLLOUT, EPOLLOUT, "level-triggered set, idle connection");
  EXPECT_EPOLL(et, WAIT_MS, EPOLLOUT, EPOLLOUT, "edge-triggered set, idle connection");
  uint64_t queued = 0;
  FILL(c->fd, 0, 94, &queued);
  // Space freed while filling may have left an edge pending: collect it, then make sure
  // the socket is still full.
  uint32_t ev;
  epoll_one(et, 0, &ev);
  ssize_t n = send(c->fd, scratch, 1, MSG_NOSIGNAL);
  CHECK(n == -1 && errno == EAGAIN, "send on the full socket: %s", res(n));
  EXPECT_EPOLL(lt, QUIET_MS, EPOLLOUT, 0, "level-triggered set, full socket");
  EXPECT_EPOLL(et, QUIET_MS, EPOLLOUT, 0, "edge-triggered set, full socket");
  helper_start(c, "recv %llu 94 0", (unsigned long long)queued);
  EXPECT_EPOLL(et, WAIT_MS, EPOLLOUT, EPOLLOUT, "edge-triggered set, the peer drains");
  EXPECT_EPOLL(lt, WAIT_MS, EPOLLOUT, EPOLLOUT, "level-triggered set, the peer drains");
  AWAIT_HELPER();
  SEND_PATTERN(c->fd, 1000, 94, queued, "send once writable");
  HELP("recv 1000 94 %llu", (unsigned long long)queued);
  return 0;
}

static int t_poll_select(struct ctx* c) {
  CHECK(c->fd < FD_SETSIZE, "descriptor %d too large for select", c->fd);
  HELP("send 20 95 0");
  int rev = poll_one(c->fd, POLLIN, WAIT_MS);
  CHECK(rev > 0 && (rev & POLLIN), "poll with 20 B sent: %s",
        rev > 0 ? events_str((unsigned)rev) : "nothing");
  fd_set r, w;
  FD_ZERO(&r);
  FD_ZERO(&w);
  FD_SET(c->fd, &r);
  FD_SET(c->fd, &w);
  struct timeval tv = {WAIT_MS / 1000, 0};
  int n = select(c->fd + 1, &r, &w, NULL, &tv);
  CHECK(n == 2 && FD_ISSET(c->fd, &r) && FD_ISSET(c->fd, &w),
        "select with 20 B queued: %d ready, readable %d, writable %d", n, FD_ISSET(c->fd, &r),
        FD_ISSET(c->fd, &w));
  EXPECT_DATA(c->fd, 20, 95, 0, "received");
  rev = poll_one(c->fd, POLLIN, QUIET_MS);
  CHECK(rev == 0, "poll once all is read: %s", events_str((unsigned)rev));
  FD_ZERO(&r);
  FD_SET(c->fd, &r);
  tv = (struct timeval){0, QUIET_MS * 1000};
  n = select(c->fd + 1, &r, NULL, NULL, &tv);
  CHECK(n == 0, "select once all is read: %d ready", n);
  HELP("shutwr");
  rev = poll_one(c->fd, POLLIN | POLLRDHUP, WAIT_MS);
  CHECK(rev > 0 && (rev & (POLLIN | POLLRDHUP | POLLHUP)) == (POLLIN | POLLRDHUP),
        "poll at the peer's EOF: %s, expected IN|RDHUP without HUP",
        rev > 0 ? events_str((unsigned)rev) : "nothing");
  FD_ZERO(&r);
  FD_SET(c->fd, &r);
  tv = (struct timeval){WAIT_MS / 1000, 0};
  n = select(c->fd + 1, &r, NULL, NULL, &tv);
  CHECK(n == 1 && FD_ISSET(c->fd, &r), "select at the peer's EOF: %d ready", n);
  ssize_t got = recv(c->fd, scratch, 16, 0);
  CHECK(got == 0, "recv at EOF: %s", res(got));
  return 0;
}

static int t_threads_duplex(struct ctx* c) {
  const unsigned long long len = 8 << 20;
  helper_start(c, "duplex %llu 101 102", len);
  TRY(duplex(c, __LINE__, len, 102, 101));
  AWAIT_HELPER();
  return 0;
}

// A thread that reads a stream with its own sequence of read sizes, keeping every read.
struct reader {
  struct ctx c;
  int fd;
  const size_t* sizes;  // the request sizes, in turn
  size_t nsizes;
  uint8_t* buf;  // everything received, in order
  size_t cap, used;
  size_t* lens;  // the length of each read
  size_t nreads, cap_reads;
};

static int reader_run(struct reader* r) {
  struct ctx* c = &r->c;
  for (size_t i = 0;; i++) {
    size_t want = r->sizes[i % r->nsizes];
    if (want > r->cap - r->used) want = r->cap - r->used;
    if (want == 0) {
      // This thread alone got the whole stream: all that may come now is EOF.
      uint8_t extra;
      ssize_t n = recv(r->fd, &extra, 1, 0);
      if (n < 0 && errno == EINTR) continue;
      CHECK(n == 0, "received more than the whole stream (%s)", res(n));
      return 0;
    }
    ssize_t n = recv(r->fd, r->buf + r->used, want, 0);
    if (n == 0) return 0;
    if (n < 0 && errno == EINTR) continue;
    CHECK(n > 0, "recv after %zu B: %s", r->used, res(n));
    if (r->nreads == r->cap_reads) {
      r->cap_reads = r->cap_reads ? 2 * r->cap_reads : 1024;
      r->lens = realloc(r->lens, r->cap_reads * sizeof *r->lens);
      if (r->lens == NULL) fatal("out of memory");
    }
    r->lens[r->nreads++] = (size_t)n;
    r->used += (size_t)n;
  }
}

static void* reader_main(void* arg) {
  reader_run(arg);
  return NULL;
}

// Whether the reads of a and b, each in its own order, interleave into the stream of `seed`
// (total bytes): every read one contiguous piece, nothing lost, nothing twice. A search
// over the interleavings, which backtracks only where both next reads match by chance.
static bool interleaves(const struct reader* a, const struct reader* b, uint32_t seed,
                        size_t total) {
  size_t* pa = calloc(a->nreads + 1, sizeof *pa);  // pa[i]: bytes in a's first i reads
  size_t* pb = calloc(b->nreads + 1, sizeof *pb);
  size_t(*stack)[2] = calloc(a->nreads + b->nreads + 2, sizeof *stack);
  if (!pa || !pb || !stack) fatal("out of memory");
  for (size_t i = 0; i < a->nreads; i++) pa[i + 1] = pa[i] + a->lens[i];
  for (size_t j = 0; j < b->nreads; j++) pb[j + 1] = pb[j] + b->lens[j];
  bool found = false;
  size_t top = 0;
  stack[top][0] = stack[top][1] = 0;
  top++;
  while (top > 0 && !found) {
    top--;
    size_t i = stack[top][0], j = stack[top][1], pos = pa[i] + pb[j];
    if (i == a->nreads && j == b->nreads) {
      found = pos == total;
      continue;
    }
    if (j < b->nreads && pos + b->lens[j] <= total &&
        mismatch(b->buf + pb[j], b->lens[j], seed, pos) < 0) {
      stack[top][0] = i;
      stack[top++][1] = j + 1;
    }
    if (i < a->nreads && pos + a->lens[i] <= total &&
        mismatch(a->buf + pa[i], a->lens[i], seed, pos) < 0) {
      stack[top][0] = i + 1;
      stack[top++][1] = j;
    }
  }
  free(pa);
  free(pb);
  free(stack);
  return found;
}

static int t_threads_split_read(struct ctx* c) {
  const size_t len = 4 << 20;
  static const size_t sizes_a[] = {1, 100, 1000, 10000}, sizes_b[] = {7, 4096, 65536};
  static struct reader r[2];
  r[0] = (struct reader){.fd = c->fd, .sizes = sizes_a, .nsizes = 4, .cap = len};
  r[1] = (struct reader){.fd = c->fd, .sizes = sizes_b, .nsizes = 3, .cap = len};
  r[0].buf = malloc(len);
  r[1].buf = malloc(len);
  if (!r[0].buf || !r[1].buf) fatal("out of memory");
  helper_start(c, "send %zu 103 0 64 0", len);
  helper_start(c, "shutwr");
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) {
    if (pthread_create(&threads[i], NULL, reader_main, &r[i]) != 0) fatal("pthread_create");
  }
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  int rc = 0;
  if (r[0].c.why[0] || r[1].c.why[0]) {
    rc = fail(c, __LINE__, "reading thread: %s", r[0].c.why[0] ? r[0].c.why : r[1].c.why);
  } else if (r[0].used + r[1].used != len) {
    rc = fail(c, __LINE__, "the threads read %zu + %zu B, the peer sent %zu", r[0].used, r[1].used,
              len);
  } else if (!interleaves(&r[0], &r[1], 103, len)) {
    rc = fail(c, __LINE__,
              "the %zu + %zu reads of the two threads do not interleave into the stream "
              "(bytes lost, duplicated or reordered)",
              r[0].nreads, r[1].nreads);
  }
  for (int i = 0; i < 2; i++) {
    free(r[i].buf);
    free(r[i].lens);
  }
  TRY(rc);
  AWAIT_HELPER();
  AWAIT_HELPER();
  return 0;
}

// A call that blocks in another thread on the same socket; its outcome.
struct blocked {
  int fd;
  bool send;
  uint8_t buf[CHUNK];
  ssize_t n;
  int err;
  atomic_int tid;   // the thread's id, once it runs
  atomic_int done;  // set once the call returned
  long done_ms;     // when (now_ms)
};

static void* blocked_main(void* arg) {
  struct blocked* b = arg;
  atomic_store(&b->tid, (int)gettid());
  b->n = b->send ? send(b->fd, b->buf, CHUNK, MSG_NOSIGNAL) : recv(b->fd, b->buf, 100, 0);
  b->err = errno;
  b->done_ms = now_ms();
  atomic_store(&b->done, 1);
  return NULL;
}

// Kernel TCP releases the socket while a call sleeps: another thread's nonblocking call
// on the same socket does not wait for it.
static int t_threads_dontwait_recv(struct ctx* c) {
  static struct blocked b;
  b = (struct blocked){.fd = c->fd, .send = false};
  CHECK(set_timeout(c->fd, SO_RCVTIMEO, 1000) == 0, "SO_RCVTIMEO: %s", res(-1));
  pthread_t thread;
  if (pthread_create(&thread, NULL, blocked_main, &b) != 0) fatal("pthread_create");
  sleep_ms(QUIET_MS);  // the thread is asleep in recv by now
  long t0 = now_ms();
  ssize_t n = recv(c->fd, scratch, 100, MSG_DONTWAIT);
  int err = errno;
  long ms = now_ms() - t0;
  helper_start(c, "send 100 104 0");
  pthread_join(thread, NULL);
  AWAIT_HELPER();
  CHECK(n == -1 && err == EAGAIN && ms < 200,
        "recv(MSG_DONTWAIT) while another thread is blocked in recv: %s after %ld ms",
        res_e(n, err), ms);
  CHECK(b.n == 100, "the blocked recv, data sent after the other thread's call: %s",
        res_e(b.n, b.err));
  CHECK_DATA(b.buf, 100, 104, 0, "received by the blocked thread");
  return 0;
}

static int t_threads_dontwait_send(struct ctx* c) {
  static struct blocked b;
  CHECK(set_timeout(c->fd, SO_SNDTIMEO, 1000) == 0, "SO_SNDTIMEO: %s", res(-1));
  uint64_t queued = 0;
  FILL(c->fd, MSG_DONTWAIT, 105, &queued);
  b = (struct blocked){.fd = c->fd, .send = true};
  pattern(b.buf, CHUNK, 105, queued);
  pthread_t thread;
  if (pthread_create(&thread, NULL, blocked_main, &b) != 0) fatal("pthread_create");
  sleep_ms(QUIET_MS);  // the thread is asleep in send by now
  long t0 = now_ms();
  ssize_t n = send(c->fd, scratch, 100, MSG_DONTWAIT | MSG_NOSIGNAL);
  int err = errno;
  long ms = now_ms() - t0;
  helper_start(c, "recv %llu 105 0", (unsigned long long)(queued + CHUNK));
  pthread_join(thread, NULL);
  CHECK(n == -1 && err == EAGAIN && ms < 200,
        "send(MSG_DONTWAIT) while another thread is blocked in send on the full socket: %s "
        "after %ld ms",
        res_e(n, err), ms);
  CHECK(b.n == CHUNK, "the blocked send of %d B, the peer draining: %s", CHUNK, res_e(b.n, b.err));
  AWAIT_HELPER();
  return 0;
}

static int t_dup(struct ctx* c) {
  int d1 = own(c, dup(c->fd));
  int d2 = own(c, fcntl(c->fd, F_DUPFD_CLOEXEC, 0));
  CHECK(d1 >= 0 && d2 >= 0, "dup/F_DUPFD_CLOEXEC: %s", res(-1));
  HELP("send 30 111 0");
  EXPECT_DATA(c->fd, 10, 111, 0, "read through the original");
  EXPECT_DATA(d1, 10, 111, 10, "read through dup()");
  EXPECT_DATA(d2, 10, 111, 20, "read through F_DUPFD_CLOEXEC");
  SEND_PATTERN(d1, 10, 112, 0, "send through dup()");
  SEND_PATTERN(c->fd, 10, 112, 10, "send through the original");
  SEND_PATTERN(d2, 10, 112, 20, "send through F_DUPFD_CLOEXEC");
  HELP("recv 30 112 0");
  close(c->fd);
  c->fd = -1;
  HELP("quiet 100");  // no EOF: the duplicates keep the connection
  HELP("send 40 113 0");
  EXPECT_DATA(d1, 40, 113, 0, "read through dup() after closing the original");
  SEND_PATTERN(d2, 40, 114, 0, "send through F_DUPFD_CLOEXEC after closing the original");
  HELP("recv 40 114 0");
  close_owned(c, d1);
  HELP("quiet 100");
  HELP("send 10 115 0");
  EXPECT_DATA(d2, 10, 115, 0, "read through the last descriptor");
  close_owned(c, d2);
  HELP("eof");  // the last descriptor closed: the connection ends
  return 0;
}

struct kick {
  pthread_t target;
  int after_ms;
  atomic_int done;
};

// Signals the target after `after_ms`, then every 50 ms until it is done: on a loaded
// machine the first signal may land before the target has entered its blocking call.
static void* kick_main(void* arg) {
  struct kick* k = arg;
  sleep_ms(k->after_ms);
  while (!atomic_load(&k->done)) {
    pthread_kill(k->target, SIGUSR1);
    sleep_ms(50);
  }
  return NULL;
}

// A blocking recv that SIGUSR1 hits after kick_ms, its handler installed with sa_flags.
static ssize_t interrupted_recv(struct ctx* c, int sa_flags, int kick_ms, long* ms, int* err) {
  struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = sa_flags};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  struct kick k = {pthread_self(), kick_ms, 0};
  pthread_t thread;
  if (pthread_create(&thread, NULL, kick_main, &k) != 0) fatal("pthread_create");
  long t0 = now_ms();
  ssize_t n = recv(c->fd, scratch, 8, 0);
  *err = errno;
  *ms = now_ms() - t0;
  atomic_store(&k.done, 1);
  pthread_join(thread, NULL);
  return n;
}

static int t_eintr(struct ctx* c) {
  long ms;
  int err, before = atomic_load(&usr1s);
  // No receive timeout: signal(7)'s rule for sockets with one is checked last.
  CHECK(set_timeout(c->fd, SO_RCVTIMEO, 0) == 0, "SO_RCVTIMEO: %s", res(-1));
  // Without SA_RESTART: EINTR (the data sent at 400 ms bound the wait if it is not).
  helper_start(c, "send 8 121 0 1 0 400");
  ssize_t n = interrupted_recv(c, 0, 100, &ms, &err);
  CHECK(atomic_load(&usr1s) > before, "the handler never ran");
  before = atomic_load(&usr1s);
  CHECK(n == -1 && err == EINTR && ms < 400,
        "recv hit at 100 ms by a handler without SA_RESTART: %s after %ld ms", res_e(n, err), ms);
  AWAIT_HELPER();
  EXPECT_DATA(c->fd, 8, 121, 0, "sent after the interrupted recv");
  // With SA_RESTART: the call goes on and returns the data sent at 400 ms. A crash
  // reporter's (or a sanitizer runtime's) SIGSEGV and SIGBUS handlers, installed without
  // SA_RESTART, change nothing: those signals never interrupt a call asleep in the kernel.
  struct sigaction fault = {.sa_handler = on_fault}, saved_segv, saved_bus;
  sigemptyset(&fault.sa_mask);
  sigaction(SIGSEGV, &fault, &saved_segv);
  sigaction(SIGBUS, &fault, &saved_bus);
  helper_start(c, "send 8 122 0 1 0 400");
  n = interrupted_recv(c, SA_RESTART, 100, &ms, &err);
  sigaction(SIGSEGV, &saved_segv, NULL);
  sigaction(SIGBUS, &saved_bus, NULL);
  AWAIT_HELPER();
  // On a loaded machine the data may beat the first signal; then there was nothing to
  // restart and only the data can be checked.
  bool signalled = atomic_load(&usr1s) > before;
  before = atomic_load(&usr1s);
  CHECK(n == 8 && (ms >= 300 || !signalled),
        "recv hit at 100 ms by a handler with SA_RESTART, data sent at 400 ms: %s after %ld ms",
        res_e(n, err), ms);
  CHECK_DATA(scratch, 8, 122, 0, "received by the restarted recv");
  // With SA_RESTART and SO_RCVTIMEO: never restarted, EINTR (signal(7)).
  CHECK(set_timeout(c->fd, SO_RCVTIMEO, 2000) == 0, "SO_RCVTIMEO: %s", res(-1));
  n = interrupted_recv(c, SA_RESTART, 100, &ms, &err);
  CHECK(atomic_load(&usr1s) > before, "the handler never ran");
  CHECK(n == -1 && err == EINTR && ms < 1000,
        "recv with a 2 s SO_RCVTIMEO hit at 100 ms by a handler with SA_RESTART: %s after %ld "
        "ms, expected EINTR",
        res_e(n, err), ms);
  return 0;
}

// ------------------------------------------------------------------------ corners: epoll

static int epoll_mod(struct ctx* c, int line, int ep, int fd, uint32_t events) {
  struct epoll_event ev = {.events = events, .data.fd = fd};
  if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) != 0) {
    return fail(c, line, "EPOLL_CTL_MOD to %s: %s", events_str(events), res(-1));
  }
  return 0;
}
#define EPOLL_MOD(ep, fd, events) TRY(epoll_mod(c, __LINE__, ep, fd, events))

// One epoll_wait (EINTR retried): the number of events, the first in *ev.
static int epoll_first(int ep, int timeout_ms, struct epoll_event* ev) {
  struct epoll_event e[4];
  int n;
  do {
    n = epoll_wait(ep, e, 4, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (n > 0) *ev = e[0];
  return n;
}

// EPOLLONESHOT: one event, then nothing until EPOLL_CTL_MOD re-arms it (level-triggered:
// bytes still unread are reported at once; edge-triggered: only new bytes).
static int t_epoll_oneshot(struct ctx* c) {
  const uint32_t oneshot = EPOLLIN | EPOLLONESHOT;
  int ep;
  TRY(ep = new_epoll(c, __LINE__, c->fd, oneshot));
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "idle connection");
  HELP("send 100 140 0");
  EXPECT_EPOLL(ep, WAIT_MS, EPOLLIN, EPOLLIN, "first arrival");
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "after the one event, 100 B unread");
  HELP("send 100 140 100");
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "disarmed, more bytes arrived");
  EPOLL_MOD(ep, c->fd, oneshot);
  EXPECT_EPOLL(ep, WAIT_MS, EPOLLIN, EPOLLIN, "re-armed with 200 B unread");
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "disarmed again");
  EXPECT_DATA(c->fd, 200, 140, 0, "received");
  EPOLL_MOD(ep, c->fd, oneshot);
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "re-armed, all read");
  helper_start(c, "send 50 140 200 1 0 100");  // arrives while epoll_wait sleeps
  EXPECT_EPOLL(ep, WAIT_MS, EPOLLIN, EPOLLIN, "re-armed, bytes sent while asleep");
  AWAIT_HELPER();
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "disarmed after the wake-up");
  EXPECT_DATA(c->fd, 50, 140, 200, "received");
  EPOLL_MOD(ep, c->fd, oneshot | EPOLLET);
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "edge-triggered one-shot, nothing new");
  HELP("send 10 140 250");
  EXPECT_EPOLL(ep, WAIT_MS, EPOLLIN, EPOLLIN, "edge-triggered one-shot, new bytes");
  HELP("send 10 140 260");
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLIN, 0, "edge-triggered one-shot, disarmed, new bytes");
  EXPECT_DATA(c->fd, 20, 140, 250, "received");
  EPOLL_MOD(ep, c->fd, EPOLLOUT | EPOLLONESHOT);
  EXPECT_EPOLL(ep, WAIT_MS, EPOLLOUT, EPOLLOUT, "EPOLLOUT one-shot");
  EXPECT_EPOLL(ep, QUIET_MS, EPOLLOUT, 0, "EPOLLOUT one-shot, disarmed");
  return 0;
}

// EPOLLEXCLUSIVE: several threads, each with its own epoll set holding the socket with
// EPOLLEXCLUSIVE, read one stream (MSG_DONTWAIT, under a lock, so the order is kept): every
// byte arrives once and in order, and no wake-up is lost (each wait is bounded; a thread
// that waits WAIT_MS in vain while the stream is unfinished fails). An eventfd in every
// set ends the waits at EOF.
enum { EXCL_THREADS = 3 };

struct excl_reader {
  struct ctx c;  // this thread's failure
  int ep, fd, wakeups;
};

static struct {
  pthread_mutex_t mu;
  uint8_t* buf;
  size_t cap, used;
  bool eof;
  int stop;
} excl = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int excl_run(struct excl_reader* r) {
  struct ctx* c = &r->c;
  for (;;) {
    pthread_mutex_lock(&excl.mu);
    bool eof = excl.eof;
    pthread_mutex_unlock(&excl.mu);
    if (eof) return 0;
    struct epoll_event ev[2];
    int n = epoll_wait(r->ep, ev, 2, WAIT_MS);
    if (n < 0 && errno == EINTR) continue;
    CHECK(n >= 0, "epoll_wait: %s", res(n));
    bool mine = false;
    for (int i = 0; i < n; i++) mine |= ev[i].data.fd == r->fd;
    pthread_mutex_lock(&excl.mu);
    if (n == 0 && !excl.eof) {
      size_t used = excl.used;
      pthread_mutex_unlock(&excl.mu);
      return fail(c, __LINE__, "no wake-up within %d ms, %zu B received and no EOF yet", WAIT_MS,
                  used);
    }
    r->wakeups += mine;
    while (mine && !excl.eof) {
      ssize_t got = recv(r->fd, excl.buf + excl.used, excl.cap - excl.used, MSG_DONTWAIT);
      if (got > 0) {
        excl.used += (size_t)got;
      } else if (got == 0) {
        excl.eof = true;
        uint64_t one = 1;
        if (write(excl.stop, &one, sizeof one) != sizeof one) excl.eof = true;
      } else {
        int err = errno;
        if (err != EAGAIN) {
          pthread_mutex_unlock(&excl.mu);
          return fail(c, __LINE__, "recv: %s", res_e(got, err));
        }
        break;  // another thread was quicker
      }
    }
    pthread_mutex_unlock(&excl.mu);
  }
}

static void* excl_main(void* arg) {
  excl_run(arg);
  return NULL;
}

static int t_epoll_exclusive(struct ctx* c) {
  const size_t len = 256 << 10;
  static struct excl_reader r[EXCL_THREADS];
  excl.buf = malloc(len + CHUNK);
  if (excl.buf == NULL) fatal("out of memory");
  excl.cap = len + CHUNK;
  excl.used = 0;
  excl.eof = false;
  excl.stop = own(c, eventfd(0, EFD_CLOEXEC));
  CHECK(excl.stop >= 0, "eventfd: %s", res(-1));
  for (int i = 0; i < EXCL_THREADS; i++) {
    r[i] = (struct excl_reader){.fd = c->fd};
    r[i].ep = own(c, epoll_create1(EPOLL_CLOEXEC));
    struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = c->fd};
    struct epoll_event stop = {.events = EPOLLIN, .data.fd = excl.stop};
    CHECK(r[i].ep >= 0 && epoll_ctl(r[i].ep, EPOLL_CTL_ADD, c->fd, &ev) == 0 &&
              epoll_ctl(r[i].ep, EPOLL_CTL_ADD, excl.stop, &stop) == 0,
          "epoll set %d with EPOLLEXCLUSIVE: %s", i, res(-1));
  }
  // EPOLLEXCLUSIVE is for EPOLL_CTL_ADD only (epoll_ctl(2)).
  struct epoll_event mod = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = c->fd};
  int rc = epoll_ctl(r[0].ep, EPOLL_CTL_MOD, c->fd, &mod);
  CHECK(rc == -1 && errno == EINVAL, "EPOLL_CTL_MOD with EPOLLEXCLUSIVE: %s, expected EINVAL",
        res(rc));
  helper_start(c, "send %zu 150 0 64 2", len);
  helper_start(c, "shutwr");
  pthread_t threads[EXCL_THREADS];
  for (int i = 0; i < EXCL_THREADS; i++) {
    if (pthread_create(&threads[i], NULL, excl_main, &r[i]) != 0) fatal("pthread_create");
  }
  for (int i = 0; i < EXCL_THREADS; i++) pthread_join(threads[i], NULL);
  int wakeups = 0;
  rc = 0;
  for (int i = 0; i < EXCL_THREADS && rc == 0; i++) {
    wakeups += r[i].wakeups;
    if (r[i].c.why[0]) rc = fail(c, __LINE__, "reading thread %d: %s", i, r[i].c.why);
  }
  if (rc == 0 && (excl.used != len || !excl.eof)) {
    rc = fail(c, __LINE__, "the threads read %zu B%s, the peer sent %zu B and its FIN", excl.used,
              excl.eof ? " and EOF" : " and no EOF", len);
  }
  if (rc == 0 && mismatch(excl.buf, len, 150, 0) >= 0) {
    long long i = mismatch(excl.buf, len, 150, 0);
    rc = fail(c, __LINE__, "byte %lld of the stream read by the threads is wrong", i);
  }
  free(excl.buf);
  excl.buf = NULL;
  TRY(rc);
  CHECK(wakeups > 0, "no thread was ever woken for the socket");
  AWAIT_HELPER();
  AWAIT_HELPER();
  return 0;
}

// EPOLLRDHUP on the peer's shutdown(SHUT_WR): reported with EPOLLIN where asked for, alone
// in a set that asks for EPOLLRDHUP only; bytes before the FIN still arrive; this side can
// still send; once it shuts down too, EPOLLHUP.
static int t_epoll_rdhup(struct ctx* c) {
  const uint32_t all = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLHUP | EPOLLERR;
  int in, rdhup;
  TRY(in = new_epoll(c, __LINE__, c->fd, EPOLLIN | EPOLLRDHUP));
  TRY(rdhup = new_epoll(c, __LINE__, c->fd, EPOLLRDHUP));
  EXPECT_EPOLL(rdhup, QUIET_MS, all, 0, "idle connection, EPOLLRDHUP set");
  HELP("send 100 160 0");
  EXPECT_EPOLL(in, WAIT_MS, all, EPOLLIN, "bytes, no FIN yet");
  EXPECT_EPOLL(rdhup, QUIET_MS, all, 0, "bytes, no FIN yet, EPOLLRDHUP set");
  HELP("shutwr");
  EXPECT_EPOLL(rdhup, WAIT_MS, all, EPOLLRDHUP, "the peer's shutdown(SHUT_WR), EPOLLRDHUP set");
  EXPECT_EPOLL(in, WAIT_MS, all, EPOLLIN | EPOLLRDHUP,
               "the peer's shutdown(SHUT_WR), 100 B unread");
  EXPECT_DATA(c->fd, 100, 160, 0, "sent before the FIN");
  ssize_t n = recv(c->fd, scratch, 16, 0);
  CHECK(n == 0, "recv at EOF: %s", res(n));
  EXPECT_EPOLL(in, QUIET_MS, all, EPOLLIN | EPOLLRDHUP, "EOF read (level-triggered)");
  SEND_PATTERN(c->fd, 5000, 161, 0, "sent after the peer's FIN");
  HELP("recv 5000 161 0");
  CHECK(shutdown(c->fd, SHUT_WR) == 0, "shutdown(SHUT_WR): %s", res(-1));
  EXPECT_EPOLL(rdhup, WAIT_MS, all, EPOLLRDHUP | EPOLLHUP, "both directions shut, EPOLLRDHUP set");
  EXPECT_EPOLL(in, WAIT_MS, all, EPOLLIN | EPOLLRDHUP | EPOLLHUP, "both directions shut");
  return 0;
}

// An epoll set inside other epoll sets: the inner set's readiness (the socket's) reaches a
// level-triggered and an edge-triggered outer set, a sleeping outer wait wakes up, and poll
// on the inner set's descriptor reports POLLIN.
static int t_epoll_nested(struct ctx* c) {
  int inner, outer, outer_et;
  TRY(inner = new_epoll(c, __LINE__, c->fd, EPOLLIN));
  TRY(outer = new_epoll(c, __LINE__, inner, EPOLLIN));
  TRY(outer_et = new_epoll(c, __LINE__, inner, EPOLLIN | EPOLLET));
  EXPECT_EPOLL(outer, QUIET_MS, EPOLLIN, 0, "idle connection, outer set");
  int rev = poll_one(inner, POLLIN, 0);
  CHECK(rev == 0, "poll on the inner set, idle connection: %s", events_str((unsigned)rev));
  helper_start(c, "send 300 170 0 1 0 100");  // arrives while the outer wait sleeps
  struct epoll_event ev = {0};
  int n = epoll_first(outer, WAIT_MS, &ev);
  AWAIT_HELPER();
  CHECK(n == 1 && ev.data.fd == inner && (ev.events & EPOLLIN),
        "outer set, bytes arrived while asleep: %s, %s for fd %d (the inner set is %d)", res(n),
        events_str(ev.events), ev.data.fd, inner);
  EXPECT_EPOLL(outer_et, WAIT_MS, EPOLLIN, EPOLLIN, "edge-triggered outer set");
  EXPECT_EPOLL(outer_et, QUIET_MS, EPOLLIN, 0, "edge-triggered outer set, nothing new");
  EXPECT_EPOLL(outer, QUIET_MS, EPOLLIN, EPOLLIN, "outer set, 300 B unread");
  rev = poll_one(inner, POLLIN, WAIT_MS);
  CHECK(rev > 0 && (rev & POLLIN), "poll on the inner set, 300 B unread: %s",
        rev > 0 ? events_str((unsigned)rev) : "nothing");
  n = epoll_first(inner, 0, &ev);
  CHECK(n == 1 && ev.data.fd == c->fd && (ev.events & EPOLLIN),
        "inner set: %s, %s for fd %d (the socket is %d)", res(n), events_str(ev.events), ev.data.fd,
        c->fd);
  EXPECT_DATA(c->fd, 300, 170, 0, "received");
  EXPECT_EPOLL(outer, QUIET_MS, EPOLLIN, 0, "all read, outer set");
  HELP("send 20 170 300");
  EXPECT_EPOLL(outer_et, WAIT_MS, EPOLLIN, EPOLLIN, "edge-triggered outer set, new bytes");
  EXPECT_EPOLL(outer, WAIT_MS, EPOLLIN, EPOLLIN, "outer set, new bytes");
  EXPECT_DATA(c->fd, 20, 170, 300, "received");
  HELP("shutwr");
  EXPECT_EPOLL(outer, WAIT_MS, EPOLLIN, EPOLLIN, "outer set, the peer's FIN");
  ssize_t got = recv(c->fd, scratch, 16, 0);
  CHECK(got == 0, "recv at EOF: %s", res(got));
  return 0;
}

// The wait of round 0 (epoll_pwait), 1 (epoll_pwait2) or 2 (epoll_wait).
static int wait_round(int round, int ep, struct epoll_event* ev, const sigset_t* during,
                      int timeout_ms) {
  if (round == 0) return epoll_pwait(ep, ev, 4, timeout_ms, during);
  if (round == 1) {
    struct timespec ts = {timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
    return epoll_pwait2(ep, ev, 4, &ts, during);
  }
  return epoll_wait(ep, ev, 4, timeout_ms);
}

static int pwait_round(struct ctx* c, int ep, int round) {
  static const char* const names[] = {"epoll_pwait", "epoll_pwait2", "epoll_wait (SA_RESTART)"};
  const char* call = names[round];
  // SIGUSR1 reaches the pwait calls only through their mask; epoll_wait is never restarted,
  // whatever SA_RESTART says (signal(7)).
  struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = round == 2 ? SA_RESTART : 0};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  sigset_t usr1, during;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, NULL, &during);
  sigdelset(&during, SIGUSR1);
  if (round < 2) pthread_sigmask(SIG_BLOCK, &usr1, NULL);
  int before = atomic_load(&usr1s);
  struct kick k = {pthread_self(), 100, 0};
  pthread_t thread;
  if (pthread_create(&thread, NULL, kick_main, &k) != 0) fatal("pthread_create");
  struct epoll_event ev[4];
  long t0 = now_ms();
  int n = wait_round(round, ep, ev, &during, WAIT_MS);
  int err = errno;
  long ms = now_ms() - t0;
  atomic_store(&k.done, 1);
  pthread_join(thread, NULL);
  if (round < 2) {  // a signal the kicker sent after the wait returned is still pending
    struct timespec zero = {0, 0};
    while (sigtimedwait(&usr1, NULL, &zero) > 0) {
    }
    pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
  }
  CHECK(atomic_load(&usr1s) > before, "%s: the handler never ran", call);
  CHECK(n == -1 && err == EINTR && ms < WAIT_MS / 2,
        "%s, idle connection, hit by SIGUSR1 after 100 ms: %s after %ld ms, expected EINTR", call,
        res_e(n, err), ms);
  // The next wait works as ever: bytes sent 100 ms later wake it.
  helper_start(c, "send 8 %d 0 1 0 100", 180 + round);
  if (round < 2) pthread_sigmask(SIG_BLOCK, &usr1, NULL);
  n = wait_round(round, ep, ev, &during, WAIT_MS);
  err = errno;
  if (round < 2) pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
  AWAIT_HELPER();
  CHECK(n == 1 && (ev[0].events & EPOLLIN) && ev[0].data.fd == c->fd,
        "%s after the interrupted one, 8 B sent: %s (%s)", call, res_e(n, err),
        n > 0 ? events_str(ev[0].events) : "no event");
  EXPECT_DATA(c->fd, 8, 180 + round, 0, "sent after the interrupted wait");
  return 0;
}

static int t_epoll_pwait_eintr(struct ctx* c) {
  int ep;
  TRY(ep = new_epoll(c, __LINE__, c->fd, EPOLLIN));
  for (int round = 0; round < 3; round++) TRY(pwait_round(c, ep, round));
  return 0;
}

// A descriptor closed while registered leaves every epoll set (the kernel drops the
// registration with the file): no event for it, not even when the peer closes too. A new
// connection that gets the same number can be added again (no EEXIST) and reports normally.
static int t_epoll_closed_fd(struct ctx* c) {
  const uint32_t all = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLHUP | EPOLLERR;
  int ep;
  TRY(ep = new_epoll(c, __LINE__, c->fd, EPOLLIN | EPOLLRDHUP));
  HELP("send 100 190 0");
  EXPECT_EPOLL(ep, WAIT_MS, EPOLLIN, EPOLLIN, "bytes before the close");
  EXPECT_DATA(c->fd, 100, 190, 0, "received before the close");
  int old = c->fd;
  c->fd = -1;
  CHECK(close(old) == 0, "close: %s", res(-1));
  EXPECT_EPOLL(ep, QUIET_MS, all, 0, "the registered descriptor was closed");
  HELP("eof");
  HELP("close");
  EXPECT_EPOLL(ep, QUIET_MS, all, 0, "the registered descriptor was closed, then the peer too");
  helper_start(c, "reconnect");
  int fd = open_extra(c, __LINE__, SOCK_CLOEXEC);
  if (fd < 0) return -1;
  c->fd = fd;
  AWAIT_HELPER();
  CHECK(fd == old, "the new connection has descriptor %d, expected the lowest free one, %d", fd,
        old);
  struct epoll_event add = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &add) == 0,
        "EPOLL_CTL_ADD of the reused number %d: %s (EEXIST: the closed socket is still there)", fd,
        res(-1));
  EXPECT_EPOLL(ep, QUIET_MS, all, 0, "new connection, idle");
  HELP("send 64 191 0");
  struct epoll_event ev = {0};
  int n = epoll_first(ep, WAIT_MS, &ev);
  CHECK(n == 1 && ev.data.fd == fd && (ev.events & all) == EPOLLIN,
        "new connection, 64 B arrived: %s, %s for fd %d", res(n), events_str(ev.events),
        ev.data.fd);
  EXPECT_DATA(fd, 64, 191, 0, "received on the new connection");
  EXPECT_EPOLL(ep, QUIET_MS, all, 0, "new connection, all read");
  return 0;
}

// ------------------------------------------------------------------------ corners: threads

// Waits until the thread of `b` sleeps (in its call, presumably), at most 2 s.
static void wait_asleep(struct blocked* b) {
  for (long deadline = now_ms() + 2000; now_ms() < deadline; sleep_ms(5)) {
    int tid = atomic_load(&b->tid);
    if (tid == 0) continue;
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE* f = fopen(path, "r");
    if (f == NULL) return;  // the thread ended
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char* end = strrchr(stat, ')');
    if (end != NULL && end[1] == ' ' && end[2] == 'S') {
      sleep_ms(20);
      return;
    }
  }
}

static void start_blocked(struct blocked* b, pthread_t* thread) {
  if (pthread_create(thread, NULL, blocked_main, b) != 0) fatal("pthread_create");
  wait_asleep(b);
}

// Linux TCP: close() from another thread does not wake a recv blocked on the socket; the
// socket lives on until that call returns (here with bytes the peer sends later), and only
// then does the connection end (the peer sees EOF).
static int t_threads_close_recv(struct ctx* c) {
  static struct blocked b;
  b = (struct blocked){.fd = c->fd, .send = false};
  pthread_t thread;
  start_blocked(&b, &thread);
  int fd = c->fd;
  c->fd = -1;
  int rc = close(fd);
  long closed = now_ms();
  sleep_ms(300);
  bool early = atomic_load(&b.done);
  helper_start(c, "send 100 200 0");
  pthread_join(thread, NULL);
  AWAIT_HELPER();
  CHECK(rc == 0, "close: %s", res(rc));
  CHECK(!early,
        "close() from another thread ended the blocked recv after %ld ms: %s (Linux TCP: the "
        "recv goes on)",
        b.done_ms - closed, res_e(b.n, b.err));
  CHECK(b.n == 100, "the blocked recv, bytes sent after another thread closed the socket: %s",
        res_e(b.n, b.err));
  CHECK_DATA(b.buf, 100, 200, 0, "received by the blocked recv");
  HELP("eof");  // the last user of the socket let go: the connection ends now
  return 0;
}

// shutdown(SHUT_RD) from another thread ends a blocked recv with EOF at once; the peer is
// told nothing and this side still sends.
static int t_threads_shutrd(struct ctx* c) {
  static struct blocked b;
  b = (struct blocked){.fd = c->fd, .send = false};
  pthread_t thread;
  start_blocked(&b, &thread);
  long t0 = now_ms();
  int rc = shutdown(c->fd, SHUT_RD);
  pthread_join(thread, NULL);
  CHECK(rc == 0, "shutdown(SHUT_RD): %s", res(rc));
  CHECK(b.n == 0 && b.done_ms - t0 < 1000,
        "recv blocked in another thread, shutdown(SHUT_RD): %s after %ld ms, expected EOF at once",
        res_e(b.n, b.err), b.done_ms - t0);
  ssize_t n = recv(c->fd, scratch, 16, 0);
  CHECK(n == 0, "recv after shutdown(SHUT_RD): %s", res(n));
  int rev = poll_one(c->fd, POLLIN | POLLRDHUP, 0);
  CHECK(rev > 0 && (rev & (POLLIN | POLLRDHUP | POLLHUP)) == (POLLIN | POLLRDHUP),
        "poll after shutdown(SHUT_RD): %s, expected IN|RDHUP", events_str((unsigned)rev));
  HELP("quiet 100");  // SHUT_RD sends nothing
  SEND_PATTERN(c->fd, 1000, 201, 0, "sent after shutdown(SHUT_RD)");
  HELP("recv 1000 201 0");
  return 0;
}

// shutdown(SHUT_RDWR) from a third thread ends both a recv blocked on the empty socket
// (EOF) and a send blocked on the full one (EPIPE, or the bytes it had sent) at once; the
// peer receives everything sent, then EOF.
static int t_threads_shutrdwr(struct ctx* c) {
  static struct blocked rx, tx;
  uint64_t queued = 0;
  FILL(c->fd, MSG_DONTWAIT, 202, &queued);
  rx = (struct blocked){.fd = c->fd, .send = false};
  tx = (struct blocked){.fd = c->fd, .send = true};
  pattern(tx.buf, CHUNK, 202, queued);
  pthread_t threads[2];
  start_blocked(&rx, &threads[0]);
  start_blocked(&tx, &threads[1]);
  long t0 = now_ms();
  int rc = shutdown(c->fd, SHUT_RDWR);
  pthread_join(threads[0], NULL);
  pthread_join(threads[1], NULL);
  CHECK(rc == 0, "shutdown(SHUT_RDWR): %s", res(rc));
  CHECK(rx.n == 0 && rx.done_ms - t0 < 1000,
        "recv blocked in another thread, shutdown(SHUT_RDWR): %s after %ld ms, expected EOF",
        res_e(rx.n, rx.err), rx.done_ms - t0);
  CHECK(((tx.n == -1 && tx.err == EPIPE) || (tx.n > 0 && tx.n <= CHUNK)) && tx.done_ms - t0 < 1000,
        "send blocked on the full socket in another thread, shutdown(SHUT_RDWR): %s after %ld "
        "ms, expected EPIPE",
        res_e(tx.n, tx.err), tx.done_ms - t0);
  HELP("recv %llu 202 0", (unsigned long long)(queued + (tx.n > 0 ? (uint64_t)tx.n : 0)));
  HELP("eof");
  return 0;
}

// Several threads accept on one listener, blocked in accept4 (phase 0) or each waiting in
// its own epoll set that holds the listener with EPOLLEXCLUSIVE (phase 1): every connection
// is accepted exactly once, and its bytes are checked both ways. On the client side (no
// listener) several threads connect at once instead and the helper accepts them.
enum { ACC_THREADS = 4, ACC_CONNS = 8, ACC_LEN = 20000 };

struct acceptor {
  struct ctx c;  // this thread's failure and buffer
  int ep;        // its own epoll set (EPOLLEXCLUSIVE phase), or -1
  int first;     // client side: the index of its first connection
  int served;
};

static atomic_int acc_seen[ACC_CONNS];
static atomic_int acc_done, acc_failed;
static int acc_stop = -1;  // eventfd in every epoll set: ends the EPOLLEXCLUSIVE phase
static uint32_t acc_seed;
static long acc_deadline;

static void acc_finish(void) {
  uint64_t one = 1;
  if (acc_stop >= 0 && write(acc_stop, &one, sizeof one) != sizeof one)
    atomic_store(&acc_failed, 1);
}

// One accept and exchange: 0 to go on, 1 when the phase is over, -1 on failure.
static int acceptor_one(struct acceptor* a) {
  struct ctx* c = &a->c;
  int fd;
  if (a->ep < 0) {
    fd = accept4(c->listener, NULL, NULL, SOCK_CLOEXEC);  // SO_RCVTIMEO bounds it
    if (fd < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    CHECK(fd >= 0, "accept4: %s", res(fd));
  } else {
    struct epoll_event ev[2];
    int n = epoll_wait(a->ep, ev, 2, WAIT_MS);
    if (n < 0 && errno == EINTR) return 0;
    CHECK(n >= 0, "epoll_wait: %s", res(n));
    if (atomic_load(&acc_done) >= ACC_CONNS || atomic_load(&acc_failed)) return 1;
    CHECK(n > 0, "EPOLLEXCLUSIVE on the listener: no wake-up within %d ms, %d of %d served",
          WAIT_MS, atomic_load(&acc_done), ACC_CONNS);
    fd = accept4(c->listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && errno == EAGAIN) return 0;  // another thread took it
    CHECK(fd >= 0, "accept4: %s", res(fd));
  }
  int fl = fcntl(fd, F_GETFL);
  bool want_nonblock = a->ep >= 0;
  if (fl < 0 || !!(fl & O_NONBLOCK) != want_nonblock ||
      (want_nonblock && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)) {
    close(fd);
    return fail(c, __LINE__, "accept4(%s): F_GETFL %#x", want_nonblock ? "SOCK_NONBLOCK" : "0",
                (unsigned)fl);
  }
  set_timeout(fd, SO_RCVTIMEO, WAIT_MS);
  set_timeout(fd, SO_SNDTIMEO, WAIT_MS);
  a->served++;
  int rc = exchange_server(c, fd, ACC_LEN, acc_seed, acc_seen, ACC_CONNS);
  close(fd);
  TRY(rc);
  if (atomic_fetch_add(&acc_done, 1) + 1 == ACC_CONNS) acc_finish();
  return 0;
}

static void* acceptor_main(void* arg) {
  struct acceptor* a = arg;
  while (atomic_load(&acc_done) < ACC_CONNS && !atomic_load(&acc_failed)) {
    if (now_ms() > acc_deadline) {
      fail(&a->c, __LINE__, "%d of %d connections served in %d ms", atomic_load(&acc_done),
           ACC_CONNS, 2 * WAIT_MS);
      break;
    }
    int rc = acceptor_one(a);
    if (rc < 0) {
      atomic_store(&acc_failed, 1);
      acc_finish();
    }
    if (rc != 0) break;
  }
  return NULL;
}

static void* connector_main(void* arg) {
  struct acceptor* a = arg;
  struct ctx* c = &a->c;
  for (int j = 0; j < ACC_CONNS / ACC_THREADS; j++) {
    int fd = open_extra(c, __LINE__, SOCK_CLOEXEC);
    if (fd < 0) return NULL;
    set_timeout(fd, SO_RCVTIMEO, WAIT_MS);
    set_timeout(fd, SO_SNDTIMEO, WAIT_MS);
    int rc = exchange_client(c, fd, (uint32_t)(a->first + j), ACC_LEN, acc_seed);
    close(fd);
    if (rc < 0) return NULL;
    a->served++;
  }
  return NULL;
}

static int accept_phase(struct ctx* c, int phase) {
  static struct acceptor a[ACC_THREADS];
  acc_seed = 300 + 100 * (uint32_t)phase;
  atomic_store(&acc_done, 0);
  atomic_store(&acc_failed, 0);
  for (int i = 0; i < ACC_CONNS; i++) atomic_store(&acc_seen[i], 0);
  acc_stop = -1;
  acc_deadline = now_ms() + 2 * WAIT_MS;
  for (int i = 0; i < ACC_THREADS; i++) {
    a[i] = (struct acceptor){.ep = -1, .first = i * (ACC_CONNS / ACC_THREADS)};
    a[i].c.is_server = c->is_server;
    a[i].c.listener = c->listener;
    a[i].c.server_addr = c->server_addr;
  }
  if (c->is_server && phase == 0) {
    CHECK(set_timeout(c->listener, SO_RCVTIMEO, 200) == 0, "SO_RCVTIMEO: %s", res(-1));
  } else if (c->is_server) {
    acc_stop = own(c, eventfd(0, EFD_CLOEXEC));
    CHECK(acc_stop >= 0, "eventfd: %s", res(-1));
    for (int i = 0; i < ACC_THREADS; i++) {
      a[i].ep = own(c, epoll_create1(EPOLL_CLOEXEC));
      struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = c->listener};
      struct epoll_event stop = {.events = EPOLLIN, .data.fd = acc_stop};
      CHECK(a[i].ep >= 0 && epoll_ctl(a[i].ep, EPOLL_CTL_ADD, c->listener, &ev) == 0 &&
                epoll_ctl(a[i].ep, EPOLL_CTL_ADD, acc_stop, &stop) == 0,
            "epoll set %d with the listener (EPOLLEXCLUSIVE): %s", i, res(-1));
    }
  }
  helper_start(c, "%s %d %d %u", c->is_server ? "connect" : "accept", ACC_CONNS, ACC_LEN, acc_seed);
  pthread_t threads[ACC_THREADS];
  for (int i = 0; i < ACC_THREADS; i++) {
    if (pthread_create(&threads[i], NULL, c->is_server ? acceptor_main : connector_main, &a[i]))
      fatal("pthread_create");
  }
  for (int i = 0; i < ACC_THREADS; i++) pthread_join(threads[i], NULL);
  if (c->is_server) set_timeout(c->listener, SO_RCVTIMEO, 0);
  int served = 0;
  for (int i = 0; i < ACC_THREADS; i++) {
    served += a[i].served;
    c->connections += c->is_server ? a[i].served : a[i].c.connections;
  }
  for (int i = 0; i < ACC_THREADS; i++) {
    CHECK(a[i].c.why[0] == '\0', "thread %d: %s", i, a[i].c.why);
  }
  AWAIT_HELPER();
  CHECK(served == ACC_CONNS, "%d of %d connections served", served, ACC_CONNS);
  for (int i = 0; c->is_server && i < ACC_CONNS; i++) {
    CHECK(atomic_load(&acc_seen[i]) == 1, "connection %d accepted %d times", i,
          atomic_load(&acc_seen[i]));
  }
  return 0;
}

static int t_threads_accept(struct ctx* c) {
  for (int phase = 0; phase < (c->is_server ? 2 : 1); phase++) TRY(accept_phase(c, phase));
  return 0;
}

// ------------------------------------------------------------------------ corners: options

static int get_linger(int fd, struct linger* lg) {
  socklen_t len = sizeof *lg;
  int rc = getsockopt(fd, SOL_SOCKET, SO_LINGER, lg, &len);
  return rc == 0 && len != sizeof *lg ? -1 : rc;
}

// Options read back as set, and act where the test can see it: TCP_CORK holds nothing back
// for good (every corked piece arrives after uncorking); TCP_NODELAY ping-pong of small
// messages; TCP_INFO, SO_ERROR, buffer sizes and an unknown option answered like TCP.
static int t_sockopts_more(struct ctx* c) {
  int v = -1;
  int fdf = fcntl(c->fd, F_GETFD), fl = fcntl(c->fd, F_GETFL);
  CHECK(fdf == FD_CLOEXEC && fl >= 0 && !(fl & O_NONBLOCK) && (fl & O_ACCMODE) == O_RDWR,
        "opened with SOCK_CLOEXEC: F_GETFD %#x, F_GETFL %#x (expected close-on-exec, blocking, "
        "O_RDWR)",
        (unsigned)fdf, (unsigned)fl);
  struct linger lg = {.l_onoff = 1, .l_linger = 7}, got = {-1, -1};
  CHECK(setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER: %s", res(-1));
  CHECK(get_linger(c->fd, &got) == 0 && got.l_onoff == 1 && got.l_linger == 7,
        "SO_LINGER {1, 7} reads {%d, %d}", got.l_onoff, got.l_linger);
  lg = (struct linger){0, 0};
  CHECK(setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER: %s", res(-1));
  CHECK(get_linger(c->fd, &got) == 0 && got.l_onoff == 0, "SO_LINGER {0, 0} reads {%d, %d}",
        got.l_onoff, got.l_linger);
  CHECK(get_int(c->fd, SOL_SOCKET, SO_KEEPALIVE, &v) == 0 && v == 0, "SO_KEEPALIVE default: %d", v);
  static const struct {
    int level, name, value;
    const char* what;
  } opts[] = {
      {SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
      {IPPROTO_TCP, TCP_KEEPIDLE, 30, "TCP_KEEPIDLE"},
      {IPPROTO_TCP, TCP_KEEPINTVL, 5, "TCP_KEEPINTVL"},
      {IPPROTO_TCP, TCP_KEEPCNT, 4, "TCP_KEEPCNT"},
      {IPPROTO_IP, IP_TOS, 0x10, "IP_TOS"},
      {IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY"},
  };
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    CHECK(set_int(c->fd, opts[i].level, opts[i].name, opts[i].value) == 0, "set %s: %s",
          opts[i].what, res(-1));
    CHECK(get_int(c->fd, opts[i].level, opts[i].name, &v) == 0 && v == opts[i].value,
          "%s set to %d reads %d", opts[i].what, opts[i].value, v);
  }
  // An accepted socket has the listener's SO_REUSEADDR (set here), a connected one none.
  CHECK(get_int(c->fd, SOL_SOCKET, SO_REUSEADDR, &v) == 0 && v == (c->is_server ? 1 : 0),
        "SO_REUSEADDR of the %s socket: %d", c->is_server ? "accepted" : "connected", v);
  // TCP_CORK: pieces sent while corked all arrive once uncorked.
  CHECK(set_int(c->fd, IPPROTO_TCP, TCP_CORK, 1) == 0, "TCP_CORK on: %s", res(-1));
  CHECK(get_int(c->fd, IPPROTO_TCP, TCP_CORK, &v) == 0 && v == 1, "TCP_CORK on reads %d", v);
  SEND_PATTERN(c->fd, 100, 210, 0, "corked piece 1");
  SEND_PATTERN(c->fd, 200, 210, 100, "corked piece 2");
  SEND_PATTERN(c->fd, 3000, 210, 300, "corked piece 3");
  CHECK(set_int(c->fd, IPPROTO_TCP, TCP_CORK, 0) == 0, "TCP_CORK off: %s", res(-1));
  CHECK(get_int(c->fd, IPPROTO_TCP, TCP_CORK, &v) == 0 && v == 0, "TCP_CORK off reads %d", v);
  HELP("recv 3300 210 0");
  // TCP_NODELAY: small messages back and forth.
  for (int i = 0; i < 20; i++) {
    SEND_PATTERN(c->fd, 10, 211, 10 * (uint64_t)i, "ping");
    HELP("recv 10 211 %d", 10 * i);
    HELP("send 10 212 %d", 10 * i);
    EXPECT_DATA(c->fd, 10, 212, 10 * (uint64_t)i, "pong");
  }
  CHECK(get_int(c->fd, SOL_SOCKET, SO_ERROR, &v) == 0 && v == 0, "SO_ERROR: %d", v);
  CHECK(get_int(c->fd, SOL_SOCKET, SO_RCVBUF, &v) == 0 && v > 0, "SO_RCVBUF: %d", v);
  CHECK(get_int(c->fd, SOL_SOCKET, SO_SNDBUF, &v) == 0 && v > 0, "SO_SNDBUF: %d", v);
  CHECK(get_int(c->fd, IPPROTO_TCP, TCP_MAXSEG, &v) == 0 && v > 0, "TCP_MAXSEG: %d", v);
  struct tcp_info info = {0};
  socklen_t len = sizeof info;
  CHECK(getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 && len > 0 &&
            info.tcpi_state == TCP_ESTABLISHED && info.tcpi_snd_mss > 0 && info.tcpi_rcv_mss > 0,
        "TCP_INFO: length %u, state %d, snd_mss %u, rcv_mss %u", (unsigned)len, info.tcpi_state,
        info.tcpi_snd_mss, info.tcpi_rcv_mss);
  len = sizeof v;
  int rc = getsockopt(c->fd, SOL_SOCKET, 12345, &v, &len);
  CHECK(rc == -1 && errno == ENOPROTOOPT, "getsockopt of an unknown option: %s", res(rc));
  return 0;
}

// SO_LINGER {1, 0}: close() resets the connection, and the peer's next recv reports
// ECONNRESET, then EOF (helper "reset"). Then the other way round on a new connection:
// this side, blocked in recv, sees the peer's abortive close as ECONNRESET.
static int t_linger_abort(struct ctx* c) {
  SEND_PATTERN(c->fd, 100, 220, 0, "sent before the abortive close");
  HELP("recv 100 220 0");
  HELP("send 100 221 0");
  EXPECT_DATA(c->fd, 100, 221, 0, "received before the abortive close");
  struct linger lg = {.l_onoff = 1, .l_linger = 0}, got = {-1, -1};
  CHECK(setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER: %s", res(-1));
  CHECK(get_linger(c->fd, &got) == 0 && got.l_onoff == 1 && got.l_linger == 0,
        "SO_LINGER {1, 0} reads {%d, %d}", got.l_onoff, got.l_linger);
  helper_start(c, "reset");
  sleep_ms(QUIET_MS);
  int fd = c->fd;
  c->fd = -1;
  CHECK(close(fd) == 0, "close with SO_LINGER {1, 0}: %s", res(-1));
  AWAIT_HELPER();
  helper_start(c, "reconnect");
  fd = open_extra(c, __LINE__, SOCK_CLOEXEC);
  if (fd < 0) return -1;
  c->fd = fd;
  AWAIT_HELPER();
  CHECK(set_timeout(fd, SO_RCVTIMEO, WAIT_MS) == 0, "SO_RCVTIMEO: %s", res(-1));
  helper_start(c, "abort");
  ssize_t n = recv(fd, scratch, 16, 0);
  int err = errno;
  AWAIT_HELPER();
  TRY(reset_outcome(c, __LINE__, n, err, "recv, the peer closed with SO_LINGER {1, 0}"));
  n = recv(fd, scratch, 16, 0);
  CHECK(n == 0, "a second recv after the reset: %s, expected EOF", res(n));
  return 0;
}

// SO_LINGER {1, 5}: close() after a transfer larger than the socket buffers returns within
// the linger time, and every byte reaches the peer, then EOF.
static int t_linger_graceful(struct ctx* c) {
  const uint64_t len = 2 << 20;
  struct linger lg = {.l_onoff = 1, .l_linger = 5};
  CHECK(setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER: %s", res(-1));
  helper_start(c, "recv %llu 222 0", (unsigned long long)len);
  SEND_PATTERN(c->fd, len, 222, 0, "sent before a lingering close");
  long t0 = now_ms();
  int fd = c->fd;
  c->fd = -1;
  int rc = close(fd);
  long ms = now_ms() - t0;
  AWAIT_HELPER();
  CHECK(rc == 0 && ms < 5000, "close with SO_LINGER {1, 5}: %s after %ld ms", res(rc), ms);
  HELP("eof");
  return 0;
}

// SOCK_NONBLOCK and SOCK_CLOEXEC given to socket() (client) or accept4() (server) are what
// fcntl reports on the application's descriptor, and they act (recv: EAGAIN at once, or a
// wait); F_SETFD and F_SETFL change them as on any descriptor.
static int check_flags(struct ctx* c, int fd, int want, const char* when) {
  int fl = fcntl(fd, F_GETFL), fdf = fcntl(fd, F_GETFD);
  CHECK(fl >= 0 && fdf >= 0 && !!(fl & O_NONBLOCK) == !!(want & SOCK_NONBLOCK) &&
            !!(fdf & FD_CLOEXEC) == !!(want & SOCK_CLOEXEC),
        "%s: F_GETFL %#x, F_GETFD %#x, expected%s%s", when, (unsigned)fl, (unsigned)fdf,
        want & SOCK_NONBLOCK ? " O_NONBLOCK" : " blocking",
        want & SOCK_CLOEXEC ? " FD_CLOEXEC" : " inheritable");
  CHECK(set_timeout(fd, SO_RCVTIMEO, 300) == 0, "SO_RCVTIMEO: %s", res(-1));
  long t0 = now_ms();
  ssize_t n = recv(fd, scratch, 10, 0);
  int err = errno;
  long ms = now_ms() - t0;
  bool nonblock = want & SOCK_NONBLOCK;
  CHECK(n == -1 && err == EAGAIN && (nonblock ? ms < 250 : ms >= 280),
        "%s: recv on the idle socket (300 ms SO_RCVTIMEO): %s after %ld ms, expected EAGAIN %s",
        when, res_e(n, err), ms, nonblock ? "at once" : "after the timeout");
  return 0;
}

static int t_fd_flags(struct ctx* c) {
  static const int combos[] = {0, SOCK_NONBLOCK, SOCK_CLOEXEC, SOCK_NONBLOCK | SOCK_CLOEXEC};
  for (int i = 0; i < 4; i++) {
    int want = combos[i];
    char when[96];
    snprintf(when, sizeof when, "%s(%s)", c->is_server ? "accept4" : "socket",
             want == 0               ? "0"
             : want == SOCK_NONBLOCK ? "SOCK_NONBLOCK"
             : want == SOCK_CLOEXEC  ? "SOCK_CLOEXEC"
                                     : "SOCK_NONBLOCK|SOCK_CLOEXEC");
    close(c->fd);
    c->fd = -1;
    helper_start(c, "reconnect");
    int fd = open_extra(c, __LINE__, want);
    if (fd < 0) return -1;
    c->fd = fd;
    AWAIT_HELPER();
    TRY(check_flags(c, fd, want, when));
    HELP("send 64 %d 0", 230 + i);
    EXPECT_DATA(fd, 64, 230 + (uint32_t)i, 0, "received");
    SEND_PATTERN(fd, 64, 240 + (uint32_t)i, 0, "sent");
    HELP("recv 64 %d 0", 240 + i);
    int flipped = want ^ (SOCK_NONBLOCK | SOCK_CLOEXEC);
    int fl = fcntl(fd, F_GETFL);
    CHECK(fcntl(fd, F_SETFD, (flipped & SOCK_CLOEXEC) ? FD_CLOEXEC : 0) == 0 &&
              fcntl(fd, F_SETFL, fl ^ O_NONBLOCK) == 0,
          "F_SETFD/F_SETFL: %s", res(-1));
    snprintf(when + strlen(when), sizeof when - strlen(when), ", both flags flipped");
    TRY(check_flags(c, fd, flipped, when));
  }
  return 0;
}

struct subtest {
  const char* name;
  int (*run)(struct ctx* c);
};

static const struct subtest SUBTESTS[] = {
    {"peek", t_peek},
    {"urgent", t_urgent},
    {"urgent_inline", t_urgent_inline},
    {"recvmmsg", t_recvmmsg},
    {"buffer_bound", t_buffer_bound},
    {"peek_waitall", t_peek_waitall},
    {"waitall", t_waitall},
    {"dontwait", t_dontwait},
    {"nonblock_fcntl", t_nonblock_fcntl},
    {"nonblock_ioctl", t_nonblock_ioctl},
    {"fionread", t_fionread},
    {"rcvtimeo", t_rcvtimeo},
    {"sndtimeo", t_sndtimeo},
    {"halfclose", t_halfclose},
    {"epipe", t_epipe},
    {"sockopts", t_sockopts},
    {"epoll_lt", t_epoll_lt},
    {"epoll_et", t_epoll_et},
    {"epoll_two_sets", t_epoll_two_sets},
    {"epoll_out", t_epoll_out},
    {"poll_select", t_poll_select},
    {"threads_duplex", t_threads_duplex},
    {"threads_split_read", t_threads_split_read},
    {"threads_dontwait_recv", t_threads_dontwait_recv},
    {"threads_dontwait_send", t_threads_dontwait_send},
    {"dup", t_dup},
    {"eintr", t_eintr},
    {"epoll_oneshot", t_epoll_oneshot},
    {"epoll_exclusive", t_epoll_exclusive},
    {"epoll_rdhup", t_epoll_rdhup},
    {"epoll_nested", t_epoll_nested},
    {"epoll_pwait_eintr", t_epoll_pwait_eintr},
    {"epoll_closed_fd", t_epoll_closed_fd},
    {"threads_close_recv", t_threads_close_recv},
    {"threads_shutrd", t_threads_shutrd},
    {"threads_shutrdwr", t_threads_shutrdwr},
    {"threads_accept", t_threads_accept},
    {"sockopts_more", t_sockopts_more},
    {"linger_abort", t_linger_abort},
    {"linger_graceful", t_linger_graceful},
    {"fd_flags", t_fd_flags},
};
enum { NSUBTESTS = sizeof SUBTESTS / sizeof SUBTESTS[0] };

// ------------------------------------------------------------------------ running

static void open_data(struct ctx* c) {
  int fd;
  if (c->is_server) {
    if (poll_one(c->listener, POLLIN, CTL_MS) <= 0) fatal("no connection within %d ms", CTL_MS);
    fd = accept4(c->listener, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) fatal("accept: %s", res(fd));
  } else {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr*)&c->server_addr, sizeof c->server_addr) != 0)
      fatal("socket/connect: %s", res(-1));
  }
  if (set_timeout(fd, SO_RCVTIMEO, WAIT_MS) != 0 || set_timeout(fd, SO_SNDTIMEO, WAIT_MS) != 0)
    fatal("SO_RCVTIMEO/SO_SNDTIMEO: %s", res(-1));
  c->fd = fd;
  c->connections++;
}

static bool run_tester(struct ctx* c, const struct subtest* t, const char* role) {
  c->why[0] = '\0';
  c->npending = 0;
  c->helper_failed = false;
  snprintf(watchdog_name, sizeof watchdog_name, "%s/%s", role, t->name);
  atomic_store(&watchdog_deadline, now_ms() + SUBTEST_LIMIT_MS);
  ctl_send(c, "begin %s", t->name);
  long t0 = now_ms();
  int rc = t->run(c);
  long ms = now_ms() - t0;
  if (rc == 0 && c->npending > 0) rc = fail(c, 0, "%d helper answers not awaited", c->npending);
  close_all(c);  // before "end": a helper still waiting on the connection gives up at once
  ctl_send(c, "end");
  char line[LINE_MAX_LEN];
  do {
    ctl_line(c, line, sizeof line, CTL_MS);  // skips answers not awaited after a failure
  } while (strncmp(line, "end ", 4) != 0);
  atomic_store(&watchdog_deadline, 0);
  int helper_failures = 0, at = 0;
  sscanf(line, "end %d %n", &helper_failures, &at);
  bool ok = rc == 0 && helper_failures == 0;
  bool show_helper = helper_failures > 0 && !c->helper_failed;  // not in `why` already
  if (ok) {
    printf("PASS %s/%s (%ld ms)\n", role, t->name, ms);
  } else {
    printf("FAIL %s/%s: %s%s%s%s\n", role, t->name, rc ? c->why : "", rc && show_helper ? "; " : "",
           show_helper ? "helper: " : "", show_helper ? line + at : "");
  }
  fflush(stdout);
  return ok;
}

static void run_helper(struct ctx* c, const struct subtest* t) {
  char line[LINE_MAX_LEN], first[LINE_MAX_LEN] = "";
  ctl_line(c, line, sizeof line, CTL_MS);
  if (strncmp(line, "begin ", 6) != 0 || strcmp(line + 6, t->name) != 0)
    fatal("out of step: expected \"begin %s\", got \"%s\"", t->name, line);
  int failures = 0;
  for (;;) {
    ctl_line(c, line, sizeof line, CTL_MS);
    if (strcmp(line, "end") == 0) break;
    c->why[0] = '\0';
    c->reply[0] = '\0';
    if (helper_command(c, line) == 0) {
      ctl_send(c, "ok%s%s", c->reply[0] ? " " : "", c->reply);
    } else {
      ctl_send(c, "fail %s", c->why);
      if (failures++ == 0) snprintf(first, sizeof first, "`%.100s`: %.600s", line, c->why);
    }
  }
  close_all(c);
  ctl_send(c, "end %d %s", failures, first);
}

int main(int argc, char** argv) {
  static struct ctx ctx = {.listener = -1, .ctl = -1, .fd = -1};
  struct ctx* c = &ctx;
  for (int i = 0; i < MAX_OWNED; i++) c->owned[i] = -1;
  if (argc == 3 && strcmp(argv[1], "server") == 0) {
    c->is_server = true;
    c->port = atoi(argv[2]);
  } else if (argc == 4 && strcmp(argv[1], "client") == 0) {
    c->port = atoi(argv[3]);
  } else {
    fprintf(stderr, "usage: semantics server PORT | semantics client HOST PORT\n");
    return 2;
  }
  c->server_addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(c->port)};
  if (inet_pton(AF_INET, c->is_server ? test_host() : argv[2], &c->server_addr.sin_addr) != 1)
    fatal("bad address");

  struct sigaction sa = {.sa_handler = on_sigpipe, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPIPE, &sa, NULL);
  start_quiet_thread(watchdog_main, NULL);

  if (c->is_server) {
    c->listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->listener < 0 || set_int(c->listener, SOL_SOCKET, SO_REUSEADDR, 1) != 0 ||
        bind(c->listener, (struct sockaddr*)&c->server_addr, sizeof c->server_addr) != 0 ||
        listen(c->listener, 16) != 0)
      fatal("listen on port %d: %s", c->port, res(-1));
  }
  open_data(c);  // the first connection is the control connection
  c->ctl = c->fd;
  c->fd = -1;
  set_timeout(c->ctl, SO_RCVTIMEO, 0);
  set_timeout(c->ctl, SO_SNDTIMEO, 0);
  set_int(c->ctl, IPPROTO_TCP, TCP_NODELAY, 1);  // commands and answers are small writes

  // Debugging: SLIP_TEST_SUBTESTS="name,name,..." runs those (in that order, repeats
  // allowed) instead of every subtest once, in both roles; both processes must agree.
  static const struct subtest* plan[1024];
  size_t planned = 0;
  const char* only = getenv("SLIP_TEST_SUBTESTS");
  for (const char* p = only; p != NULL && *p != '\0' && planned < 1024;) {
    size_t len = strcspn(p, ",");
    size_t i = 0;
    while (i < NSUBTESTS && (strlen(SUBTESTS[i].name) != len || strncmp(SUBTESTS[i].name, p, len)))
      i++;
    if (i == NSUBTESTS) fatal("SLIP_TEST_SUBTESTS: no subtest \"%.*s\"", (int)len, p);
    plan[planned++] = &SUBTESTS[i];
    p += len + (p[len] == ',');
  }
  for (size_t i = 0; only == NULL && i < NSUBTESTS; i++) plan[planned++] = &SUBTESTS[i];

  int tested = 0, failed = 0;
  for (int round = 0; round < 2; round++) {
    const char* role = round == 0 ? "client" : "server";
    bool tester = (round == 0) != c->is_server;
    for (size_t i = 0; i < planned; i++) {
      open_data(c);
      if (tester) {
        tested++;
        failed += !run_tester(c, plan[i], role);
      } else {
        run_helper(c, plan[i]);
      }
    }
  }
  close(c->ctl);
  if (c->listener >= 0) close(c->listener);
  printf(
      "{\"role\": \"%s\", \"subtests\": %d, \"tested\": %d, \"failed\": %d, "
      "\"connections\": %d}\n",
      c->is_server ? "server" : "client", (int)NSUBTESTS, tested, failed, c->connections);
  return failed ? 1 : 0;
}
