// Edge-triggered epoll echo client with a nonblocking connect.
//
// usage: et_client HOST PORT TOTAL_BYTES SEED
//
// Registers the socket once with EPOLLET|EPOLLIN|EPOLLOUT|EPOLLRDHUP before connecting,
// waits for EPOLLOUT after EINPROGRESS and checks SO_ERROR, then streams TOTAL_BYTES of
// seeded random data in random-size writes to an echo server and checks that every byte
// comes back in order. The edge-triggered contract is kept strictly: after an edge, writes
// go on until EAGAIN (or the end of the data) and reads until EAGAIN (or EOF); nothing is
// retried before the next edge. A missed edge therefore shows as no event for
// IDLE_TIMEOUT_MS, which fails the test instead of hanging it. After the last byte it
// shuts down its write side and reads until EOF; the peer's FIN must raise EPOLLRDHUP.
// Exits 0 and prints one summary line on success; prints the reason and exits 1 otherwise.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

enum { IDLE_TIMEOUT_MS = 10000, MAX_IO = 256 * 1024 };

struct client {
  int fd;
  const uint8_t *data;  // what is sent, and so what must come back
  size_t total;
  size_t sent;
  size_t received;
  bool can_write;  // EPOLLOUT edge seen and no EAGAIN since
  bool can_read;   // EPOLLIN edge seen and no EAGAIN since
  bool shut;       // write side shut down
  bool eof;
  bool saw_rdhup;
  unsigned long in_edges, out_edges, write_eagains, read_eagains;
  uint64_t rng;
  uint8_t buf[MAX_IO];
};

static void die(const struct client *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "et_client: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (c != NULL) {
    fprintf(stderr, " (sent %zu/%zu, received %zu, in edges %lu, out edges %lu)", c->sent,
            c->total, c->received, c->in_edges, c->out_edges);
  }
  fputc('\n', stderr);
  exit(1);
}

static uint64_t next_random(uint64_t *state) {  // xorshift64*
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1DULL;
}

// A size in 1..MAX_IO, spread over every power of two.
static size_t random_size(struct client *c) {
  size_t bits = next_random(&c->rng) % 19;  // 2^18 == MAX_IO
  return 1 + next_random(&c->rng) % ((size_t)1 << bits);
}

static void write_until_eagain(struct client *c) {
  while (c->can_write && c->sent < c->total) {
    size_t want = random_size(c);
    if (want > c->total - c->sent) want = c->total - c->sent;
    ssize_t n = send(c->fd, c->data + c->sent, want, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      c->can_write = false;
      c->write_eagains++;
    } else if (n <= 0) {
      die(c, "send: %s", n < 0 ? strerror(errno) : "returned 0");
    } else {
      c->sent += (size_t)n;
    }
  }
  if (c->sent == c->total && !c->shut) {
    if (shutdown(c->fd, SHUT_WR) != 0) die(c, "shutdown: %s", strerror(errno));
    c->shut = true;
  }
}

static void read_until_eagain(struct client *c) {
  while (c->can_read && !c->eof) {
    ssize_t n = recv(c->fd, c->buf, random_size(c), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      c->can_read = false;
      c->read_eagains++;
    } else if (n < 0) {
      die(c, "recv: %s", strerror(errno));
    } else if (n == 0) {
      c->eof = true;
    } else {
      if ((size_t)n > c->total - c->received) die(c, "echo longer than what was sent");
      if (memcmp(c->buf, c->data + c->received, (size_t)n) != 0) {
        die(c, "echo differs within bytes %zu..%zu", c->received, c->received + (size_t)n);
      }
      c->received += (size_t)n;
    }
  }
}

static void wait_edges(struct client *c, int ep) {
  struct epoll_event events[4];
  int n;
  do {
    n = epoll_wait(ep, events, 4, IDLE_TIMEOUT_MS);
  } while (n < 0 && errno == EINTR);
  if (n < 0) die(c, "epoll_wait: %s", strerror(errno));
  if (n == 0) {
    die(c, "no epoll event for %d ms (missed edge?) can_write=%d can_read=%d", IDLE_TIMEOUT_MS,
        c->can_write, c->can_read);
  }
  for (int i = 0; i < n; i++) {
    uint32_t ev = events[i].events;
    if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
      c->can_write = true;
      c->out_edges++;
    }
    if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) {
      c->can_read = true;
      c->in_edges++;
    }
    if (ev & EPOLLRDHUP) c->saw_rdhup = true;
  }
}

static void fill_random(uint8_t *data, size_t len, uint64_t seed) {
  uint64_t state = seed | 1;
  for (size_t i = 0; i < len; i += 8) {
    uint64_t r = next_random(&state);
    memcpy(data + i, &r, len - i < 8 ? len - i : 8);
  }
}

int main(int argc, char **argv) {
  if (argc != 5) die(NULL, "usage: et_client HOST PORT TOTAL_BYTES SEED");
  static struct client client;
  struct client *c = &client;
  c->total = strtoull(argv[3], NULL, 10);
  c->rng = strtoull(argv[4], NULL, 10) * 2 + 1;
  uint8_t *data = malloc(c->total);
  if (data == NULL || c->total == 0) die(NULL, "bad TOTAL_BYTES %s", argv[3]);
  fill_random(data, c->total, c->rng);
  c->data = data;

  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
  if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) die(NULL, "bad HOST %s", argv[1]);
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (c->fd < 0 || ep < 0) die(NULL, "socket/epoll_create1: %s", strerror(errno));
  struct epoll_event reg = {.events = EPOLLET | EPOLLIN | EPOLLOUT | EPOLLRDHUP};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &reg) != 0) die(NULL, "epoll_ctl: %s", strerror(errno));

  int rc = connect(c->fd, (struct sockaddr *)&addr, sizeof addr);
  if (rc != 0 && errno != EINPROGRESS) die(NULL, "connect: %s", strerror(errno));
  const char *connect_result = rc == 0 ? "0" : "EINPROGRESS";
  if (rc != 0) {
    while (!c->can_write) wait_edges(c, ep);
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
      die(c, "getsockopt(SO_ERROR): %s", strerror(errno));
    }
    if (err != 0) die(c, "connect completed with SO_ERROR %s", strerror(err));
  }

  // The edge that reported the connect is the first OUT edge: use it before waiting again.
  c->can_write = true;
  for (;;) {
    write_until_eagain(c);
    read_until_eagain(c);
    if (c->eof) break;
    wait_edges(c, ep);
  }
  if (c->received != c->total) die(c, "EOF before the whole echo came back");
  // EOF may have been read in the same drain as the last data, before epoll reported the
  // FIN's edge: that edge is then still pending, and must carry EPOLLRDHUP.
  if (!c->saw_rdhup) wait_edges(c, ep);
  if (!c->saw_rdhup) die(c, "EOF read, but epoll never reported EPOLLRDHUP");
  if (c->write_eagains == 0) die(c, "send never returned EAGAIN: no EPOLLOUT edge was tested");
  printf("et_client: ok, connect returned %s, %zu bytes echoed, in edges %lu, out edges %lu, "
         "write EAGAINs %lu, read EAGAINs %lu\n",
         connect_result, c->total, c->in_edges, c->out_edges, c->write_eagains, c->read_eagains);
  close(c->fd);
  close(ep);
  free(data);
  return 0;
}
