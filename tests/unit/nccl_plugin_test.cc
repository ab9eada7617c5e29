// The NCCL plugin as NCCL uses it: dlopen the built libnccl-net-slipstream.so, look up each
// exported table, and drive it as NCCL's proxy thread does (connect and accept called again
// until they return a comm, isend/irecv that may say "not now", test until done), over shm,
// in separate processes where it matters: transfers of random sizes checked byte for byte,
// 32 requests in flight, grouped receives, a ring all-reduce of 4 ranks checked against the
// exact sum, closes with requests in flight, a listen comm reused, and bad input (foreign
// handles, double closes, a peer that dies mid-transfer) that must end in an NCCL error,
// never a crash or a hang.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ncclnet-plugin/nccl_abi.h"
#include "shm/msg_wire.h"

#ifndef SLIP_NCCL_PLUGIN_PATH
#error "SLIP_NCCL_PLUGIN_PATH must name the built plugin"
#endif

namespace {

std::string g_last_warning;

void Logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
            const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  g_last_warning = buf;
  EXPECT_TRUE(flags & NCCL_NET) << buf;
}

struct Plugin {
  void* lib = nullptr;
  const ncclNet_v8_t* v8 = nullptr;
  const ncclNet_v9_t* v9 = nullptr;
  const ncclNet_v10_t* v10 = nullptr;
  const ncclNet_v11_t* v11 = nullptr;
  void* ctx = nullptr;  // v11's
};

Plugin& P() {
  static Plugin p = [] {
    Plugin p;
    p.lib = dlopen(SLIP_NCCL_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (p.lib == nullptr) return p;
    p.v8 = static_cast<const ncclNet_v8_t*>(dlsym(p.lib, "ncclNetPlugin_v8"));
    p.v9 = static_cast<const ncclNet_v9_t*>(dlsym(p.lib, "ncclNetPlugin_v9"));
    p.v10 = static_cast<const ncclNet_v10_t*>(dlsym(p.lib, "ncclNetPlugin_v10"));
    p.v11 = static_cast<const ncclNet_v11_t*>(dlsym(p.lib, "ncclNetPlugin_v11"));
    if (p.v11 && p.v11->init(&p.ctx, 1, nullptr, Logger, nullptr) != ncclSuccess) p.v11 = nullptr;
    return p;
  }();
  return p;
}

// One version's calls, in v11's terms (sizes as size_t).
struct Api {
  int version;
  std::function<ncclResult_t(void*, void**)> listen;  // handle, listen comm
  std::function<ncclResult_t(void*, void**)> connect;
  std::function<ncclResult_t(void*, void**)> accept;
  std::function<ncclResult_t(void*, void*, size_t, int, void**)> isend;
  std::function<ncclResult_t(void*, int, void**, size_t*, int*, void**)> irecv;
  std::function<ncclResult_t(void*, int*, int*)> test;
  std::function<ncclResult_t(void*)> close_send, close_recv, close_listen;
};

template <typename T>
Api MakeApi(int version, const T* t) {
  Api a;
  a.version = version;
  a.accept = [t](void* l, void** r) { return t->accept(l, r, nullptr); };
  a.test = [t](void* r, int* d, int* s) { return t->test(r, d, s); };
  a.close_send = t->closeSend;
  a.close_recv = t->closeRecv;
  a.close_listen = t->closeListen;
  return a;
}

Api ApiV(int version) {
  Plugin& p = P();
  if (version == 8) {
    Api a = MakeApi(8, p.v8);
    a.listen = [t = p.v8](void* h, void** l) { return t->listen(0, h, l); };
    a.connect = [t = p.v8](void* h, void** s) { return t->connect(0, h, s, nullptr); };
    a.isend = [t = p.v8](void* c, void* d, size_t n, int tag, void** r) {
      return t->isend(c, d, int(n), tag, nullptr, r);
    };
    a.irecv = [t = p.v8](void* c, int n, void** d, size_t* s, int* tags, void** r) {
      int sizes[8];
      for (int i = 0; i < n; ++i) sizes[i] = int(s[i]);
      void* mh[8] = {};
      return t->irecv(c, n, d, sizes, tags, mh, r);
    };
    return a;
  }
  if (version == 9) {
    Api a = MakeApi(9, p.v9);
    a.listen = [t = p.v9](void* h, void** l) { return t->listen(0, h, l); };
    a.connect = [t = p.v9](void* h, void** s) { return t->connect(0, h, s, nullptr); };
    a.isend = [t = p.v9](void* c, void* d, size_t n, int tag, void** r) {
      return t->isend(c, d, n, tag, nullptr, r);
    };
    a.irecv = [t = p.v9](void* c, int n, void** d, size_t* s, int* tags, void** r) {
      void* mh[8] = {};
      return t->irecv(c, n, d, s, tags, mh, r);
    };
    return a;
  }
  if (version == 10) {
    Api a = MakeApi(10, p.v10);
    a.listen = [t = p.v10](void* h, void** l) { return t->listen(0, h, l); };
    a.connect = [t = p.v10](void* h, void** s) { return t->connect(0, nullptr, h, s, nullptr); };
    a.isend = [t = p.v10](void* c, void* d, size_t n, int tag, void** r) {
      return t->isend(c, d, n, tag, nullptr, nullptr, r);
    };
    a.irecv = [t = p.v10](void* c, int n, void** d, size_t* s, int* tags, void** r) {
      void* mh[8] = {};
      void* ph[8] = {};
      return t->irecv(c, n, d, s, tags, mh, ph, r);
    };
    return a;
  }
  Api a = MakeApi(11, p.v11);
  a.listen = [t = p.v11](void* h, void** l) { return t->listen(P().ctx, 0, h, l); };
  a.connect = [t = p.v11](void* h, void** s) { return t->connect(P().ctx, 0, h, s, nullptr); };
  a.isend = [t = p.v11](void* c, void* d, size_t n, int tag, void** r) {
    return t->isend(c, d, n, tag, nullptr, nullptr, r);
  };
  a.irecv = [t = p.v11](void* c, int n, void** d, size_t* s, int* tags, void** r) {
    void* mh[8] = {};
    void* ph[8] = {};
    return t->irecv(c, n, d, s, tags, mh, ph, r);
  };
  return a;
}

using Clock = std::chrono::steady_clock;

// Content: a stream of bytes keyed by (seed, message), so that each end computes it alone.
void Fill(uint8_t* p, size_t n, uint64_t key) {
  uint64_t x = key * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = uint8_t(x);
  }
}
bool Matches(const uint8_t* p, size_t n, uint64_t key) {
  std::vector<uint8_t> want(n);
  Fill(want.data(), n, key);
  return n == 0 || std::memcmp(p, want.data(), n) == 0;
}

// Connect and accept, both called again until each returns its comm (in one process).
bool Pair(const Api& a, void* handle, void* listen, void** send, void** recv) {
  *send = *recv = nullptr;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((*send == nullptr || *recv == nullptr) && Clock::now() < deadline) {
    if (*send == nullptr && a.connect(handle, send) != ncclSuccess) return false;
    if (*recv == nullptr && a.accept(listen, recv) != ncclSuccess) return false;
  }
  return *send != nullptr && *recv != nullptr;
}

struct Message {
  size_t size;
  size_t capacity;
  int tag;
};

std::vector<Message> Plan(uint64_t seed, int count, size_t max_size) {
  std::vector<Message> plan;
  uint64_t x = seed;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int i = 0; i < count; ++i) {
    size_t size;
    switch (next() % 4) {
      case 0:
        size = next() % 64;
        break;
      case 1:
        size = next() % 65536;
        break;
      default:
        size = next() % (max_size + 1);
    }
    if (i == 0) size = 0;
    if (i == 1) size = 1 << 20;  // the ring's size exactly
    plan.push_back({size, size + next() % 1000, int(next() % 5)});
  }
  return plan;
}

// Runs one side of a plan as NCCL's proxy would: up to 32 requests in flight, each tested
// until done. post(i, &req) posts message i (req null: not now); finish(i, size) checks a
// done one. 0 when every message went through, else the first failure's code.
int DrivePlan(const Api& a, size_t count, const std::function<int(size_t, void**)>& post,
              const std::function<int(size_t, int)>& finish) {
  struct Flight {
    size_t i;
    void* req;
  };
  std::deque<Flight> flight;
  size_t next = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(40);
  while ((next < count || !flight.empty()) && Clock::now() < deadline) {
    if (next < count && flight.size() < NCCL_NET_MAX_REQUESTS) {
      void* req = nullptr;
      if (int rc = post(next, &req)) return rc;
      if (req) flight.push_back({next++, req});
    }
    for (auto it = flight.begin(); it != flight.end();) {
      int done = 0, size = -1;
      if (a.test(it->req, &done, &size) != ncclSuccess) return 11;
      if (!done) {
        ++it;
        continue;
      }
      if (int rc = finish(it->i, size)) return rc;
      it = flight.erase(it);
    }
  }
  return next == count && flight.empty() ? 0 : 13;
}

int SendPlan(const Api& a, void* send, const std::vector<Message>& plan, uint64_t seed) {
  std::vector<std::vector<uint8_t>> bufs(plan.size());
  return DrivePlan(
      a, plan.size(),
      [&](size_t i, void** req) {
        bufs[i].resize(plan[i].size);
        Fill(bufs[i].data(), plan[i].size, seed + i);
        return a.isend(send, bufs[i].data(), plan[i].size, plan[i].tag, req) == ncclSuccess ? 0
                                                                                            : 10;
      },
      [&](size_t i, int size) {
        std::vector<uint8_t>().swap(bufs[i]);
        return size_t(size) == plan[i].size ? 0 : 12;
      });
}

int RecvPlan(const Api& a, void* recv, const std::vector<Message>& plan, uint64_t seed) {
  std::vector<std::vector<uint8_t>> bufs(plan.size());
  return DrivePlan(
      a, plan.size(),
      [&](size_t i, void** req) {
        bufs[i].assign(plan[i].capacity, 0xee);
        void* data = bufs[i].data();
        size_t cap = plan[i].capacity;
        int tag = plan[i].tag;
        return a.irecv(recv, 1, &data, &cap, &tag, req) == ncclSuccess ? 0 : 20;
      },
      [&](size_t i, int size) {
        const Message& m = plan[i];
        if (size_t(size) != m.size) return 22;
        if (!Matches(bufs[i].data(), m.size, seed + i)) return 23;
        for (size_t k = m.size; k < m.capacity; ++k)  // nothing written past what was sent
          if (bufs[i][k] != 0xee) return 24;
        std::vector<uint8_t>().swap(bufs[i]);
        return 0;
      });
}

// Each test starts with v11's calls and a listen comm of its own.
class NcclPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(P().lib, nullptr) << dlerror();
    ASSERT_NE(P().v11, nullptr);
    a = ApiV(11);
    ASSERT_EQ(a.listen(handle, &listen), ncclSuccess);
  }

  void TearDown() override {
    if (listen != nullptr) {
      EXPECT_EQ(a.close_listen(listen), ncclSuccess);
    }
  }

  Api a;
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  void* listen = nullptr;
};

TEST_F(NcclPlugin, ExportsEachVersionUnderOneName) {
  Plugin& p = P();
  ASSERT_NE(p.v8, nullptr);
  ASSERT_NE(p.v9, nullptr);
  ASSERT_NE(p.v10, nullptr);
  for (const char* name : {p.v8->name, p.v9->name, p.v10->name, p.v11->name})
    EXPECT_STREQ(name, "Slipstream");
  EXPECT_EQ(dlsym(p.lib, "ncclNetPlugin_v7"), nullptr);
  EXPECT_EQ(p.v8->init(Logger), ncclSuccess);
  EXPECT_EQ(p.v10->init(Logger, nullptr), ncclSuccess);
  int ndev = 0;
  ASSERT_EQ(p.v11->devices(&ndev), ncclSuccess);
  ASSERT_GE(ndev, 1);
}

TEST_F(NcclPlugin, PropertiesAreHonest) {
  ncclNetProperties_v11_t all;
  std::memset(&all, 0x5a, sizeof(all));
  ASSERT_EQ(P().v11->getProperties(0, &all), ncclSuccess);
  const ncclNetProperties_v9_t& props = all.v9;
  EXPECT_STREQ(props.name, "slipstream-shm");
  EXPECT_EQ(props.pciPath, nullptr);
  EXPECT_EQ(props.ptrSupport, NCCL_PTR_HOST);  // shm copies with the CPU
  EXPECT_EQ(props.maxRecvs, 8);
  EXPECT_GT(props.speed, 0);
  EXPECT_GT(props.maxComms, 0);
  EXPECT_EQ(props.netDeviceType, NCCL_NET_DEVICE_HOST);
  EXPECT_EQ(props.vProps.ndevs, 1);
  EXPECT_EQ(props.vProps.devs[0], 0);
  EXPECT_EQ(all.maxMultiRequestSize, 1);
  ncclNetProperties_v8_t v8;
  ASSERT_EQ(P().v8->getProperties(0, &v8), ncclSuccess);
  EXPECT_EQ(v8.ptrSupport, NCCL_PTR_HOST);
  EXPECT_EQ(v8.maxRecvs, 8);
  EXPECT_EQ(P().v11->getProperties(99, &all), ncclInvalidArgument);
}

TEST_F(NcclPlugin, MakeVDeviceChecksWhatItMerges) {
  ncclNetVDeviceProps_v9_t bad{1, {7}};
  int dev = -1;
  EXPECT_EQ(P().v11->makeVDevice(&dev, &bad), ncclInvalidArgument);
  ncclNetVDeviceProps_v9_t twice{2, {0, 0}};
  EXPECT_EQ(P().v11->makeVDevice(&dev, &twice), ncclInvalidArgument);
  ncclNetVDeviceProps_v9_t one{1, {0}};
  int before = 0;
  P().v11->devices(&before);
  ASSERT_EQ(P().v11->makeVDevice(&dev, &one), ncclSuccess);
  EXPECT_EQ(dev, before);
  int after = 0;
  P().v11->devices(&after);
  EXPECT_EQ(after, before + 1);
  ncclNetProperties_v11_t props;
  ASSERT_EQ(P().v11->getProperties(dev, &props), ncclSuccess);
  EXPECT_EQ(props.v9.vProps.ndevs, 1);
}

// Every version's adapters, both ends in one process.
TEST_F(NcclPlugin, EachVersionCarriesMessagesExactly) {
  for (int version : {8, 9, 10, 11}) {
    SCOPED_TRACE(version);
    Api a = ApiV(version);
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void* listen = nullptr;
    ASSERT_EQ(a.listen(handle, &listen), ncclSuccess);
    void *send, *recv;
    ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
    const auto plan = Plan(version, 40, 300000);
    // Interleave both ends' loops: the receiver posts, the sender matches.
    int rc_send = -1, rc_recv = -1;
    const pid_t pid = fork();
    if (pid == 0) _exit(SendPlan(a, send, plan, 1000 * version));
    rc_recv = RecvPlan(a, recv, plan, 1000 * version);
    int status = 0;
    waitpid(pid, &status, 0);
    rc_send = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    EXPECT_EQ(rc_recv, 0);
    EXPECT_EQ(rc_send, 0);
    EXPECT_EQ(a.close_send(send), ncclSuccess);
    EXPECT_EQ(a.close_recv(recv), ncclSuccess);
    EXPECT_EQ(a.close_listen(listen), ncclSuccess);
  }
}

// The proxy's view: two processes, one listening; random sizes up to 4 MiB (past the 1 MiB
// ring), 32 in flight each way, receives larger than their sends.
TEST_F(NcclPlugin, SeparateProcessesRandomSizes) {
  const auto plan = Plan(91, 300, 4 << 20);
  const pid_t pid = fork();
  if (pid == 0) {
    void* send = nullptr;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (send == nullptr && Clock::now() < deadline)
      if (a.connect(handle, &send) != ncclSuccess) _exit(2);
    if (send == nullptr) _exit(3);
    const int rc = SendPlan(a, send, plan, 7000);
    _exit(rc != 0 ? rc : a.close_send(send) == ncclSuccess ? 0 : 4);
  }
  void* recv = nullptr;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (recv == nullptr && Clock::now() < deadline)
    ASSERT_EQ(a.accept(listen, &recv), ncclSuccess);
  ASSERT_NE(recv, nullptr);
  EXPECT_EQ(RecvPlan(a, recv, plan, 7000), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
}

// Grouped receives: one irecv of n buffers, each for its tag; the sends come in any order
// of their tags and each lands in its own buffer, sizes reported per buffer.
TEST_F(NcclPlugin, GroupedReceivesMatchByTag) {
  void *send, *recv;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(n);
    for (int round = 0; round < 5; ++round) {
      std::vector<std::vector<uint8_t>> in(n), out(n);
      void* data[8];
      size_t caps[8];
      int tags[8];
      for (int i = 0; i < n; ++i) {
        const size_t size = (size_t(i) * 7919 + round * 104729) % 200000;
        in[i].resize(size);
        Fill(in[i].data(), size, n * 100 + round * 10 + i);
        out[i].assign(size + 16, 0);
        data[i] = out[i].data();
        caps[i] = out[i].size();
        tags[i] = 100 + i;
      }
      void* rreq = nullptr;
      ASSERT_EQ(a.irecv(recv, n, data, caps, tags, &rreq), ncclSuccess);
      ASSERT_NE(rreq, nullptr);
      std::vector<void*> sreqs;
      for (int k = 0; k < n; ++k) {
        // Not in tag order: rotated, and reversed every other round.
        const int i = round % 2 ? n - 1 - (k + round) % n : (k + round) % n;
        void* req = nullptr;
        const auto deadline = Clock::now() + std::chrono::seconds(5);
        while (req == nullptr && Clock::now() < deadline)
          ASSERT_EQ(a.isend(send, in[i].data(), in[i].size(), 100 + i, &req), ncclSuccess);
        ASSERT_NE(req, nullptr);
        sreqs.push_back(req);
      }
      int rdone = 0;
      int sizes[8] = {};
      std::vector<int> sdone(n, 0);
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (Clock::now() < deadline) {
        bool all = true;
        for (int k = 0; k < n; ++k) {
          int size;
          if (!sdone[k]) {
            ASSERT_EQ(a.test(sreqs[k], &sdone[k], &size), ncclSuccess);
          }
          all = all && sdone[k];
        }
        if (!rdone) {
          ASSERT_EQ(a.test(rreq, &rdone, sizes), ncclSuccess);
        }
        if (all && rdone) break;
      }
      ASSERT_TRUE(rdone);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(size_t(sizes[i]), in[i].size());
        EXPECT_TRUE(Matches(out[i].data(), in[i].size(), n * 100 + round * 10 + i)) << i;
      }
    }
  }
  // A send larger than the buffer posted for its tag is refused, not truncated.
  std::vector<uint8_t> small(10), big(100);
  void* data = small.data();
  size_t cap = small.size();
  int tag = 1;
  void* rreq = nullptr;
  ASSERT_EQ(a.irecv(recv, 1, &data, &cap, &tag, &rreq), ncclSuccess);
  void* sreq = nullptr;
  ncclResult_t rc = ncclSuccess;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (rc == ncclSuccess && sreq == nullptr && Clock::now() < deadline)
    rc = a.isend(send, big.data(), big.size(), 1, &sreq);
  EXPECT_EQ(rc, ncclInvalidArgument);
  EXPECT_NE(g_last_warning.find("receive of 10 bytes"), std::string::npos) << g_last_warning;
  EXPECT_EQ(a.close_send(send), ncclSuccess);
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);  // with a receive in flight
}

// A ring all-reduce of 4 ranks, each its own process, over the plugin: reduce-scatter then
// all-gather, int32 sums checked exactly.
TEST_F(NcclPlugin, RingAllReduceOfFourRanks) {
  constexpr int kRanks = 4;
  constexpr size_t kCount = (3 << 20) / 4 + 5;  // 3 MiB of int32, not a multiple of 4 ranks
  struct Shared {
    char handles[kRanks][NCCL_NET_HANDLE_MAXSIZE];
    std::atomic<int> ready;
  };
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(shared, MAP_FAILED);
  new (shared) Shared();
  auto value = [](int rank, size_t i) { return int32_t((i * 2654435761u + rank * 97) % 100000); };
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      Api a = ApiV(11);
      void* listen = nullptr;
      if (a.listen(shared->handles[rank], &listen) != ncclSuccess) _exit(2);
      shared->ready.fetch_add(1);
      while (shared->ready.load() < kRanks) usleep(100);
      void *send = nullptr, *recv = nullptr;
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while ((send == nullptr || recv == nullptr) && Clock::now() < deadline) {
        if (!send && a.connect(shared->handles[(rank + 1) % kRanks], &send) != ncclSuccess)
          _exit(3);
        if (!recv && a.accept(listen, &recv) != ncclSuccess) _exit(4);
      }
      if (!send || !recv) _exit(5);
      std::vector<int32_t> data(kCount), tmp(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = value(rank, i);
      auto chunk_begin = [](int c) { return kCount * size_t(c) / kRanks; };
      auto step = [&](int send_chunk, int recv_chunk, bool reduce) -> int {
        const size_t sb = chunk_begin(send_chunk), se = chunk_begin(send_chunk + 1);
        const size_t rb = chunk_begin(recv_chunk), re = chunk_begin(recv_chunk + 1);
        void* rdata = tmp.data() + rb;
        size_t rcap = (re - rb) * 4;
        int tag = 7;
        void *rreq = nullptr, *sreq = nullptr;
        if (a.irecv(recv, 1, &rdata, &rcap, &tag, &rreq) != ncclSuccess || !rreq) return 6;
        int sdone = 0, rdone = 0, size = 0, sent = 0;
        const auto limit = Clock::now() + std::chrono::seconds(20);
        while ((!sdone || !rdone) && Clock::now() < limit) {
          if (!sreq && a.isend(send, data.data() + sb, (se - sb) * 4, 7, &sreq) != ncclSuccess)
            return 7;
          if (sreq && !sdone && a.test(sreq, &sdone, &sent) != ncclSuccess) return 8;
          if (!rdone && a.test(rreq, &rdone, &size) != ncclSuccess) return 9;
        }
        if (!sdone || !rdone || size_t(size) != rcap) return 10;
        for (size_t i = rb; i < re; ++i) data[i] = reduce ? data[i] + tmp[i] : tmp[i];
        return 0;
      };
      for (int s = 0; s < kRanks - 1; ++s)
        if (int rc = step((rank - s + kRanks) % kRanks, (rank - s - 1 + kRanks) % kRanks, true))
          _exit(rc);
      for (int s = 0; s < kRanks - 1; ++s)
        if (int rc = step((rank + 1 - s + kRanks) % kRanks, (rank - s + kRanks) % kRanks, false))
          _exit(rc);
      for (size_t i = 0; i < kCount; ++i) {
        int32_t want = 0;
        for (int r = 0; r < kRanks; ++r) want += value(r, i);
        if (data[i] != want) _exit(11);
      }
      a.close_send(send);
      a.close_recv(recv);
      a.close_listen(listen);
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  munmap(shared, sizeof(Shared));
}

// NCCL's threads: the main thread sets comms up and closes them while proxy threads drive
// others; here four pairs of comms at once, each end on a thread of its own (TSan checks
// the plugin's shared state: its table of live comms, its devices, its logger).
TEST_F(NcclPlugin, CommsDrivenFromManyThreads) {
  constexpr int kPairs = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kPairs; ++t) {
    threads.emplace_back([&, t] {
      char h[NCCL_NET_HANDLE_MAXSIZE];
      void *l = nullptr, *send = nullptr, *recv = nullptr;
      if (a.listen(h, &l) != ncclSuccess || !Pair(a, h, l, &send, &recv)) {
        ++failures;
        return;
      }
      const auto plan = Plan(500 + t, 60, 200000);
      int rc_send = -1;
      std::thread sender([&] { rc_send = SendPlan(a, send, plan, 9000 + t * 100); });
      const int rc_recv = RecvPlan(a, recv, plan, 9000 + t * 100);
      sender.join();
      if (rc_send != 0 || rc_recv != 0) ++failures;
      for (auto rc : {a.close_send(send), a.close_recv(recv), a.close_listen(l)})
        if (rc != ncclSuccess) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// One listen comm, several senders: each accept returns the next comm.
TEST_F(NcclPlugin, ListenCommIsReused) {
  void *s1, *r1, *s2, *r2;
  ASSERT_TRUE(Pair(a, handle, listen, &s1, &r1));
  ASSERT_TRUE(Pair(a, handle, listen, &s2, &r2));
  EXPECT_NE(r1, r2);
  for (void* s : {s1, s2}) EXPECT_EQ(a.close_send(s), ncclSuccess);
  for (void* r : {r1, r2}) EXPECT_EQ(a.close_recv(r), ncclSuccess);
}

TEST_F(NcclPlugin, BadHandlesAreErrorsNotCrashes) {
  void* send = nullptr;
  char zeros[NCCL_NET_HANDLE_MAXSIZE] = {};
  EXPECT_EQ(a.connect(zeros, &send), ncclInvalidArgument);
  char noise[NCCL_NET_HANDLE_MAXSIZE];
  for (size_t i = 0; i < sizeof(noise); ++i) noise[i] = char(i * 37 + 11);
  EXPECT_EQ(a.connect(noise, &send), ncclInvalidArgument);

  slip::shm::msgwire::Handle h;
  ASSERT_TRUE(
      slip::shm::msgwire::ParseHandle(reinterpret_cast<uint8_t*>(handle), sizeof(handle), &h));
  // From another host (or network namespace): shm cannot reach it.
  slip::shm::msgwire::Handle other = h;
  other.host.bytes[0] ^= 1;
  char foreign[NCCL_NET_HANDLE_MAXSIZE];
  slip::shm::msgwire::EncodeHandle(other, reinterpret_cast<uint8_t*>(foreign));
  EXPECT_EQ(a.connect(foreign, &send), ncclSystemError);
  EXPECT_NE(g_last_warning.find("another host"), std::string::npos) << g_last_warning;
  // From another network namespace of this host, with no rendezvous directory set here.
  other = h;
  other.host.bytes[20] ^= 1;
  slip::shm::msgwire::EncodeHandle(other, reinterpret_cast<uint8_t*>(foreign));
  EXPECT_EQ(a.connect(foreign, &send), ncclSystemError);
  EXPECT_NE(g_last_warning.find("SLIP_RENDEZVOUS_DIR"), std::string::npos) << g_last_warning;
  // Another user's listener.
  other = h;
  other.uid += 1;
  slip::shm::msgwire::EncodeHandle(other, reinterpret_cast<uint8_t*>(foreign));
  EXPECT_EQ(a.connect(foreign, &send), ncclInvalidArgument);
  // The right name with the wrong secret: connects, and the listener drops it.
  other = h;
  other.secret ^= 0x5555;
  slip::shm::msgwire::EncodeHandle(other, reinterpret_cast<uint8_t*>(foreign));
  ncclResult_t rc = a.connect(foreign, &send);
  EXPECT_EQ(rc, ncclSuccess);
  void* recv = nullptr;
  for (int i = 0; i < 100 && recv == nullptr; ++i) ASSERT_EQ(a.accept(listen, &recv), ncclSuccess);
  EXPECT_EQ(recv, nullptr);  // refused
  if (send) {
    // Its comm fails when it finds nobody at the other end, rather than hang.
    std::vector<uint8_t> buf(10);
    void* req = nullptr;
    rc = ncclSuccess;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (rc == ncclSuccess && Clock::now() < deadline)
      rc = a.isend(send, buf.data(), 10, 0, &req);
    EXPECT_EQ(rc, ncclRemoteError);
    EXPECT_EQ(a.close_send(send), ncclSuccess);
  }
  // A listener that is gone.
  EXPECT_EQ(a.close_listen(listen), ncclSuccess);
  listen = nullptr;
  send = nullptr;
  EXPECT_EQ(a.connect(handle, &send), ncclSystemError);
  EXPECT_EQ(send, nullptr);
}

// Whoever connects to a listener's abstract name (listed in /proc/net/unix) and sends
// garbage is dropped; the listener goes on serving its real senders.
TEST_F(NcclPlugin, ForeignHelloIsDroppedAndListenerGoesOn) {
  slip::shm::msgwire::Handle h;
  ASSERT_TRUE(
      slip::shm::msgwire::ParseHandle(reinterpret_cast<uint8_t*>(handle), sizeof(handle), &h));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const int n = snprintf(addr.sun_path + 1, sizeof(addr.sun_path) - 1,
                         "slipstream-nccl:%u:%016" PRIx64, h.pid, h.name_token);
  for (int variant = 0; variant < 3; ++variant) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    ASSERT_EQ(
        connect(fd, reinterpret_cast<sockaddr*>(&addr), offsetof(sockaddr_un, sun_path) + 1 + n),
        0);
    if (variant == 0) {
      const char junk[40] = "not a hello at all";
      ASSERT_GT(send(fd, junk, sizeof(junk), 0), 0);
    } else if (variant == 1) {
      // A HELLO with the right secret but no region.
      uint8_t hello[slip::shm::msgwire::kHelloBytes];
      slip::shm::msgwire::EncodeHello({h.secret, 1, 1 << 20}, hello);
      ASSERT_GT(send(fd, hello, sizeof(hello), 0), 0);
    }  // variant 2: closes without a word
    void* recv = nullptr;
    for (int i = 0; i < 20; ++i) ASSERT_EQ(a.accept(listen, &recv), ncclSuccess);
    EXPECT_EQ(recv, nullptr);
    close(fd);
  }
  void *send, *recv;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  EXPECT_EQ(a.close_send(send), ncclSuccess);
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
}

TEST_F(NcclPlugin, DoubleCloseIsRefused) {
  void *send, *recv;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  EXPECT_EQ(a.close_send(send), ncclSuccess);
  EXPECT_EQ(a.close_send(send), ncclInvalidArgument);
  EXPECT_EQ(a.close_recv(send), ncclInvalidArgument);  // not a recv comm
  EXPECT_EQ(a.close_listen(recv), ncclInvalidArgument);
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
  EXPECT_EQ(a.close_recv(recv), ncclInvalidArgument);
  EXPECT_EQ(a.close_listen(listen), ncclSuccess);
  EXPECT_EQ(a.close_listen(listen), ncclInvalidArgument);
  listen = nullptr;
  EXPECT_EQ(a.close_send(nullptr), ncclInvalidArgument);
}

TEST_F(NcclPlugin, RegistrationsAreHostOnly) {
  void *send, *recv;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  std::vector<uint8_t> buf(4096);
  void* mh = nullptr;
  ASSERT_EQ(P().v11->regMr(send, buf.data(), buf.size(), NCCL_PTR_HOST, &mh), ncclSuccess);
  EXPECT_EQ(P().v11->deregMr(send, mh), ncclSuccess);
  mh = nullptr;
  EXPECT_EQ(P().v11->regMr(recv, buf.data(), buf.size(), NCCL_PTR_CUDA, &mh), ncclInvalidArgument);
  EXPECT_EQ(mh, nullptr);
  EXPECT_EQ(P().v11->regMrDmaBuf(recv, buf.data(), buf.size(), NCCL_PTR_CUDA, 0, -1, &mh),
            ncclInvalidArgument);
  void* flush = reinterpret_cast<void*>(1);
  void* data = buf.data();
  int size = 10;
  EXPECT_EQ(P().v11->iflush(recv, 1, &data, &size, &mh, &flush), ncclSuccess);
  EXPECT_EQ(flush, nullptr);  // host memory: nothing to flush
  EXPECT_EQ(a.close_send(send), ncclSuccess);
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
}

// Closing a comm with requests in flight releases them; the other end's requests fail
// with an NCCL error instead of waiting for ever.
TEST_F(NcclPlugin, CloseWithRequestsInFlightFailsThePeer) {
  for (bool close_sender : {true, false}) {
    SCOPED_TRACE(close_sender);
    void *send, *recv;
    ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
    std::vector<uint8_t> in(8 << 20), out(8 << 20);
    void* data = out.data();
    size_t cap = out.size();
    int tag = 0;
    void *rreq = nullptr, *sreq = nullptr;
    ASSERT_EQ(a.irecv(recv, 1, &data, &cap, &tag, &rreq), ncclSuccess);
    while (sreq == nullptr) ASSERT_EQ(a.isend(send, in.data(), in.size(), 0, &sreq), ncclSuccess);
    int done = 0, size = 0;
    ASSERT_EQ(a.test(sreq, &done, &size), ncclSuccess);
    ASSERT_EQ(done, 0);  // 8 MiB cannot be in a 1 MiB ring yet
    void* survivor_req = close_sender ? rreq : sreq;
    ASSERT_EQ(close_sender ? a.close_send(send) : a.close_recv(recv), ncclSuccess);
    ncclResult_t rc = ncclSuccess;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (rc == ncclSuccess && !done && Clock::now() < deadline)
      rc = a.test(survivor_req, &done, &size);
    EXPECT_EQ(rc, ncclRemoteError);
    EXPECT_EQ(done, 0);
    EXPECT_EQ(close_sender ? a.close_recv(recv) : a.close_send(send), ncclSuccess);
  }
  // Many receives posted, none matched: closing releases all of them.
  void *send, *recv;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  std::vector<uint8_t> buf(64);
  for (int i = 0; i < NCCL_NET_MAX_REQUESTS; ++i) {
    void* data = buf.data();
    size_t cap = buf.size();
    int tag = i;
    void* req = nullptr;
    ASSERT_EQ(a.irecv(recv, 1, &data, &cap, &tag, &req), ncclSuccess);
    ASSERT_NE(req, nullptr);
  }
  void* data = buf.data();
  size_t cap = buf.size();
  int tag = 99;
  void* req = reinterpret_cast<void*>(1);
  ASSERT_EQ(a.irecv(recv, 1, &data, &cap, &tag, &req), ncclSuccess);
  EXPECT_EQ(req, nullptr);  // the 33rd: not now
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
  EXPECT_EQ(a.close_send(send), ncclSuccess);
}

// A sender killed in the middle of a message: the receiver's test returns an error within
// a bounded time.
TEST_F(NcclPlugin, PeerKilledMidTransferIsAnError) {
  const pid_t pid = fork();
  if (pid == 0) {
    void* send = nullptr;
    while (send == nullptr)
      if (a.connect(handle, &send) != ncclSuccess) _exit(2);
    std::vector<uint8_t> in(32 << 20, 1);
    void* req = nullptr;
    while (req == nullptr)
      if (a.isend(send, in.data(), in.size(), 0, &req) != ncclSuccess) _exit(3);
    // (isend wrote the first ring's worth; the other 31 MiB never come.)
    raise(SIGKILL);
  }
  void* recv = nullptr;
  while (recv == nullptr) ASSERT_EQ(a.accept(listen, &recv), ncclSuccess);
  std::vector<uint8_t> out(32 << 20);
  void* data = out.data();
  size_t cap = out.size();
  int tag = 0;
  void* rreq = nullptr;
  ASSERT_EQ(a.irecv(recv, 1, &data, &cap, &tag, &rreq), ncclSuccess);
  int done = 0, size = 0;
  ncclResult_t rc = ncclSuccess;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (rc == ncclSuccess && !done && Clock::now() < deadline) rc = a.test(rreq, &done, &size);
  EXPECT_EQ(rc, ncclRemoteError);
  EXPECT_EQ(done, 0);
  EXPECT_NE(g_last_warning.find("sender closed"), std::string::npos) << g_last_warning;
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
}

}  // namespace
