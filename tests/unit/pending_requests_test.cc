// Unit tests for core/pending_requests.h: what a listener keeps for requests not yet proven
// by their TCP connection.
#include "core/pending_requests.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <vector>

#include "tests/unit/loopback_endpoint.h"
#include "tests/unit/tcp_pair.h"

namespace slip {
namespace {

using test::LoopbackAt;

// The table never touches a connection: opaque pointers stand for them.
RemoteRing* Conn(uintptr_t n) {
  return reinterpret_cast<RemoteRing*>(n << 4);
}

Tuple TupleOf(uint8_t client, uint16_t port) {
  return Tuple{LoopbackAt(client, port), LoopbackAt(1, 5000)};
}

Principal Uid(uint32_t uid) {
  Principal p;
  p.kind = Principal::Kind::kUid;
  p.uid = uid;
  return p;
}

class PendingTest : public ::testing::Test {
 protected:
  static constexpr size_t kCharge = 1000;
  void SetUp() override { ASSERT_TRUE(table_.Init(budget_)); }
  void TearDown() override {
    while (table_.ForgetOneOf(nullptr)) {
    }
  }
  // Keeps a request for `t` from `who`; false when refused. Evicted ones are collected.
  bool Keep(const Tuple& t, const Principal& who, uint64_t nonce, uint64_t now_ms,
            size_t charge = kCharge) {
    PendingRequests::Room room;
    const auto admitted = table_.Reserve(&owner_, who, charge, now_ms, &room);
    for (size_t i = 0; i < room.evicted_count; ++i) evicted_.insert(room.evicted[i]);
    if (admitted != PendingRequests::Admitted::kYes) {
      last_refusal_ = admitted;
      return false;
    }
    PendingRequests::Answer answer;
    answer.ring_size = 1 << 16;
    answer.ring_key = nonce ^ 0xabc;
    answer.note_tag = uint32_t(nonce);
    table_.Keep(&room, t, nonce, Conn(nonce), answer, now_ms);
    return true;
  }

  size_t budget_ = 100 * kCharge;
  PendingRequests table_;
  RequestOwner owner_;
  std::set<RemoteRing*> evicted_;
  PendingRequests::Admitted last_refusal_ = PendingRequests::Admitted::kYes;
  uint64_t now_ = 5000;  // (the lookups' clock)
};

TEST_F(PendingTest, KeepsOneRequestPerTupleAndAnswersItsRepeat) {
  ASSERT_TRUE(Keep(TupleOf(2, 100), Uid(7), 11, 1000));
  PendingRequests::Answer a;
  EXPECT_EQ(table_.Find(TupleOf(2, 100), 11, &a), PendingRequests::Found::kSame);
  EXPECT_EQ(a.ring_key, 11u ^ 0xabc);
  EXPECT_EQ(table_.Find(TupleOf(2, 100), 12, &a), PendingRequests::Found::kOther);
  EXPECT_EQ(table_.Find(TupleOf(2, 101), 11, &a), PendingRequests::Found::kNone);
  EXPECT_TRUE(table_.Has(TupleOf(2, 100), now_));
  EXPECT_EQ(owner_.kept, 1u);
  PendingRequests::Taken taken;
  ASSERT_TRUE(table_.Take(TupleOf(2, 100), now_, &taken));
  EXPECT_EQ(taken.conn, Conn(11));
  EXPECT_EQ(taken.nonce, 11u);
  EXPECT_FALSE(taken.dropped);
  EXPECT_FALSE(table_.Has(TupleOf(2, 100), now_));
  EXPECT_EQ(owner_.kept, 0u);
  EXPECT_EQ(table_.charged(), 0u);
}

TEST_F(PendingTest, OnePrincipalHoldsAtMostItsShare) {
  for (uint16_t i = 0; i < PendingRequests::kMaxPerPrincipal; ++i)
    ASSERT_TRUE(Keep(TupleOf(2, 1000 + i), Uid(65534), 100 + i, 1000));
  // Whatever address it sends from.
  EXPECT_FALSE(Keep(TupleOf(3, 1), Uid(65534), 99, 1000));
  EXPECT_EQ(last_refusal_, PendingRequests::Admitted::kPrincipalFull);
  EXPECT_TRUE(Keep(TupleOf(3, 1), Uid(0), 98, 1000));
}

// The budget is full: the holder with the most gives up its oldest, and what it gave up
// leaves a record, so that a late connection of its client is still told apart.
TEST_F(PendingTest, AFullBudgetTakesTheOldestOfTheHolderWithTheMost) {
  budget_ = 10 * kCharge;
  TearDown();
  ASSERT_TRUE(table_.Init(budget_));
  for (uint16_t i = 0; i < 8; ++i)
    ASSERT_TRUE(Keep(TupleOf(2, 2000 + i), Uid(65534), 200 + i, 1000 + i));
  ASSERT_TRUE(Keep(TupleOf(9, 1), Uid(0), 1, 1000));
  ASSERT_TRUE(Keep(TupleOf(9, 2), Uid(0), 2, 1001));
  EXPECT_TRUE(evicted_.empty());
  ASSERT_TRUE(Keep(TupleOf(9, 3), Uid(0), 3, 1500));
  ASSERT_EQ(evicted_, std::set<RemoteRing*>{Conn(200)});
  PendingRequests::Taken taken;
  ASSERT_TRUE(table_.Take(TupleOf(2, 2000), now_, &taken));
  EXPECT_TRUE(taken.dropped);
  EXPECT_EQ(taken.conn, nullptr);
  EXPECT_EQ(taken.nonce, 200u);
  EXPECT_EQ(taken.ring_log2, 16);
  EXPECT_FALSE(table_.Has(TupleOf(2, 2000), now_));  // (taken once)
  // Root's three are all there.
  for (uint16_t p = 1; p <= 3; ++p) EXPECT_TRUE(table_.Has(TupleOf(9, p), now_));
  EXPECT_LE(table_.charged(), budget_);
}

TEST_F(PendingTest, AfterTheGraceOnlyConnectedRequestsStay) {
  ASSERT_TRUE(Keep(TupleOf(2, 1), Uid(1), 1, 1000));
  ASSERT_TRUE(Keep(TupleOf(2, 2), Uid(1), 2, 1000));
  ASSERT_TRUE(Keep(TupleOf(2, 3), Uid(1), 3, 1500));
  EXPECT_EQ(table_.next_due_ms(), 1000 + PendingRequests::kGraceMs);
  PendingRequests::Check checks[8];
  EXPECT_EQ(table_.TakeDue(1999, checks, 8), 0u);
  ASSERT_EQ(table_.TakeDue(2000, checks, 8), 2u);
  EXPECT_TRUE(checks[0].tuple == TupleOf(2, 1));
  checks[1].connected = true;  // (2, 2)'s SYN came
  RemoteRing* done[8];
  size_t count = 0;
  table_.Settle(checks, 2, 2000, done, 8, &count);
  ASSERT_EQ(count, 1u);
  EXPECT_EQ(done[0], Conn(1));
  PendingRequests::Answer a;
  EXPECT_EQ(table_.Find(TupleOf(2, 1), 1, &a), PendingRequests::Found::kNone);
  EXPECT_TRUE(table_.Has(TupleOf(2, 1), now_));  // (its record, until its request's time)
  EXPECT_FALSE(table_.Has(TupleOf(2, 1), 1000 + PendingRequests::kPendingMs));
  EXPECT_EQ(table_.Find(TupleOf(2, 2), 2, &a), PendingRequests::Found::kSame);
  // The connected one waits for accept() until kPendingMs, then goes without a record.
  const uint64_t expiry = 1000 + PendingRequests::kPendingMs;
  EXPECT_EQ(table_.TakeDue(2500, checks, 8), 1u);  // (2, 3)
  checks[0].connected = true;
  table_.Settle(checks, 1, 2500, done, 8, &count);
  EXPECT_EQ(count, 0u);
  table_.Settle(checks, 0, expiry, done, 8, &count);
  ASSERT_EQ(count, 1u);
  EXPECT_EQ(done[0], Conn(2));
  EXPECT_FALSE(table_.Has(TupleOf(2, 2), now_));
  // A request taken by accept() meanwhile is not settled twice.
  ASSERT_TRUE(Keep(TupleOf(2, 4), Uid(1), 4, 3000));
  ASSERT_EQ(table_.TakeDue(4000, checks, 8), 1u);
  PendingRequests::Taken taken;
  ASSERT_TRUE(table_.Take(TupleOf(2, 4), now_, &taken));
  table_.Settle(checks, 1, 4000, done, 8, &count);
  EXPECT_EQ(count, 0u);
}

TEST_F(PendingTest, AListenerHoldsAtMostItsCeiling) {
  budget_ = 2 * PendingRequests::kMaxPerListener;
  TearDown();
  ASSERT_TRUE(table_.Init(budget_));
  for (uint32_t i = 0; i < PendingRequests::kMaxPerListener; ++i)
    ASSERT_TRUE(Keep(TupleOf(uint8_t(2 + i / 64), uint16_t(i)), Uid(i / 64), i + 1, 1000, 1));
  EXPECT_FALSE(Keep(TupleOf(200, 1), Uid(9999), 5000, 1000, 1));
  EXPECT_EQ(last_refusal_, PendingRequests::Admitted::kListenerFull);
  RequestOwner other;
  PendingRequests::Room room;
  EXPECT_EQ(table_.Reserve(&other, Uid(9999), 1, 1000, &room), PendingRequests::Admitted::kYes);
  table_.Release(&room);
  EXPECT_EQ(other.kept, 0u);
  size_t forgotten = 0;
  while (table_.ForgetOneOf(&owner_)) ++forgotten;
  EXPECT_EQ(forgotten, PendingRequests::kMaxPerListener);
  EXPECT_EQ(owner_.kept, 0u);
}

// Where each request holds descriptors, the table holds fewer than its ceiling: a
// newcomer past it takes the oldest of the holder with the most, as for the budget.
TEST_F(PendingTest, ACeilingOfRequestsIsAFullTableToo) {
  TearDown();
  ASSERT_TRUE(table_.Init(budget_, 3));
  ASSERT_TRUE(Keep(TupleOf(2, 1), Uid(65534), 1, 1000));
  ASSERT_TRUE(Keep(TupleOf(2, 2), Uid(65534), 2, 1001));
  ASSERT_TRUE(Keep(TupleOf(9, 1), Uid(0), 3, 1002));
  ASSERT_TRUE(Keep(TupleOf(9, 2), Uid(0), 4, 1003));
  EXPECT_EQ(evicted_, std::set<RemoteRing*>{Conn(1)});
  EXPECT_EQ(owner_.kept, 3u);
  // The holder with the most (root's 2) asks again: it is refused, not made to give up
  // its own; a third sender takes root's oldest.
  EXPECT_FALSE(Keep(TupleOf(9, 3), Uid(0), 5, 1004));
  EXPECT_EQ(last_refusal_, PendingRequests::Admitted::kFull);
  EXPECT_EQ(evicted_.size(), 1u);
  ASSERT_TRUE(Keep(TupleOf(7, 1), Uid(5), 6, 1005));
  EXPECT_EQ(evicted_, (std::set<RemoteRing*>{Conn(1), Conn(3)}));
  PendingRequests::Answer a;
  EXPECT_EQ(table_.Find(TupleOf(9, 2), 4, &a), PendingRequests::Found::kSame);
}

TEST_F(PendingTest, RefusalsAreRememberedByTuple) {
  table_.RecordRefusal(TupleOf(2, 1), Reason::kRendezvousBusy, 1000);
  table_.RecordRefusal(TupleOf(2, 2), Reason::kDeclined, 1000);
  EXPECT_EQ(table_.Refused(TupleOf(2, 1), 1001), Reason::kRendezvousBusy);
  EXPECT_EQ(table_.Refused(TupleOf(2, 2), 1001), Reason::kDeclined);
  EXPECT_EQ(table_.Refused(TupleOf(2, 3), 1001), Reason::kNone);
  EXPECT_EQ(table_.Refused(TupleOf(2, 1), 1000 + PendingRequests::kPendingMs), Reason::kNone);
  // A flood of refusals overwrites the oldest only, kRefusals of them at once.
  for (uint32_t i = 0; i < PendingRequests::kRefusals - 1; ++i)
    table_.RecordRefusal(TupleOf(3, uint16_t(i)), Reason::kRendezvousBusy, 1100);
  EXPECT_EQ(table_.Refused(TupleOf(2, 2), 1200), Reason::kDeclined);
  EXPECT_EQ(table_.Refused(TupleOf(2, 1), 1200), Reason::kNone);
}

// A client that disconnects before its connection came: its request goes without a record
// (it is plain), and only if it is still that connection's; the refusal says why.
TEST_F(PendingTest, AWithdrawnRequestGoesWithoutARecord) {
  ASSERT_TRUE(Keep(TupleOf(2, 1), Uid(1), 1, 1000));
  EXPECT_EQ(table_.Withdraw(TupleOf(2, 1), Conn(9), Reason::kConnectSlow, 1100), nullptr);
  EXPECT_EQ(table_.Refused(TupleOf(2, 1), 1100), Reason::kNone);
  EXPECT_EQ(table_.Withdraw(TupleOf(2, 1), Conn(1), Reason::kConnectSlow, 1100), Conn(1));
  EXPECT_FALSE(table_.Has(TupleOf(2, 1), 1100));
  EXPECT_EQ(table_.Refused(TupleOf(2, 1), 1100), Reason::kConnectSlow);
  EXPECT_EQ(owner_.kept, 0u);
  EXPECT_EQ(table_.charged(), 0u);
  EXPECT_EQ(table_.Withdraw(TupleOf(2, 1), Conn(1), Reason::kConnectSlow, 1100), nullptr);
}

// A path that goes (a removed device) drops the requests on it, each leaving its record.
TEST_F(PendingTest, DropOneIfDropsTheMatchingOnesWithTheirRecords) {
  for (uint16_t i = 1; i <= 4; ++i) ASSERT_TRUE(Keep(TupleOf(2, i), Uid(1), i, 1000));
  auto even = [](const RemoteRing* conn, const void* ctx) noexcept {
    EXPECT_EQ(ctx, &kCharge);
    return (reinterpret_cast<uintptr_t>(conn) >> 4) % 2 == 0;
  };
  std::set<RemoteRing*> dropped;
  while (RemoteRing* conn = table_.DropOneIf(even, &kCharge, 1100)) dropped.insert(conn);
  EXPECT_EQ(dropped, (std::set<RemoteRing*>{Conn(2), Conn(4)}));
  EXPECT_EQ(owner_.kept, 2u);
  PendingRequests::Taken taken;
  ASSERT_TRUE(table_.Take(TupleOf(2, 2), 1100, &taken));
  EXPECT_TRUE(taken.dropped);
  EXPECT_EQ(taken.nonce, 2u);
  ASSERT_TRUE(table_.Take(TupleOf(2, 3), 1100, &taken));
  EXPECT_FALSE(taken.dropped);
  EXPECT_EQ(taken.conn, Conn(3));
}

// The kernel is asked for real: a request whose TCP connection exists (a loopback pair)
// stays after its grace, one for a 4-tuple nobody connected is released.
std::vector<RemoteRing*>* g_released = nullptr;

TEST_F(PendingTest, CheckDueAsksTheKernelAndReleasesTheUnconnected) {
  int fds[2];
  ASSERT_NO_FATAL_FAILURE(testing::TcpPair(fds));
  sockaddr_storage client{}, server{};
  socklen_t len = sizeof(client);
  ASSERT_EQ(getsockname(fds[0], reinterpret_cast<sockaddr*>(&client), &len), 0);
  len = sizeof(server);
  ASSERT_EQ(getpeername(fds[0], reinterpret_cast<sockaddr*>(&server), &len), 0);
  Tuple connected;
  ASSERT_TRUE(wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&client), &connected.client));
  ASSERT_TRUE(wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&server), &connected.server));
  Tuple nobody = connected;
  nobody.client.port = uint16_t(connected.client.port ^ 0x4000);
  ASSERT_TRUE(Keep(connected, Uid(1), 1, 1000));
  ASSERT_TRUE(Keep(nobody, Uid(1), 2, 1000));
  std::vector<RemoteRing*> released;
  g_released = &released;
  EXPECT_EQ(table_.CheckDue(1000 + PendingRequests::kGraceMs - 1, [](RemoteRing*) noexcept {}),
            0u);  // (in its grace)
  EXPECT_EQ(table_.CheckDue(1000 + PendingRequests::kGraceMs,
                            [](RemoteRing* conn) noexcept { g_released->push_back(conn); }),
            1u);
  g_released = nullptr;
  EXPECT_EQ(released, std::vector<RemoteRing*>{Conn(2)});
  PendingRequests::Answer a;
  EXPECT_EQ(table_.Find(connected, 1, &a), PendingRequests::Found::kSame);
  close(fds[0]);
  close(fds[1]);
}

TEST(PrincipalTest, LoopbackSendersShareOneOthersAreTheirAddress) {
  const Principal a = Principal::OfSource(LoopbackAt(2, 1000));
  EXPECT_EQ(a.kind, Principal::Kind::kLoopback);
  EXPECT_TRUE(a == Principal::OfSource(LoopbackAt(77, 2000)));
  wire::Endpoint mapped{};  // ::ffff:127.0.0.9, unfolded
  mapped.family = 6;
  mapped.addr[10] = mapped.addr[11] = 0xff;
  mapped.addr[12] = 127;
  mapped.addr[15] = 9;
  EXPECT_EQ(Principal::OfSource(mapped).kind, Principal::Kind::kLoopback);
  wire::Endpoint remote = LoopbackAt(5, 3000);
  remote.addr[0] = 10;
  const Principal r = Principal::OfSource(remote);
  EXPECT_EQ(r.kind, Principal::Kind::kAddress);
  EXPECT_EQ(r.address.port, 0);  // (any port of that address)
  remote.port = 4000;
  EXPECT_TRUE(r == Principal::OfSource(remote));
}

}  // namespace
}  // namespace slip
