// The NCCL plugin's harness (tests/unit/nccl_plugin_fixture.h has the setting): the tables
// it exports, its properties, transfers of random sizes in separate processes, grouped
// receives, a ring all-reduce of four ranks, comms driven from many threads, and the
// sender that SpawnSender executes.
#include <gtest/gtest.h>

#include "tests/unit/nccl_plugin_fixture.h"

namespace {

using namespace nccl_plugin_fixture;  // NOLINT(google-build-using-namespace)

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

// Over fabric (nccl_plugin.fabric_*), loading libfabric installs PSM's handlers, and
// opening the first endpoint shm's: the training process's signals must stay its own,
// whatever ran before this test.
TEST_F(NcclPlugin, ApplicationSignalsStayItsOwn) {
  ASSERT_NE(P().v11, nullptr);
  void* send = nullptr;
  void* recv = nullptr;
  ASSERT_TRUE(Pair(a, handle, listen, &send, &recv));
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &TestSigterm);
  EXPECT_EQ(a.close_send(send), ncclSuccess);
  EXPECT_EQ(a.close_recv(recv), ncclSuccess);
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

}  // namespace
