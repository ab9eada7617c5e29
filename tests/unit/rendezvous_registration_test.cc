// Tests for REGISTER and the listener's one answer (ACCEPT or DECLINE): a registration kept
// until accept() takes it, declined when its region, proxies or descriptors are unusable;
// malformed messages dropped without a leak; silent connections bounded; and Take, with a
// forged registration for the same 4-tuple next to the real one.
#include <gtest/gtest.h>

#include "tests/unit/rendezvous_fixture.h"

namespace slip::shm {
namespace {

using namespace rendezvous_fixture;  // NOLINT(google-build-using-namespace)

TEST_F(RendezvousRegistrationTest, KeptUnansweredThenTakenOnTheRingsAndCommitAnswersAccept) {
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  const int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
  rv_->Drain();
  ASSERT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));  // nobody accepted it yet

  Registration reg;
  EXPECT_FALSE(rv_->Take(NewClient(), server_ep_, &reg));  // a connection nobody registered
  EXPECT_FALSE(rv_->Take(client_ep_, Ep("127.0.0.1", uint16_t(server_ep_.port + 1)), &reg));
  EXPECT_FALSE(rv_->Take(server_ep_, client_ep_, &reg));  // the other way round
  EXPECT_FALSE(reg.stream);

  ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  EXPECT_TRUE(reg.msg.client == client_ep_);
  EXPECT_TRUE(reg.msg.server == server_ep_);
  EXPECT_EQ(reg.msg.nonce, offer.nonce);
  EXPECT_EQ(reg.msg.ring_size, kRing);
  EXPECT_EQ(reg.msg.fd_count, 4u);
  EXPECT_EQ(reg.msg.region_size, RegionSize(kRing));
  EXPECT_EQ(reg.uid, getuid());
  ASSERT_TRUE(reg.stream);
  EXPECT_GE(reg.anchor_slot, 0);
  EXPECT_TRUE(IsOpen(reg.anchor_slot));
  EXPECT_TRUE(fcntl(reg.anchor_slot, F_GETFD) & FD_CLOEXEC);
  EXPECT_GE(reg.answer, 0);
  EXPECT_EQ(reg.proxy_a, reg.stream->proxy_a());
  EXPECT_TRUE(IsSocket(reg.proxy_a));
  EXPECT_EQ(reg.ReadClaim(), Claim::kOpen);
  // The claim is the region's, shared with the client.
  ASSERT_NE(reg.claim, nullptr);
  ClaimOf(offer).store(uint32_t(Claim::kWithdrawn));
  EXPECT_EQ(reg.ReadClaim(), Claim::kWithdrawn);
  ClaimOf(offer).store(uint32_t(Claim::kOpen));
  // Its stream is on the rings from the start: no deadline, the whole ring free.
  Channel* channel = reg.stream->channel();
  EXPECT_EQ(channel->ring_size(), kRing);
  EXPECT_EQ(channel->control()->SettleDeadline(), 0u);
  EXPECT_EQ(channel->RxProduced(), 0u);
  EXPECT_EQ(channel->TxConsumed(), 0u);
  EXPECT_EQ(reg.stream->ReadableBytes(), 0u);

  // Taken out: not found twice.
  Registration again;
  EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &again));

  // The accepting process claims it, and only then says ACCEPT (once, then EOF).
  ASSERT_TRUE(reg.Commit());
  EXPECT_EQ(ClaimValue(offer), Claim::kTaken);
  EXPECT_EQ(reg.answer, -1);
  EXPECT_TRUE(IsAccept(ReadAnswer(sock), offer.nonce));
  EXPECT_EQ(reg.Abandon(), Claim::kTaken);  // taken: it may not be handed over as plain
  close(sock);
}

TEST_F(RendezvousRegistrationTest, RegistrationWrittenAfterAnEarlierDrainIsFound) {
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  int sock = Connect();
  ASSERT_GE(sock, 0);
  rv_->Drain();  // accepts the connection before anything was written on it
  ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
  pollfd pfd{rv_->fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 2000), 1) << "the waiting connection is not watched";
  Registration reg;
  EXPECT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  EXPECT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));
  close(sock);
}

TEST_F(RendezvousRegistrationTest, UnusableRegionOrProxiesAreDeclinedWithBadRegion) {
  WarmUpNetlink();
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  const std::vector<uint8_t> reg = [&] {
    wire::Message msg;
    msg.type = wire::Type::kRegister;
    msg.reg = RegisterFor(offer, client_ep_, server_ep_);
    return Encode(msg);
  }();
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  struct Case {
    const char* what;
    int fds[4];
  } cases[] = {
      {"A of one pair, B of another",
       {offer.memfd, offer.server_a, offer.client_b, offer.client_b}},
      {"a pipe for the region", {pipe_fds[0], offer.server_a, offer.server_b, offer.client_b}},
      {"a pipe for the client's B", {offer.memfd, offer.server_a, offer.server_b, pipe_fds[1]}},
      {"the region in a proxy slot", {offer.memfd, offer.memfd, offer.server_b, offer.client_b}},
  };
  const int before = CountOpenFds();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    int sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRaw(sock, reg.data(), reg.size(), c.fds, 4), ssize_t(reg.size()));
    rv_->Drain();
    EXPECT_TRUE(IsDecline(ReadAnswer(sock), offer.nonce, wire::DeclineReason::kBadRegion));
    close(sock);
    Registration taken;
    EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &taken));
    EXPECT_EQ(CountOpenFds(), before) << "descriptors leaked";
  }
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  // The offer itself is fine.
  ExpectKept(offer);
}

TEST_F(RendezvousRegistrationTest, ShortOfDescriptorsIsDeclinedWithDescriptors) {
  WarmUpNetlink();
  const int limit = SoftFdLimit();
  // Free slots above the floor: 3 (the rendezvous connection and two of the four
  // descriptors fit), then 5 (all of them, but not the anchor's slot).
  for (int free_slots : {3, 5}) {
    SCOPED_TRACE(free_slots);
    for (int fd = limit - free_slots; fd < limit; ++fd) ASSERT_FALSE(IsOpen(fd)) << fd;
    Offer offer;
    int sock = -1;
    ASSERT_NO_FATAL_FAILURE(SendOffer(&offer, &sock));
    const int before = CountOpenFds();
    {
      FloorGuard floor(limit - free_slots);
      rv_->Drain();
    }
    EXPECT_TRUE(IsDecline(ReadAnswer(sock), offer.nonce, wire::DeclineReason::kDescriptors));
    close(sock);
    EXPECT_EQ(CountOpenFds(), before - 1) << "descriptors leaked";
    Registration taken;
    EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &taken));
    // With the floor back where it was, the same offer goes through.
    sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
    rv_->Drain();
    EXPECT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));
    close(sock);
    EXPECT_TRUE(rv_->Take(client_ep_, server_ep_, &taken));
  }
}

int MaxOpenFd() {
  int max = -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  const int own = dirfd(dir);
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd != own) max = std::max(max, fd);
  }
  closedir(dir);
  return max;
}

TEST_F(RendezvousRegistrationTest, DescriptorsTheKernelCannotInstallAreDeclinedWithDescriptors) {
  WarmUpNetlink();
  Offer offer;
  int sock = -1;
  ASSERT_NO_FATAL_FAILURE(SendOffer(&offer, &sock));
  const int before = CountOpenFds();
  {
    // Every number below the limit taken but three: the rendezvous connection's and two of
    // the four descriptors (the kernel truncates the control message: MSG_CTRUNC).
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(devnull, 0);
    const int top = MaxOpenFd() + 1 + 3;
    std::vector<int> fillers;
    for (int fd = 0; fd < top - 3; ++fd) {
      if (!IsOpen(fd)) {
        ASSERT_EQ(dup3(devnull, fd, O_CLOEXEC), fd);
        fillers.push_back(fd);
      }
    }
    rlimit saved{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
    rlimit low = saved;
    low.rlim_cur = rlim_t(top);
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
    rv_->Drain();
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
    for (int fd : fillers) close(fd);
    close(devnull);
  }
  EXPECT_TRUE(IsDecline(ReadAnswer(sock), offer.nonce, wire::DeclineReason::kDescriptors));
  close(sock);
  EXPECT_EQ(CountOpenFds(), before - 1) << "descriptors leaked";
  Registration taken;
  EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &taken));
  Answer again = RegisterVia(rv_, dest_, client_ep_, server_ep_, &offer);
  EXPECT_TRUE(IsKept(again));
}

// A TCP socket handed over in place of the region, lingering 30 s with bytes its peer does
// not take, and whose last reference the listener then holds: declining it must not wait.
TEST_F(RendezvousRegistrationTest, ALingeringSocketHandedOverNeverHoldsTheListener) {
  sockaddr_storage local{};
  int lingering = ConnectTcp(dest_, &local);  // queued, never accepted: nobody reads
  ASSERT_GE(lingering, 0);
  ASSERT_TRUE(MakeLingering(lingering));
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  wire::Message msg;
  msg.type = wire::Type::kRegister;
  msg.reg = RegisterFor(offer, client_ep_, server_ep_);
  const std::vector<uint8_t> bytes = Encode(msg);
  const int fds[4] = {lingering, offer.server_a, offer.server_b, offer.client_b};
  const int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRaw(sock, bytes.data(), bytes.size(), fds, 4), ssize_t(bytes.size()));
  CloseIf(&lingering);  // the listener's copy is the last
  const auto start = std::chrono::steady_clock::now();
  rv_->Drain();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  EXPECT_TRUE(IsDecline(ReadAnswer(sock), offer.nonce, wire::DeclineReason::kBadRegion));
  EXPECT_LT(took.count(), 2000) << "closing the handed-over socket waited for its linger";
  close(sock);
}

TEST_F(RendezvousRegistrationTest, MalformedMessagesAreDroppedWithoutLeaks) {
  WarmUpNetlink();
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  wire::Message reg_msg;
  reg_msg.type = wire::Type::kRegister;
  reg_msg.reg = RegisterFor(offer, client_ep_, server_ep_);
  const std::vector<uint8_t> good = Encode(reg_msg);
  wire::Message cancel_msg;
  cancel_msg.type = wire::Type::kCancel;
  cancel_msg.cancel = wire::Cancel();
  cancel_msg.cancel.client = client_ep_;
  cancel_msg.cancel.server = server_ep_;
  cancel_msg.cancel.nonce = offer.nonce;
  const std::vector<uint8_t> cancel = Encode(cancel_msg);
  std::vector<uint8_t> bad_crc = good;
  bad_crc[20] ^= 1;
  const std::vector<uint8_t> garbage = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P'};
  const std::vector<uint8_t> truncated(good.begin(), good.begin() + 20);
  std::vector<uint8_t> trailing = good;
  trailing.push_back(0);
  std::vector<uint8_t> two = good;  // two REGISTERs in one datagram
  two.insert(two.end(), good.begin(), good.end());

  const int fds[10] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b, offer.memfd,
                       offer.memfd, offer.memfd,    offer.memfd,    offer.memfd,    offer.memfd};
  enum class Want { kNothing, kBadRegion, kDeclined };
  struct Case {
    const char* what;
    const std::vector<uint8_t>* bytes;
    int nfds;
    Want want;
  };
  const Case cases[] = {
      {"garbage", &garbage, 0, Want::kNothing},
      {"garbage with descriptors", &garbage, 4, Want::kNothing},
      {"bad checksum with descriptors", &bad_crc, 4, Want::kNothing},
      {"truncated with descriptors", &truncated, 4, Want::kNothing},
      {"trailing byte with descriptors", &trailing, 4, Want::kNothing},
      {"two messages in one", &two, 4, Want::kNothing},
      {"CANCEL with descriptors", &cancel, 4, Want::kNothing},
      {"CANCEL (no longer used)", &cancel, 0, Want::kNothing},
      {"REGISTER without descriptors", &good, 0, Want::kBadRegion},
      {"REGISTER with 1 descriptor", &good, 1, Want::kBadRegion},
      {"REGISTER with 3 descriptors", &good, 3, Want::kBadRegion},
      {"REGISTER with 5 descriptors", &good, 5, Want::kBadRegion},
      {"REGISTER with 8 descriptors", &good, 8, Want::kBadRegion},
      // (More than the control buffer holds: the kernel truncates it, which reads as the
      // listener being short of descriptors. Declined either way.)
      {"REGISTER with 10 descriptors", &good, 10, Want::kDeclined},
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
    rv_->Drain();
    const Answer a = ReadAnswer(sock);
    close(sock);
    switch (c.want) {
      case Want::kNothing:
        EXPECT_FALSE(a.message) << Describe(a);
        EXPECT_TRUE(a.eof_after) << "the connection was not closed";
        break;
      case Want::kBadRegion:
        EXPECT_TRUE(IsDecline(a, offer.nonce, wire::DeclineReason::kBadRegion));
        break;
      case Want::kDeclined:
        EXPECT_TRUE(a.parsed && a.type == wire::Type::kDecline) << Describe(a);
        break;
    }
    Registration reg;
    EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &reg));
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
  ExpectKept(offer);
  Registration reg;
  EXPECT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
}

TEST_F(RendezvousRegistrationTest, SilentConnectionsAreBoundedAndExpire) {
  WarmUpNetlink();
  const int before = CountOpenFds();
  // One uid may keep 8 connections waiting for their message; the 9th is closed at once.
  std::vector<int> socks;
  for (int i = 0; i < 9; ++i) {
    socks.push_back(Connect());
    ASSERT_GE(socks.back(), 0);
  }
  rv_->Drain();
  auto closed = [&socks] {
    int n = 0;
    for (int s : socks) {
      char c;
      n += recv(s, &c, 1, MSG_DONTWAIT) == 0;
    }
    return n;
  };
  EXPECT_EQ(closed(), 1);
  EXPECT_EQ(CountOpenFds(), before + 9 + 8);
  // They wait a second at most.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  rv_->Drain();
  EXPECT_EQ(closed(), 9);
  EXPECT_EQ(CountOpenFds(), before + 9);
  for (int s : socks) close(s);
}

// ---------------------------------------------------------------------------- per 4-tuple

TEST_F(RendezvousRegistrationTest, FourRegistrationsPerTupleAndThoseGoneMakeRoom) {
  std::vector<std::unique_ptr<Offer>> offers;
  auto register_one = [&] {
    offers.push_back(std::make_unique<Offer>());
    return Register(offers.back().get());
  };
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    {
      const Answer a = register_one();
      EXPECT_TRUE(IsKept(a));
    }
  }
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsDecline(a, offers.back()->nonce, wire::DeclineReason::kBusy));
  }
  // Another 4-tuple is not affected.
  Offer other;
  const wire::Endpoint other_ep = NewClient();
  EXPECT_TRUE(IsKept(Register(&other, other_ep)));

  // A withdrawn registration can no longer be confirmed: it makes room.
  ClaimWithdraw(offers[1].get());
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsKept(a));
  }  // [5]
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsDecline(a, offers.back()->nonce, wire::DeclineReason::kBusy));
  }
  // So does an abandoned one.
  ClaimOf(*offers[2]).store(uint32_t(Claim::kAbandoned));
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsKept(a));
  }  // [7]
  // A confirmed one does not.
  ClaimOf(*offers[3]).store(uint32_t(Claim::kTaken));
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsDecline(a, offers.back()->nonce, wire::DeclineReason::kBusy));
  }

  // Take finds one of the live ones, and the rest go with it (abandoned, unless confirmed).
  Registration reg;
  ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  std::vector<size_t> live = {0, 3, 5, 7};
  EXPECT_NE(std::find_if(live.begin(), live.end(),
                         [&](size_t i) { return offers[i]->nonce == reg.msg.nonce; }),
            live.end());
  for (size_t i : live) {
    if (offers[i]->nonce == reg.msg.nonce) {
      EXPECT_EQ(ClaimValue(*offers[i]), i == 3 ? Claim::kTaken : Claim::kOpen);
    } else {
      EXPECT_EQ(ClaimValue(*offers[i]), i == 3 ? Claim::kTaken : Claim::kAbandoned) << i;
    }
  }
  Registration again;
  EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &again));
  EXPECT_TRUE(rv_->Take(other_ep, server_ep_, &again));
  EXPECT_EQ(again.msg.nonce, other.nonce);
}

TEST_F(RendezvousRegistrationTest, TakePicksTheRegistrationOfTheClientSocketsOwner) {
  SKIP_UNLESS_ROOT();
  UidChild nobody(kNobody);
  ASSERT_TRUE(nobody.ok());
  {
    // Root's socket; root registered first, the forger (another uid) after it.
    const wire::Endpoint client = NewClient();
    Offer mine;
    ASSERT_TRUE(IsKept(RegisterVia(rv_, dest_, client, server_ep_, &mine)));
    SleepMs(3);
    uint64_t forged_nonce = 0;
    ASSERT_TRUE(IsKept(nobody.Register(rv_, dest_, client, server_ep_, &forged_nonce)));
    Registration reg;
    ASSERT_TRUE(rv_->Take(client, server_ep_, &reg));
    EXPECT_EQ(reg.uid, 0u);
    EXPECT_EQ(reg.msg.nonce, mine.nonce);
    EXPECT_EQ(reg.ReadClaim(), Claim::kOpen);
    EXPECT_EQ(nobody.ReadClaim(0), Claim::kAbandoned);
    Registration again;
    EXPECT_FALSE(rv_->Take(client, server_ep_, &again));
  }
  {
    // The other uid's socket; it registered first, root after it.
    wire::Endpoint client = nobody.Connect(dest_);
    ASSERT_NE(client.port, 0);
    uint64_t its_nonce = 0;
    ASSERT_TRUE(IsKept(nobody.Register(rv_, dest_, client, server_ep_, &its_nonce)));
    SleepMs(3);
    Offer forged;
    ASSERT_TRUE(IsKept(RegisterVia(rv_, dest_, client, server_ep_, &forged)));
    Registration reg;
    ASSERT_TRUE(rv_->Take(client, server_ep_, &reg));
    EXPECT_EQ(reg.uid, kNobody);
    EXPECT_EQ(reg.msg.nonce, its_nonce);
    EXPECT_EQ(ClaimValue(forged), Claim::kAbandoned);
    EXPECT_EQ(nobody.ReadClaim(1), Claim::kOpen);
  }
  {
    // Two of root's own for root's socket (not told apart): the newest.
    const wire::Endpoint client = NewClient();
    Offer older, newer;
    ASSERT_TRUE(IsKept(RegisterVia(rv_, dest_, client, server_ep_, &older)));
    SleepMs(3);
    ASSERT_TRUE(IsKept(RegisterVia(rv_, dest_, client, server_ep_, &newer)));
    Registration reg;
    ASSERT_TRUE(rv_->Take(client, server_ep_, &reg));
    EXPECT_EQ(reg.msg.nonce, newer.nonce);
    EXPECT_EQ(ClaimValue(older), Claim::kAbandoned);
  }
}

// A forger that predicts a plain client's 4-tuple and registers it: the connection's
// client socket is not the forger's, so nothing is held for it (the plain client is never
// answered through a channel the forger set up, and never reset by what it does next).
TEST_F(RendezvousRegistrationTest, ARegistrationOfAnotherUidThanTheClientSocketsIsNeverTaken) {
  SKIP_UNLESS_ROOT();
  UidChild nobody(kNobody);
  ASSERT_TRUE(nobody.ok());
  const wire::Endpoint client = NewClient();  // root's socket, registered by nobody alone
  uint64_t forged_nonce = 0;
  ASSERT_TRUE(IsKept(nobody.Register(rv_, dest_, client, server_ep_, &forged_nonce)));
  Registration reg;
  EXPECT_FALSE(rv_->Take(client, server_ep_, &reg));
  EXPECT_FALSE(reg.stream);
  EXPECT_EQ(nobody.ReadClaim(0), Claim::kAbandoned);  // its client goes plain too
  Registration again;
  EXPECT_FALSE(rv_->Take(client, server_ep_, &again));  // and it is gone from the table
}

// A registration for a 4-tuple no TCP connection has: the kernel names no owner, so it is
// not taken (and does not stay behind).
TEST_F(RendezvousRegistrationTest, ARegistrationWithoutAConnectionIsNeverTaken) {
  // A port of this process's, bound but never connected: no connection has this 4-tuple.
  sockaddr_storage local{};
  const int bound = BindLoopback(&local);
  ASSERT_GE(bound, 0) << std::strerror(-bound);
  const wire::Endpoint client = Ep(local);
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer, client)));
  Registration reg;
  EXPECT_FALSE(rv_->Take(client, server_ep_, &reg));
  EXPECT_EQ(ClaimValue(offer), Claim::kAbandoned);
  close(bound);
}

}  // namespace
}  // namespace slip::shm
