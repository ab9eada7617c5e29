// Tests for AcceptRegistration's checks of everything the peer hands over in a REGISTER:
// ring and region sizes, the memfd (its size, its seals, its kind), the proxy pair (sockets
// of one pair), the header against the message, and a header snapshotted once.
#include <gtest/gtest.h>

#include "tests/unit/rendezvous_fixture.h"

namespace slip::shm {
namespace {

using namespace rendezvous_fixture;  // NOLINT(google-build-using-namespace)

// ---------------------------------------------------------------------------- AcceptRegistration

// What a REGISTER carries, as the listener receives it: duplicates of the offer's memfd,
// the server's proxy pair and the client's B.
class RendezvousAcceptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WarmUpNetlink();
    before_ = CountOpenFds();
    Fresh();
  }
  void TearDown() override {
    for (int& fd : fds_) CloseIf(&fd);
    offer_.reset();
    EXPECT_EQ(CountOpenFds(), before_) << "descriptors leaked";
  }

  // A new offer and what its REGISTER carries (after checking that the last left nothing).
  void Fresh() {
    for (int& fd : fds_) CloseIf(&fd);
    offer_.reset();
    EXPECT_EQ(CountOpenFds(), before_) << "descriptors leaked";
    offer_ = std::make_unique<Offer>();
    ASSERT_EQ(PrepareOffer(kRing, offer_.get()), 0);
    msg_ = RegisterFor(*offer_, Ep("127.0.0.1", 40000), Ep("127.0.0.1", 5201));
    const int carried[4] = {offer_->memfd, offer_->server_a, offer_->server_b, offer_->client_b};
    for (int i = 0; i < 4; ++i) {
      fds_[i] = fcntl(carried[i], F_DUPFD_CLOEXEC, 0);
      ASSERT_GE(fds_[i], 0);
    }
  }

  // Replaces slot `i` with `fd` (closing what was there).
  void Replace(int i, int fd) {
    ASSERT_GE(fd, 0);
    CloseIf(&fds_[i]);
    fds_[i] = fd;
  }

  // AcceptRegistration must refuse, closing everything it was given.
  void ExpectRejected(wire::DeclineReason want = wire::DeclineReason::kBadRegion) {
    int given[4];
    std::copy(fds_, fds_ + 4, given);
    const int count = CountOpenFds();
    int a = -1, b = -1;
    std::atomic<uint32_t>* claim = nullptr;
    wire::DeclineReason reason = wire::DeclineReason::kUnspecified;
    std::unique_ptr<Channel> channel = AcceptRegistration(msg_, fds_, -1, &a, &b, &claim, &reason);
    EXPECT_FALSE(channel) << "accepted";
    EXPECT_EQ(reason, want);
    EXPECT_EQ(a, -1);
    EXPECT_EQ(b, -1);
    EXPECT_EQ(claim, nullptr);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(fds_[i], -1) << i;
      EXPECT_FALSE(IsOpen(given[i])) << "slot " << i << " not closed";
    }
    EXPECT_EQ(CountOpenFds(), count - 4);
  }

  // A sealed memfd of `size` bytes, with the offer's header where it fits.
  int SealedCopy(off_t size, int seals = F_SEAL_SHRINK | F_SEAL_GROW) {
    int fd = memfd_create("copy", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, size), 0);
    const size_t n = std::min<size_t>(kControlPage, size_t(size));
    EXPECT_EQ(pwrite(fd, offer_->region, n, 0), ssize_t(n));
    if (seals) {
      EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
    }
    return fd;
  }

  RegionHeader& Header() { return static_cast<RegionControl*>(offer_->region)->header; }

  int before_ = 0;
  std::unique_ptr<Offer> offer_;
  wire::Register msg_;
  int fds_[4] = {-1, -1, -1, -1};
};

TEST_F(RendezvousAcceptTest, AcceptsWhatAClientBuilds) {
  const int given[4] = {fds_[0], fds_[1], fds_[2], fds_[3]};
  int a = -1, b = -1;
  std::atomic<uint32_t>* claim = nullptr;
  wire::DeclineReason reason = wire::DeclineReason::kUnspecified;
  std::unique_ptr<Channel> channel = AcceptRegistration(msg_, fds_, -1, &a, &b, &claim, &reason);
  ASSERT_TRUE(channel) << "reason " << int(reason);
  for (int fd : fds_) EXPECT_EQ(fd, -1);
  EXPECT_EQ(a, given[1]);
  EXPECT_EQ(b, given[2]);
  EXPECT_FALSE(IsOpen(given[0])) << "the memfd is kept open";
  EXPECT_TRUE(IsOpen(given[3]));  // the client's B: the channel's
  EXPECT_EQ(channel->ring_size(), kRing);
  EXPECT_EQ(channel->control()->SettleDeadline(), 0u);  // not held
  ASSERT_NE(claim, nullptr);
  EXPECT_EQ(claim->load(), 0u);
  ClaimOf(*offer_).store(uint32_t(Claim::kTaken));
  EXPECT_EQ(claim->load(), 1u);  // the same word, through the server's own mapping
  channel.reset();
  EXPECT_FALSE(IsOpen(given[3]));
  close(a);
  close(b);
}

TEST_F(RendezvousAcceptTest, RejectsRingSizesOutOfRange) {
  for (uint32_t ring : {0u, 2048u, 6000u, 4096u + 64u, 512u << 20, 0x80000000u}) {
    SCOPED_TRACE(ring);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    msg_.ring_size = ring;
    msg_.region_size = RegionSize(ring);
    ExpectRejected();
  }
}

TEST_F(RendezvousAcceptTest, RejectsARingSizeOtherThanTheRegions) {
  // Valid, and the memfd agrees with the message, but the region was built for another.
  msg_.ring_size = 2 * kRing;
  msg_.region_size = RegionSize(2 * kRing);
  Replace(0, SealedCopy(off_t(msg_.region_size)));
  ExpectRejected();
}

TEST_F(RendezvousAcceptTest, RejectsARegionSizeThatDoesNotFitTheRing) {
  for (uint64_t size : {RegionSize(kRing) + 4096, RegionSize(kRing) - 4096, uint64_t(0)}) {
    SCOPED_TRACE(size);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    msg_.region_size = size;
    Replace(0, SealedCopy(off_t(size)));  // the file agrees with the message
    ExpectRejected();
  }
}

TEST_F(RendezvousAcceptTest, RejectsAMemfdOfTheWrongSize) {
  for (off_t size : {off_t(RegionSize(kRing) - 4096), off_t(RegionSize(kRing) + 4096),
                     off_t(RegionSize(kRing) + 1), off_t(0)}) {
    SCOPED_TRACE(size);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    Replace(0, SealedCopy(size));
    ExpectRejected();
  }
}

TEST_F(RendezvousAcceptTest, RejectsARegionThatCanStillBeResized) {
  for (int seals : {0, int(F_SEAL_GROW), int(F_SEAL_SHRINK)}) {
    SCOPED_TRACE(seals);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    Replace(0, SealedCopy(off_t(RegionSize(kRing)), seals));
    ExpectRejected();
  }
  // An ordinary file of the right size cannot be sealed at all.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  char path[] = "/tmp/slip_region_XXXXXX";
  int file = mkostemp(path, O_CLOEXEC);
  ASSERT_GE(file, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(file, off_t(RegionSize(kRing))), 0);
  Replace(0, file);
  ExpectRejected();
}

TEST_F(RendezvousAcceptTest, RejectsANonRegularFileInTheRegionSlot) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  close(pipe_fds[1]);
  Replace(0, pipe_fds[0]);
  ExpectRejected();
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Replace(0, socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ExpectRejected();
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Replace(0, open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ExpectRejected();
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Replace(0, open("/dev/zero", O_RDWR | O_CLOEXEC));
  ExpectRejected();
}

TEST_F(RendezvousAcceptTest, RejectsANonSocketInEveryProxySlot) {
  for (int slot = 1; slot < 4; ++slot) {
    SCOPED_TRACE(slot);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    int pipe_fds[2];
    ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
    close(pipe_fds[1]);
    Replace(slot, pipe_fds[0]);
    ExpectRejected();
    ASSERT_NO_FATAL_FAILURE(Fresh());
    Replace(slot, SealedCopy(off_t(RegionSize(kRing))));  // a regular file
    ExpectRejected();
  }
}

TEST_F(RendezvousAcceptTest, RejectsOtherSocketKindsInEveryProxySlot) {
  for (int slot = 1; slot < 4; ++slot) {
    for (int kind = 0; kind < 4; ++kind) {
      SCOPED_TRACE("slot " + std::to_string(slot) + " kind " + std::to_string(kind));
      ASSERT_NO_FATAL_FAILURE(Fresh());
      int fd = -1;
      if (kind == 0) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (kind == 1) fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (kind >= 2) {
        int pair[2];
        ASSERT_EQ(
            socketpair(AF_UNIX, (kind == 2 ? SOCK_DGRAM : SOCK_SEQPACKET) | SOCK_CLOEXEC, 0, pair),
            0);
        close(pair[1]);
        fd = pair[0];
      }
      Replace(slot, fd);
      ExpectRejected();
    }
  }
}

TEST_F(RendezvousAcceptTest, RejectsProxyEndsThatAreNotOnePair) {
  // A of the server's pair, B of the client's (a pair of its own).
  Replace(2, fcntl(offer_->client_b, F_DUPFD_CLOEXEC, 0));
  ExpectRejected();
  // Two ends of two fresh pairs.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  int p[2], q[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, q), 0);
  Replace(1, p[0]);
  Replace(2, q[1]);
  close(p[1]);
  close(q[0]);
  ExpectRejected();
  // The same end twice.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Replace(2, fcntl(fds_[1], F_DUPFD_CLOEXEC, 0));
  ExpectRejected();
  // A whose peer is gone.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p), 0);
  Replace(1, p[0]);
  Replace(2, fcntl(p[0], F_DUPFD_CLOEXEC, 0));
  close(p[1]);
  ExpectRejected();
}

TEST_F(RendezvousAcceptTest, RejectsAHeaderThatDoesNotMatchTheMessage) {
  Header().magic ^= 1;
  ExpectRejected();
  Header().magic ^= 1;
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Header().nonce ^= 1;
  ExpectRejected();
  Header().nonce ^= 1;
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Header().ring_size = 2 * kRing;
  ExpectRejected();
  Header().ring_size = kRing;
  // The message's nonce against the region's.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  msg_.nonce ^= 0x100;
  ExpectRejected();
}

// (Five come with a registration without a port or through the directory: Rendezvous
// checks which, keyed_registration_test.cc and dir_rendezvous_test.cc.)
TEST_F(RendezvousAcceptTest, RejectsAnotherDescriptorCount) {
  for (uint32_t count : {0u, 3u, 6u}) {
    SCOPED_TRACE(count);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    msg_.fd_count = count;
    ExpectRejected();
  }
}

// The region is a file the client also holds: if it could shrink the file after the server
// mapped it, the server's next access to the rings would die of SIGBUS. Run in a child.
TEST_F(RendezvousAcceptTest, ShrinkingTheRegionAfterAcceptCannotKillTheServer) {
  int a = -1, b = -1;
  wire::DeclineReason reason;
  std::unique_ptr<Channel> server = AcceptRegistration(msg_, fds_, -1, &a, &b, nullptr, &reason);
  ASSERT_TRUE(server) << "reason " << int(reason);
  EXPECT_NE(ftruncate(offer_->memfd, 0), 0);
  EXPECT_EQ(errno, EPERM);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = ftruncate(offer_->memfd, 0);  // the client's copy of the memfd; refused
    (void)rc;
    volatile uint64_t produced = server->RxProduced();     // the server reads its control page
    volatile uint8_t first = server->RxData()[kRing - 1];  // and its ring
    (void)produced;
    (void)first;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the server side died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  server.reset();
  close(a);
  close(b);
}

// The header is read once: what the client writes there afterwards changes nothing.
TEST_F(RendezvousAcceptTest, TheHeaderIsSnapshottedOnce) {
  int server_a = -1, server_b = -1;
  wire::DeclineReason reason;
  std::unique_ptr<Channel> server_ch =
      AcceptRegistration(msg_, fds_, -1, &server_a, &server_b, nullptr, &reason);
  ASSERT_TRUE(server_ch) << "reason " << int(reason);
  Header().ring_size = 1u << 30;
  Header().magic = 0;
  Header().nonce ^= 0xffff;
  EXPECT_EQ(server_ch->ring_size(), kRing);

  RegionHeader* header = &Header();
  int client_a = -1, client_b = -1;
  std::unique_ptr<Channel> client_ch =
      MakeClientChannel(offer_.get(), -1, {}, {}, &client_a, &client_b);
  ASSERT_TRUE(client_ch);
  Stream server(std::move(server_ch), server_a, server_b, StreamOptions{});
  Stream client(std::move(client_ch), client_a, client_b, StreamOptions{});
  // Both ways, many times round the ring: every access stays within the validated size
  // (AddressSanitizer would see one beyond the mapping).
  EXPECT_TRUE(ExchangeThrough(&client, &server, 20 * kRing + 123));
  header->ring_size = 0;
  EXPECT_TRUE(ExchangeThrough(&server, &client, 5 * kRing + 7));
  EXPECT_EQ(server.channel()->ring_size(), kRing);

  // And a cursor the client sets out of range resets the connection, nothing else.
  auto* control = reinterpret_cast<RegionControl*>(header);
  control->to_server.produced.store(control->to_server.produced.load() + (1ull << 40));
  uint8_t buf[64];
  iovec iov{buf, sizeof(buf)};
  EXPECT_EQ(server.Recv(&iov, 1, 0, true), -ECONNRESET);
}

}  // namespace
}  // namespace slip::shm
