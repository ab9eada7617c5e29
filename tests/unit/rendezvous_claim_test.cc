// Tests for what registrations may hold (per uid, the table's capacity, eviction), a
// registration's claim (taken, withdrawn, abandoned; kept across a move), and a
// registered connection that settles end to end.
#include <gtest/gtest.h>

#include "tests/unit/rendezvous_fixture.h"

namespace slip::shm {
namespace {

using namespace rendezvous_fixture;  // NOLINT(google-build-using-namespace)

// ---------------------------------------------------------------------------- quotas

TEST(RendezvousQuotaTest, CapacityFollowsTheDescriptorsAboveTheFloor) {
  for (size_t capacity : {size_t(4), size_t(16), size_t(40)}) {
    SCOPED_TRACE(capacity);
    auto server = StartServer("127.0.0.1", "127.0.0.1", false, capacity);
    ASSERT_TRUE(server);
    EXPECT_EQ(server->rv->capacity(), capacity);
    EXPECT_EQ(server->rv->per_uid_limit(), std::max<size_t>(2, capacity - capacity / 4));
  }
  // Never below 4, whatever the space.
  auto tiny = StartServer("127.0.0.1", "127.0.0.1", false, 1);
  ASSERT_TRUE(tiny);
  EXPECT_EQ(tiny->rv->capacity(), 4u);
  EXPECT_EQ(tiny->rv->per_uid_limit(), 3u);
}

TEST(RendezvousQuotaTest, PerUidLimitCapacityAndEviction) {
  SKIP_UNLESS_ROOT();
  constexpr size_t kCapacity = 16;
  auto server = StartServer("127.0.0.1", "127.0.0.1", false, kCapacity);
  ASSERT_TRUE(server);
  Rendezvous* rv = server->rv.get();
  ASSERT_EQ(rv->capacity(), kCapacity);
  const size_t per_uid = rv->per_uid_limit();
  ASSERT_EQ(per_uid, 12u);
  const sockaddr_storage dest = server->To("127.0.0.1");
  const wire::Endpoint server_ep = server->Endpoint("127.0.0.1");
  // Every registration names a real connection of its uid (Take asks the kernel whose the
  // client socket is): root's are this process's, nobody's the child's.
  std::map<size_t, TcpClient> root_tcp;
  std::map<size_t, wire::Endpoint> nobody_tcp;
  auto root_client = [&](size_t i) {
    auto it = root_tcp.find(i);
    if (it == root_tcp.end()) it = root_tcp.emplace(i, TcpClient(dest)).first;
    return it->second.ep();
  };

  // Root fills its share (distinct 4-tuples, never taken), a few ms apart.
  std::vector<std::unique_ptr<Offer>> root;
  for (size_t i = 0; i < per_uid; ++i) {
    root.push_back(std::make_unique<Offer>());
    ASSERT_TRUE(IsKept(RegisterVia(rv, dest, root_client(i), server_ep, root.back().get()))) << i;
    SleepMs(2);
  }
  {
    Offer over;
    EXPECT_TRUE(IsDecline(RegisterVia(rv, dest, root_client(100), server_ep, &over), over.nonce,
                          wire::DeclineReason::kBusy));
  }
  // Another uid still gets the rest of the table.
  UidChild nobody(kNobody);
  ASSERT_TRUE(nobody.ok());
  auto nobody_client = [&](size_t i) {
    auto it = nobody_tcp.find(i);
    if (it == nobody_tcp.end()) it = nobody_tcp.emplace(i, nobody.Connect(dest)).first;
    return it->second;
  };
  int nobody_count = 0;
  for (size_t i = per_uid; i < kCapacity; ++i) {
    uint64_t nonce = 0;
    ASSERT_TRUE(IsKept(nobody.Register(rv, dest, nobody_client(nobody_count), server_ep, &nonce)))
        << i;
    ++nobody_count;
  }
  // The table is full. Root's two oldest are confirmed by their client.
  ClaimOf(*root[0]).store(uint32_t(Claim::kTaken));
  ClaimOf(*root[1]).store(uint32_t(Claim::kTaken));
  // The lighter uid makes root's oldest unconfirmed registration give way, one at a time.
  for (size_t victim : {size_t(2), size_t(3)}) {
    SCOPED_TRACE(victim);
    uint64_t nonce = 0;
    EXPECT_TRUE(IsKept(nobody.Register(rv, dest, nobody_client(nobody_count), server_ep, &nonce)));
    ++nobody_count;
    for (size_t i = 0; i < root.size(); ++i) {
      const Claim want = i < 2 ? Claim::kTaken : i <= victim ? Claim::kAbandoned : Claim::kOpen;
      EXPECT_EQ(ClaimValue(*root[i]), want) << i;
    }
  }
  // The heavier uid cannot push the lighter one out.
  {
    Offer more;
    EXPECT_TRUE(IsDecline(RegisterVia(rv, dest, root_client(101), server_ep, &more), more.nonce,
                          wire::DeclineReason::kBusy));
  }
  for (int i = 0; i < nobody_count; ++i) EXPECT_EQ(nobody.ReadClaim(i), Claim::kOpen) << i;
  // Confirmed registrations never give way: with all of root's confirmed, nothing can.
  for (size_t i = 4; i < root.size(); ++i) ClaimOf(*root[i]).store(uint32_t(Claim::kTaken));
  {
    uint64_t nonce = 0;
    EXPECT_TRUE(IsDecline(nobody.Register(rv, dest, nobody_client(nobody_count), server_ep, &nonce),
                          nonce, wire::DeclineReason::kBusy));
  }
  for (size_t i = 0; i < root.size(); ++i) {
    EXPECT_EQ(ClaimValue(*root[i]), i == 2 || i == 3 ? Claim::kAbandoned : Claim::kTaken) << i;
  }
  // What the table holds: the evicted are gone, the confirmed are there.
  Registration reg;
  EXPECT_FALSE(rv->Take(root_client(2), server_ep, &reg));
  EXPECT_FALSE(rv->Take(root_client(3), server_ep, &reg));
  EXPECT_TRUE(rv->Take(root_client(0), server_ep, &reg));
  EXPECT_EQ(reg.msg.nonce, root[0]->nonce);
  EXPECT_TRUE(rv->Take(nobody_client(nobody_count - 1), server_ep, &reg));
  EXPECT_EQ(reg.uid, kNobody);
  // One entry free again: root may register.
  Offer last;
  EXPECT_TRUE(IsKept(RegisterVia(rv, dest, root_client(102), server_ep, &last)));
}

// ---------------------------------------------------------------------------- Registration

TEST_F(RendezvousRegistrationTest, ClaimReadAndAbandonSemantics) {
  {
    Registration empty;
    EXPECT_EQ(empty.ReadClaim(), Claim::kAbandoned);
    EXPECT_EQ(empty.Abandon(), Claim::kAbandoned);
  }
  struct Case {
    const char* what;
    uint32_t before;
    Claim read;
    Claim abandon;
    uint32_t after;
  } cases[] = {
      {"open", 0, Claim::kOpen, Claim::kAbandoned, 3},
      // (taken as the client wrote it, not by this end's Commit: not the rings')
      {"taken by the client", 1, Claim::kTaken, Claim::kAbandoned, 1},
      {"withdrawn", 2, Claim::kWithdrawn, Claim::kWithdrawn, 2},
      {"abandoned", 3, Claim::kAbandoned, Claim::kAbandoned, 3},
      {"garbage", 77, Claim::kOpen, Claim::kAbandoned, 77},
      {"garbage, high", 0xffffffffu, Claim::kOpen, Claim::kAbandoned, 0xffffffffu},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Offer offer;
    ASSERT_TRUE(IsKept(Register(&offer)));
    Registration reg;
    ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
    ClaimOf(offer).store(c.before);
    EXPECT_EQ(reg.ReadClaim(), c.read);
    EXPECT_EQ(reg.Abandon(), c.abandon);
    EXPECT_EQ(ClaimOf(offer).load(), c.after);
    EXPECT_EQ(reg.Abandon(), c.abandon);  // and it stays so
  }
  // Abandoned first, the client can no longer withdraw or confirm.
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer)));
  Registration reg;
  ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  EXPECT_EQ(reg.Abandon(), Claim::kAbandoned);
  ClaimWithdraw(&offer);
  EXPECT_EQ(ClaimValue(offer), Claim::kAbandoned);
}

TEST_F(RendezvousRegistrationTest, MovingKeepsTheClaimAndTheStream) {
  WarmUpNetlink();
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer)));
  Registration reg;
  ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  std::atomic<uint32_t>* const claim = reg.claim;
  Stream* const stream = reg.stream.get();
  const int anchor = reg.anchor_slot, proxy_a = reg.proxy_a;
  ASSERT_NE(claim, nullptr);
  ASSERT_NE(stream, nullptr);

  const int answer = reg.answer;
  EXPECT_GE(answer, 0);
  Registration moved(std::move(reg));
  EXPECT_EQ(moved.answer, answer);
  EXPECT_EQ(reg.answer, -1);
  EXPECT_EQ(moved.claim, claim);
  EXPECT_EQ(moved.stream.get(), stream);
  EXPECT_EQ(moved.anchor_slot, anchor);
  EXPECT_EQ(moved.proxy_a, proxy_a);
  EXPECT_EQ(moved.msg.nonce, offer.nonce);
  EXPECT_EQ(reg.claim, nullptr);
  EXPECT_FALSE(reg.stream);
  EXPECT_EQ(reg.anchor_slot, -1);
  EXPECT_EQ(reg.proxy_a, -1);
  EXPECT_EQ(reg.ReadClaim(), Claim::kAbandoned);  // nothing to read: as if abandoned
  ASSERT_TRUE(moved.Commit());                    // (its own claim moves with it)
  EXPECT_EQ(moved.ReadClaim(), Claim::kTaken);

  Registration assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.claim, claim);
  EXPECT_EQ(assigned.stream.get(), stream);
  EXPECT_EQ(assigned.anchor_slot, anchor);
  EXPECT_EQ(moved.claim, nullptr);
  EXPECT_FALSE(moved.stream);
  EXPECT_EQ(assigned.Abandon(), Claim::kTaken);
  EXPECT_TRUE(IsOpen(anchor));

  // Assigning over a live registration lets go of what it held: the stream's proxy pair,
  // the client's B, the anchor's slot (its rendezvous connection went with its Commit).
  Offer other;
  const wire::Endpoint other_ep = NewClient();
  ASSERT_TRUE(IsKept(Register(&other, other_ep)));
  Registration second;
  ASSERT_TRUE(rv_->Take(other_ep, server_ep_, &second));
  const int before = CountOpenFds();
  EXPECT_GE(second.answer, 0);
  assigned = std::move(second);
  EXPECT_EQ(CountOpenFds(), before - 4);
  EXPECT_EQ(second.answer, -1);
  EXPECT_FALSE(IsOpen(anchor));
  EXPECT_EQ(assigned.msg.nonce, other.nonce);
  ClaimOf(other).store(uint32_t(Claim::kWithdrawn));
  EXPECT_EQ(assigned.ReadClaim(), Claim::kWithdrawn);
}

// ---------------------------------------------------------------------------- end to end

TEST_F(RendezvousRegistrationTest, RegisteredConnectionSettlesEndToEnd) {
  // The client: a TCP socket (bound first: the 4-tuple is registered before the SYN), its
  // registration, then the connection and its channel awaiting the listener's answer.
  sockaddr_storage local{};
  int tcp = BindLoopback(&local);
  ASSERT_GE(tcp, 0) << std::strerror(-tcp);
  const wire::Endpoint client_ep = Ep(local);

  Offer offer;
  int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  ASSERT_EQ(SendRegister(sock, offer, client_ep, server_ep_), 0);
  ASSERT_EQ(connect(tcp, Sa(dest_), Len(dest_)), 0);
  ASSERT_EQ(fcntl(tcp, F_SETFL, O_NONBLOCK), 0);
  ASSERT_EQ(dup3(tcp, offer.anchor_slot, O_CLOEXEC), offer.anchor_slot);
  close(tcp);
  int client_a = -1, client_b = -1;
  std::unique_ptr<Channel> client_channel =
      MakeClientChannel(&offer, sock, client_ep, server_ep_, &client_a, &client_b);
  ASSERT_TRUE(client_channel);
  EXPECT_EQ(client_channel->control()->SettleFd(), sock);
  Reason why = Reason::kNone;
  EXPECT_EQ(client_channel->control()->Settle(sys::MonotonicMs(), &why),
            ChannelControl::Settlement::kPending);
  Channel* client_ch = client_channel.get();
  Stream client(std::move(client_channel), client_a, client_b, StreamOptions{});

  // The server: accept() takes the registration and claims it (answering ACCEPT), and the
  // TCP socket goes to the slot kept for it.
  // (The listener's backlog holds the fixture's own connection too: accept this one's.)
  int accepted = -1;
  for (;;) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    accepted = accept4(server_->tcp, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    ASSERT_GE(accepted, 0) << std::strerror(errno);
    if (Ep(peer) == client_ep) break;
    close(accepted);
  }
  Registration reg;
  ASSERT_TRUE(rv_->Take(client_ep, server_ep_, &reg));
  ASSERT_TRUE(reg.Commit());
  ASSERT_EQ(dup3(accepted, reg.anchor_slot, O_CLOEXEC), reg.anchor_slot);
  close(accepted);
  Channel* server_ch = reg.stream->channel();
  EXPECT_EQ(server_ch->control()->SettleDeadline(), 0u);  // on the rings from the start

  // The client has its ACCEPT, and the claim says taken: settled, with nothing in band.
  pollfd answered{sock, POLLIN, 0};
  EXPECT_EQ(poll(&answered, 1, 2000), 1);
  EXPECT_EQ(client_ch->control()->Settle(sys::MonotonicMs(), &why),
            ChannelControl::Settlement::kSettled);
  EXPECT_EQ(client_ch->control()->SettleDeadline(), 0u);
  EXPECT_EQ(reg.ReadClaim(), Claim::kTaken);
  EXPECT_EQ(server_ch->control()->SettleDeadline(), 0u);
  EXPECT_FALSE(server_ch->control()->AnchorCarriesStream());
  EXPECT_TRUE(ExchangeThrough(&client, reg.stream.get(), 100000));
  // Nothing of the stream went over TCP.
  char c;
  EXPECT_EQ(recv(reg.anchor_slot, &c, 1, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
}

}  // namespace
}  // namespace slip::shm
