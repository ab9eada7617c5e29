// Conn: one accelerated connection over verbs; its stream is a QpChannel's
// (verbs/qp_channel.h), and this adds what the connection does with the queue pair beyond
// one stream.
//
// A group's client: the client of a listener that shares its port (kFlagGroup) is held,
// like a server's connection, until the process that accepted its TCP connection says
// TAKEN on the queue pair (settle.cc).
//
// Reuse (docs/DESIGN.md "Reusing queue pairs"): a queue pair outlives its stream. When both
// ends close in order, each says in its CLOSED note that it keeps the queue pair, then
// parks it (PARKED); the next connection from the same client to the same listener claims
// it (CLAIM, ANSWER) instead of a new rdma_cm exchange and queue pair. The stream's state
// starts again from zero at the claim: by then both ends' last writes have landed (RC
// delivers in order, and each end's PARKED follows its last write). conn_reuse.cc.
//
// Thread safety: QpChannel's; the link messages arrive on whichever thread polls.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/pending_requests.h"
#include "core/wire.h"
#include "verbs/qp_channel.h"

namespace slip::verbs {

class Conn;

// Takes a Conn back when its stream lets go (Conn::Destroy): the module, which closes the
// stream in order and then keeps the queue pair for reuse or deletes the Conn.
class ConnOwner {
 public:
  virtual void Release(Conn* conn) noexcept = 0;

 protected:
  ~ConnOwner() = default;
};

class Conn final : public QpChannel {
 public:
  // Creates the completion queue, the queue pair on `id` and the rings. Returns nullptr
  // with *error (-errno) on failure; `id` stays the caller's then.
  static Conn* Create(rdma_cm_id* id, Device* device, uint32_t ring_size, bool send_notify,
                      int* error) noexcept;
  ~Conn() override;

  // Who takes the Conn back when its stream is destroyed (else it is deleted).
  void SetOwner(ConnOwner* owner) noexcept { owner_ = owner; }
  void Destroy() noexcept override {
    if (owner_)
      owner_->Release(this);
    else
      delete this;
  }

  // --- a listener's request ---
  // The 4-tuple of the request it answers, kept in the module's table until accept()
  // takes it (the progress thread withdraws it there when its client disconnects first).
  void SetRequest(const Tuple& t) noexcept { request_ = t; }
  const Tuple& request() const noexcept { return request_; }

  // --- a group's client (settle.cc) ---
  // ExpectTaken (at the REP) lets the TAKEN in from then on; HoldForTaken (before SetProxy)
  // holds the stream, like a server's, until Settle sees the TAKEN and sends the CONFIRM,
  // or sees the server's own bytes, a failure or `deadline_ms` and goes plain. (A group's
  // queue pair is never parked: ExpectTaken implies NoReuse.)
  void ExpectTaken(uint64_t nonce) noexcept;
  bool awaits_taken() const noexcept { return expect_taken_.load(std::memory_order_acquire); }
  void HoldForTaken(uint64_t deadline_ms) noexcept;
  // Listener of such a group: the accepting process took the request (a SEND).
  bool SendTaken(uint64_t nonce) noexcept;
  // A group's client settles on the TAKEN; a server as RemoteRing says.
  Settlement Settle(uint64_t now_ms, Reason* why) noexcept override;

  // --- reuse (conn_reuse.cc) ---
  // Never parked for a later connection (a group's: the claim could not be checked).
  void NoReuse() noexcept { no_reuse_ = true; }
  // The client end of a connection to `dest` (what a later connect() there may reuse).
  void SetClientOf(const wire::Endpoint& dest) noexcept {
    client_role_ = true;
    dest_ = dest;
  }
  bool client_role() const noexcept { return client_role_; }
  const wire::Endpoint& dest() const noexcept { return dest_; }
  // The application let go of the stream (QpChannel::EndStream). With `may_linger` an
  // orderly close keeps the queue pair; returns true when it did (then Park() or delete),
  // false when only deleting is left.
  bool CloseStream(bool may_linger) noexcept;
  // Listed by the module: says PARKED and lets the progress thread take what arrives.
  void Park() noexcept;
  // Both ends parked, nothing failed: a connection may claim it (client end).
  bool Claimable() const noexcept;
  // Gone for good (the peer disconnected or will, an error): to be deleted.
  bool ParkedDead() const noexcept;
  bool PeerParked() const noexcept { return peer_parked_.load(std::memory_order_acquire); }
  // Client: takes the queue pair for a new connection and sends the CLAIM; the answer
  // comes as an event on EventFd(), and TakeAnswer() says it: 1 accepted, -1 refused or
  // failed, 0 not yet.
  bool SendClaim(uint64_t nonce, uint16_t client_port, uint16_t server_port) noexcept;
  int TakeAnswer() noexcept;
  // Listener: the CLAIM that arrived on this parked queue pair, if any (taken once).
  bool TakeClaim(LinkMsg* claim) noexcept;
  // Listener: starts the claimed connection (its HELLO is the claim) and answers it.
  void BeginClaimed(const LinkMsg& claim) noexcept;
  bool SendAnswer(uint64_t nonce, bool accepted) noexcept;

 private:
  Conn(rdma_cm_id* id, Device* device, uint32_t ring_size) noexcept
      : QpChannel(id, device, ring_size) {}

  // PARKED, CLAIM, ANSWER and TAKEN, each checked against what this end expects.
  void HandleLink(const LinkMsg& msg) const noexcept override;
  bool SendLink(const LinkMsg& msg) noexcept;
  // A group's client (HoldForTaken): settles on the TAKEN, or goes plain.
  Settlement SettleClient(uint64_t now_ms, Reason* why) noexcept;
  // The stream's state back to a new connection's (a claimed queue pair; the listener's
  // takes `claim` as its HELLO).
  void ResetStream(const LinkMsg* claim = nullptr) noexcept;

  ConnOwner* owner_ = nullptr;
  Tuple request_{};  // (set and read by the progress thread)

  // A group's client: expecting the TAKEN (from the REP on), its nonce, whether it came,
  // how long Settle waits before it looks at the completion queue again, and since when.
  std::atomic<bool> expect_taken_{false};
  uint64_t taken_nonce_ = 0;
  mutable std::atomic<bool> taken_{false};
  uint32_t taken_poll_ms_ = 1;
  uint64_t held_since_ms_ = 0;

  // Reuse (QpChannel's parked_ and claiming_ are what the data path reads of it).
  bool no_reuse_ = false;
  bool client_role_ = false;
  wire::Endpoint dest_{};
  bool stream_closed_ = false;                    // CloseStream ran
  std::atomic<bool> parked_said_{false};          // our PARKED posted
  mutable std::atomic<bool> peer_parked_{false};  // its PARKED arrived
  uint64_t claim_nonce_ = 0;
  mutable std::atomic<int> answer_{0};            // client: 1 accepted, -1 refused
  mutable std::atomic<bool> claim_taken_{false};  // listener: a CLAIM arrived
  mutable LinkMsg claim_;
};

}  // namespace slip::verbs
