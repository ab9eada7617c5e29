// Tests for the shm rendezvous and registration: publishing and finding the abstract socket
// of a listener, REGISTER/CANCEL over it with their descriptors, robustness against
// malformed messages (no crash, no leaked descriptor), and AcceptRegistration's checks.
//
// Abstract socket names are shared by everything in the network namespace, so every test
// publishes on a port of its own, chosen at random and retried while the name is taken.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/channel.h"
#include "core/wire.h"
#include "shm/region.h"
#include "shm/shm.h"

namespace slip::shm {
namespace {

constexpr uint32_t kRing = 4096;

sockaddr_in V4(const char* addr, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, addr, &sa.sin_addr);
  return sa;
}

sockaddr_in6 V6(const char* addr, uint16_t port) {
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_port = htons(port);
  inet_pton(AF_INET6, addr, &sa.sin6_addr);
  return sa;
}

const sockaddr* Sa(const sockaddr_in& sa) {
  return reinterpret_cast<const sockaddr*>(&sa);
}
const sockaddr* Sa(const sockaddr_in6& sa) {
  return reinterpret_cast<const sockaddr*>(&sa);
}

wire::Endpoint Ep(const sockaddr_in& sa) {
  wire::Endpoint ep;
  EXPECT_TRUE(wire::EndpointFromSockaddr(Sa(sa), &ep));
  return ep;
}

int CountOpenFds() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

bool IsSocket(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

uint16_t RandomPort() {
  static std::mt19937 rng(std::random_device{}());
  return uint16_t(std::uniform_int_distribution<int>(20000, 60999)(rng));
}

// Publishes a rendezvous for `family_addr` (an address for V4 or V6) on a free random port.
template <typename MakeAddr>
std::unique_ptr<Rendezvous> PublishOnFreePort(MakeAddr make, bool v6only, uint16_t* port) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    *port = RandomPort();
    auto local = make(*port);
    int error = 0;
    auto rv = Rendezvous::Publish(Sa(local), v6only, &error);
    if (rv) return rv;
    EXPECT_EQ(error, -EADDRINUSE);
  }
  ADD_FAILURE() << "no free rendezvous name";
  return nullptr;
}

std::unique_ptr<Rendezvous> PublishV4(const char* addr, uint16_t* port) {
  return PublishOnFreePort([addr](uint16_t p) { return V4(addr, p); }, false, port);
}

// A datagram on a connected rendezvous socket, with `nfds` descriptors attached.
ssize_t SendRaw(int sock, const void* data, size_t len, const int* fds, int nfds) {
  iovec iov{const_cast<void*>(data), len};
  std::vector<char> control(CMSG_SPACE(size_t(nfds) * sizeof(int)), 0);
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds > 0) {
    mh.msg_control = control.data();
    mh.msg_controllen = control.size();
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(size_t(nfds) * sizeof(int));
    std::memcpy(CMSG_DATA(cm), fds, size_t(nfds) * sizeof(int));
  }
  return sendmsg(sock, &mh, MSG_NOSIGNAL);
}

std::vector<uint8_t> Encode(const wire::Message& msg) {
  std::vector<uint8_t> buf(wire::kMaxMessageSize);
  buf.resize(wire::EncodeMessage(msg, buf.data(), buf.size()));
  EXPECT_FALSE(buf.empty());
  return buf;
}

// ---------------------------------------------------------------------------- finding

TEST(RendezvousTest, PublishedExactNameIsFound) {
  uint16_t port;
  auto rv = PublishV4("127.0.0.1", &port);
  ASSERT_TRUE(rv);
  EXPECT_GE(rv->fd(), 0);
  auto dest = V4("127.0.0.1", port);
  int sock = FindRendezvous(Sa(dest));
  ASSERT_GE(sock, 0) << std::strerror(-sock);
  EXPECT_TRUE(IsSocket(sock));
  EXPECT_TRUE(fcntl(sock, F_GETFD) & FD_CLOEXEC);
  close(sock);
  // Another port, another address of the same port: no rendezvous.
  auto other_port = V4("127.0.0.1", uint16_t(port == 60999 ? port - 1 : port + 1));
  EXPECT_EQ(FindRendezvous(Sa(other_port)), -ECONNREFUSED);
  auto other_addr = V4("127.0.0.2", port);
  EXPECT_EQ(FindRendezvous(Sa(other_addr)), -ECONNREFUSED);
}

TEST(RendezvousTest, NothingPublishedMeansRefusedAndNoLeak) {
  const int before = CountOpenFds();
  for (int i = 0; i < 20; ++i) {
    auto dest = V4("127.0.0.1", RandomPort());
    int sock = FindRendezvous(Sa(dest));
    if (sock >= 0) close(sock);  // someone else's listener on that port: fine
  }
  EXPECT_EQ(CountOpenFds(), before);
  sockaddr_un unix_addr{};
  unix_addr.sun_family = AF_UNIX;
  EXPECT_EQ(FindRendezvous(reinterpret_cast<const sockaddr*>(&unix_addr)), -EAFNOSUPPORT);
}

TEST(RendezvousTest, SecondPublishOfTheSameNameFails) {
  uint16_t port;
  auto first = PublishV4("127.0.0.1", &port);
  ASSERT_TRUE(first);
  auto local = V4("127.0.0.1", port);
  int error = 0;
  EXPECT_EQ(Rendezvous::Publish(Sa(local), false, &error), nullptr);
  EXPECT_EQ(error, -EADDRINUSE);
  // Another scope of the same port is another name.
  auto any = V4("0.0.0.0", port);
  error = 0;
  auto wildcard = Rendezvous::Publish(Sa(any), false, &error);
  EXPECT_TRUE(wildcard) << std::strerror(-error);
  // Once the first is gone, its name can be published again.
  first.reset();
  auto again = Rendezvous::Publish(Sa(local), false, &error);
  EXPECT_TRUE(again) << std::strerror(-error);
}

// A REGISTER sent through the socket FindRendezvous returns ends up in `rv`'s table.
::testing::AssertionResult ReachesRendezvous(const sockaddr* dest, uint16_t port, Rendezvous* rv) {
  int sock = FindRendezvous(dest);
  if (sock < 0) return ::testing::AssertionFailure() << "not found: " << std::strerror(-sock);
  Offer offer;
  if (PrepareOffer(kRing, &offer) != 0) return ::testing::AssertionFailure() << "PrepareOffer";
  auto client = Ep(V4("127.0.0.1", 40001));
  auto server = Ep(V4("127.0.0.1", port));
  int rc = SendRegister(sock, offer, client, server);
  close(sock);
  if (rc != 0) return ::testing::AssertionFailure() << "SendRegister: " << std::strerror(-rc);
  std::vector<Registration> regs;
  size_t n = rv->Take(client, server, &regs);
  if (n != 1) return ::testing::AssertionFailure() << "Take found " << n;
  return ::testing::AssertionSuccess();
}

TEST(RendezvousTest, WildcardListenerIsFoundByASpecificDestination) {
  uint16_t port;
  auto rv = PublishV4("0.0.0.0", &port);
  ASSERT_TRUE(rv);
  auto loopback = V4("127.0.0.1", port);
  EXPECT_TRUE(ReachesRendezvous(Sa(loopback), port, rv.get()));
  auto other = V4("127.0.0.2", port);
  EXPECT_TRUE(ReachesRendezvous(Sa(other), port, rv.get()));
  // A client that speaks IPv6 with a v4-mapped address reaches the IPv4 wildcard too.
  auto mapped = V6("::ffff:127.0.0.1", port);
  EXPECT_TRUE(ReachesRendezvous(Sa(mapped), port, rv.get()));
}

TEST(RendezvousTest, ExactListenerIsPreferredOverTheWildcard) {
  uint16_t port;
  auto wildcard = PublishV4("0.0.0.0", &port);
  ASSERT_TRUE(wildcard);
  auto local = V4("127.0.0.1", port);
  int error = 0;
  auto exact = Rendezvous::Publish(Sa(local), false, &error);
  ASSERT_TRUE(exact) << std::strerror(-error);
  EXPECT_TRUE(ReachesRendezvous(Sa(local), port, exact.get()));
  std::vector<Registration> regs;
  EXPECT_EQ(wildcard->Take(Ep(V4("127.0.0.1", 40001)), Ep(local), &regs), 0u);
}

TEST(RendezvousTest, DualStackWildcardServesIpv4ButV6OnlyDoesNot) {
  uint16_t port;
  auto dual = PublishOnFreePort([](uint16_t p) { return V6("::", p); }, /*v6only=*/false, &port);
  ASSERT_TRUE(dual);
  auto v4 = V4("127.0.0.1", port);
  EXPECT_TRUE(ReachesRendezvous(Sa(v4), port, dual.get()));
  dual.reset();

  auto v6only = PublishOnFreePort([](uint16_t p) { return V6("::", p); }, /*v6only=*/true, &port);
  ASSERT_TRUE(v6only);
  auto v4_again = V4("127.0.0.1", port);
  EXPECT_EQ(FindRendezvous(Sa(v4_again)), -ECONNREFUSED);
  auto v6 = V6("::1", port);
  int sock = FindRendezvous(Sa(v6));
  EXPECT_GE(sock, 0);
  if (sock >= 0) close(sock);
}

// ---------------------------------------------------------------------------- registering

class RendezvousRegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rv_ = PublishV4("127.0.0.1", &port_);
    ASSERT_TRUE(rv_);
    server_ = Ep(V4("127.0.0.1", port_));
    client_ = Ep(V4("127.0.0.1", 40000));
  }

  int Connect() {
    auto dest = V4("127.0.0.1", port_);
    int sock = FindRendezvous(Sa(dest));
    EXPECT_GE(sock, 0) << std::strerror(-sock);
    return sock;
  }

  // Registers `offer` for (client_, server_) and takes the registration back out.
  ::testing::AssertionResult RegisterAndTake(Offer* offer, Registration* out) {
    if (int rc = PrepareOffer(kRing, offer); rc != 0)
      return ::testing::AssertionFailure() << "PrepareOffer: " << std::strerror(-rc);
    int sock = Connect();
    if (sock < 0) return ::testing::AssertionFailure() << "no rendezvous";
    int rc = SendRegister(sock, *offer, client_, server_);
    close(sock);
    if (rc != 0) return ::testing::AssertionFailure() << "SendRegister: " << std::strerror(-rc);
    std::vector<Registration> regs;
    if (size_t n = rv_->Take(client_, server_, &regs); n != 1)
      return ::testing::AssertionFailure() << "Take found " << n;
    *out = std::move(regs[0]);
    return ::testing::AssertionSuccess();
  }

  wire::Confirm ConfirmFor(const Offer& offer) {
    wire::Confirm confirm;
    confirm.nonce = offer.nonce;
    confirm.ring_size = offer.ring_size;
    return confirm;
  }

  // AcceptRegistration must refuse `reg` with `want`, leaving the out-parameters alone.
  void ExpectRejected(Registration* reg, const wire::Confirm& confirm, wire::DeclineReason want) {
    int a = -1, b = -1;
    wire::DeclineReason reason = wire::DeclineReason::kUnspecified;
    std::unique_ptr<Channel> channel = AcceptRegistration(reg, confirm, &a, &b, &reason);
    EXPECT_FALSE(channel) << "accepted";
    EXPECT_EQ(int(reason), int(want));
    EXPECT_EQ(a, -1);
    EXPECT_EQ(b, -1);
  }

  uint16_t port_ = 0;
  std::unique_ptr<Rendezvous> rv_;
  wire::Endpoint client_, server_;
};

TEST_F(RendezvousRegistrationTest, RegisterThenTakeReturnsItWithItsDescriptors) {
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRegister(sock, offer, client_, server_), 0);
  close(sock);

  std::vector<Registration> regs;
  auto other_client = Ep(V4("127.0.0.1", 40002));
  EXPECT_EQ(rv_->Take(other_client, server_, &regs), 0u);
  auto other_server = Ep(V4("127.0.0.1", uint16_t(port_ + 1)));
  EXPECT_EQ(rv_->Take(client_, other_server, &regs), 0u);
  EXPECT_TRUE(regs.empty());

  ASSERT_EQ(rv_->Take(client_, server_, &regs), 1u);
  ASSERT_EQ(regs.size(), 1u);
  const Registration& reg = regs[0];
  EXPECT_TRUE(reg.msg.client == client_);
  EXPECT_TRUE(reg.msg.server == server_);
  EXPECT_EQ(reg.msg.nonce, offer.nonce);
  EXPECT_EQ(reg.msg.ring_size, kRing);
  EXPECT_EQ(reg.msg.fd_count, 4u);
  EXPECT_EQ(reg.msg.region_size, RegionSize(kRing));
  EXPECT_EQ(ReadClaim(const_cast<Registration*>(&reg)), Claim::kOpen);
  struct stat st;
  ASSERT_EQ(fstat(reg.fds[0], &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(uint64_t(st.st_size), RegionSize(kRing));
  for (int i = 0; i < 4; ++i) {
    EXPECT_GE(reg.fds[i], 0) << i;
    EXPECT_TRUE(fcntl(reg.fds[i], F_GETFD) & FD_CLOEXEC) << i;
    if (i > 0) {
      EXPECT_TRUE(IsSocket(reg.fds[i])) << i;
    }
  }
  // Taken out: not found twice.
  std::vector<Registration> again;
  EXPECT_EQ(rv_->Take(client_, server_, &again), 0u);
}

TEST_F(RendezvousRegistrationTest, TakenRegistrationCarriesAWorkingConnection) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  int server_a = -1, server_b = -1;
  wire::DeclineReason reason;
  auto server = AcceptRegistration(&reg, ConfirmFor(offer), &server_a, &server_b, &reason);
  ASSERT_TRUE(server) << "reason " << int(reason);
  EXPECT_TRUE(IsSocket(server_a));
  EXPECT_TRUE(IsSocket(server_b));
  int client_a = -1, client_b = -1;
  auto client = MakeClientChannel(&offer, &client_a, &client_b);
  ASSERT_TRUE(client);
  ASSERT_EQ(client->ring_size(), kRing);
  ASSERT_EQ(server->ring_size(), kRing);

  // Each side's sending ring is the other's receiving ring, through the two mappings.
  const char up[] = "client to server";
  client->TxCopy(0, up, sizeof(up));
  client->TxPublish(sizeof(up));
  ASSERT_EQ(server->RxProduced(), sizeof(up));
  EXPECT_EQ(std::memcmp(server->RxData(), up, sizeof(up)), 0);
  server->RxConsumed(sizeof(up));
  EXPECT_EQ(client->TxConsumed(), sizeof(up));
  const char down[] = "server to client";
  server->TxCopy(0, down, sizeof(down));
  server->TxPublish(sizeof(down));
  ASSERT_EQ(client->RxProduced(), sizeof(down));
  EXPECT_EQ(std::memcmp(client->RxData(), down, sizeof(down)), 0);
  EXPECT_FALSE(client->RxEof());
  server->CloseTx();
  EXPECT_TRUE(client->RxEof());
  EXPECT_FALSE(server->TxPeerClosed());
  client->CloseRx();
  EXPECT_TRUE(server->TxPeerClosed());
  for (int fd : {server_a, server_b, client_a, client_b}) close(fd);
}

// The claim word decides, once, whether a registered connection's CONFIRM comes: whichever
// end moves it first. (The storm bug: a server that gave up waiting, and a client that
// confirmed a moment later, put a CONFIRM in front of a plain application.)
TEST_F(RendezvousRegistrationTest, ServerThatGaveUpFirstKeepsTheClientFromConfirming) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  EXPECT_EQ(ReadClaim(&reg), Claim::kOpen);
  EXPECT_EQ(Abandon(&reg), Claim::kAbandoned);
  EXPECT_FALSE(ClaimConfirm(&offer));  // the client must send nothing of ours now
  EXPECT_EQ(ReadClaim(&reg), Claim::kAbandoned);
  EXPECT_EQ(Abandon(&reg), Claim::kAbandoned);  // and it stays so
}

TEST_F(RendezvousRegistrationTest, ClientThatConfirmedFirstKeepsTheServerWaiting) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  EXPECT_TRUE(ClaimConfirm(&offer));
  EXPECT_EQ(Abandon(&reg), Claim::kConfirmed);  // the CONFIRM is on its way: wait for it
  EXPECT_EQ(ReadClaim(&reg), Claim::kConfirmed);
  EXPECT_TRUE(ClaimConfirm(&offer));
}

TEST_F(RendezvousRegistrationTest, WithdrawalIsSeenByTheServer) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  ClaimWithdraw(&offer);
  EXPECT_EQ(ReadClaim(&reg), Claim::kWithdrawn);
  EXPECT_EQ(Abandon(&reg), Claim::kWithdrawn);
  EXPECT_FALSE(ClaimConfirm(&offer));
}

TEST_F(RendezvousRegistrationTest, ClaimSurvivesMovingTheRegistration) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  EXPECT_EQ(ReadClaim(&reg), Claim::kOpen);  // maps the header page
  Registration moved(std::move(reg));
  EXPECT_EQ(moved.header != nullptr, true);
  EXPECT_EQ(reg.header, nullptr);
  EXPECT_TRUE(ClaimConfirm(&offer));
  EXPECT_EQ(ReadClaim(&moved), Claim::kConfirmed);
  Registration assigned;
  assigned = std::move(moved);
  EXPECT_EQ(Abandon(&assigned), Claim::kConfirmed);
}

TEST_F(RendezvousRegistrationTest, AnUnsealedRegionIsNeverMappedAndGivenUpAtTheDeadline) {
  // A region the client could still shrink is never mapped (a SIGBUS in the server): no
  // Slipstream client builds one. It settles nothing: the server waits for the first bytes
  // as for any registration (a forger's must not make it go plain early) and gives it up.
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  int plain = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(ftruncate(plain, off_t(RegionSize(kRing))), 0);
  close(reg.fds[0]);
  reg.fds[0] = plain;
  EXPECT_EQ(ReadClaim(&reg), Claim::kOpen);
  EXPECT_EQ(reg.header, nullptr);
  EXPECT_EQ(Abandon(&reg), Claim::kAbandoned);
}

TEST_F(RendezvousRegistrationTest, RegistrationWrittenAfterAnEarlierDrainIsFound) {
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  int sock = Connect();
  ASSERT_GE(sock, 0);
  rv_->Drain();  // accepts the connection before anything was written on it
  ASSERT_EQ(SendRegister(sock, offer, client_, server_), 0);
  std::vector<Registration> regs;
  EXPECT_EQ(rv_->Take(client_, server_, &regs), 1u);
  close(sock);
}

TEST_F(RendezvousRegistrationTest, MalformedMessagesAreDroppedWithoutLeaks) {
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  wire::Message reg_msg;
  reg_msg.type = wire::Type::kRegister;
  reg_msg.reg = wire::Register();
  reg_msg.reg.client = client_;
  reg_msg.reg.server = server_;
  reg_msg.reg.nonce = offer.nonce;
  reg_msg.reg.ring_size = kRing;
  reg_msg.reg.fd_count = 4;
  reg_msg.reg.region_size = RegionSize(kRing);
  const std::vector<uint8_t> good = Encode(reg_msg);
  wire::Message cancel_msg;
  cancel_msg.type = wire::Type::kCancel;
  cancel_msg.cancel = wire::Cancel();
  cancel_msg.cancel.client = client_;
  cancel_msg.cancel.server = server_;
  cancel_msg.cancel.nonce = offer.nonce;
  const std::vector<uint8_t> cancel = Encode(cancel_msg);
  std::vector<uint8_t> bad_crc = good;
  bad_crc[20] ^= 1;
  const std::vector<uint8_t> garbage = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P'};
  std::vector<uint8_t> truncated(good.begin(), good.begin() + 20);
  std::vector<uint8_t> trailing = good;
  trailing.push_back(0);

  const int fds[10] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b, offer.memfd,
                       offer.memfd, offer.memfd,    offer.memfd,    offer.memfd,    offer.memfd};
  struct Case {
    const char* what;
    const std::vector<uint8_t>* bytes;
    int nfds;
  };
  const Case cases[] = {
      {"garbage", &garbage, 0},
      {"garbage with descriptors", &garbage, 4},
      {"bad checksum with descriptors", &bad_crc, 4},
      {"truncated with descriptors", &truncated, 4},
      {"trailing byte with descriptors", &trailing, 4},
      {"REGISTER without descriptors", &good, 0},
      {"REGISTER with 1 descriptor", &good, 1},
      {"REGISTER with 3 descriptors", &good, 3},
      {"REGISTER with 5 descriptors", &good, 5},
      {"REGISTER with 8 descriptors", &good, 8},
      {"REGISTER with 10 descriptors", &good, 10},
      {"CANCEL with descriptors", &cancel, 4},
      {"CANCEL (no longer used)", &cancel, 0},
  };
  // The first drop may log: let the log open whatever it opens before counting.
  {
    int sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRaw(sock, garbage.data(), garbage.size(), fds, 2), ssize_t(garbage.size()));
    close(sock);
    rv_->Drain();
  }
  const int before = CountOpenFds();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    int sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRaw(sock, c.bytes->data(), c.bytes->size(), fds, c.nfds),
              ssize_t(c.bytes->size()))
        << std::strerror(errno);
    close(sock);
    rv_->Drain();
    std::vector<Registration> regs;
    EXPECT_EQ(rv_->Take(client_, server_, &regs), 0u);
    EXPECT_EQ(CountOpenFds(), before) << "descriptors leaked";
  }
  // A connection that closes without a word, and one that stays silent.
  int silent = Connect();
  ASSERT_GE(silent, 0);
  close(Connect());
  rv_->Drain();
  EXPECT_EQ(CountOpenFds(), before + 2);  // `silent` and the rendezvous' end of it
  close(silent);
  rv_->Drain();
  EXPECT_EQ(CountOpenFds(), before);
  // Still serving: a well-formed registration goes through.
  int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRegister(sock, offer, client_, server_), 0);
  close(sock);
  std::vector<Registration> regs;
  EXPECT_EQ(rv_->Take(client_, server_, &regs), 1u);
}

// ---------------------------------------------------------------------------- accepting

TEST_F(RendezvousRegistrationTest, AcceptRejectsAWrongNonce) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  wire::Confirm confirm = ConfirmFor(offer);
  confirm.nonce ^= 0x100;
  ExpectRejected(&reg, confirm, wire::DeclineReason::kNonceMismatch);
  // Still usable with the right one: the rejection left the descriptors in place.
  int a = -1, b = -1;
  wire::DeclineReason reason;
  EXPECT_TRUE(AcceptRegistration(&reg, ConfirmFor(offer), &a, &b, &reason));
  close(a);
  close(b);
}

TEST_F(RendezvousRegistrationTest, AcceptRejectsARingSizeOtherThanConfirmed) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  wire::Confirm confirm = ConfirmFor(offer);
  confirm.ring_size = 2 * kRing;
  ExpectRejected(&reg, confirm, wire::DeclineReason::kBadRegion);
}

// Puts in place of the registration's region a copy of `size` bytes (its header included
// where it fits), sealed against resizing as a well-behaved client's would be.
void ReplaceRegion(Registration* reg, off_t size) {
  int fd = memfd_create("wrong-size", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, size), 0);
  char page[kControlPage];
  ssize_t n = pread(reg->fds[0], page, std::min<size_t>(sizeof(page), size_t(size)), 0);
  ASSERT_GE(n, 0);
  ASSERT_EQ(pwrite(fd, page, size_t(n), 0), n);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  close(reg->fds[0]);
  reg->fds[0] = fd;
}

TEST_F(RendezvousRegistrationTest, AcceptRejectsARegionSizeThatDoesNotFitTheRing) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  reg.msg.region_size = RegionSize(kRing) + 4096;
  ASSERT_NO_FATAL_FAILURE(ReplaceRegion(&reg, off_t(reg.msg.region_size)));  // the file agrees
  ExpectRejected(&reg, ConfirmFor(offer), wire::DeclineReason::kBadRegion);
}

TEST_F(RendezvousRegistrationTest, AcceptRejectsAMemfdOfTheWrongSize) {
  for (off_t size : {off_t(RegionSize(kRing) - 4096), off_t(RegionSize(kRing) + 4096), off_t(0)}) {
    SCOPED_TRACE(size);
    Offer offer;
    Registration reg;
    ASSERT_TRUE(RegisterAndTake(&offer, &reg));
    ASSERT_NO_FATAL_FAILURE(ReplaceRegion(&reg, size));
    ExpectRejected(&reg, ConfirmFor(offer), wire::DeclineReason::kBadRegion);
  }
}

TEST_F(RendezvousRegistrationTest, AcceptRejectsARegionWithoutTheRightHeader) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  auto* header = static_cast<RegionHeader*>(offer.region);
  header->magic ^= 1;
  ExpectRejected(&reg, ConfirmFor(offer), wire::DeclineReason::kBadRegion);
  header->magic ^= 1;
  header->nonce ^= 1;
  ExpectRejected(&reg, ConfirmFor(offer), wire::DeclineReason::kBadRegion);
  header->nonce ^= 1;
  header->ring_size = 2 * kRing;
  ExpectRejected(&reg, ConfirmFor(offer), wire::DeclineReason::kBadRegion);
}

TEST_F(RendezvousRegistrationTest, AcceptRejectsANonSocketInEveryProxySlot) {
  for (int slot = 1; slot < 4; ++slot) {
    SCOPED_TRACE("slot " + std::to_string(slot));
    Offer offer;
    Registration reg;
    ASSERT_TRUE(RegisterAndTake(&offer, &reg));
    int pipe_fds[2];
    ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
    close(pipe_fds[1]);
    close(reg.fds[slot]);
    reg.fds[slot] = pipe_fds[0];
    ExpectRejected(&reg, ConfirmFor(offer), wire::DeclineReason::kBadRegion);
  }
}

TEST_F(RendezvousRegistrationTest, AcceptRejectsASocketInTheRegionSlot) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(sock, 0);
  close(reg.fds[0]);
  reg.fds[0] = sock;
  ExpectRejected(&reg, ConfirmFor(offer), wire::DeclineReason::kBadRegion);
}

// The region is a file the client also holds: if it can shrink the file after the server
// mapped it, the server's next access to the rings dies of SIGBUS. The server must be safe
// from that (e.g. by requiring F_SEAL_SHRINK on the memfd). Run in a child process.
TEST_F(RendezvousRegistrationTest, ShrinkingTheRegionAfterAcceptCannotKillTheServer) {
  Offer offer;
  Registration reg;
  ASSERT_TRUE(RegisterAndTake(&offer, &reg));
  int a = -1, b = -1;
  wire::DeclineReason reason;
  std::unique_ptr<Channel> server = AcceptRegistration(&reg, ConfirmFor(offer), &a, &b, &reason);
  ASSERT_TRUE(server) << "reason " << int(reason);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = ftruncate(offer.memfd, 0);  // the client's copy of the memfd; may be refused
    (void)rc;
    volatile uint64_t produced = server->RxProduced();  // the server reads its control page
    volatile uint8_t first = server->RxData()[0];       // and its ring
    (void)produced;
    (void)first;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the server side died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  close(a);
  close(b);
}

TEST_F(RendezvousRegistrationTest, RejectedRegistrationsLeakNothing) {
  const int before = CountOpenFds();
  {
    Offer offer;
    Registration reg;
    ASSERT_TRUE(RegisterAndTake(&offer, &reg));
    wire::Confirm confirm = ConfirmFor(offer);
    confirm.nonce ^= 1;
    ExpectRejected(&reg, confirm, wire::DeclineReason::kNonceMismatch);
  }
  EXPECT_EQ(CountOpenFds(), before);
}

}  // namespace
}  // namespace slip::shm
