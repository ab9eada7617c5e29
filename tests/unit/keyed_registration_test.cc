// Registering by the socket (docs/DESIGN.md, "Registering without a port"): a client of a
// listener without SO_REUSEPORT registers before its SYN with its unbound TCP socket
// handed over instead of a 4-tuple; the listener knows the connection again at accept by
// that socket's inode, as the kernel names the connection's client socket. What is tested
// here: such a registration is taken for its own socket's connection and for no other,
// whoever registers; one without its socket, or with something else in its place, is
// declined; the listener tells its clients whether it is alone on its address; and a
// client learns that only from a connection the listener took.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "core/channel.h"
#include "core/wire.h"
#include "shm/region.h"
#include "shm/shm.h"
#include "tests/unit/rendezvous_helpers.h"

namespace slip::shm {
namespace {

using namespace rendezvous_helpers;  // NOLINT(google-build-using-namespace)

constexpr uint32_t kRing = 4096;

class KeyedRegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Start(/*solo=*/false)); }
  void TearDown() override {
    rv_.reset();
    CloseIf(&listener_);
  }

  bool Start(bool solo) {
    rv_.reset();
    CloseIf(&listener_);
    for (int attempt = 0; attempt < 100; ++attempt) {
      const uint16_t port = RandomPort();
      listener_ = TcpSocket(Addr("127.0.0.1", port), false, /*listen_too=*/true);
      if (listener_ < 0) continue;
      int error = 0;
      rv_ = Rendezvous::Publish(port, InodeOf(listener_), StreamOptions{}, &error, solo);
      if (rv_) {
        dest_ = Addr("127.0.0.1", port);
        server_ep_ = Ep("127.0.0.1", port);
        return true;
      }
      CloseIf(&listener_);
    }
    return false;
  }

  // An unbound TCP socket, as a client has it before connect().
  static int UnboundSocket() { return socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); }

  // What the unbound socket's registration names as its client end: no port.
  static wire::Endpoint Portless() { return Ep("0.0.0.0", 0); }

  // Registers `offer` (prepared here) with `client` and `fifth` as the fifth descriptor
  // (-1: four), lets the rendezvous read it, and returns the answer.
  Answer Register(Offer* offer, const wire::Endpoint& client, int fifth) {
    Answer a;
    const int sock = FindRendezvous(Sa(dest_));
    if (sock < 0) {
      a.find_rc = sock;
      return a;
    }
    int rc = PrepareOffer(kRing, offer);
    if (rc == 0) rc = SendRegister(sock, *offer, client, server_ep_, fifth);
    EXPECT_EQ(rc, 0) << std::strerror(-rc);
    rv_->Drain();
    a = ReadAnswer(sock, kQuietMs);
    answers_.push_back(sock);  // (kept open: closing it would withdraw nothing, but tidy)
    return a;
  }

  // Connects `fd` to the listener; returns its client end.
  wire::Endpoint Connect(int fd) {
    EXPECT_EQ(connect(fd, Sa(dest_), Len(dest_)), 0) << std::strerror(errno);
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len), 0);
    return Ep(local);
  }

  static const RegionHeader& Header(const Offer& offer) {
    return static_cast<RegionControl*>(offer.region)->header;
  }

  ~KeyedRegistrationTest() override {
    for (int fd : answers_) close(fd);
  }

  int listener_ = -1;
  std::unique_ptr<Rendezvous> rv_;
  sockaddr_storage dest_{};
  wire::Endpoint server_ep_;
  std::vector<int> answers_;
};

TEST_F(KeyedRegistrationTest, TakenForItsOwnSocketsConnectionAndNoOther) {
  const int mine = UnboundSocket();
  ASSERT_GE(mine, 0);
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer, Portless(), mine)));

  // Another connection to the same listener (any port, this uid): not this registration.
  const int other = UnboundSocket();
  const wire::Endpoint other_ep = Connect(other);
  Registration reg;
  EXPECT_FALSE(rv_->Take(other_ep, server_ep_, &reg));
  EXPECT_EQ(Header(offer).claim.load(), uint32_t(Claim::kOpen));  // left for its own

  // Its own socket's connection, whatever port connect() picked.
  const wire::Endpoint mine_ep = Connect(mine);
  ASSERT_NE(mine_ep.port, 0);
  ASSERT_TRUE(rv_->Take(mine_ep, server_ep_, &reg));
  EXPECT_EQ(reg.msg.nonce, offer.nonce);
  EXPECT_EQ(reg.msg.fd_count, 5u);
  EXPECT_EQ(reg.client_inode, InodeOf(mine));
  EXPECT_EQ(reg.client_socket, -1);  // (its inode was all the listener kept)
  ASSERT_TRUE(reg.stream);
  ASSERT_TRUE(reg.Commit());
  EXPECT_EQ(Header(offer).claim.load(), uint32_t(Claim::kTaken));
  Registration again;
  EXPECT_FALSE(rv_->Take(mine_ep, server_ep_, &again));
  close(other);
  close(mine);
}

// The listener keeps nothing of the socket: the client's close ends the connection as
// plain TCP's would (a kept reference would hold it open, the server never seeing EOF).
TEST_F(KeyedRegistrationTest, TheSocketHandedOverIsNotKept) {
  const int mine = UnboundSocket();
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer, Portless(), mine)));
  Connect(mine);
  const int accepted = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  close(mine);  // the last reference, unless the listener kept one
  pollfd pfd{accepted, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 2000), 1);
  char byte;
  EXPECT_EQ(recv(accepted, &byte, 1, MSG_DONTWAIT), 0);  // EOF
  close(accepted);
}

// A forger (any uid) can hand over only its own sockets: its registration never matches
// another client's connection, and the real registration next to it is the one taken.
TEST_F(KeyedRegistrationTest, AnotherSocketsRegistrationNeverMatches) {
  const int forger = UnboundSocket();
  const int real = UnboundSocket();
  Offer forged, offer;
  ASSERT_TRUE(IsKept(Register(&forged, Portless(), forger)));
  ASSERT_TRUE(IsKept(Register(&offer, Portless(), real)));
  const wire::Endpoint real_ep = Connect(real);
  Registration reg;
  ASSERT_TRUE(rv_->Take(real_ep, server_ep_, &reg));
  EXPECT_EQ(reg.msg.nonce, offer.nonce);
  EXPECT_EQ(Header(forged).claim.load(), uint32_t(Claim::kOpen));  // untouched: not this one's
  close(forger);
  close(real);
}

TEST_F(KeyedRegistrationTest, NoPortWithoutItsSocketOrWithSomethingElseIsDeclined) {
  {
    Offer offer;  // no port, four descriptors: no way to know the connection
    EXPECT_TRUE(
        IsDecline(Register(&offer, Portless(), -1), offer.nonce, wire::DeclineReason::kBadRegion));
  }
  {
    int pipe_fds[2];
    ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
    Offer offer;  // a pipe where the socket goes
    EXPECT_TRUE(IsDecline(Register(&offer, Portless(), pipe_fds[0]), offer.nonce,
                          wire::DeclineReason::kBadRegion));
    close(pipe_fds[0]);
    close(pipe_fds[1]);
  }
  {
    // A bound port and a fifth descriptor: five where four belong.
    const int bound = UnboundSocket();
    Offer offer;
    EXPECT_TRUE(IsDecline(Register(&offer, Ep("127.0.0.1", 40000), bound), offer.nonce,
                          wire::DeclineReason::kBadRegion));
    close(bound);
  }
}

TEST_F(KeyedRegistrationTest, TheListenerSaysWhetherItIsAloneOnItsAddress) {
  {
    const int fd = UnboundSocket();
    Offer offer;
    ASSERT_TRUE(IsKept(Register(&offer, Portless(), fd)));
    EXPECT_EQ(Header(offer).listener_flags.load(), 0u);  // published as a possible group
    close(fd);
  }
  ASSERT_TRUE(Start(/*solo=*/true));
  const int fd = UnboundSocket();
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer, Portless(), fd)));
  EXPECT_EQ(Header(offer).listener_flags.load(), kListenerSolo);
  close(fd);
  // Shared by forked workers from now on (read in accept() only): said too.
  rv_->Share();
  const int fd2 = UnboundSocket();
  Offer shared;
  const int sock = FindRendezvous(Sa(dest_));
  ASSERT_GE(sock, 0);
  ASSERT_EQ(PrepareOffer(kRing, &shared), 0);
  ASSERT_EQ(SendRegister(sock, shared, Portless(), server_ep_, fd2), 0);
  const wire::Endpoint ep = Connect(fd2);
  Registration reg;
  ASSERT_TRUE(rv_->Take(ep, server_ep_, &reg));  // (read by the accepting process itself)
  EXPECT_EQ(Header(shared).listener_flags.load(), kListenerSolo | kListenerShared);
  close(sock);
  close(fd2);
}

TEST(SoloListenersTest, RemembersRecentListenersOnly) {
  EXPECT_FALSE(IsSoloListener(0));
  NoteSoloListener(0);
  EXPECT_FALSE(IsSoloListener(0));
  const uint64_t base = 0x5010000000ull;
  NoteSoloListener(base);
  EXPECT_TRUE(IsSoloListener(base));
  EXPECT_FALSE(IsSoloListener(base + 1));
  NoteSoloListener(base);  // (noted once)
  for (uint64_t i = 1; i < 64; ++i) NoteSoloListener(base + i);
  EXPECT_TRUE(IsSoloListener(base));  // 64 fit
  NoteSoloListener(base + 64);
  EXPECT_FALSE(IsSoloListener(base));  // the oldest gave way
  EXPECT_TRUE(IsSoloListener(base + 64));
}

}  // namespace
}  // namespace slip::shm
