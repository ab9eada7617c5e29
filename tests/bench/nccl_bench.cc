// slip-nccl-bench: the NCCL plugin's message path against kernel TCP on loopback (what
// NCCL's own socket transport rides), in one run, on a host without a GPU.
//
//   slip-nccl-bench PLUGIN.so [SECONDS_PER_POINT]
//
// Two processes. For each message size: latency (ping-pong of one message each way, the
// median round trip / 2) and bandwidth (8 messages in flight, one direction, bytes per
// second at the receiver), first over a TCP connection on 127.0.0.1 (TCP_NODELAY, blocking
// writes and reads, an 8-byte length before each message: no threads in between, as NCCL's
// socket transport has), then over the
// plugin (ncclNetPlugin_v11, driven as NCCL's proxy does: isend/irecv, test until done).
// Every message's bytes are checked once per point (first and last byte of each).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "ncclnet-plugin/nccl_abi.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWindow = 8;
const size_t kSizes[] = {8, 1024, 64 << 10, 1 << 20, 4 << 20};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const char* what) {
  perror(what);
  _exit(2);
}

// ------------------------------------------------------------------ kernel TCP

void WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, b, n);
    if (w <= 0) Die("write");
    b += w;
    n -= size_t(w);
  }
}
void ReadAll(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, b, n);
    if (r <= 0) Die("read");
    b += r;
    n -= size_t(r);
  }
}

void TcpPair(int* a, int* b) {
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(l, reinterpret_cast<sockaddr*>(&addr), len) || listen(l, 1) ||
      getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len))
    Die("listen");
  *a = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(*a, reinterpret_cast<sockaddr*>(&addr), len)) Die("connect");
  *b = accept(l, nullptr, nullptr);
  close(l);
  const int one = 1;
  setsockopt(*a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(*b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Runs `child` in a child process and `parent` here; returns the parent's result.
double Fork(const std::function<void()>& child, const std::function<double()>& parent) {
  const pid_t pid = fork();
  if (pid == 0) {
    child();
    _exit(0);
  }
  const double r = parent();
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "the other process failed (status %d)\n", status);
    exit(1);
  }
  return r;
}

struct Point {
  double lat_us = 0;
  double gbps = 0;
};

Point TcpPoint(size_t size, double seconds) {
  Point p;
  std::vector<uint8_t> buf(size + 8, 0x5a);
  int a, b;
  TcpPair(&a, &b);
  // Latency: a fixed number of round trips sized from a first probe.
  const int rounds = size <= 65536 ? 20000 : 500;
  p.lat_us = Fork(
      [&] {
        close(a);
        for (int i = 0; i < rounds; ++i) {
          ReadAll(b, buf.data(), size);
          WriteAll(b, buf.data(), size);
        }
      },
      [&] {
        std::vector<double> rtt;
        for (int i = 0; i < rounds; ++i) {
          const auto t0 = Clock::now();
          WriteAll(a, buf.data(), size);
          ReadAll(a, buf.data(), size);
          rtt.push_back(Seconds(t0, Clock::now()));
        }
        std::nth_element(rtt.begin(), rtt.begin() + rtt.size() / 2, rtt.end());
        return rtt[rtt.size() / 2] / 2 * 1e6;
      });
  // Bandwidth: the child streams length-prefixed messages for `seconds`, then a 0 length.
  p.gbps = Fork(
      [&] {
        close(a);
        const auto end = Clock::now() + std::chrono::duration<double>(seconds);
        uint64_t n = size;
        while (Clock::now() < end) {
          WriteAll(b, &n, 8);
          WriteAll(b, buf.data(), size);
        }
        n = 0;
        WriteAll(b, &n, 8);
      },
      [&] {
        uint64_t n, bytes = 0;
        const auto t0 = Clock::now();
        for (;;) {
          ReadAll(a, &n, 8);
          if (n == 0) break;
          ReadAll(a, buf.data(), n);
          if (buf[0] != 0x5a || buf[n - 1] != 0x5a) Die("tcp content");
          bytes += n;
        }
        return double(bytes) / Seconds(t0, Clock::now()) / 1e9;
      });
  close(a);
  close(b);
  return p;
}

// ------------------------------------------------------------------ the plugin

const ncclNet_v11_t* g_net = nullptr;
void* g_ctx = nullptr;

void Check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) {
    fprintf(stderr, "%s: ncclResult %d\n", what, rc);
    _exit(3);
  }
}

void* Wait(void* req) {
  int done = 0, size = 0;
  while (!done) Check(g_net->test(req, &done, &size), "test");
  return nullptr;
}

void* Send(void* comm, void* data, size_t size, void* mh) {
  void* req = nullptr;
  while (req == nullptr) Check(g_net->isend(comm, data, size, 1, mh, nullptr, &req), "isend");
  return req;
}
void* Recv(void* comm, void* data, size_t size, void* mh) {
  void* req = nullptr;
  int tag = 1;
  void* ph = nullptr;
  while (req == nullptr) Check(g_net->irecv(comm, 1, &data, &size, &tag, &mh, &ph, &req), "irecv");
  return req;
}

// The buffers of one side of a point, registered with its comms as NCCL registers its own
// (an RDMA transport moves registered memory only).
struct Buffers {
  std::vector<uint8_t> one;
  std::vector<std::vector<uint8_t>> window;
  void* one_send = nullptr;  // registrations: `one` with the send and the receive comm,
  void* one_recv = nullptr;  // the window with the comm that streams through it
  void* window_mh[kWindow] = {};

  Buffers(size_t size) : one(size, 0x5a), window(kWindow, std::vector<uint8_t>(size, 0x5a)) {}
  void Register(void* send, void* recv, void* window_comm) {
    Check(g_net->regMr(send, one.data(), one.size(), NCCL_PTR_HOST, &one_send), "regMr");
    Check(g_net->regMr(recv, one.data(), one.size(), NCCL_PTR_HOST, &one_recv), "regMr");
    for (int k = 0; k < kWindow; ++k)
      Check(g_net->regMr(window_comm, window[size_t(k)].data(), window[size_t(k)].size(),
                         NCCL_PTR_HOST, &window_mh[k]),
            "regMr");
  }
  void Deregister(void* send, void* recv, void* window_comm) {
    g_net->deregMr(send, one_send);
    g_net->deregMr(recv, one_recv);
    for (void* mh : window_mh) g_net->deregMr(window_comm, mh);
  }
};

// Two comms between this process and the peer: to it (send) and from it (recv).
struct Comms {
  void* send = nullptr;
  void* recv = nullptr;
};

// Listens, swaps handles with the peer over its pipes, connects and accepts.
Comms Connect(int to, int from) {
  char mine[NCCL_NET_HANDLE_MAXSIZE], theirs[NCCL_NET_HANDLE_MAXSIZE];
  void* listen = nullptr;
  Check(g_net->listen(g_ctx, 0, mine, &listen), "listen");
  WriteAll(to, mine, sizeof(mine));
  ReadAll(from, theirs, sizeof(theirs));
  Comms c;
  while (!c.send || !c.recv) {
    if (!c.send) Check(g_net->connect(g_ctx, 0, theirs, &c.send, nullptr), "connect");
    if (!c.recv) Check(g_net->accept(listen, &c.recv, nullptr), "accept");
  }
  g_net->closeListen(listen);
  return c;
}

int Rounds(size_t size) {
  return size <= 65536 ? 20000 : 500;
}

// The peer's side of one point: the echo of the latency phase, then it streams for
// `seconds`; it closes its comms when the measuring side says so.
void PeerPoint(size_t size, double seconds, int to, int from) {
  Comms c = Connect(to, from);
  Buffers b(size);
  b.Register(c.send, c.recv, c.send);
  // The next receive is posted before the pong goes, as NCCL's proxy posts receives ahead:
  // its clear-to-send travels while the ping is on its way.
  void* next = Recv(c.recv, b.one.data(), size, b.one_recv);
  for (int i = 0; i < Rounds(size); ++i) {
    Wait(next);
    next = i + 1 < Rounds(size) ? Recv(c.recv, b.one.data(), size, b.one_recv) : nullptr;
    Wait(Send(c.send, b.one.data(), size, b.one_send));
  }
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  void* reqs[kWindow] = {};
  uint64_t sent = 0;
  while (Clock::now() < end) {
    const int k = int(sent++ % kWindow);
    if (reqs[k]) Wait(reqs[k]);
    reqs[k] = Send(c.send, b.window[size_t(k)].data(), size, b.window_mh[k]);
  }
  for (void* r : reqs)
    if (r) Wait(r);
  Wait(Send(c.send, b.one.data(), 0, b.one_send));  // the end
  char done;
  ReadAll(from, &done, 1);
  b.Deregister(c.send, c.recv, c.send);
  g_net->closeSend(c.send);
  g_net->closeRecv(c.recv);
}

Point PluginPoint(size_t size, int to, int from) {
  Point p;
  Comms c = Connect(to, from);
  Buffers b(size);
  b.Register(c.send, c.recv, c.recv);
  std::vector<double> rtt;
  for (int i = 0; i < Rounds(size); ++i) {
    const auto s = Clock::now();
    void* pong = Recv(c.recv, b.one.data(), size, b.one_recv);
    Wait(Send(c.send, b.one.data(), size, b.one_send));
    Wait(pong);
    rtt.push_back(Seconds(s, Clock::now()));
  }
  // Receive with kWindow posted until the zero-length end.
  void* reqs[kWindow];
  for (int k = 0; k < kWindow; ++k)
    reqs[k] = Recv(c.recv, b.window[size_t(k)].data(), size, b.window_mh[k]);
  const auto t0 = Clock::now();
  uint64_t bytes = 0;
  for (uint64_t i = 0;; ++i) {
    const int k = int(i % kWindow);
    int done = 0, got = 0;
    while (!done) Check(g_net->test(reqs[k], &done, &got), "test");
    if (got == 0) break;
    const std::vector<uint8_t>& w = b.window[size_t(k)];
    if (w[0] != 0x5a || w[size_t(got) - 1] != 0x5a) Die("plugin content");
    bytes += size_t(got);
    reqs[k] = Recv(c.recv, b.window[size_t(k)].data(), size, b.window_mh[k]);
  }
  const double stream_s = Seconds(t0, Clock::now());
  b.Deregister(c.send, c.recv, c.recv);
  g_net->closeSend(c.send);
  g_net->closeRecv(c.recv);  // (with receives still posted: released)
  WriteAll(to, "x", 1);
  std::nth_element(rtt.begin(), rtt.begin() + rtt.size() / 2, rtt.end());
  p.lat_us = rtt[rtt.size() / 2] / 2 * 1e6;
  p.gbps = double(bytes) / stream_s / 1e9;
  return p;
}

// GB/s of one core copying `size`-byte messages from kWindow buffers into kWindow others in
// turn: the bytes the bandwidth phase moves, over the same working set (at 4 MiB, 32 MiB
// each side: past this host's caches, as the plugin's window is). The shm transport's
// physical limit: every byte it carries is copied twice, into the ring and out of it.
double MemcpyGBps(size_t size, double seconds) {
  std::vector<std::vector<uint8_t>> from(kWindow, std::vector<uint8_t>(size, 0x5a));
  std::vector<std::vector<uint8_t>> to(kWindow, std::vector<uint8_t>(size, 0));
  uint64_t bytes = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  for (size_t k = 0; Clock::now() < end; k = (k + 1) % kWindow) {
    std::memcpy(to[k].data(), from[k].data(), size);
    __asm__ __volatile__("" : : "r"(to[k].data()) : "memory");
    bytes += size;
  }
  return double(bytes) / Seconds(t0, Clock::now()) / 1e9;
}

bool LoadPlugin(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    fprintf(stderr, "%s\n", dlerror());
    return false;
  }
  g_net = static_cast<const ncclNet_v11_t*>(dlsym(lib, "ncclNetPlugin_v11"));
  if (g_net == nullptr || g_net->init(&g_ctx, 1, nullptr, nullptr, nullptr) != ncclSuccess) {
    fprintf(stderr, "no usable ncclNetPlugin_v11 in %s\n", path);
    return false;
  }
  return true;
}

const char* Human(size_t n, char (&out)[32]) {
  if (n >= (1 << 20))
    snprintf(out, sizeof(out), "%zu MiB", n >> 20);
  else if (n >= 1024)
    snprintf(out, sizeof(out), "%zu KiB", n >> 10);
  else
    snprintf(out, sizeof(out), "%zu B", n);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN.so [SECONDS_PER_POINT]\n", argv[0]);
    return 2;
  }
  const double seconds = argc > 2 ? atof(argv[2]) : 2.0;
  // The plugin's peer is a process of its own from the start, which loads the plugin
  // itself: an RDMA device opened before fork() is not the child's.
  int down[2], up[2];
  if (pipe(down) || pipe(up)) Die("pipe");
  const pid_t peer = fork();
  if (peer == 0) {
    if (!LoadPlugin(argv[1])) _exit(2);
    for (size_t size : kSizes) PeerPoint(size, seconds, up[1], down[0]);
    g_net->finalize(g_ctx);
    _exit(0);
  }
  if (!LoadPlugin(argv[1])) return 2;
  ncclNetProperties_v11_t props{};
  g_net->getProperties(0, &props);
  printf("plugin device: %s\n\n", props.v9.name);
  printf(
      "| message | TCP latency (us) | plugin latency (us) | TCP/plugin | TCP GB/s | plugin GB/s | "
      "plugin/TCP |\n");
  printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double last_gbps = 0;
  for (size_t size : kSizes) {
    const Point tcp = TcpPoint(size, seconds);
    const Point plugin = PluginPoint(size, down[1], up[0]);
    char h[32];
    printf("| %s | %.2f | %.2f | %.2fx | %.3f | %.3f | %.2fx |\n", Human(size, h), tcp.lat_us,
           plugin.lat_us, tcp.lat_us / plugin.lat_us, tcp.gbps, plugin.gbps,
           plugin.gbps / tcp.gbps);
    fflush(stdout);
    last_gbps = plugin.gbps;
  }
  const size_t largest = kSizes[sizeof(kSizes) / sizeof(kSizes[0]) - 1];
  const double copy = MemcpyGBps(largest, seconds / 2);
  char h[32];
  printf("\nmemcpy %s (%d buffers in turn): %.3f GB/s; the plugin's %s bandwidth is %.0f%% of it\n",
         Human(largest, h), kWindow, copy, h, 100 * last_gbps / copy);
  g_net->finalize(g_ctx);
  int status = 0;
  waitpid(peer, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "the plugin's peer failed (status %d)\n", status);
    return 1;
  }
  return 0;
}
