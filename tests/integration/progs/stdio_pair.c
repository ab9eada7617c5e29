// stdio on a connection: the client writes seeded lines with fputs/fprintf on a FILE made
// by fdopen, the server reads them with getline from its own fdopen'd FILE and sends each
// back reversed (fputs, fprintf, then dprintf for the last), the client reads the answers
// with getline and checks every byte. Both also check that fileno() names the socket.
//
// usage: stdio_pair server PORT SEED
//        stdio_pair client HOST PORT SEED
// Prints one JSON line {"lines": N, "exact": true|false, "fileno": true|false}; exits 0
// when both are true.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { kLines = 3000, kMaxLine = 3000 };

static uint64_t next(uint64_t* s) {  // xorshift64*
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

// Line i of the seeded stream: 0..kMaxLine letters (no newline).
static size_t make_line(uint64_t seed, int i, char* out) {
  uint64_t s = seed * 1000003u + (uint64_t)i + 1;
  size_t len = next(&s) % (kMaxLine + 1);
  for (size_t k = 0; k < len; k++) out[k] = (char)('a' + next(&s) % 26);
  out[len] = 0;
  return len;
}

static void reverse(char* s, size_t len) {
  for (size_t a = 0, b = len; a + 1 < b; a++, b--) {
    char t = s[a];
    s[a] = s[b - 1];
    s[b - 1] = t;
  }
}

static int report(int lines, bool exact, bool fileno_ok) {
  printf("{\"lines\": %d, \"exact\": %s, \"fileno\": %s}\n", lines, exact ? "true" : "false",
         fileno_ok ? "true" : "false");
  return exact && fileno_ok ? 0 : 1;
}

// The next line of `in` without its newline, its length in *len; false at EOF or an error.
static bool next_line(FILE* in, char** line, size_t* cap, size_t* len) {
  ssize_t n = getline(line, cap, in);
  if (n < 0) return false;
  if (n > 0 && (*line)[n - 1] == '\n') (*line)[--n] = 0;
  *len = (size_t)n;
  return true;
}

static int serve(int fd, uint64_t seed) {
  (void)seed;
  int wfd = dup(fd);
  FILE* in = fdopen(fd, "r");
  FILE* out = fdopen(wfd, "w");
  if (!in || !out) return report(0, false, false);
  bool fileno_ok = fileno(in) == fd && fileno(out) == wfd;
  char* line = NULL;
  size_t cap = 0;
  int lines = 0;
  bool exact = true;
  for (size_t len;;) {
    if (!next_line(in, &line, &cap, &len)) {
      exact = false;  // EOF or an error before END
      break;
    }
    if (strcmp(line, "END") == 0) break;
    reverse(line, len);
    if (lines % 2 == 0)
      fputs(line, out), fputc('\n', out);
    else
      fprintf(out, "%s\n", line);
    lines++;
  }
  fflush(out);
  dprintf(wfd, "END %d\n", lines);
  free(line);
  fclose(out);
  fclose(in);
  return report(lines, exact && lines == kLines, fileno_ok);
}

struct writer {
  FILE* out;
  int fd;
  uint64_t seed;
};

// The client's lines, from a thread of their own: the answers come back while it writes.
static void* write_lines(void* arg) {
  struct writer* w = arg;
  static char line[kMaxLine + 1];
  for (int i = 0; i < kLines; i++) {
    make_line(w->seed, i, line);
    if (i % 3 == 0)
      fprintf(w->out, "%s\n", line);
    else
      fputs(line, w->out), fputc('\n', w->out);
  }
  fflush(w->out);
  dprintf(w->fd, "END\n");
  return NULL;
}

static int talk(int fd, uint64_t seed) {
  int rfd = dup(fd);
  FILE* out = fdopen(fd, "w");
  FILE* in = fdopen(rfd, "r");
  if (!in || !out) return report(0, false, false);
  bool fileno_ok = fileno(out) == fd && fileno(in) == rfd;
  static char want[kMaxLine + 1];
  struct writer w = {out, fd, seed};
  pthread_t writer;
  if (pthread_create(&writer, NULL, write_lines, &w) != 0) return report(0, false, fileno_ok);
  char* line = NULL;
  size_t cap = 0;
  int lines = 0;
  bool exact = true;
  for (size_t len;;) {
    if (!next_line(in, &line, &cap, &len)) {
      exact = false;  // EOF or an error before END
      break;
    }
    if (strncmp(line, "END ", 4) == 0) {
      exact = exact && atoi(line + 4) == kLines;
      break;
    }
    size_t wlen = make_line(seed, lines, want);
    reverse(want, wlen);
    if (len != wlen || memcmp(line, want, len) != 0) exact = false;
    lines++;
  }
  free(line);
  pthread_join(writer, NULL);
  fclose(in);
  fclose(out);
  return report(lines, exact && lines == kLines, fileno_ok);
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "server") == 0) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr*)&a, sizeof a) != 0 || listen(ls, 4) != 0) return 2;
    printf("READY\n");
    fflush(stdout);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) return 2;
    close(ls);
    return serve(fd, strtoull(argv[3], NULL, 10));
  }
  if (argc == 5 && strcmp(argv[1], "client") == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    if (connect(fd, (struct sockaddr*)&a, sizeof a) != 0) return 2;
    return talk(fd, strtoull(argv[4], NULL, 10));
  }
  fprintf(stderr, "usage: stdio_pair server PORT SEED | client HOST PORT SEED\n");
  return 2;
}
