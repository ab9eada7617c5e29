// Many connections and connection storms: one server, one client, both single-threaded
// epoll loops on nonblocking sockets. run.py starts them (plain, then under slip-run) and
// checks descriptors, mappings and memory between the phases.
//
//   storm serve  --port P --mode close|hold
//   storm client --port P --mode hold  --conns N                           --gate DIR
//   storm client --port P --mode storm --conns N --concurrency C --rounds R --gate DIR
//       [--max-request B] [--max-reply B]
//
// Per connection the client sends a request (16-byte header: magic, length, id; then
// `length` bytes derived from the id) and the server, having checked every byte, answers
// with a reply of the same form (another length and pattern derived from the id), which
// the client checks byte by byte.
//   mode close (the storm, like HTTP with "Connection: close"): the server closes after its
//     reply; the client must then read EOF, and closes. The client keeps C connections in
//     flight (nonblocking connect, request, reply, EOF, close) until N are done: a round.
//   mode hold: the client opens N connections one after another (blocking connect), then
//     sends every request and checks every reply with all N open at once, then closes them
//     all; the server closes each on its EOF.
// The client waits at each gate for the file DIR/go.K (K = 0 before the first connection,
// then after each round; hold: 1 with every connection open, 2 after closing them all),
// announcing it with a line "GATE K" after a JSON line saying what it did.
// Both raise the soft RLIMIT_NOFILE to the hard limit. The server stops on SIGTERM or
// SIGINT and prints its report (one JSON line). Exit status 0 unless a check failed.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { HDR = 16, STALL_MS = 20000, GATE_TIMEOUT_MS = 120000, MAX_ERRORS_SHOWN = 5 };
static const uint32_t kReqMagic = 0x31515253;  // "SRQ1"
static const uint32_t kRepMagic = 0x31505253;  // "SRP1"
static const uint32_t kBadMagic = 0x58505253;  // "SRPX": the server found the request bad

// ---- content --------------------------------------------------------------------------

static uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static uint64_t req_seed(uint64_t id) { return mix(id * 2 + 1); }
static uint64_t rep_seed(uint64_t id) { return mix(id * 2 + 2); }
static uint32_t req_len(uint64_t id, uint32_t max) { return 1 + (uint32_t)(mix(id ^ 0x5151) % max); }
static uint32_t rep_len(uint64_t id, uint32_t max) { return 1 + (uint32_t)(mix(id ^ 0xa3a3) % max); }

// Byte `off` of the stream with seed `seed`.
static uint8_t pattern_at(uint64_t seed, uint64_t off) {
  return (uint8_t)(mix(seed + off / 8) >> (8 * (off % 8)));
}
static void pattern_fill(uint64_t seed, uint64_t off, uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = pattern_at(seed, off + i);
}
static bool pattern_check(uint64_t seed, uint64_t off, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern_at(seed, off + i)) return false;
  return true;
}

static void put_hdr(uint8_t *h, uint32_t magic, uint32_t len, uint64_t id) {
  memcpy(h, &magic, 4);
  memcpy(h + 4, &len, 4);
  memcpy(h + 8, &id, 8);
}
static void get_hdr(const uint8_t *h, uint32_t *magic, uint32_t *len, uint64_t *id) {
  memcpy(magic, h, 4);
  memcpy(len, h + 4, 4);
  memcpy(id, h + 8, 8);
}

// ---- common ---------------------------------------------------------------------------

static long errors;
static char error_text[MAX_ERRORS_SHOWN][200];

static void fail(const char *fmt, ...) {
  if (errors < MAX_ERRORS_SHOWN) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text[errors], sizeof(error_text[0]), fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: %s\n", error_text[errors]);
  }
  errors++;
}

static void die(const char *what) {
  fprintf(stderr, "fatal: %s: %s\n", what, strerror(errno));
  exit(2);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) die("getrlimit");
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) die("setrlimit");
  return (long)rl.rlim_cur;
}

static void print_errors_json(void) {
  printf("\"errors\":%ld,\"first_errors\":[", errors);
  for (long i = 0; i < errors && i < MAX_ERRORS_SHOWN; i++) {
    printf("%s\"", i ? "," : "");
    for (const char *c = error_text[i]; *c; c++)
      if (*c == '"' || *c == '\\') printf("\\%c", *c);
      else if ((unsigned char)*c >= 0x20) putchar(*c);
    printf("\"");
  }
  printf("]");
}

static struct sockaddr_in loopback(int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

static void set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) die("fcntl O_NONBLOCK");
}

static void ep_ctl(int ep, int op, int fd, uint32_t events, void *ptr) {
  struct epoll_event ev = {.events = events, .data.ptr = ptr};
  if (epoll_ctl(ep, op, fd, &ev) != 0) die("epoll_ctl");
}

// A connection's state stays allocated (marked dead) for a while after its descriptor is
// closed, so that an epoll event that still names it after close() (which the kernel never
// reports once no descriptor refers to the socket) is detected and counted instead of
// being a use after free.
enum { QUARANTINE = 4096 };
static const uint32_t kLive = 0x4c495645, kDead = 0x44454144;
struct tracked {
  uint32_t magic;
  int fd;
  uint64_t id;
};
static void *quarantine[QUARANTINE];
static size_t quarantine_next;
static long stale_events;

static void retire(struct tracked *t) {
  t->magic = kDead;
  free(quarantine[quarantine_next]);
  quarantine[quarantine_next] = t;
  quarantine_next = (quarantine_next + 1) % QUARANTINE;
}

// Says (once, on stderr) which file the stale registration is on and which descriptors of
// this process still refer to it: /proc/self/fdinfo/EPFD lists each registration's target
// number and inode.
static void diagnose_stale(int ep, int fd) {
  static bool done;
  if (done) return;
  done = true;
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", ep);
  FILE *f = fopen(path, "r");
  if (!f) return;
  unsigned long inos[8];
  int ninos = 0;
  while (fgets(line, sizeof(line), f)) {
    int tfd;
    unsigned long i;
    char *p = strstr(line, "ino:");
    if (sscanf(line, "tfd: %d", &tfd) == 1 && tfd == fd && p && sscanf(p, "ino:%lx", &i) == 1) {
      fprintf(stderr, "diagnosis: epoll registration: %s", line);
      if (ninos < 8) inos[ninos++] = i;
    }
  }
  fclose(f);
  for (int k = 0; k < ninos; k++) {
    char want[64], target[256];
    snprintf(want, sizeof(want), "socket:[%lu]", inos[k]);
    fprintf(stderr, "diagnosis: descriptors referring to %s (pid/fd):", want);
    DIR *procs = opendir("/proc");
    struct dirent *pe;
    while (procs && (pe = readdir(procs))) {
      if (pe->d_name[0] < '1' || pe->d_name[0] > '9') continue;
      char dir[300];
      snprintf(dir, sizeof(dir), "/proc/%s/fd", pe->d_name);
      DIR *fds = opendir(dir);
      struct dirent *fe;
      while (fds && (fe = readdir(fds))) {
        char link[600];
        snprintf(link, sizeof(link), "%s/%s", dir, fe->d_name);
        ssize_t n = readlink(link, target, sizeof(target) - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (!strcmp(target, want)) fprintf(stderr, " %s/%s", pe->d_name, fe->d_name);
      }
      if (fds) closedir(fds);
    }
    if (procs) closedir(procs);
    fprintf(stderr, " (this process is %d)\n", getpid());
  }
}

static int diag_ep = -1;

static bool stale(const struct tracked *t, uint32_t events, const char *who) {
  if (t->magic == kLive) return false;
  stale_events++;
  if (stale_events == 1) fprintf(stderr, "diagnosis: the stale event's data is %p\n", (void *)t);
  diagnose_stale(diag_ep, t->fd);
  fail("%s: epoll_wait reported events 0x%x for connection %llu after close(%d), which no "
       "other descriptor refers to", who, events, (unsigned long long)t->id, t->fd);
  return true;
}

// ---- server ---------------------------------------------------------------------------

enum sstate { S_REQ, S_REP, S_EOF };
struct sconn {
  struct tracked t;  // first
  int fd;
  enum sstate st;
  uint8_t hdr[HDR];
  size_t got;  // bytes of header + body read
  uint32_t len;
  uint64_t id;
  bool bad;
  uint8_t *out;  // the reply
  size_t out_len, out_done;
  uint32_t events;
};

static volatile sig_atomic_t stop_requested;
static void on_stop(int sig) { (void)sig; stop_requested = 1; }

static long s_accepted, s_served, s_open, s_max_open, s_bad_requests;
static uint64_t s_bytes_in, s_bytes_out;
static uint32_t s_max_reply = 4096;  // the client's --max-reply must match

static void sconn_close(int ep, struct sconn *c) {
  (void)ep;  // close() removes it from the epoll set
  if (close(c->fd) != 0) fail("server: close(%d): %s", c->fd, strerror(errno));
  free(c->out);
  c->out = NULL;
  retire(&c->t);
  s_open--;
}

static void sconn_want(int ep, struct sconn *c, uint32_t events) {
  if (c->events == events) return;
  c->events = events;
  ep_ctl(ep, EPOLL_CTL_MOD, c->fd, events, c);
}

// Returns false when the connection is gone.
static bool server_io(int ep, struct sconn *c, bool hold) {
  uint8_t buf[65536];
  for (;;) {
    if (c->st == S_REQ) {
      size_t want = c->got < HDR ? HDR - c->got : HDR + (size_t)c->len - c->got;
      if (want > sizeof(buf)) want = sizeof(buf);
      ssize_t n = read(c->fd, buf, want);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      if (n <= 0) {
        fail("server: connection %llu: %s after %zu request bytes", (unsigned long long)c->id,
             n == 0 ? "EOF" : strerror(errno), c->got);
        sconn_close(ep, c);
        return false;
      }
      s_bytes_in += (uint64_t)n;
      size_t off = 0;
      if (c->got < HDR) {
        size_t h = (size_t)n < HDR - c->got ? (size_t)n : HDR - c->got;
        memcpy(c->hdr + c->got, buf, h);
        c->got += h;
        off = h;
        if (c->got == HDR) {
          uint32_t magic;
          get_hdr(c->hdr, &magic, &c->len, &c->id);
          c->t.id = c->id;
          if (magic != kReqMagic || c->len == 0 || c->len > (1u << 24)) {
            fail("server: bad request header (magic %08x, length %u)", magic, c->len);
            sconn_close(ep, c);
            return false;
          }
        }
      }
      if (off < (size_t)n) {
        if (!pattern_check(req_seed(c->id), c->got - HDR, buf + off, (size_t)n - off))
          c->bad = true;
        c->got += (size_t)n - off;
      }
      if (c->got == HDR + (size_t)c->len) {
        uint32_t rl = rep_len(c->id, s_max_reply);
        c->out = malloc(HDR + rl);
        if (!c->out) die("malloc");
        if (c->bad) {
          s_bad_requests++;
          fail("server: connection %llu: request content differs", (unsigned long long)c->id);
        }
        put_hdr(c->out, c->bad ? kBadMagic : kRepMagic, rl, c->id);
        pattern_fill(rep_seed(c->id), 0, c->out + HDR, rl);
        c->out_len = HDR + rl;
        c->st = S_REP;
      }
    } else if (c->st == S_REP) {
      ssize_t n = write(c->fd, c->out + c->out_done, c->out_len - c->out_done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        sconn_want(ep, c, EPOLLOUT);
        return true;
      }
      if (n <= 0) {
        fail("server: connection %llu: write: %s", (unsigned long long)c->id,
             n == 0 ? "returned 0" : strerror(errno));
        sconn_close(ep, c);
        return false;
      }
      s_bytes_out += (uint64_t)n;
      c->out_done += (size_t)n;
      if (c->out_done == c->out_len) {
        s_served++;
        free(c->out);
        c->out = NULL;
        if (!hold) {
          sconn_close(ep, c);
          return false;
        }
        c->st = S_EOF;
        sconn_want(ep, c, EPOLLIN);
      }
    } else {  // S_EOF: the client closes; nothing more may arrive
      ssize_t n = read(c->fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      if (n > 0) fail("server: connection %llu: %zd bytes after the request",
                      (unsigned long long)c->id, n);
      else if (n < 0) fail("server: connection %llu: read at EOF: %s",
                           (unsigned long long)c->id, strerror(errno));
      sconn_close(ep, c);
      return false;
    }
  }
}

static int serve(int port, bool hold) {
  struct sigaction sa = {.sa_handler = on_stop};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) die("socket");
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in a = loopback(port);
  if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0) die("bind");
  if (listen(lfd, 4096) != 0) die("listen");
  set_nonblock(lfd);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) die("epoll_create1");
  ep_ctl(ep, EPOLL_CTL_ADD, lfd, EPOLLIN, NULL);
  diag_ep = ep;
  printf("{\"event\":\"listening\",\"pid\":%d,\"port\":%d}\n", getpid(), port);
  struct epoll_event evs[256];
  while (!stop_requested) {
    int n = epoll_wait(ep, evs, 256, 100);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      struct sconn *c = evs[i].data.ptr;
      if (c == NULL) {
        for (;;) {
          int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
          if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN) fail("server: accept: %s", strerror(errno));
            break;
          }
          c = calloc(1, sizeof(*c));
          if (!c) die("calloc");
          c->fd = fd;
          c->t = (struct tracked){kLive, fd, 0};
          c->events = EPOLLIN;
          ep_ctl(ep, EPOLL_CTL_ADD, fd, EPOLLIN, c);
          s_accepted++;
          if (++s_open > s_max_open) s_max_open = s_open;
        }
        continue;
      }
      if (!stale(&c->t, evs[i].events, "server")) server_io(ep, c, hold);
    }
  }
  printf("{\"role\":\"server\",\"accepted\":%ld,\"served\":%ld,\"bad_requests\":%ld,"
         "\"open_at_exit\":%ld,\"max_open\":%ld,\"bytes_in\":%llu,\"bytes_out\":%llu,"
         "\"stale_events\":%ld,", s_accepted, s_served, s_bad_requests, s_open, s_max_open,
         (unsigned long long)s_bytes_in, (unsigned long long)s_bytes_out, stale_events);
  print_errors_json();
  printf("}\n");
  return errors ? 1 : 0;
}

// ---- client ---------------------------------------------------------------------------

enum cstate { C_CONNECTING, C_WRITE, C_READ, C_EOF, C_DONE };
static const char *cstate_name[] = {"connecting", "writing", "reading", "awaiting-eof", "done"};
struct cconn {
  struct tracked t;  // first
  int fd;
  enum cstate st;
  uint64_t id;
  uint8_t *req;
  size_t req_len, req_done;
  uint8_t hdr[HDR];
  size_t got;
  uint32_t len;  // expected reply length
  uint32_t events;
};

static uint32_t c_max_request = 1024, c_max_reply = 4096;
static long c_ok, c_active;
static uint64_t c_bytes_out, c_bytes_in;
static double c_last_progress;

static void wait_gate(const char *dir, int k) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/go.%d", dir, k);
  printf("GATE %d\n", k);
  fflush(stdout);
  struct stat st;
  for (int waited = 0; stat(path, &st) != 0; waited += 2) {
    if (waited > GATE_TIMEOUT_MS) {
      fprintf(stderr, "fatal: nobody opened gate %s\n", path);
      exit(2);
    }
    usleep(2000);
  }
  c_last_progress = now_s();
}

static struct cconn *cconn_new(uint64_t id) {
  struct cconn *c = calloc(1, sizeof(*c));
  if (!c) die("calloc");
  c->id = id;
  c->t = (struct tracked){kLive, -1, id};
  uint32_t len = req_len(id, c_max_request);
  c->req_len = HDR + len;
  c->req = malloc(c->req_len);
  if (!c->req) die("malloc");
  put_hdr(c->req, kReqMagic, len, id);
  pattern_fill(req_seed(id), 0, c->req + HDR, len);
  return c;
}

static void cconn_free(struct cconn *c, bool close_fd) {
  if (close_fd && close(c->fd) != 0) fail("client: close(%d): %s", c->fd, strerror(errno));
  free(c->req);
  c->req = NULL;
  c->t.fd = c->fd;
  retire(&c->t);
}

static void cconn_want(int ep, struct cconn *c, uint32_t events) {
  if (c->events == events) return;
  c->events = events;
  ep_ctl(ep, EPOLL_CTL_MOD, c->fd, events, c);
}

// Advances one connection as far as it goes without blocking. Returns its state; C_DONE
// with the descriptor already closed in storm mode (then `c` is freed).
static enum cstate client_io(int ep, struct cconn *c, bool storm) {
  uint8_t buf[65536];
  for (;;) {
    switch (c->st) {
      case C_CONNECTING: {
        int err = 0;
        socklen_t el = sizeof(err);
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
        if (err == 0) {
          // EPOLLOUT with no error: connected (checked, not assumed).
          struct sockaddr_in peer;
          socklen_t pl = sizeof(peer);
          if (getpeername(c->fd, (struct sockaddr *)&peer, &pl) != 0) {
            if (errno == ENOTCONN) return c->st;  // spurious wake-up
            err = errno;
          }
        }
        if (err) {
          fail("client: connection %llu: connect: %s", (unsigned long long)c->id, strerror(err));
          goto broken;
        }
        c->st = C_WRITE;
        break;
      }
      case C_WRITE: {
        ssize_t n = write(c->fd, c->req + c->req_done, c->req_len - c->req_done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
          cconn_want(ep, c, EPOLLOUT);
          return c->st;
        }
        if (n <= 0) {
          fail("client: connection %llu: write: %s", (unsigned long long)c->id,
               n == 0 ? "returned 0" : strerror(errno));
          goto broken;
        }
        c_bytes_out += (uint64_t)n;
        c->req_done += (size_t)n;
        if (c->req_done == c->req_len) {
          c->st = C_READ;
          c->len = rep_len(c->id, c_max_reply);
          cconn_want(ep, c, EPOLLIN);
        }
        break;
      }
      case C_READ: {
        size_t want = c->got < HDR ? HDR - c->got : HDR + (size_t)c->len - c->got;
        if (want > sizeof(buf)) want = sizeof(buf);
        ssize_t n = read(c->fd, buf, want);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return c->st;
        if (n <= 0) {
          fail("client: connection %llu: %s after %zu reply bytes", (unsigned long long)c->id,
               n == 0 ? "EOF" : strerror(errno), c->got);
          goto broken;
        }
        c_bytes_in += (uint64_t)n;
        size_t off = 0;
        if (c->got < HDR) {
          size_t h = (size_t)n < HDR - c->got ? (size_t)n : HDR - c->got;
          memcpy(c->hdr + c->got, buf, h);
          c->got += h;
          off = h;
          if (c->got == HDR) {
            uint32_t magic, len;
            uint64_t id;
            get_hdr(c->hdr, &magic, &len, &id);
            if (magic != kRepMagic || len != c->len || id != c->id) {
              fail("client: connection %llu: reply header magic %08x length %u id %llu, "
                   "expected %08x %u %llu", (unsigned long long)c->id, magic, len,
                   (unsigned long long)id, kRepMagic, c->len, (unsigned long long)c->id);
              goto broken;
            }
          }
        }
        if (off < (size_t)n) {
          if (!pattern_check(rep_seed(c->id), c->got - HDR, buf + off, (size_t)n - off)) {
            fail("client: connection %llu: reply content differs at offset %zu",
                 (unsigned long long)c->id, c->got - HDR);
            goto broken;
          }
          c->got += (size_t)n - off;
        }
        if (c->got == HDR + (size_t)c->len) {
          if (!storm) {
            c_ok++;
            c->st = C_DONE;
            cconn_want(ep, c, 0);
            c_last_progress = now_s();
            return C_DONE;
          }
          c->st = C_EOF;
        }
        break;
      }
      case C_EOF: {
        ssize_t n = read(c->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return c->st;
        if (n != 0) {
          fail("client: connection %llu: %s where EOF was expected", (unsigned long long)c->id,
               n > 0 ? "bytes" : strerror(errno));
          goto broken;
        }
        c_ok++;
        c_active--;
        c_last_progress = now_s();
        cconn_free(c, true);
        return C_DONE;
      }
      case C_DONE:
        return C_DONE;
    }
  }
broken:
  if (storm) {
    c_active--;
    cconn_free(c, true);
    return C_DONE;
  }
  c->st = C_DONE;
  cconn_want(ep, c, 0);
  return C_DONE;
}

static void check_stall(struct cconn **all, long n, const char *phase) {
  if (now_s() - c_last_progress < STALL_MS / 1000.0) return;
  long counts[C_DONE + 1] = {0};
  for (long i = 0; i < n; i++)
    if (all[i]) counts[all[i]->st]++;
  fprintf(stderr, "fatal: no progress for %d s during %s; connections by state:", STALL_MS / 1000,
          phase);
  for (int s = 0; s <= C_DONE; s++) fprintf(stderr, " %s=%ld", cstate_name[s], counts[s]);
  fprintf(stderr, "\n");
  printf("{\"role\":\"client\",\"stalled\":\"%s\",\"ok\":%ld,", phase, c_ok);
  print_errors_json();
  printf("}\n");
  exit(3);
}

static int client_hold(int port, long conns, const char *gate) {
  struct cconn **all = calloc((size_t)conns, sizeof(*all));
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (!all || ep < 0) die("setup");
  diag_ep = ep;
  wait_gate(gate, 0);  // the baseline: everything but the connections
  struct sockaddr_in a = loopback(port);
  double t0 = now_s();
  for (long i = 0; i < conns; i++) {
    struct cconn *c = cconn_new((uint64_t)i);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0) die("socket");
    int r;
    while ((r = connect(c->fd, (struct sockaddr *)&a, sizeof(a))) != 0 && errno == EINTR) {
    }
    if (r != 0) {
      fprintf(stderr, "fatal: connection %ld of %ld: connect: %s\n", i, conns, strerror(errno));
      exit(2);
    }
    set_nonblock(c->fd);
    c->st = C_WRITE;
    c->events = EPOLLOUT;
    ep_ctl(ep, EPOLL_CTL_ADD, c->fd, EPOLLOUT, c);
    all[i] = c;
  }
  double t1 = now_s();
  // Every connection is open: now the requests and replies, all at once.
  long done = 0;
  for (long i = 0; i < conns; i++)
    if (client_io(ep, all[i], false) == C_DONE) done++;
  struct epoll_event evs[256];
  c_last_progress = now_s();
  while (done < conns) {
    int n = epoll_wait(ep, evs, 256, 1000);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      struct cconn *c = evs[i].data.ptr;
      if (!stale(&c->t, evs[i].events, "client") && c->st != C_DONE &&
          client_io(ep, c, false) == C_DONE)
        done++;
    }
    check_stall(all, conns, "the exchange");
  }
  double t2 = now_s();
  printf("{\"event\":\"open\",\"conns\":%ld,\"ok\":%ld,\"connect_s\":%.6f,\"exchange_s\":%.6f}\n",
         conns, c_ok, t1 - t0, t2 - t1);
  wait_gate(gate, 1);
  double t3 = now_s();
  for (long i = 0; i < conns; i++) cconn_free(all[i], true);
  double t4 = now_s();
  printf("{\"event\":\"closed\",\"close_s\":%.6f}\n", t4 - t3);
  wait_gate(gate, 2);
  close(ep);
  free(all);
  printf("{\"role\":\"client\",\"mode\":\"hold\",\"conns\":%ld,\"ok\":%ld,\"bytes_out\":%llu,"
         "\"bytes_in\":%llu,\"stale_events\":%ld,", conns, c_ok,
         (unsigned long long)c_bytes_out, (unsigned long long)c_bytes_in, stale_events);
  print_errors_json();
  printf("}\n");
  return errors || c_ok != conns ? 1 : 0;
}

static int client_storm(int port, long per_round, long concurrency, int rounds, const char *gate) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) die("epoll_create1");
  diag_ep = ep;
  wait_gate(gate, 0);  // the baseline: everything but the connections
  struct sockaddr_in a = loopback(port);
  uint64_t next_id = 0;
  struct epoll_event evs[256];
  for (int r = 1; r <= rounds; r++) {
    long started = 0, ok_before = c_ok, errors_before = errors;
    double t0 = now_s();
    c_last_progress = t0;
    while (started < per_round || c_active > 0) {
      while (c_active < concurrency && started < per_round) {
        struct cconn *c = cconn_new(next_id++);
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (c->fd < 0) die("socket");
        started++;
        c_active++;
        int rc = connect(c->fd, (struct sockaddr *)&a, sizeof(a));
        if (rc != 0 && errno != EINPROGRESS) {
          fail("client: connection %llu: connect: %s", (unsigned long long)c->id,
               strerror(errno));
          c_active--;
          cconn_free(c, true);
          continue;
        }
        c->st = rc == 0 ? C_WRITE : C_CONNECTING;
        c->events = EPOLLOUT;
        ep_ctl(ep, EPOLL_CTL_ADD, c->fd, EPOLLOUT, c);
        if (rc == 0) client_io(ep, c, true);
      }
      int n = epoll_wait(ep, evs, 256, 1000);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) die("epoll_wait");
      for (int i = 0; i < n; i++) {
        struct cconn *c = evs[i].data.ptr;
        if (!stale(&c->t, evs[i].events, "client")) client_io(ep, c, true);
      }
      if (now_s() - c_last_progress >= STALL_MS / 1000.0) {
        fprintf(stderr, "fatal: round %d: no connection completed for %d s; %ld in flight, %ld "
                "of %ld started\n", r, STALL_MS / 1000, c_active, started, per_round);
        printf("{\"role\":\"client\",\"stalled\":\"round %d\",\"ok\":%ld,", r, c_ok);
        print_errors_json();
        printf("}\n");
        exit(3);
      }
    }
    double s = now_s() - t0;
    printf("{\"event\":\"round\",\"round\":%d,\"conns\":%ld,\"ok\":%ld,\"errors\":%ld,"
           "\"seconds\":%.6f,\"conns_per_s\":%.1f}\n", r, per_round, c_ok - ok_before,
           errors - errors_before, s, per_round / s);
    wait_gate(gate, r);
  }
  close(ep);
  long total = per_round * rounds;
  printf("{\"role\":\"client\",\"mode\":\"storm\",\"conns\":%ld,\"ok\":%ld,\"bytes_out\":%llu,"
         "\"bytes_in\":%llu,\"stale_events\":%ld,", total, c_ok,
         (unsigned long long)c_bytes_out, (unsigned long long)c_bytes_in, stale_events);
  print_errors_json();
  printf("}\n");
  return errors || c_ok != total ? 1 : 0;
}

// ---- main -----------------------------------------------------------------------------

static void usage(void) {
  fprintf(stderr,
          "usage: storm serve --port P --mode close|hold [--max-reply B]\n"
          "       storm client --port P --mode hold|storm --conns N [--concurrency C] "
          "[--rounds R] --gate DIR [--max-request B] [--max-reply B]\n");
  exit(2);
}

int main(int argc, char **argv) {
  if (argc < 2) usage();
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  const char *role = argv[1], *mode = NULL, *gate = NULL;
  int port = 0, rounds = 1;
  long conns = 0, concurrency = 1;
  for (int i = 2; i < argc; i++) {
    if (i + 1 >= argc) usage();
    const char *k = argv[i], *v = argv[++i];
    if (!strcmp(k, "--port")) port = atoi(v);
    else if (!strcmp(k, "--mode")) mode = v;
    else if (!strcmp(k, "--conns")) conns = atol(v);
    else if (!strcmp(k, "--concurrency")) concurrency = atol(v);
    else if (!strcmp(k, "--rounds")) rounds = atoi(v);
    else if (!strcmp(k, "--gate")) gate = v;
    else if (!strcmp(k, "--max-request")) c_max_request = (uint32_t)atol(v);
    else if (!strcmp(k, "--max-reply")) c_max_reply = s_max_reply = (uint32_t)atol(v);
    else usage();
  }
  if (port <= 0 || !mode || c_max_request == 0 || c_max_reply == 0) usage();
  long limit = raise_nofile();
  fprintf(stderr, "RLIMIT_NOFILE %ld\n", limit);
  if (!strcmp(role, "serve")) {
    if (strcmp(mode, "close") && strcmp(mode, "hold")) usage();
    return serve(port, !strcmp(mode, "hold"));
  }
  if (strcmp(role, "client") || !gate || conns <= 0) usage();
  if (!strcmp(mode, "hold")) return client_hold(port, conns, gate);
  if (!strcmp(mode, "storm") && concurrency > 0 && rounds > 0)
    return client_storm(port, conns, concurrency, rounds, gate);
  usage();
  return 2;
}
