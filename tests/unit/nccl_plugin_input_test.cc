// The NCCL plugin's harness against bad input (tests/unit/nccl_plugin_fixture.h has the
// setting): foreign and malformed handles of every transport, silent connections, a
// foreign HELLO, a double close, registrations of what it cannot serve.
#include <gtest/gtest.h>

#include "tests/unit/nccl_plugin_fixture.h"

namespace {

using namespace nccl_plugin_fixture;  // NOLINT(google-build-using-namespace)

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
  ExpectServesThenRefuses();
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
  ExpectServesThenRefuses();
}

// Anybody who reaches a fabric listener's TCP address can connect and say nothing: 40
// such connections, held open, must not keep a real sender out (the listener keeps 16
// waiting for their REQ, and a newcomer still gets in). The comm then carries messages
// exactly.
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

}  // namespace
