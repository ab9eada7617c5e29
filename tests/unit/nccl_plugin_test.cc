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
#include <netinet/in.h>
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
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fabric/msg_wire.h"
#include "ncclnet-plugin/nccl_abi.h"
#include "shm/msg_wire.h"
#include "verbs/msg_wire.h"

#ifndef SLIP_NCCL_PLUGIN_PATH
#error "SLIP_NCCL_PLUGIN_PATH must name the built plugin"
#endif

namespace {

std::string g_last_warning;
std::string g_warnings;  // every warning since a test cleared it, a line each

// The transport under test: shm by default; tests/vm/verbs-suite.sh runs this harness in
// the Soft-RoCE guest, where the plugin offers rxe0 (verbs); ctest's nccl_plugin.fabric_*
// run it over libfabric's providers (SLIP_TRANSPORTS=fabric, SLIP_FABRIC_PROVIDER).
bool OverTransport(const char* name) {
  const char* t = getenv("SLIP_NCCL_TEST_TRANSPORT");
  return t != nullptr && std::strcmp(t, name) == 0;
}
bool OverVerbs() {
  return OverTransport("verbs");
}
bool OverFabric() {
  return OverTransport("fabric");
}
bool OverShm() {
  return !OverVerbs() && !OverFabric();
}
// libfabric 1.17's shm provider, and ofi_rxm over verbs, crash (in their completion queue
// read) when one end of a comm closes mid-transfer while the other end, in the same
// process and domain, is still moving (the tcp provider does not): NCCL's ranks are
// processes, but the tests that run ranks as threads must not take them there.
bool FabricTeardownInProcessCrashes() {
  const char* provider = getenv("SLIP_FABRIC_PROVIDER");
  return OverFabric() && !(provider && std::strcmp(provider, "tcp") == 0);
}
constexpr const char* kFabricTeardownInProcess =
    "libfabric 1.17 (shm, ofi_rxm over verbs) crashes when a comm's end closes mid-transfer "
    "while its other end in the same process moves (PeerKilledMidTransferIsAnError covers a "
    "peer process)";

void Logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
            const char* fmt, ...) {
  // SLIP_NCCL_TEST_VERBOSE=1 prints the plugin's warnings, =2 every line it logs.
  const char* verbose = getenv("SLIP_NCCL_TEST_VERBOSE");
  if (level != NCCL_LOG_WARN && !(verbose && verbose[0] == '2')) return;
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  if (verbose) fprintf(stderr, "[%d] %s\n", int(getpid()), buf);
  EXPECT_TRUE(flags & NCCL_NET) << buf;
  if (level == NCCL_LOG_WARN) {
    g_last_warning = buf;
    g_warnings += buf;
    g_warnings += '\n';
  }
}

struct Plugin {
  void* lib = nullptr;
  const ncclNet_v8_t* v8 = nullptr;
  const ncclNet_v9_t* v9 = nullptr;
  const ncclNet_v10_t* v10 = nullptr;
  const ncclNet_v11_t* v11 = nullptr;
  void* ctx = nullptr;  // v11's
};

// The test's own SIGTERM handler, installed before the plugin starts: libfabric's PSM
// installs one of its own as it initialises (exit(1)), and the plugin must put ours back.
void TestSigterm(int) {}

Plugin& P() {
  static Plugin p = [] {
    Plugin p;
    struct sigaction ours {};
    ours.sa_handler = TestSigterm;
    sigaction(SIGTERM, &ours, nullptr);
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

// One version's calls, in v11's terms (sizes as size_t). isend and irecv register their
// buffers with the comm first (regMr) and name the registrations, as NCCL does (an RDMA
// transport moves registered memory only); test() deregisters them once the request is
// done, and a close deregisters what its comm still has, as NCCL does before it closes.
struct Api {
  int version;
  std::function<ncclResult_t(void*, void**)> listen;  // handle, listen comm
  std::function<ncclResult_t(void*, void**)> connect;
  std::function<ncclResult_t(void*, void**)> accept;
  std::function<ncclResult_t(void*, void*, size_t, int, void**)> isend;
  std::function<ncclResult_t(void*, int, void**, size_t*, int*, void**)> irecv;
  std::function<ncclResult_t(void*, int*, int*)> test;
  std::function<ncclResult_t(void*)> close_send, close_recv, close_listen;
  // The version's own calls, with registrations.
  std::function<ncclResult_t(void*, void*, size_t, int, void*, void**)> raw_isend;
  std::function<ncclResult_t(void*, int, void**, size_t*, int*, void**, void**)> raw_irecv;
  std::function<ncclResult_t(void*, void*, size_t, void**)> reg;
  std::function<ncclResult_t(void*, void*)> dereg;
};

// The registrations of requests in flight: request -> (comm, its registrations).
struct InFlight {
  void* comm;
  std::vector<void*> mhandles;
};
std::mutex g_flight_mu;
std::map<void*, InFlight> g_flight;

void Remember(void* req, void* comm, std::vector<void*> mhandles) {
  std::lock_guard lock(g_flight_mu);
  g_flight[req] = {comm, std::move(mhandles)};
}

template <typename T>
Api MakeApi(int version, const T* t) {
  Api a;
  a.version = version;
  a.accept = [t](void* l, void** r) { return t->accept(l, r, nullptr); };
  a.close_listen = t->closeListen;
  a.dereg = t->deregMr;
  return a;
}

// The calls every version shares, over its raw ones.
Api Complete(Api a, const std::function<ncclResult_t(void*, int*, int*)>& test,
             const std::function<ncclResult_t(void*)>& close_send,
             const std::function<ncclResult_t(void*)>& close_recv) {
  auto dereg = a.dereg;
  a.isend = [a](void* c, void* d, size_t n, int tag, void** r) {
    void* mh = nullptr;
    *r = nullptr;
    if (ncclResult_t rc = a.reg(c, d, n, &mh); rc != ncclSuccess) return rc;
    const ncclResult_t rc = a.raw_isend(c, d, n, tag, mh, r);
    if (rc != ncclSuccess || *r == nullptr)
      a.dereg(c, mh);
    else
      Remember(*r, c, {mh});
    return rc;
  };
  a.irecv = [a](void* c, int n, void** d, size_t* s, int* tags, void** r) {
    std::vector<void*> mh(size_t(n > 0 ? n : 0), nullptr);
    *r = nullptr;
    for (int i = 0; i < n; ++i) {
      if (ncclResult_t rc = a.reg(c, d[i], s[i], &mh[size_t(i)]); rc != ncclSuccess) {
        for (int k = 0; k < i; ++k) a.dereg(c, mh[size_t(k)]);
        return rc;
      }
    }
    const ncclResult_t rc = a.raw_irecv(c, n, d, s, tags, mh.data(), r);
    if (rc != ncclSuccess || *r == nullptr) {
      for (void* m : mh) a.dereg(c, m);
    } else {
      Remember(*r, c, std::move(mh));
    }
    return rc;
  };
  a.test = [test, dereg](void* r, int* d, int* s) {
    const ncclResult_t rc = test(r, d, s);
    if (rc == ncclSuccess && *d) {
      InFlight f;
      {
        std::lock_guard lock(g_flight_mu);
        auto it = g_flight.find(r);
        if (it == g_flight.end()) return rc;
        f = std::move(it->second);
        g_flight.erase(it);
      }
      for (void* m : f.mhandles) EXPECT_EQ(dereg(f.comm, m), ncclSuccess);
    }
    return rc;
  };
  auto closer = [dereg](const std::function<ncclResult_t(void*)>& close) {
    return [dereg, close](void* c) {
      std::vector<InFlight> left;
      {
        std::lock_guard lock(g_flight_mu);
        for (auto it = g_flight.begin(); it != g_flight.end();) {
          if (it->second.comm == c) {
            left.push_back(std::move(it->second));
            it = g_flight.erase(it);
          } else {
            ++it;
          }
        }
      }
      for (auto& f : left)
        for (void* m : f.mhandles) dereg(c, m);
      return close(c);
    };
  };
  a.close_send = closer(close_send);
  a.close_recv = closer(close_recv);
  return a;
}

Api ApiV(int version) {
  Plugin& p = P();
  if (version == 8) {
    Api a = MakeApi(8, p.v8);
    a.listen = [t = p.v8](void* h, void** l) { return t->listen(0, h, l); };
    a.connect = [t = p.v8](void* h, void** s) { return t->connect(0, h, s, nullptr); };
    a.reg = [t = p.v8](void* c, void* d, size_t n, void** mh) {
      return t->regMr(c, d, int(n), NCCL_PTR_HOST, mh);
    };
    a.raw_isend = [t = p.v8](void* c, void* d, size_t n, int tag, void* mh, void** r) {
      return t->isend(c, d, int(n), tag, mh, r);
    };
    a.raw_irecv = [t = p.v8](void* c, int n, void** d, size_t* s, int* tags, void** mh, void** r) {
      int sizes[8];
      for (int i = 0; i < n && i < 8; ++i) sizes[i] = int(s[i]);
      return t->irecv(c, n, d, sizes, tags, mh, r);
    };
    return Complete(a, p.v8->test, p.v8->closeSend, p.v8->closeRecv);
  }
  if (version == 9) {
    Api a = MakeApi(9, p.v9);
    a.listen = [t = p.v9](void* h, void** l) { return t->listen(0, h, l); };
    a.connect = [t = p.v9](void* h, void** s) { return t->connect(0, h, s, nullptr); };
    a.reg = [t = p.v9](void* c, void* d, size_t n, void** mh) {
      return t->regMr(c, d, n, NCCL_PTR_HOST, mh);
    };
    a.raw_isend = [t = p.v9](void* c, void* d, size_t n, int tag, void* mh, void** r) {
      return t->isend(c, d, n, tag, mh, r);
    };
    a.raw_irecv = [t = p.v9](void* c, int n, void** d, size_t* s, int* tags, void** mh, void** r) {
      return t->irecv(c, n, d, s, tags, mh, r);
    };
    return Complete(a, p.v9->test, p.v9->closeSend, p.v9->closeRecv);
  }
  if (version == 10) {
    Api a = MakeApi(10, p.v10);
    a.listen = [t = p.v10](void* h, void** l) { return t->listen(0, h, l); };
    a.connect = [t = p.v10](void* h, void** s) { return t->connect(0, nullptr, h, s, nullptr); };
    a.reg = [t = p.v10](void* c, void* d, size_t n, void** mh) {
      return t->regMr(c, d, n, NCCL_PTR_HOST, mh);
    };
    a.raw_isend = [t = p.v10](void* c, void* d, size_t n, int tag, void* mh, void** r) {
      return t->isend(c, d, n, tag, mh, nullptr, r);
    };
    a.raw_irecv = [t = p.v10](void* c, int n, void** d, size_t* s, int* tags, void** mh, void** r) {
      void* ph[8] = {};
      return t->irecv(c, n, d, s, tags, mh, ph, r);
    };
    return Complete(a, p.v10->test, p.v10->closeSend, p.v10->closeRecv);
  }
  Api a = MakeApi(11, p.v11);
  a.listen = [t = p.v11](void* h, void** l) { return t->listen(P().ctx, 0, h, l); };
  a.connect = [t = p.v11](void* h, void** s) { return t->connect(P().ctx, 0, h, s, nullptr); };
  a.reg = [t = p.v11](void* c, void* d, size_t n, void** mh) {
    return t->regMr(c, d, n, NCCL_PTR_HOST, mh);
  };
  a.raw_isend = [t = p.v11](void* c, void* d, size_t n, int tag, void* mh, void** r) {
    return t->isend(c, d, n, tag, mh, nullptr, r);
  };
  a.raw_irecv = [t = p.v11](void* c, int n, void** d, size_t* s, int* tags, void** mh, void** r) {
    void* ph[8] = {};
    return t->irecv(c, n, d, s, tags, mh, ph, r);
  };
  return Complete(a, p.v11->test, p.v11->closeSend, p.v11->closeRecv);
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

// A sender in a process of its own, as NCCL's ranks are: connects to `handle` and sends
// the plan Plan(plan_seed, count, max_size) keyed from `key`, or (die_mid) posts a send of
// 32 MiB and is killed while it is under way.
struct SenderRole {
  uint64_t plan_seed;
  int count;
  size_t max_size;
  uint64_t key;
  bool die_mid;
};

int RunSender(const char* handle, const SenderRole& role) {
  Api a = ApiV(11);
  void* send = nullptr;
  char h[NCCL_NET_HANDLE_MAXSIZE];
  std::memcpy(h, handle, sizeof(h));
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (send == nullptr && Clock::now() < deadline)
    if (a.connect(h, &send) != ncclSuccess) return 2;
  if (send == nullptr) return 3;
  if (role.die_mid) {
    std::vector<uint8_t> in(32 << 20, 1);
    void* req = nullptr;
    while (req == nullptr)
      if (a.isend(send, in.data(), in.size(), 0, &req) != ncclSuccess) return 3;
    // (the send is under way; the rest of it never comes.)
    raise(SIGKILL);
  }
  const int rc = SendPlan(a, send, Plan(role.plan_seed, role.count, role.max_size), role.key);
  return rc != 0 ? rc : a.close_send(send) == ncclSuccess ? 0 : 4;
}

// Over shm a forked child runs the sender; over verbs and fabric the child executes this
// binary again (NcclPluginChild.Sender), so that it opens the device itself: a device
// opened before fork() is not the child's (uverbs refuses a process other than its opener;
// libfabric's providers keep threads and state that fork() does not carry).
pid_t SpawnSender(const char* handle, const SenderRole& role) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  if (OverShm()) _exit(RunSender(handle, role));
  char hex[2 * NCCL_NET_HANDLE_MAXSIZE + 1];
  for (int i = 0; i < NCCL_NET_HANDLE_MAXSIZE; ++i)
    snprintf(hex + 2 * i, 3, "%02x", unsigned(uint8_t(handle[i])));
  char spec[160];
  snprintf(spec, sizeof(spec), "%" PRIu64 ",%d,%zu,%" PRIu64 ",%d", role.plan_seed, role.count,
           role.max_size, role.key, int(role.die_mid));
  setenv("SLIP_NCCL_CHILD_HANDLE", hex, 1);
  setenv("SLIP_NCCL_CHILD_ROLE", spec, 1);
  execl("/proc/self/exe", "slip_unit_tests", "--gtest_filter=NcclPluginChild.Sender",
        static_cast<char*>(nullptr));
  _exit(127);
}

// The exec'd sender of SpawnSender; skipped when run on its own.
TEST(NcclPluginChild, Sender) {
  const char* hex = getenv("SLIP_NCCL_CHILD_HANDLE");
  const char* spec = getenv("SLIP_NCCL_CHILD_ROLE");
  if (hex == nullptr || spec == nullptr) GTEST_SKIP() << "SpawnSender's child only";
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  for (int i = 0; i < NCCL_NET_HANDLE_MAXSIZE && hex[2 * i] && hex[2 * i + 1]; ++i) {
    unsigned byte = 0;
    sscanf(hex + 2 * i, "%2x", &byte);
    handle[i] = char(byte);
  }
  SenderRole role{};
  int die = 0;
  ASSERT_EQ(sscanf(spec, "%" SCNu64 ",%d,%zu,%" SCNu64 ",%d", &role.plan_seed, &role.count,
                   &role.max_size, &role.key, &die),
            5);
  role.die_mid = die != 0;
  ASSERT_NE(P().lib, nullptr);
  _exit(RunSender(handle, role));
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

// Over fabric (nccl_plugin.fabric_*), loading libfabric installs PSM's handlers: the
// training process's signals must stay its own.
TEST_F(NcclPlugin, ApplicationSignalsStayItsOwn) {
  ASSERT_NE(P().v11, nullptr);
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &TestSigterm);
}

TEST_F(NcclPlugin, PropertiesAreHonest) {
  ncclNetProperties_v11_t all;
  std::memset(&all, 0x5a, sizeof(all));
  ASSERT_EQ(P().v11->getProperties(0, &all), ncclSuccess);
  const ncclNetProperties_v9_t& props = all.v9;
  // rxe (the Soft-RoCE guest) is a virtual device: no PCI path either.
  if (OverFabric()) {
    // "slipstream-shm", "slipstream-tcp-eth0": the core provider, then the domain.
    const char* provider = getenv("SLIP_FABRIC_PROVIDER");
    ASSERT_NE(provider, nullptr);
    EXPECT_EQ(std::string(props.name).rfind(std::string("slipstream-") + provider, 0), 0u)
        << props.name;
  } else {
    EXPECT_STREQ(props.name, OverVerbs() ? "slipstream-rxe0" : "slipstream-shm");
  }
  EXPECT_EQ(props.pciPath, nullptr);
  EXPECT_EQ(props.ptrSupport, NCCL_PTR_HOST);  // no device memory registration yet
  // verbs and fabric register per comm; shm's registrations are notes.
  EXPECT_EQ(props.regIsGlobal, OverShm() ? 1 : 0);
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
    // Both ends' loops at once: the receiver posts, the sender matches. (Threads: an RDMA
    // comm cannot cross fork.)
    int rc_send = -1;
    std::thread sender([&] { rc_send = SendPlan(a, send, plan, 1000 * version); });
    const int rc_recv = RecvPlan(a, recv, plan, 1000 * version);
    sender.join();
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
  const pid_t pid = SpawnSender(handle, {91, 300, 4 << 20, 7000, false});
  ASSERT_GT(pid, 0);
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
  if (OverFabric()) {
    // A tagged message's sender does not know the receive's size: the receive fails (the
    // provider writes nothing past its buffer), and with it the comm.
    EXPECT_EQ(rc, ncclSuccess);
    int done = 0;
    while (rc == ncclSuccess && !done && Clock::now() < deadline) rc = a.test(rreq, &done, nullptr);
    EXPECT_EQ(rc, ncclRemoteError);
    EXPECT_NE(g_last_warning.find("larger than the receive posted"), std::string::npos)
        << g_last_warning;
  } else {
    EXPECT_EQ(rc, ncclInvalidArgument);
    EXPECT_NE(g_last_warning.find("receive of 10 bytes"), std::string::npos) << g_last_warning;
  }
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
    std::atomic<int> finished;
  };
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(shared, MAP_FAILED);
  new (shared) Shared();
  auto value = [](int rank, size_t i) { return int32_t((i * 2654435761u + rank * 97) % 100000); };
  // One rank: its own comms (a listen comm, a send comm to the next rank, the receive comm
  // of the previous one's), a reduce-scatter and an all-gather; 0 when its sum is exact.
  auto rank_main = [&](int rank) -> int {
    Api a = ApiV(11);
    void* listen = nullptr;
    if (a.listen(shared->handles[rank], &listen) != ncclSuccess) return 2;
    shared->ready.fetch_add(1);
    while (shared->ready.load() < kRanks) usleep(100);
    void *send = nullptr, *recv = nullptr;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while ((send == nullptr || recv == nullptr) && Clock::now() < deadline) {
      if (!send && a.connect(shared->handles[(rank + 1) % kRanks], &send) != ncclSuccess) return 3;
      if (!recv && a.accept(listen, &recv) != ncclSuccess) return 4;
    }
    if (!send || !recv) return 5;
    std::vector<int32_t> data(kCount), tmp(kCount);
    for (size_t i = 0; i < kCount; ++i) data[i] = value(rank, i);
    auto chunk_begin = [&](int c) { return kCount * size_t(c) / kRanks; };
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
        return rc;
    for (int s = 0; s < kRanks - 1; ++s)
      if (int rc = step((rank + 1 - s + kRanks) % kRanks, (rank - s + kRanks) % kRanks, false))
        return rc;
    for (size_t i = 0; i < kCount; ++i) {
      int32_t want = 0;
      for (int r = 0; r < kRanks; ++r) want += value(r, i);
      if (data[i] != want) return 11;
    }
    // Every rank done before any closes, as NCCL's ranks end a communicator (and as
    // libfabric's shm needs when the ranks are threads of one process).
    shared->finished.fetch_add(1);
    const auto all_done = Clock::now() + std::chrono::seconds(10);
    while (shared->finished.load() < kRanks && Clock::now() < all_done) usleep(100);
    a.close_send(send);
    a.close_recv(recv);
    a.close_listen(listen);
    return 0;
  };
  if (!OverShm()) {
    // A device opened before fork() is not the child's (uverbs refuses a process other
    // than its opener), so over verbs and fabric the ranks are threads: each with its own
    // comms, endpoints and registrations, through the device as between processes.
    std::vector<std::thread> ranks;
    std::vector<int> rcs(kRanks, -1);
    for (int rank = 0; rank < kRanks; ++rank)
      ranks.emplace_back([&, rank] { rcs[size_t(rank)] = rank_main(rank); });
    for (auto& t : ranks) t.join();
    for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(rcs[size_t(rank)], 0) << "rank " << rank;
    munmap(shared, sizeof(Shared));
    return;
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) _exit(rank_main(rank));
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

// Zeros and noise are nobody's handle.
void ExpectNotHandles(const Api& a) {
  void* send = nullptr;
  char zeros[NCCL_NET_HANDLE_MAXSIZE] = {};
  EXPECT_EQ(a.connect(zeros, &send), ncclInvalidArgument);
  char noise[NCCL_NET_HANDLE_MAXSIZE];
  for (size_t i = 0; i < sizeof(noise); ++i) noise[i] = char(i * 37 + 11);
  EXPECT_EQ(a.connect(noise, &send), ncclInvalidArgument);
  EXPECT_EQ(send, nullptr);
}

TEST_F(NcclPlugin, BadHandlesAreErrorsNotCrashes) {
  if (!OverShm()) GTEST_SKIP() << "shm's handles (Bad{Verbs,Fabric}HandlesAreErrors: theirs)";
  void* send = nullptr;
  ExpectNotHandles(a);

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

// Connects with `h` until the connect fails or returns a comm (the listener driven
// meanwhile); the result.
ncclResult_t ConnectUntilDecided(const Api& a, void* listen, char* h, void** send) {
  ncclResult_t rc = ncclSuccess;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (rc == ncclSuccess && *send == nullptr && Clock::now() < deadline) {
    rc = a.connect(h, send);
    void* recv = nullptr;
    if (listen != nullptr) {
      EXPECT_EQ(a.accept(listen, &recv), ncclSuccess);
    }
    EXPECT_EQ(recv, nullptr);  // nobody with a bad handle is accepted
  }
  return rc;
}

// verbs' handles: what is not one, a sender without the listener's secret (refused by the
// listener), a listener without the handle's secret (an impostor at the address: refused
// by the sender), a listener that is gone; each an error in bounded time, and the
// listener serves its real senders after all of them.
TEST_F(NcclPlugin, BadVerbsHandlesAreErrors) {
  if (!OverVerbs()) GTEST_SKIP() << "the Soft-RoCE guest's (tests/vm/verbs-suite.sh)";
  void* send = nullptr;
  ExpectNotHandles(a);
  namespace vw = slip::verbs::msgwire;
  vw::Handle h;
  ASSERT_TRUE(vw::ParseHandle(reinterpret_cast<uint8_t*>(handle), sizeof(handle), &h));
  char forged[NCCL_NET_HANDLE_MAXSIZE] = {};
  for (size_t flip : {size_t(0), vw::kSecretHalf}) {
    SCOPED_TRACE(flip);
    vw::Handle other = h;
    other.secret[flip] ^= 0x5a;
    vw::EncodeHandle(other, reinterpret_cast<uint8_t*>(forged));
    send = nullptr;
    // The listener rejects the first; the sender refuses the impostor's answer.
    EXPECT_EQ(ConnectUntilDecided(a, listen, forged, &send),
              flip == 0 ? ncclSystemError : ncclRemoteError);
    EXPECT_EQ(send, nullptr);
    EXPECT_NE(g_last_warning.find(flip == 0 ? "REJECTED" : "does not carry the handle's secret"),
              std::string::npos)
        << g_last_warning;
  }
  void *good_send = nullptr, *good_recv = nullptr;
  ASSERT_TRUE(Pair(a, handle, listen, &good_send, &good_recv));
  EXPECT_EQ(a.close_send(good_send), ncclSuccess);
  EXPECT_EQ(a.close_recv(good_recv), ncclSuccess);
  // A listener that is gone.
  EXPECT_EQ(a.close_listen(listen), ncclSuccess);
  listen = nullptr;
  send = nullptr;
  EXPECT_EQ(ConnectUntilDecided(a, nullptr, handle, &send), ncclSystemError);
  EXPECT_EQ(send, nullptr);
}

// fabric's handles and exchange (fabric/msg_wire.h): what is not a handle, a sender without
// the listener's secret (its connection closed by the listener), a listener without the
// handle's secret (an impostor at the address: refused by the sender), strangers on the
// listener's TCP port (garbage, a REQ with a bad address), a listener that is gone; each
// an error in bounded time, and the listener serves its real senders after all of them.
TEST_F(NcclPlugin, BadFabricHandlesAreErrors) {
  if (!OverFabric()) GTEST_SKIP() << "ctest's nccl_plugin.fabric_* runs";
  void* send = nullptr;
  ExpectNotHandles(a);
  namespace fw = slip::fabric::msgwire;
  fw::Handle h;
  ASSERT_TRUE(fw::ParseHandle(reinterpret_cast<uint8_t*>(handle), sizeof(handle), &h));
  char forged[NCCL_NET_HANDLE_MAXSIZE] = {};
  for (size_t flip : {size_t(0), slip::msg::kSecretHalf}) {
    SCOPED_TRACE(flip);
    fw::Handle other = h;
    other.secret[flip] ^= 0x5a;
    fw::EncodeHandle(other, reinterpret_cast<uint8_t*>(forged));
    send = nullptr;
    g_warnings.clear();
    EXPECT_EQ(ConnectUntilDecided(a, listen, forged, &send), ncclRemoteError);
    EXPECT_EQ(send, nullptr);
    EXPECT_NE(g_warnings.find(flip == 0 ? "refused" : "does not carry the handle's secret"),
              std::string::npos)
        << g_warnings;
  }
  // Strangers at the listener's TCP address: bytes that are no REQ, and a REQ with the
  // secret's first half but an address no provider takes (all zeros past one byte).
  const socklen_t len = h.address.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  for (int kind = 0; kind < 2; ++kind) {
    SCOPED_TRACE(kind);
    const int fd = socket(h.address.ss_family, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&h.address), len), 0);
    uint8_t msg[fw::kHelloBytes];
    if (kind == 0) {
      for (size_t i = 0; i < sizeof(msg); ++i) msg[i] = uint8_t(i * 7 + 3);
    } else {
      fw::Hello req;
      std::memcpy(req.proof, h.secret, slip::msg::kSecretHalf);
      req.address_len = 1;
      ASSERT_TRUE(fw::EncodeHello(fw::kMagic.request, req, msg));
    }
    ASSERT_EQ(write(fd, msg, sizeof(msg)), ssize_t(sizeof(msg)));
    // The listener drops it (closes the connection) and accepts nothing.
    char byte;
    ssize_t got = -1;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      void* recv = nullptr;
      ASSERT_EQ(a.accept(listen, &recv), ncclSuccess);
      ASSERT_EQ(recv, nullptr);
      got = ::recv(fd, &byte, 1, MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN)) break;
      usleep(1000);
    }
    EXPECT_LE(got, 0) << "the listener answered a stranger";
    close(fd);
  }
  void *good_send = nullptr, *good_recv = nullptr;
  ASSERT_TRUE(Pair(a, handle, listen, &good_send, &good_recv));
  EXPECT_EQ(a.close_send(good_send), ncclSuccess);
  EXPECT_EQ(a.close_recv(good_recv), ncclSuccess);
  // A listener that is gone: its port refuses.
  EXPECT_EQ(a.close_listen(listen), ncclSuccess);
  listen = nullptr;
  send = nullptr;
  EXPECT_EQ(ConnectUntilDecided(a, nullptr, handle, &send), ncclSystemError);
  EXPECT_EQ(send, nullptr);
}

// Anybody who reaches a fabric listener's TCP address can connect and say nothing: 40
// such connections, held open, must not keep a real sender out (the listener keeps 16
// waiting for their REQ; before, 16 silent ones made it close every newcomer, the real
// sender's too, for the 20 s each was kept). The comm then carries messages exactly.
TEST_F(NcclPlugin, SilentConnectionsDoNotKeepARealSenderOut) {
  if (!OverFabric()) GTEST_SKIP() << "ctest's nccl_plugin.fabric_* runs";
  namespace fw = slip::fabric::msgwire;
  fw::Handle h;
  ASSERT_TRUE(fw::ParseHandle(reinterpret_cast<uint8_t*>(handle), sizeof(handle), &h));
  const socklen_t len = h.address.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::vector<int> silent;
  for (int i = 0; i < 40; ++i) {
    const int fd = socket(h.address.ss_family, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&h.address), len), 0);
    silent.push_back(fd);
  }
  for (int i = 0; i < 20; ++i) {  // (the listener takes them in when NCCL polls it)
    void* recv = nullptr;
    ASSERT_EQ(a.accept(listen, &recv), ncclSuccess);
    ASSERT_EQ(recv, nullptr);
  }
  void *send = nullptr, *recv = nullptr;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  const auto plan = Plan(77, 20, 200000);
  int rc_send = -1;
  std::thread sender([&] { rc_send = SendPlan(a, send, plan, 7700); });
  const int rc_recv = RecvPlan(a, recv, plan, 7700);
  sender.join();
  EXPECT_EQ(rc_recv, 0);
  EXPECT_EQ(rc_send, 0);
  EXPECT_EQ(a.close_send(send), ncclSuccess);
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
  for (int fd : silent) close(fd);
}

// Whoever connects to a listener's abstract name (listed in /proc/net/unix) and sends
// garbage is dropped; the listener goes on serving its real senders.
TEST_F(NcclPlugin, ForeignHelloIsDroppedAndListenerGoesOn) {
  if (!OverShm()) GTEST_SKIP() << "shm's rendezvous (Bad{Verbs,Fabric}HandlesAreErrors: theirs)";
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

// iflush: nothing to wait for where the CPU reads what arrived (host memory: a null
// request); with SLIP_NCCL_FLUSH=1 over verbs (the guest's run), the GPUDirect flush's path
// for real: a one-byte RDMA READ through a queue pair connected to itself, done through
// test(), more times than there are requests (each flush's storage comes back).
TEST_F(NcclPlugin, FlushIsAReadWhereItMatters) {
  const char* forced_env = getenv("SLIP_NCCL_FLUSH");
  const bool forced = OverVerbs() && forced_env && std::strcmp(forced_env, "1") == 0;
  const ncclNet_v11_t* net = P().v11;
  void *send, *recv;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  std::vector<uint8_t> in(3000), out(4096, 0xee);
  Fill(in.data(), in.size(), 77);
  void *rmh = nullptr, *smh = nullptr;
  ASSERT_EQ(net->regMr(recv, out.data(), out.size(), NCCL_PTR_HOST, &rmh), ncclSuccess);
  ASSERT_EQ(net->regMr(send, in.data(), in.size(), NCCL_PTR_HOST, &smh), ncclSuccess);
  void* data = out.data();
  size_t cap = out.size();
  int tag = 3;
  void* ph = nullptr;
  void *rreq = nullptr, *sreq = nullptr;
  ASSERT_EQ(net->irecv(recv, 1, &data, &cap, &tag, &rmh, &ph, &rreq), ncclSuccess);
  ASSERT_NE(rreq, nullptr);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (sreq == nullptr && Clock::now() < deadline)
    ASSERT_EQ(net->isend(send, in.data(), in.size(), 3, smh, nullptr, &sreq), ncclSuccess);
  ASSERT_NE(sreq, nullptr);
  int sdone = 0, rdone = 0, got = 0;
  while ((!sdone || !rdone) && Clock::now() < deadline) {
    if (!sdone) {
      ASSERT_EQ(net->test(sreq, &sdone, nullptr), ncclSuccess);
    }
    if (!rdone) {
      ASSERT_EQ(net->test(rreq, &rdone, &got), ncclSuccess);
    }
  }
  ASSERT_TRUE(sdone && rdone);
  ASSERT_EQ(got, int(in.size()));
  int size = got;
  for (int round = 0; round < 2 * NCCL_NET_MAX_REQUESTS; ++round) {
    void* flush = reinterpret_cast<void*>(1);
    ASSERT_EQ(net->iflush(recv, 1, &data, &size, &rmh, &flush), ncclSuccess);
    if (!forced) {
      EXPECT_EQ(flush, nullptr);
      break;
    }
    ASSERT_NE(flush, nullptr);
    int done = 0;
    while (!done && Clock::now() < deadline)
      ASSERT_EQ(net->test(flush, &done, nullptr), ncclSuccess);
    ASSERT_TRUE(done) << round;
  }
  EXPECT_TRUE(Matches(out.data(), in.size(), 77));
  EXPECT_EQ(net->deregMr(recv, rmh), ncclSuccess);
  EXPECT_EQ(net->deregMr(send, smh), ncclSuccess);
  EXPECT_EQ(a.close_send(send), ncclSuccess);
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
}

// A sender whose send completed and which then closes: the receive it completed is the
// receiver's, whole, even when the receiver learns of the close first (a receive posted
// after it is refused); only what never arrived fails.
TEST_F(NcclPlugin, SendCompletedBeforeCloseStillArrives) {
  void *send, *recv;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  std::vector<uint8_t> in(700001), out(in.size() + 99, 0xee);
  Fill(in.data(), in.size(), 4242);
  void* data = out.data();
  size_t cap = out.size();
  int tag = 5;
  void *rreq = nullptr, *sreq = nullptr;
  ASSERT_EQ(a.irecv(recv, 1, &data, &cap, &tag, &rreq), ncclSuccess);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (sreq == nullptr && Clock::now() < deadline)
    ASSERT_EQ(a.isend(send, in.data(), in.size(), 5, &sreq), ncclSuccess);
  ASSERT_NE(sreq, nullptr);
  int sdone = 0;
  while (!sdone && Clock::now() < deadline) {
    ASSERT_EQ(a.test(sreq, &sdone, nullptr), ncclSuccess);
    int rdone = 0;  // (shm's sender waits for the receiver to take the bytes: drive it)
    if (!sdone && !OverVerbs()) {  // (and a provider's rendezvous for large sends)
      ASSERT_EQ(a.test(rreq, &rdone, nullptr), ncclSuccess);
    }
    if (rdone) rreq = nullptr;
  }
  ASSERT_TRUE(sdone);
  EXPECT_EQ(a.close_send(send), ncclSuccess);
  usleep(50000);  // the close reaches the receiver
  if (rreq != nullptr) {
    // Another receive, posted now: the receiver may learn here that the sender is gone.
    void* data2 = out.data() + in.size();
    size_t cap2 = 99;
    void* late = nullptr;
    const ncclResult_t late_rc = a.irecv(recv, 1, &data2, &cap2, &tag, &late);
    EXPECT_TRUE(late_rc == ncclSuccess || late_rc == ncclRemoteError) << late_rc;
    int done = 0, size = -1;
    ncclResult_t rc = ncclSuccess;
    while (rc == ncclSuccess && !done && Clock::now() < deadline) rc = a.test(rreq, &done, &size);
    EXPECT_EQ(rc, ncclSuccess);
    ASSERT_TRUE(done);
    EXPECT_EQ(size, int(in.size()));
  }
  EXPECT_TRUE(Matches(out.data(), in.size(), 4242));
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
}

// Closing a comm with requests in flight releases them; the other end's requests fail
// with an NCCL error instead of waiting for ever.
TEST_F(NcclPlugin, CloseWithRequestsInFlightFailsThePeer) {
  if (FabricTeardownInProcessCrashes()) GTEST_SKIP() << kFabricTeardownInProcess;
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
// a bounded time. Over RDMA the send may still complete: its writes were the device's to
// carry when the process died (seen under ASan, where the process is slower than rxe); then
// its bytes are all there, and the next receive is the one that fails.
TEST_F(NcclPlugin, PeerKilledMidTransferIsAnError) {
  const pid_t pid = SpawnSender(handle, {0, 0, 0, 0, true});
  ASSERT_GT(pid, 0);
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
  if (rc == ncclSuccess && done) {
    EXPECT_FALSE(OverShm()) << "over shm the rest of the message never comes";
    ASSERT_EQ(size, 32 << 20);
    EXPECT_EQ(std::count(out.begin(), out.end(), uint8_t(1)), long(out.size()));
    rreq = nullptr;
    done = 0;
    rc = a.irecv(recv, 1, &data, &cap, &tag, &rreq);  // (may know already)
    while (rc == ncclSuccess && rreq && !done && Clock::now() < deadline)
      rc = a.test(rreq, &done, &size);
  }
  EXPECT_EQ(rc, ncclRemoteError);
  EXPECT_EQ(done, 0);
  EXPECT_NE(g_last_warning.find("sender closed"), std::string::npos) << g_last_warning;
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
}

}  // namespace
