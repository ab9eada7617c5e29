// Tests for the rendezvous directory (shm/dir_rendezvous.h): names, the endpoints a
// listener publishes, what a handed-over client socket proves, and the listener's side:
// a registration is taken only with its own connection's socket, one whose connection
// another process accepted is declined by the timer-driven look, names are withdrawn when
// the listener is shared, stale names are replaced and live ones left alone, and a client
// trusts only its own uid's and the directory owner's rendezvous.
//
// Everything runs in one network namespace, on loopback: the listener publishes its name
// for 127.0.0.1 explicitly (ReachableEndpoints never offers loopback), and the client uses
// the directory as a client in another namespace would. integration.pods.* runs the same
// across two real namespaces.
#include "shm/dir_rendezvous.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "core/stream.h"
#include "core/wire.h"
#include "shm/region.h"
#include "shm/shm.h"
#include "tests/unit/rendezvous_helpers.h"

namespace slip::shm {
namespace {

using namespace rendezvous_helpers;  // NOLINT(google-build-using-namespace)

constexpr uint32_t kRing = 4096;
constexpr uid_t kNobody = 65534;

std::string NameOf(const char* dir, const wire::Endpoint& ep) {
  char entry[kDirEntryNameMax];
  if (!DirEntryName(ep, entry, sizeof(entry))) return "";
  return std::string(dir) + "/" + entry;
}

TEST(DirEntryNameTest, AddressAndPort) {
  EXPECT_EQ(NameOf("/run/slip", Ep("10.1.2.3", 8080)), "/run/slip/slip3-10.1.2.3-8080");
  EXPECT_EQ(NameOf("/d", Ep("fd00::1", 443)), "/d/slip3-fd00::1-443");
  // A v4-mapped destination is its IPv4 address (the wire's form).
  EXPECT_EQ(NameOf("/d", Ep("::ffff:10.0.0.9", 7)), "/d/slip3-10.0.0.9-7");
  // The longest fits.
  EXPECT_EQ(NameOf("/d", Ep("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535)),
            "/d/slip3-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff-65535");
  wire::Endpoint unknown;  // family 0
  char entry[kDirEntryNameMax];
  EXPECT_FALSE(DirEntryName(unknown, entry, sizeof(entry)));
}

TEST(ReachableEndpointsTest, LoopbackNoneAnAddressItselfAWildcardEveryOtherAddress) {
  wire::Endpoint out[kMaxDirNames];
  EXPECT_EQ(ReachableEndpoints(Ep("127.0.0.1", 80), false, out, kMaxDirNames), 0u);
  EXPECT_EQ(ReachableEndpoints(Ep("::1", 80), false, out, kMaxDirNames), 0u);
  ASSERT_EQ(ReachableEndpoints(Ep("10.9.8.7", 80), false, out, kMaxDirNames), 1u);
  EXPECT_TRUE(out[0] == Ep("10.9.8.7", 80));
  EXPECT_EQ(ReachableEndpoints(Ep("10.9.8.7", 80), false, out, 0), 0u);
  // A wildcard: this host's addresses, never loopback or link-local, each once, the port
  // kept; IPv4 ones only for IPv4 and dual-stack listeners.
  for (const char* any : {"0.0.0.0", "::"}) {
    for (bool v6only : {false, true}) {
      SCOPED_TRACE(std::string(any) + (v6only ? " v6only" : ""));
      const wire::Endpoint local = Ep(any, 4242);
      const size_t n = ReachableEndpoints(local, v6only, out, kMaxDirNames);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(out[i].port, 4242);
        EXPECT_FALSE(out[i].family == 4 && out[i].addr[0] == 127);
        EXPECT_FALSE(out[i].family == 6 && out[i].addr[0] == 0xfe &&
                     (out[i].addr[1] & 0xc0) == 0x80);
        if (local.family == 4 || v6only) {
          EXPECT_EQ(out[i].family, local.family);
        }
        for (size_t k = 0; k < i; ++k) EXPECT_FALSE(out[k] == out[i]);
      }
    }
  }
}

// A TCP socket bound to 127.0.0.1 (the kernel picks the port), not connected.
int BoundSocket(wire::Endpoint* local) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_storage any = Addr("127.0.0.1", 0);
  EXPECT_EQ(bind(fd, Sa(any), Len(any)), 0);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len), 0);
  *local = Ep(ss);
  return fd;
}

TEST(LookAtClientSocketTest, OnlyAConnectedSocketOfTheFourTupleProvesIt) {
  int listener = -1;
  uint16_t port = 0;
  for (int i = 0; i < 100 && listener < 0; ++i) {
    port = RandomPort();
    listener = TcpSocket(Addr("127.0.0.1", port), false, true);
  }
  ASSERT_GE(listener, 0);
  const wire::Endpoint server = Ep("127.0.0.1", port);
  wire::Endpoint client;
  int tcp = BoundSocket(&client);
  EXPECT_EQ(LookAtClientSocket(tcp, client, server), ClientSocket::kConnecting);  // not begun
  const sockaddr_storage dest = Addr("127.0.0.1", port);
  ASSERT_EQ(connect(tcp, Sa(dest), Len(dest)), 0);
  EXPECT_EQ(LookAtClientSocket(tcp, client, server), ClientSocket::kConnected);
  EXPECT_EQ(LookAtClientSocket(tcp, client, Ep("127.0.0.1", uint16_t(port + 1))),
            ClientSocket::kNotIt);
  EXPECT_EQ(LookAtClientSocket(tcp, server, client), ClientSocket::kNotIt);
  // Not a TCP socket at all.
  int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int pipes[2];
  ASSERT_EQ(pipe2(pipes, O_CLOEXEC), 0);
  EXPECT_EQ(LookAtClientSocket(udp, client, server), ClientSocket::kNotIt);
  EXPECT_EQ(LookAtClientSocket(pipes[0], client, server), ClientSocket::kNotIt);
  EXPECT_EQ(LookAtClientSocket(-1, client, server), ClientSocket::kNotIt);
  // Reset by the server: over, not "not begun".
  const int accepted = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  linger hard{1, 0};
  setsockopt(accepted, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  close(accepted);
  pollfd pfd{tcp, POLLIN, 0};
  poll(&pfd, 1, 1000);
  char c;
  EXPECT_LT(recv(tcp, &c, 1, MSG_DONTWAIT), 0);  // ECONNRESET: now CLOSE
  EXPECT_EQ(LookAtClientSocket(tcp, client, server), ClientSocket::kNotIt);
  close(udp);
  close(pipes[0]);
  close(pipes[1]);
  close(tcp);
  close(listener);
}

// A listener on 127.0.0.1 with its rendezvous, published in a directory of its own.
class DirRegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/slip-ut-rdv-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (int attempt = 0; attempt < 100 && !rv_; ++attempt) {
      port_ = RandomPort();
      tcp_ = TcpSocket(Addr("127.0.0.1", port_), false, true);
      if (tcp_ < 0) continue;
      int error = 0;
      rv_ = Rendezvous::Publish(port_, InodeOf(tcp_), StreamOptions{}, &error);
      if (!rv_) CloseIf(&tcp_);
    }
    ASSERT_TRUE(rv_);
    server_ = Ep("127.0.0.1", port_);
    dest_ = Addr("127.0.0.1", port_);
    RendezvousDir dir;
    ASSERT_TRUE(dir.Open(dir_.c_str()));
    ASSERT_EQ(rv_->PublishInDir(dir.get(), &server_, 1), 1u);
    name_ = NameOf(dir_.c_str(), server_);
  }
  void TearDown() override {
    rv_.reset();
    CloseIf(&tcp_);
    unlink(name_.c_str());
    rmdir(dir_.c_str());
  }

  // A client connection registered through the directory.
  struct Client {
    Offer offer;
    wire::Endpoint ep;
    int tcp = -1;   // the connection's socket (bound; connected by Connect())
    int sock = -1;  // its rendezvous connection
    ~Client() {
      CloseIf(&tcp);
      CloseIf(&sock);
    }
  };
  // Registers a new bound socket's 4-tuple; `proof` (-1: the socket itself) is the socket
  // handed over instead.
  std::unique_ptr<Client> Register(int proof = -1, const wire::Endpoint* server = nullptr) {
    auto c = std::make_unique<Client>();
    c->tcp = BoundSocket(&c->ep);
    c->sock = FindDirRendezvous(dir_.c_str(), Sa(dest_));
    EXPECT_GE(c->sock, 0) << std::strerror(-c->sock);
    EXPECT_EQ(PrepareOffer(kRing, &c->offer), 0);
    EXPECT_EQ(SendRegister(c->sock, c->offer, c->ep, server ? *server : server_,
                           proof >= 0 ? proof : c->tcp),
              0);
    return c;
  }
  void Connect(Client* c) {
    ASSERT_EQ(connect(c->tcp, Sa(dest_), Len(dest_)), 0) << std::strerror(errno);
  }
  Claim ClaimOf(const Client& c) {
    return Claim(static_cast<RegionControl*>(c.offer.region)->header.claim.load());
  }

  std::string dir_, name_;
  uint16_t port_ = 0;
  int tcp_ = -1;
  std::unique_ptr<Rendezvous> rv_;
  wire::Endpoint server_;
  sockaddr_storage dest_{};
};

TEST_F(DirRegistrationTest, TheNameIsASocketAnybodyMayConnectTo) {
  struct stat st;
  ASSERT_EQ(stat(name_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u);
}

TEST_F(DirRegistrationTest, ARegistrationWithItsOwnConnectedSocketIsTakenAndAccepted) {
  auto c = Register();
  rv_->Drain();
  EXPECT_TRUE(IsKept(ReadAnswer(c->sock, kQuietMs)));
  Connect(c.get());
  Registration reg;
  ASSERT_TRUE(rv_->Take(c->ep, server_, &reg));
  EXPECT_EQ(reg.msg.fd_count, 5u);
  EXPECT_EQ(reg.client_socket, -1);  // looked at, then let go of
  ASSERT_TRUE(reg.stream);
  ASSERT_TRUE(reg.Commit());
  EXPECT_EQ(ClaimOf(*c), Claim::kTaken);
  EXPECT_TRUE(IsAccept(ReadAnswer(c->sock), c->offer.nonce));
}

TEST_F(DirRegistrationTest, ARegistrationWithAnotherConnectionsSocketIsDropped) {
  wire::Endpoint other;
  const int stranger = BoundSocket(&other);  // bound, so of another 4-tuple
  auto c = Register(stranger);
  rv_->Drain();
  EXPECT_TRUE(IsDecline(ReadAnswer(c->sock), c->offer.nonce, wire::DeclineReason::kBadRegion));
  Connect(c.get());
  Registration reg;
  EXPECT_FALSE(rv_->Take(c->ep, server_, &reg));
  close(stranger);
}

TEST_F(DirRegistrationTest, ARegistrationForAnAddressNotPublishedIsDropped) {
  const wire::Endpoint elsewhere = Ep("127.0.0.1", uint16_t(port_ + 1));
  auto c = Register(-1, &elsewhere);
  rv_->Drain();
  EXPECT_TRUE(IsDecline(ReadAnswer(c->sock), c->offer.nonce, wire::DeclineReason::kBadRegion));
}

TEST_F(DirRegistrationTest, ARegistrationWithoutItsSocketIsDropped) {
  // Four descriptors through the directory: no proof.
  auto c = std::make_unique<Client>();
  c->tcp = BoundSocket(&c->ep);
  c->sock = FindDirRendezvous(dir_.c_str(), Sa(dest_));
  ASSERT_GE(c->sock, 0);
  ASSERT_EQ(PrepareOffer(kRing, &c->offer), 0);
  ASSERT_EQ(SendRegister(c->sock, c->offer, c->ep, server_), 0);
  rv_->Drain();
  EXPECT_TRUE(IsDecline(ReadAnswer(c->sock), c->offer.nonce, wire::DeclineReason::kBadRegion));
}

// Drains as the control thread does when the rendezvous' descriptor is readable, until
// `sock` has an answer or `ms` pass. Returns whether the descriptor woke it.
bool ServeUntilAnswered(Rendezvous* rv, int sock, int ms) {
  bool woken = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    pollfd pfds[2] = {{rv->fd(), POLLIN, 0}, {sock, POLLIN, 0}};
    poll(pfds, 2, 50);
    if (pfds[1].revents) return woken;
    if (pfds[0].revents & POLLIN) {
      woken = true;
      rv->Drain();
    }
  }
  return woken;
}

TEST_F(DirRegistrationTest, AConnectionAcceptedByAnotherProcessIsDeclinedSoon) {
  auto c = Register();
  Connect(c.get());
  rv_->Drain();
  // Accepted plain (another process sharing the port would): nothing here takes it.
  const int accepted = accept4(tcp_, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(ServeUntilAnswered(rv_.get(), c->sock, 3000)) << "the timer never woke us";
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  EXPECT_TRUE(IsDecline(ReadAnswer(c->sock), c->offer.nonce, wire::DeclineReason::kNoRegistration));
  EXPECT_EQ(ClaimOf(*c), Claim::kAbandoned);
  EXPECT_LT(waited.count(), 2000);
  close(accepted);
}

TEST_F(DirRegistrationTest, AConnectionAnsweredByAnotherNamespaceIsDeclinedSoon) {
  // The client's SYN is answered, but by a listener this one's kernel does not see (here:
  // another port of this host, named by the registration as ours).
  int other = -1;
  uint16_t other_port = 0;
  for (int i = 0; i < 100 && other < 0; ++i) {
    other_port = RandomPort();
    other = TcpSocket(Addr("127.0.0.1", other_port), false, true);
  }
  ASSERT_GE(other, 0);
  auto c = Register();
  rv_->Drain();
  const sockaddr_storage elsewhere = Addr("127.0.0.1", other_port);
  ASSERT_EQ(connect(c->tcp, Sa(elsewhere), Len(elsewhere)), 0);
  EXPECT_TRUE(ServeUntilAnswered(rv_.get(), c->sock, 3000));
  EXPECT_TRUE(IsDecline(ReadAnswer(c->sock), c->offer.nonce, wire::DeclineReason::kNoRegistration));
  close(other);
}

TEST_F(DirRegistrationTest, ALingeringClientSocketNeverHoldsTheListener) {
  // A client that fills the server's window, sets SO_LINGER to 30 s and closes its own
  // copy leaves the listener the last reference: a plain close() there would wait 30 s
  // (in accept(), or in the control thread).
  auto c = Register();
  Connect(c.get());
  rv_->Drain();
  ASSERT_TRUE(MakeLingering(c->tcp));
  CloseIf(&c->tcp);
  const auto start = std::chrono::steady_clock::now();
  Registration reg;
  EXPECT_TRUE(rv_->Take(c->ep, server_, &reg));  // (it proves the connection, then lets go)
  reg = Registration();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  EXPECT_LT(took.count(), 2000) << "closing the client's socket waited for its linger";
}

TEST_F(DirRegistrationTest, TheTimerStopsWhenNoRegistrationWaits) {
  auto c = Register();
  Connect(c.get());
  rv_->Drain();
  Registration reg;
  ASSERT_TRUE(rv_->Take(c->ep, server_, &reg));
  ASSERT_TRUE(reg.Commit());
  // One more tick at most (the look that finds nobody waiting disarms it).
  for (int i = 0; i < 3; ++i) {
    pollfd pfd{rv_->fd(), POLLIN, 0};
    if (poll(&pfd, 1, 60) == 1) rv_->Drain();
  }
  pollfd pfd{rv_->fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 100), 0) << "still ticking with nothing to look at";
}

TEST_F(DirRegistrationTest, SharingWithdrawsTheNamesAndTellsQueuedClients) {
  auto held = Register();  // read and held: declined, nobody watches it any more
  rv_->Drain();
  ASSERT_TRUE(IsKept(ReadAnswer(held->sock, kQuietMs)));
  const int queued = FindDirRendezvous(dir_.c_str(), Sa(dest_));
  ASSERT_GE(queued, 0);
  rv_->Share();
  EXPECT_TRUE(
      IsDecline(ReadAnswer(held->sock), held->offer.nonce, wire::DeclineReason::kNoRegistration));
  struct stat st;
  EXPECT_NE(stat(name_.c_str(), &st), 0);
  EXPECT_EQ(FindDirRendezvous(dir_.c_str(), Sa(dest_)), -ENOENT);
  const Answer a = ReadAnswer(queued);
  EXPECT_TRUE(!a.message && a.eof_after) << Describe(a);
  close(queued);
}

TEST_F(DirRegistrationTest, AStaleNameIsReplacedALiveOneLeftAlone) {
  // Live: a second listener's rendezvous for the same address and port does not take it.
  int error = 0;
  const int tcp2 = TcpSocket(Addr("127.0.0.1", 0), false, true);
  auto second = Rendezvous::Publish(PortOf(tcp2), InodeOf(tcp2), StreamOptions{}, &error);
  ASSERT_TRUE(second);
  RendezvousDir dir;
  ASSERT_TRUE(dir.Open(dir_.c_str()));
  EXPECT_EQ(second->PublishInDir(dir.get(), &server_, 1), 0u);
  second.reset();  // (leaves the first one's name)
  const int sock = FindDirRendezvous(dir_.c_str(), Sa(dest_));
  EXPECT_GE(sock, 0) << "the live name was taken away";
  CloseIf(const_cast<int*>(&sock));
  // Stale: the listener died without removing its name.
  rv_.reset();
  const int stale = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un name{};
  name.sun_family = AF_UNIX;
  std::strcpy(name.sun_path, name_.c_str());
  ASSERT_EQ(bind(stale, reinterpret_cast<sockaddr*>(&name), sizeof(name)), 0);
  close(stale);
  EXPECT_EQ(FindDirRendezvous(dir_.c_str(), Sa(dest_)), -ECONNREFUSED);
  rv_ = Rendezvous::Publish(port_, InodeOf(tcp_), StreamOptions{}, &error);
  ASSERT_TRUE(rv_);
  EXPECT_EQ(rv_->PublishInDir(dir.get(), &server_, 1), 1u);
  const int fresh = FindDirRendezvous(dir_.c_str(), Sa(dest_));
  EXPECT_GE(fresh, 0);
  if (fresh >= 0) close(fresh);
  close(tcp2);
}

TEST(DirTrustTest, OnlyOurOwnUidOrTheDirectoryOwnerIsTrusted) {
  EXPECT_TRUE(TrustedInDir(1000, 1000, 0));
  EXPECT_TRUE(TrustedInDir(0, 1000, 0));
  EXPECT_FALSE(TrustedInDir(1001, 1000, 0));
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a child that setuid()s to nobody)";
  char tmpl[] = "/tmp/slip-ut-trust-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  ASSERT_EQ(chmod(tmpl, 01777), 0);  // anybody may create names there
  const wire::Endpoint server = Ep("127.0.0.1", 9);
  const std::string path = NameOf(tmpl, server);
  sockaddr_un name{};
  name.sun_family = AF_UNIX;
  std::strcpy(name.sun_path, path.c_str());
  const socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  const sockaddr_storage dest = Addr("127.0.0.1", 9);
  {
    Squatter squatter;  // nobody, in root's sticky directory: not trusted
    ASSERT_TRUE(squatter.Start(name, len, kNobody));
    EXPECT_EQ(FindDirRendezvous(tmpl, Sa(dest)), -EPERM);
    const Squatter::Report report = squatter.Finish();
    EXPECT_EQ(report.bytes, 0);  // nothing was registered with it
    EXPECT_EQ(report.fds, 0);
  }
  unlink(path.c_str());
  // nobody's own directory: no proof of anything, whoever holds the name (it used to be
  // trusted as its owner's, and nobody received the client's region and TCP socket).
  ASSERT_EQ(chown(tmpl, kNobody, kNobody), 0);
  ASSERT_EQ(chmod(tmpl, 0755), 0);
  {
    Squatter squatter;
    ASSERT_TRUE(squatter.Start(name, len, kNobody));
    EXPECT_EQ(FindDirRendezvous(tmpl, Sa(dest)), -EPERM);
    const Squatter::Report report = squatter.Finish();
    EXPECT_EQ(report.accepted, 0) << "an untrusted directory's name was connected to";
    EXPECT_EQ(report.fds, 0);
  }
  unlink(path.c_str());
  rmdir(tmpl);
}

}  // namespace
}  // namespace slip::shm
