// Conn's reuse of queue pairs (docs/DESIGN.md "Reusing queue pairs"): the link messages
// (PARKED, CLAIM, ANSWER), parking, and starting a claimed connection again from zero.
#include <cstring>
#include <mutex>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/conn.h"

namespace slip::verbs {

bool Conn::SendLink(const LinkMsg& msg) noexcept {
  // From a buffer of the control block, one per kind: a SEND's bytes must stay put until
  // it completes. A PARKED may still be in flight when the CLAIM goes; the next message of
  // a kind follows a whole stream.
  const size_t offset = msg.kind == LinkKind::kParked ? kParkedOutOffset : kClaimOutOffset;
  return PostControl(offset, EncodeLink(msg, slot().control() + offset, kRecvBufSize));
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

void Conn::ResetStream(const LinkMsg* claim) noexcept {
  ResetChannel(claim);
  peer_parked_.store(false);
  parked_said_.store(false);
  stream_closed_ = false;
  answer_.store(0);
  claim_taken_.store(false);
  expect_taken_.store(false);
  taken_.store(false);
}

bool Conn::SendClaim(uint64_t nonce, uint16_t client_port, uint16_t server_port) noexcept {
  TakeEventsHere();  // the answer wakes this thread, through EventFd
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
  if (answer != 0) GiveEventsBack();
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
  ResetStream(&claim);
}

bool Conn::SendAnswer(uint64_t nonce, bool accepted) noexcept {
  LinkMsg answer;
  answer.kind = LinkKind::kAnswer;
  answer.accepted = accepted;
  answer.nonce = nonce;
  return SendLink(answer);
}

}  // namespace slip::verbs
