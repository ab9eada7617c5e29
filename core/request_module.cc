#include "core/request_module.h"

#include "core/stand_in_ring.h"
#include "core/sys.h"

namespace slip {

RequestKeeper::~RequestKeeper() {
  if (!table()) return;  // (a fork child's are the parent's)
  while (RemoteRing* conn = table_.ForgetOneOf(nullptr)) Delete(conn);
}

bool RequestKeeper::Make(size_t budget_bytes, size_t max_kept) noexcept {
  if (made_.load(std::memory_order_acquire)) return true;
  std::lock_guard<std::mutex> lock(make_mu_);
  if (made_.load(std::memory_order_relaxed)) return true;
  if (!table_.Init(budget_bytes, max_kept)) return false;
  made_.store(true, std::memory_order_release);
  return true;
}

bool RequestKeeper::Has(const Tuple& t) noexcept {
  PendingRequests* table = this->table();
  return table && table->Has(t, sys::MonotonicMs());
}

void RequestKeeper::Drop(const Tuple& t) noexcept {
  if (PendingRequests* table = this->table()) Delete(table->Forget(t, sys::MonotonicMs()));
}

Reason RequestKeeper::Refused(const Tuple& t) noexcept {
  PendingRequests* table = this->table();
  return table ? table->Refused(t, sys::MonotonicMs()) : Reason::kNone;
}

std::unique_ptr<Channel> RequestKeeper::Take(const Tuple& t, int proxy_b, KeptRequest* kept,
                                             Reason* why, bool* committed) noexcept {
  *kept = KeptRequest{};
  *why = Reason::kConnectSlow;
  PendingRequests* table = this->table();
  PendingRequests::Taken taken;
  if (!table || !table->Take(t, sys::MonotonicMs(), &taken)) return nullptr;
  // Its client had our answer: its CONFIRM may be on its way (a transport that knows
  // better says so in Accepted).
  *committed = true;
  *why = Reason::kResources;
  std::unique_ptr<RemoteRing, PendingRequests::Deleter> conn(taken.conn, release_);
  const int own_b = sys::DupAbove(proxy_b, fd_floor_);
  if (own_b < 0) return nullptr;
  const uint64_t deadline = sys::MonotonicMs() + handshake_ms_;
  if (taken.dropped) {
    // Dropped before its connection came (its grace, its path, or room for another's): a
    // stand-in without a path (core/stand_in_ring.h), so that a CONFIRM of the client's
    // goes onto TCP.
    auto stand_in = StandInRing::Create(names_, 1u << taken.ring_log2, taken.nonce, deadline);
    if (!stand_in) {
      sys::close(own_b);
      return nullptr;
    }
    stand_in->SetProxy(own_b);
    return stand_in;
  }
  conn->Hold(taken.nonce, deadline);
  conn->SetProxy(own_b);
  kept->conn = conn.release();
  kept->nonce = taken.nonce;
  *why = Reason::kNone;
  return nullptr;
}

size_t RequestKeeper::CheckDue(uint64_t now_ms) noexcept {
  PendingRequests* table = this->table();
  if (!table) return 0;
  const uint64_t due = table->next_due_ms();
  return due != 0 && due <= now_ms ? table->CheckDue(now_ms, release_) : 0;
}

void RequestKeeper::ForgetOwner(const RequestOwner* owner) noexcept {
  if (PendingRequests* table = this->table())
    while (RemoteRing* conn = table->ForgetOneOf(owner)) Delete(conn);
}

}  // namespace slip
