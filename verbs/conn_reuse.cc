// Conn's reuse of queue pairs (docs/DESIGN.md "Reusing queue pairs"): the link messages
// (PARKED, CLAIM, ANSWER), parking, and starting a claimed connection again from zero.
#include <sys/epoll.h>

#include <cstring>
#include <mutex>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/conn.h"
#include "verbs/conn_internal.h"

namespace slip::verbs {

using namespace conn_internal;

bool Conn::SendLink(const LinkMsg& msg) noexcept {
  // From a buffer of the control block, one per kind: a SEND's bytes must stay put until
  // it completes. A PARKED may still be in flight when the CLAIM goes; the next message of
  // a kind follows a whole stream.
  uint8_t* buf =
      slot_.control() + (msg.kind == LinkKind::kParked ? kParkedOutOffset : kClaimOutOffset);
  const size_t len = EncodeLink(msg, buf, kRecvBufSize);
  ibv_sge sge{uint64_t(uintptr_t(buf)), uint32_t(len), remote_lkey_};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  if (len <= max_inline_) wr.send_flags = IBV_SEND_INLINE;
  return PostChain(&wr, 1);
}

void Conn::HandleLink(const LinkMsg& msg) const noexcept {
  auto* self = const_cast<Conn*>(this);
  switch (msg.kind) {
    case LinkKind::kParked:
      // Follows the peer's CLOSED, which said it would keep the queue pair.
      if (peer_closed_.load(std::memory_order_acquire) &&
          peer_lingers_.load(std::memory_order_acquire)) {
        peer_parked_.store(true, std::memory_order_release);
        return;
      }
      break;
    case LinkKind::kClaim:
      // Only a listener's parked queue pair is claimed, once, after the client parked.
      if (!client_role_ && parked_.load(std::memory_order_acquire) &&
          peer_parked_.load(std::memory_order_acquire) && !claim_taken_.load()) {
        claim_ = msg;
        claim_taken_.store(true, std::memory_order_release);
        return;
      }
      break;
    case LinkKind::kAnswer:
      if (claiming_.load(std::memory_order_acquire) && msg.nonce == claim_nonce_ &&
          answer_.load() == 0) {
        answer_.store(msg.accepted ? 1 : -1, std::memory_order_release);
        return;
      }
      break;
    case LinkKind::kTaken:
      // Once, to a group's client, for its own request.
      if (expect_taken_.load(std::memory_order_acquire) && msg.nonce == taken_nonce_ &&
          !taken_.exchange(true, std::memory_order_acq_rel))
        return;
      break;
  }
  SLIP_LOG(kWarn,
           "verbs: unexpected link message %u from the peer (client %d, parked %d, peer "
           "parked %d, peer closed %d/%d, claim %d, claiming %d); resetting",
           unsigned(msg.kind), int(client_role_), int(parked_.load()), int(peer_parked_.load()),
           int(peer_closed_.load()), int(peer_lingers_.load()), int(claim_taken_.load()),
           int(claiming_.load()));
  self->Fail(EPROTO);
}

void Conn::Park() noexcept {
  // Parked before PARKED goes out (a listener's queue pair must take the CLAIM that may
  // follow it), claimable only after (a client's CLAIM must not overtake its PARKED).
  parked_.store(true, std::memory_order_seq_cst);
  // Arms the completion queue and the progress thread's watch (WantsProgress).
  Poll();
  LinkMsg parked;
  parked.kind = LinkKind::kParked;
  if (!SendLink(parked)) {
    Fail(ECONNRESET);
    return;
  }
  parked_said_.store(true, std::memory_order_release);
}

bool Conn::ParkedDead() const noexcept {
  return error_.load(std::memory_order_acquire) != 0 || !on_transport() ||
         peer_disconnected_.load(std::memory_order_acquire) ||
         (peer_closed_.load(std::memory_order_acquire) &&
          !peer_lingers_.load(std::memory_order_acquire));
}

bool Conn::Claimable() const noexcept {
  Poll();
  return parked_said_.load(std::memory_order_acquire) && client_role_ && !ParkedDead() &&
         peer_parked_.load(std::memory_order_acquire);
}

void Conn::ResetStream() noexcept {
  stream_live_.store(false, std::memory_order_relaxed);
  // Both ends' last writes of the old stream landed before the PARKED that preceded this
  // (the client's claim, or the listener's answer to it): nothing old arrives any more.
  rx_wake_.reader_waiting.store(0);
  rx_wake_.writer_waiting.store(0);
  rx_wake_.tokens.store(0);
  tx_wake_.reader_waiting.store(0);
  tx_wake_.writer_waiting.store(0);
  tx_wake_.tokens.store(0);
  rx_produced_.store(0);
  tx_credit_.store(0);
  *reinterpret_cast<volatile uint64_t*>(slot_.control() + kCreditInOffset) = 0;
  rx_eof_.store(false);
  peer_closed_.store(false);
  peer_lingers_.store(false);
  peer_parked_.store(false);
  parked_said_.store(false);
  deferred_wakes_.store(0);
  credit_sent_ = 0;
  tx_posted_ = 0;
  eof_sent_ = false;
  eof_posted_.store(false);
  rx_close_wanted_.store(false);
  held_broken_.store(false);
  gate_.Lower();
  closed_sent_.store(false);
  closing_.store(false);
  aborting_ = false;
  failover_wanted_.store(false);
  failover_.Reset();  // anchor, cursors, carriage
  streamed_ = false;
  stream_closed_ = false;
  answer_.store(0);
  claim_taken_.store(false);
  expect_taken_.store(false);
  taken_.store(false);
}

bool Conn::SendClaim(uint64_t nonce, uint16_t client_port, uint16_t server_port) noexcept {
  {
    // From now on this thread takes the queue pair's events (EventFd): the progress
    // thread's watch stands down (OnWatchEvent checks claiming_ under the same lock).
    std::lock_guard<std::mutex> lock(g_registry_mu);
    claiming_.store(true, std::memory_order_seq_cst);
    if (own_.channel && !own_.dropped && watched_.exchange(false)) {
      epoll_event ev{};
      ev.events = EPOLLONESHOT;
      ev.data.u64 = uint64_t(uintptr_t(this)) | 1;
      sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_MOD, own_fd_, &ev);
    }
  }
  parked_.store(false, std::memory_order_seq_cst);
  ResetStream();
  claim_nonce_ = nonce;
  Poll();  // arms the queue: the answer must wake EventFd()
  LinkMsg claim;
  claim.kind = LinkKind::kClaim;
  claim.ring_log2 = uint8_t(__builtin_ctz(ring_size()));
  claim.nonce = nonce;
  claim.client_port = client_port;
  claim.server_port = server_port;
  return SendLink(claim);
}

int Conn::TakeAnswer() noexcept {
  TakeEvents(1 << 30);
  Poll();
  int answer = answer_.load(std::memory_order_acquire);
  if (answer == 0 && error_.load(std::memory_order_acquire) != 0) answer = -1;
  if (answer != 0) claiming_.store(false, std::memory_order_release);
  return answer;
}

bool Conn::TakeClaim(LinkMsg* claim) noexcept {
  if (!claim_taken_.load(std::memory_order_acquire) || !parked_.load() || rdma_released())
    return false;
  *claim = claim_;
  return true;
}

void Conn::BeginClaimed(const LinkMsg& claim) noexcept {
  parked_.store(false, std::memory_order_seq_cst);
  ResetStream();
  // The claim is this connection's HELLO: the client's ring is the one we know.
  Hello hello;
  hello.ring_log2 = claim.ring_log2;
  hello.nonce = claim.nonce;
  hello.ring_addr = peer_ring_addr_;
  hello.rkey = peer_rkey_;
  hello_ = hello;
  hello_received_.store(true, std::memory_order_release);
}

bool Conn::SendTaken(uint64_t nonce) noexcept {
  LinkMsg taken;
  taken.kind = LinkKind::kTaken;
  taken.nonce = nonce;
  return SendLink(taken);
}

bool Conn::SendAnswer(uint64_t nonce, bool accepted) noexcept {
  LinkMsg answer;
  answer.kind = LinkKind::kAnswer;
  answer.accepted = accepted;
  answer.nonce = nonce;
  return SendLink(answer);
}

}  // namespace slip::verbs
