// Tests for core/request_module.h's RequestKeeper: what accept() does with the table of kept
// requests, the same for every transport that keeps them. The kept connections are
// StandInRings (real RemoteRings without a path), so that holding them and handing them
// their proxy is the real thing; the deleter counts what the keeper deletes.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include "core/request_module.h"
#include "core/stand_in_ring.h"
#include "core/sys.h"
#include "tests/unit/loopback_endpoint.h"

namespace slip {
namespace {

using test::LoopbackAt;

constexpr RemoteRing::Names kNames = {TransportKind::kVerbs, "verbs", "RDMA",
                                      "the queue pair failed"};
constexpr uint32_t kRing = 4096;
constexpr uint32_t kHandshakeMs = 2000;

std::set<RemoteRing*>* g_deleted = nullptr;

void Delete(RemoteRing* conn) noexcept {
  g_deleted->insert(conn);
  delete static_cast<StandInRing*>(conn);
}

Tuple TupleOf(uint16_t port) {
  return Tuple{LoopbackAt(2, port), LoopbackAt(1, 5000)};
}

class KeeperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_deleted = &deleted_;
    ASSERT_TRUE(keeper_->Make(PendingRequests::DefaultBudget(1 << 20), 16));
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, proxy_), 0);
  }
  void TearDown() override {
    keeper_.reset();
    g_deleted = nullptr;
    close(proxy_[0]);
    close(proxy_[1]);
  }
  // Keeps a request for `t` whose connection is a fresh stand-in; returns it.
  RemoteRing* Keep(const Tuple& t, uint64_t nonce, RequestOwner* owner = nullptr) {
    PendingRequests* table = keeper_->table();
    PendingRequests::Room room;
    EXPECT_EQ(table->Reserve(owner ? owner : &owner_, Principal::OfSource(t.client), 1000,
                             sys::MonotonicMs(), &room),
              PendingRequests::Admitted::kYes);
    RemoteRing* conn = StandInRing::Create(kNames, kRing, 0, 0).release();
    PendingRequests::Answer answer;
    answer.ring_size = kRing;
    table->Keep(&room, t, nonce, conn, answer, sys::MonotonicMs());
    return conn;
  }

  std::set<RemoteRing*> deleted_;
  std::unique_ptr<RequestKeeper> keeper_ =
      std::make_unique<RequestKeeper>(kNames, Delete, 100, kHandshakeMs);
  RequestOwner owner_;
  int proxy_[2] = {-1, -1};
};

TEST_F(KeeperTest, AKeptRequestIsHandedOverHeldWithItsProxy) {
  RemoteRing* conn = Keep(TupleOf(1), 77);
  EXPECT_TRUE(keeper_->Has(TupleOf(1)));
  KeptRequest kept;
  Reason why = Reason::kNone;
  bool committed = false;
  const uint64_t before = sys::MonotonicMs();
  EXPECT_EQ(keeper_->Take(TupleOf(1), proxy_[1], &kept, &why, &committed), nullptr);
  ASSERT_EQ(kept.conn, conn);
  std::unique_ptr<Channel> owned(kept.conn);
  EXPECT_EQ(kept.nonce, 77u);
  EXPECT_TRUE(committed);
  EXPECT_TRUE(conn->held());
  EXPECT_GE(conn->SettleDeadline(), before + kHandshakeMs);
  EXPECT_FALSE(keeper_->Has(TupleOf(1)));
  EXPECT_TRUE(deleted_.empty());
  EXPECT_EQ(owner_.kept, 0u);
}

TEST_F(KeeperTest, ADroppedRequestGetsAStandIn) {
  RemoteRing* conn = Keep(TupleOf(2), 78);
  auto any = [](const RemoteRing*, const void*) noexcept { return true; };
  ASSERT_EQ(keeper_->table()->DropOneIf(any, nullptr, sys::MonotonicMs()), conn);
  keeper_->Delete(conn);
  ASSERT_TRUE(keeper_->Has(TupleOf(2)));  // (its record)
  KeptRequest kept;
  Reason why = Reason::kNone;
  bool committed = false;
  std::unique_ptr<Channel> stand_in = keeper_->Take(TupleOf(2), proxy_[1], &kept, &why, &committed);
  ASSERT_NE(stand_in, nullptr);
  EXPECT_EQ(kept.conn, nullptr);
  EXPECT_TRUE(committed);  // its client had our answer
  EXPECT_TRUE(static_cast<RemoteRing*>(stand_in.get())->held());
  EXPECT_EQ(stand_in->kind(), TransportKind::kVerbs);
}

TEST_F(KeeperTest, NothingKeptIsPlainAndUncommitted) {
  KeptRequest kept;
  Reason why = Reason::kNone;
  bool committed = false;
  EXPECT_EQ(keeper_->Take(TupleOf(3), proxy_[1], &kept, &why, &committed), nullptr);
  EXPECT_EQ(kept.conn, nullptr);
  EXPECT_EQ(why, Reason::kConnectSlow);
  EXPECT_FALSE(committed);
}

TEST_F(KeeperTest, DropForgetsAndDeletesAndRefusalsAreKept) {
  RemoteRing* conn = Keep(TupleOf(4), 79);
  keeper_->Drop(TupleOf(4));
  EXPECT_EQ(deleted_, std::set<RemoteRing*>{conn});
  EXPECT_FALSE(keeper_->Has(TupleOf(4)));  // (forgotten: no record)
  keeper_->table()->RecordRefusal(TupleOf(5), Reason::kRendezvousBusy, sys::MonotonicMs());
  EXPECT_EQ(keeper_->Refused(TupleOf(5)), Reason::kRendezvousBusy);
  EXPECT_EQ(keeper_->Refused(TupleOf(6)), Reason::kNone);
}

TEST_F(KeeperTest, AListenersRequestsGoWithItAndTheRestWithTheKeeper) {
  RequestOwner other;
  RemoteRing* a = Keep(TupleOf(7), 1);
  RemoteRing* b = Keep(TupleOf(8), 2, &other);
  keeper_->ForgetOwner(&other);
  EXPECT_EQ(deleted_, std::set<RemoteRing*>{b});
  keeper_.reset();
  EXPECT_EQ(deleted_, (std::set<RemoteRing*>{a, b}));
}

// In a fork child the requests are the parent's: nothing is found, nothing deleted.
TEST_F(KeeperTest, AForkChildTouchesNothing) {
  RemoteRing* conn = Keep(TupleOf(9), 3);
  keeper_->ForkChild();
  EXPECT_EQ(keeper_->table(), nullptr);
  EXPECT_FALSE(keeper_->Has(TupleOf(9)));
  keeper_->Drop(TupleOf(9));
  keeper_.reset();
  EXPECT_TRUE(deleted_.empty());
  delete static_cast<StandInRing*>(conn);  // (the "parent's", here the test's)
}

TEST(KeeperUnmade, HasNothingUntilMade) {
  RequestKeeper keeper(kNames, Delete, 100, kHandshakeMs);
  EXPECT_EQ(keeper.table(), nullptr);
  EXPECT_FALSE(keeper.Has(TupleOf(1)));
  EXPECT_EQ(keeper.Refused(TupleOf(1)), Reason::kNone);
  EXPECT_EQ(keeper.CheckDue(sys::MonotonicMs() + 100000), 0u);
}

}  // namespace
}  // namespace slip
