// What the harness of the NCCL plugin shares (nccl_plugin_test.cc,
// nccl_plugin_input_test.cc, nccl_plugin_failure_test.cc). The NCCL plugin as NCCL uses it: dlopen
// the built libnccl-net-slipstream.so, look up each exported table, and drive it as NCCL's proxy
// thread does (connect and accept called again until they return a comm, isend/irecv that may say
// "not now", test until done), over shm, in separate processes where it matters: transfers of
// random sizes checked byte for byte, 32 requests in flight, grouped receives, a ring all-reduce of
// 4 ranks checked against the exact sum, closes with requests in flight, a listen comm reused, and
// bad input (foreign handles, double closes, a peer that dies mid-transfer) that must end in an
// NCCL error, never a crash or a hang.
#pragma once

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

namespace nccl_plugin_fixture {

inline std::string g_last_warning;
inline std::string g_warnings;  // every warning since a test cleared it, a line each

// The transport under test: shm by default; tests/vm/verbs-suite.sh runs this harness in
// the Soft-RoCE guest, where the plugin offers rxe0 (verbs); ctest's nccl_plugin.fabric_*
// run it over libfabric's providers (SLIP_TRANSPORTS=fabric, SLIP_FABRIC_PROVIDER).
inline bool OverTransport(const char* name) {
  const char* t = getenv("SLIP_NCCL_TEST_TRANSPORT");
  return t != nullptr && std::strcmp(t, name) == 0;
}
inline bool OverVerbs() {
  return OverTransport("verbs");
}
inline bool OverFabric() {
  return OverTransport("fabric");
}
inline bool OverShm() {
  return !OverVerbs() && !OverFabric();
}
// libfabric 1.17's shm provider, and ofi_rxm over verbs, crash (in their completion queue
// read) when one end of a comm closes mid-transfer while the other end, in the same
// process and domain, is still moving (the tcp provider does not): NCCL's ranks are
// processes, but the tests that run ranks as threads must not take them there.
inline bool FabricTeardownInProcessCrashes() {
  const char* provider = getenv("SLIP_FABRIC_PROVIDER");
  return OverFabric() && !(provider && std::strcmp(provider, "tcp") == 0);
}
inline constexpr const char* kFabricTeardownInProcess =
    "libfabric 1.17 (shm, ofi_rxm over verbs) crashes when a comm's end closes mid-transfer "
    "while its other end in the same process moves (PeerKilledMidTransferIsAnError covers a "
    "peer process)";

inline void Logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
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
inline void TestSigterm(int) {}

inline Plugin& P() {
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
inline std::mutex g_flight_mu;
inline std::map<void*, InFlight> g_flight;

inline void Remember(void* req, void* comm, std::vector<void*> mhandles) {
  std::lock_guard lock(g_flight_mu);
  g_flight[req] = {comm, std::move(mhandles)};
}

template <typename T>
inline Api MakeApi(int version, const T* t) {
  Api a;
  a.version = version;
  a.accept = [t](void* l, void** r) { return t->accept(l, r, nullptr); };
  a.close_listen = t->closeListen;
  a.dereg = t->deregMr;
  return a;
}

// The calls every version shares, over its raw ones.
inline Api Complete(Api a, const std::function<ncclResult_t(void*, int*, int*)>& test,
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

inline Api ApiV(int version) {
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
inline void Fill(uint8_t* p, size_t n, uint64_t key) {
  uint64_t x = key * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = uint8_t(x);
  }
}
inline bool Matches(const uint8_t* p, size_t n, uint64_t key) {
  std::vector<uint8_t> want(n);
  Fill(want.data(), n, key);
  return n == 0 || std::memcmp(p, want.data(), n) == 0;
}

// Connect and accept, both called again until each returns its comm (in one process).
inline bool Pair(const Api& a, void* handle, void* listen, void** send, void** recv) {
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

inline std::vector<Message> Plan(uint64_t seed, int count, size_t max_size) {
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
inline int DrivePlan(const Api& a, size_t count, const std::function<int(size_t, void**)>& post,
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

inline int SendPlan(const Api& a, void* send, const std::vector<Message>& plan, uint64_t seed) {
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

inline int RecvPlan(const Api& a, void* recv, const std::vector<Message>& plan, uint64_t seed) {
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

inline int RunSender(const char* handle, const SenderRole& role) {
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
inline pid_t SpawnSender(const char* handle, const SenderRole& role) {
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

// Connects with `h` until the connect fails or returns a comm (the listener driven
// meanwhile); the result.
inline ncclResult_t ConnectUntilDecided(const Api& a, void* listen, char* h, void** send) {
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

  // The listener still serves a real sender; then, closed, its handle is refused (a
  // listener that is gone: its port refuses).
  void ExpectServesThenRefuses() {
    void *good_send = nullptr, *good_recv = nullptr;
    ASSERT_TRUE(Pair(a, handle, listen, &good_send, &good_recv));
    EXPECT_EQ(a.close_send(good_send), ncclSuccess);
    EXPECT_EQ(a.close_recv(good_recv), ncclSuccess);
    EXPECT_EQ(a.close_listen(listen), ncclSuccess);
    listen = nullptr;
    void* send = nullptr;
    EXPECT_EQ(ConnectUntilDecided(a, nullptr, handle, &send), ncclSystemError);
    EXPECT_EQ(send, nullptr);
  }

  Api a;
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  void* listen = nullptr;
};

}  // namespace nccl_plugin_fixture
