// The NCCL plugin's harness when things end (tests/unit/nccl_plugin_fixture.h has the
// setting): flush where it matters, a send completed before a close, a close with requests
// in flight, a peer killed mid-transfer: an NCCL error, never a crash or a hang.
#include <gtest/gtest.h>

#include "tests/unit/nccl_plugin_fixture.h"

namespace {

using namespace nccl_plugin_fixture;  // NOLINT(google-build-using-namespace)

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
