// The verbs module's parked queue pairs (docs/DESIGN.md "Reusing queue pairs"): kept after
// an orderly close, claimed by the next connection from the same client to the same
// listener, swept when they die or idle too long.
#include <algorithm>
#include <cerrno>
#include <mutex>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/module_impl.h"

namespace slip::verbs {

using namespace module_internal;

void VerbsModule::Release(Conn* conn) noexcept {
  // The closing thread (the closer, or close() itself with SO_LINGER) runs the close: the
  // notes and their acknowledgements, as before reuse existed.
  const bool room = !forked_.load() && options_->reuse > 0 && ParkedCount() < options_->reuse &&
                    !conn->orphaned();
  if (!conn->CloseStream(room)) {
    delete conn;
    return;
  }
  // Listed before PARKED goes out: a claim that follows it must find the queue pair here.
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    try {
      parked_.push_back(ParkedConn{conn, sys::MonotonicMs(), false});
    } catch (...) {
      conn = nullptr;
    }
  }
  if (!conn) return;  // (out of memory: leaked, as nothing else could be done safely)
  conn->Park();
  {
    // (A claim may have taken it meanwhile: then it is no longer listed, and a stream's.)
    std::lock_guard<std::mutex> lock(park_mu_);
    for (ParkedConn& p : parked_) {
      if (p.conn == conn) p.ready = true;
    }
  }
  SLIP_LOG(kDebug, "verbs: queue pair %u parked for reuse", conn->qp_num());
}

size_t VerbsModule::ParkedCount() noexcept {
  std::lock_guard<std::mutex> lock(park_mu_);
  return parked_.size();
}

Conn* VerbsModule::TakeParked(const wire::Endpoint& dest) noexcept {
  std::lock_guard<std::mutex> lock(park_mu_);
  // The newest first: its peer is the most likely still there.
  for (size_t i = parked_.size(); i-- > 0;) {
    Conn* conn = parked_[i].conn;
    if (!parked_[i].ready || !conn->client_role() || !(conn->dest() == dest) ||
        conn->ring_size() != config_->ring_size || !conn->Claimable())
      continue;
    parked_.erase(parked_.begin() + long(i));
    return conn;
  }
  return nullptr;
}

void VerbsModule::PutParked(Conn* conn) noexcept {
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    try {
      parked_.push_back(ParkedConn{conn, sys::MonotonicMs()});
      return;
    } catch (...) {
    }
  }
  delete conn;
}

ClientConn* VerbsModule::Reuse(const wire::Endpoint& dest) noexcept {
  if (options_->reuse == 0) return nullptr;
  Conn* conn = TakeParked(dest);
  if (!conn) return nullptr;
  auto* c = new (std::nothrow) ClientConn();
  if (!c) {
    PutParked(conn);
    return nullptr;
  }
  c->conn = conn;
  c->id = conn->id();
  c->dest = dest;
  c->reused = true;
  c->stage = ClientConn::Stage::kReused;
  c->deadline_ms = sys::MonotonicMs();  // nothing to wait for: Advance says kResolved
  SLIP_LOG(kDebug, "verbs: reusing parked queue pair %u", conn->qp_num());
  return c;
}

bool VerbsModule::SendClaim(ClientConn* c, const wire::Endpoint& client,
                            const wire::Endpoint& server, uint32_t ring_size,
                            Reason* why) noexcept {
  *why = Reason::kResources;
  if (c->stage != ClientConn::Stage::kResolved || ring_size != c->conn->ring_size() ||
      !(server == c->dest))
    return false;
  c->ring_log2 = uint8_t(__builtin_ctz(ring_size));
  c->stage = ClientConn::Stage::kClaim;  // from here on the queue pair is this connection's
  c->deadline_ms = sys::MonotonicMs() + config_->handshake_timeout_ms;
  if (!c->conn->SendClaim(c->nonce, client.port, server.port)) return false;
  *why = Reason::kNone;
  return true;
}

Listener* VerbsModule::ListenerFor(const wire::Endpoint& server) noexcept {
  for (Listener* l : listeners_) {
    if (l->port == server.port && (l->wildcard || SameAddress(l->addr, server))) return l;
  }
  return nullptr;
}

void VerbsModule::ServeClaims() noexcept {
  std::vector<ParkedConn> claimed;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    LinkMsg unused;
    MoveOutIf(&parked_, &claimed, [&](const ParkedConn& p) { return p.conn->TakeClaim(&unused); });
  }
  for (const ParkedConn& p : claimed) {
    LinkMsg claim;
    if (p.conn->TakeClaim(&claim)) ServeClaim(p.conn, claim);
  }
}

void VerbsModule::ServeClaim(Conn* conn, const LinkMsg& claim) noexcept {
  // The claim names ports only: the addresses are the queue pair's own, which rdma_cm
  // checked when it was made (OnConnectRequest).
  Tuple tuple;
  bool ok = EndpointOf(rdma_get_peer_addr(conn->id()), &tuple.client) &&
            EndpointOf(rdma_get_local_addr(conn->id()), &tuple.server) &&
            (1u << claim.ring_log2) == conn->ring_size();
  tuple.client.port = claim.client_port;
  tuple.server.port = claim.server_port;
  PendingRequests* const table = Requests();
  PendingRequests::Room room;
  PendingRequests::Answer unused;
  bool kept = false;
  if (ok && table && table->Find(tuple, claim.nonce, &unused) == PendingRequests::Found::kNone) {
    std::lock_guard<std::mutex> lock(mu_);
    Listener* l = ListenerFor(tuple.server);
    // A group's listener answers requests only (the member check, the TAKEN): a queue pair
    // parked with a listener that was not a group's before cannot serve it.
    if (l && !l->group && ReserveRequest(l, tuple, conn->ring_size(), &room)) {
      // Kept before the answer: the client's SYN follows the answer.
      conn->BeginClaimed(claim);
      conn->SetRequest(tuple);
      PendingRequests::Answer answer;
      answer.ring_size = conn->ring_size();
      table->Keep(&room, tuple, claim.nonce, conn, answer, sys::MonotonicMs());
      kept = true;
    }
  }
  for (size_t i = 0; i < room.evicted_count; ++i) DeleteRequest(room.evicted[i]);
  SLIP_LOG(kDebug, "verbs: claim of queue pair %u for port %u: %s", conn->qp_num(),
           claim.server_port, kept ? "pending" : "refused");
  if (kept && conn->SendAnswer(claim.nonce, true)) return;
  if (kept) {
    // The answer could not go: the request is withdrawn before anyone waits for it (a
    // forger's SYN may have had accept() take it: then it is accept()'s).
    if (!table->Withdraw(tuple, conn, Reason::kResources, sys::MonotonicMs())) return;
  } else {
    conn->SendAnswer(claim.nonce, false);
  }
  delete conn;  // the client learns from its disconnect too
}

void VerbsModule::SweepParked() noexcept {
  std::vector<ParkedConn> gone;
  const uint64_t now = sys::MonotonicMs();
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    MoveOutIf(&parked_, &gone, [now](const ParkedConn& p) {
      const uint64_t idle = p.conn->client_role() ? kClientIdleMs : kListenerIdleMs;
      const uint64_t limit = p.conn->PeerParked() ? idle : kLingerMs;
      return p.ready && (p.conn->ParkedDead() || now - p.since_ms >= limit);
    });
  }
  for (const ParkedConn& p : gone) delete p.conn;  // disconnects: the peer drops its end
}

bool VerbsModule::EvictParked() noexcept {
  Conn* oldest = nullptr;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    auto it =
        std::find_if(parked_.begin(), parked_.end(), [](const ParkedConn& p) { return p.ready; });
    if (it == parked_.end()) return false;
    oldest = it->conn;
    parked_.erase(it);
  }
  SLIP_LOG(kDebug, "verbs: dropping parked queue pair %u for a new connection", oldest->qp_num());
  delete oldest;
  return true;
}

}  // namespace slip::verbs
