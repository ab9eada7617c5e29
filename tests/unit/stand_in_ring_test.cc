// Tests for core/stand_in_ring.h: the connection that stands in for a request its listener
// dropped before the TCP connection came. Its client may still send the request's CONFIRM,
// which must never reach the application: it settles the connection, which then moves to
// TCP from byte 0 by the FAILOVER exchange; other bytes make it plain at once. The anchor
// is a real loopback TCP connection; the control thread's part (Settle) is played by the
// test with the clock passed in.
#include "core/stand_in_ring.h"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "core/anchor_path.h"
#include "core/sys.h"
#include "tests/unit/tcp_pair.h"

namespace slip {
namespace {

using Settlement = ChannelControl::Settlement;
using testing::TcpPair;

constexpr RemoteRing::Names kNames = {TransportKind::kFabric, "fabric", "the fabric",
                                      "a write on the fabric failed"};
constexpr uint32_t kRing = 4096;
constexpr uint64_t kNonce = 0x1234abcd5678ef01ull;
constexpr uint64_t kDeadline = 10000;

struct Accepted {
  Accepted() {
    TcpPair(tcp);
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, proxy), 0);
    ring = StandInRing::Create(kNames, kRing, kNonce, kDeadline);
    EXPECT_NE(ring, nullptr);
    ring->SetAnchor(tcp[1]);
    ring->SetProxy(proxy[1]);  // (the ring's from now on)
  }
  ~Accepted() {
    ring.reset();
    close(tcp[0]);
    close(tcp[1]);
    close(proxy[0]);
  }
  int tcp[2] = {-1, -1};  // the client's end, the server's (the anchor)
  int proxy[2] = {-1, -1};
  std::unique_ptr<StandInRing> ring;
};

TEST(StandInRing, IsHeldWithNothingToRead) {
  Accepted a;
  ASSERT_TRUE(a.ring->held());
  EXPECT_EQ(a.ring->kind(), TransportKind::kFabric);
  EXPECT_EQ(a.ring->SettleDeadline(), kDeadline);
  Reason why = Reason::kNone;
  EXPECT_EQ(a.ring->Settle(1000, &why), Settlement::kPending);  // nothing from the client yet
  EXPECT_EQ(a.ring->RxProduced(), 0u);
  EXPECT_FALSE(a.ring->RxEof());
}

TEST(StandInRing, PlainBytesMakeItPlainAsABusyRendezvous) {
  Accepted a;
  ASSERT_EQ(send(a.tcp[0], "GET /", 5, 0), 5);
  testing::WaitFor(a.tcp[1], POLLIN);
  Reason why = Reason::kNone;
  EXPECT_EQ(a.ring->Settle(1000, &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kRendezvousBusy);
  EXPECT_TRUE(a.ring->AnchorCarriesStream());
  EXPECT_FALSE(a.ring->held());
  // The bytes are the application's, from byte 0 on TCP.
  a.ring->OnAnchorReady(EPOLLIN);  // the control thread's look
  ASSERT_EQ(a.ring->RxProduced(), 5u);
  EXPECT_EQ(memcmp(a.ring->RxData(), "GET /", 5), 0);
}

TEST(StandInRing, TheRequestsConfirmMovesItToTcpFromByteZero) {
  Accepted a;
  ASSERT_TRUE(SendConfirm(a.tcp[0], kNonce, kRing, 1000));
  testing::WaitFor(a.tcp[1], POLLIN);
  Reason why = Reason::kNone;
  EXPECT_EQ(a.ring->Settle(1000, &why), Settlement::kSettled);
  // No path of the transport's: settled, it fails over at once, saying it received
  // nothing, and the client's answer (it sent nothing that arrived) puts it on TCP.
  wire::Failover ours;
  ASSERT_TRUE(ReceiveFailover(a.tcp[0], 2000, &ours));
  EXPECT_EQ(ours.received, 0u);
  wire::Failover theirs;
  theirs.received = 0;
  theirs.sent = 0;
  theirs.cause = wire::FailoverCause::kPeerRequest;
  ASSERT_TRUE(SendFailover(a.tcp[0], theirs, 1000));
  testing::WaitFor(a.tcp[1], POLLIN);
  wire::Failover answer;
  ASSERT_TRUE(ReceiveFailover(a.tcp[1], 1000, &answer));
  EXPECT_TRUE(a.ring->OnPeerFailover(answer));
  EXPECT_TRUE(a.ring->AnchorCarriesStream());
  EXPECT_EQ(a.ring->Error(), 0);
}

TEST(StandInRing, AConfirmOfAnotherRequestResets) {
  Accepted a;
  ASSERT_TRUE(SendConfirm(a.tcp[0], kNonce + 1, kRing, 1000));
  testing::WaitFor(a.tcp[1], POLLIN);
  Reason why = Reason::kNone;
  EXPECT_EQ(a.ring->Settle(1000, &why), Settlement::kReset);
  EXPECT_NE(a.ring->Error(), 0);
}

TEST(StandInRing, SilenceUntilTheDeadlineIsPlainBehindTheGate) {
  Accepted a;
  Reason why = Reason::kNone;
  EXPECT_EQ(a.ring->Settle(kDeadline, &why), Settlement::kPlain);
  EXPECT_TRUE(a.ring->AnchorCarriesStream());
  // A late CONFIRM behind the gate is never delivered: it resets the connection.
  ASSERT_TRUE(SendConfirm(a.tcp[0], kNonce, kRing, 1000));
  testing::WaitFor(a.tcp[1], POLLIN);
  a.ring->OnAnchorReady(EPOLLIN);  // the control thread's look
  EXPECT_NE(a.ring->Error(), 0);
}

}  // namespace
}  // namespace slip
