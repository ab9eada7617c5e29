// StreamConn's own connected endpoint (SLIP_FABRIC_ENDPOINT=msg, fabric/stream_link.h):
// a client's connect, a server's accept of the one request its REQ announced, the
// endpoint's events, and the receives that the peer's notes consume where the provider
// needs them (FI_RX_CQ_DATA: verbs), or that its sends fill (SLIP_FABRIC_DATA=send).
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "fabric/stream_conn.h"
#include "fabric/stream_fabric.h"
#include "fabric/stream_wire.h"

namespace slip::fabric {

bool StreamConn::ConnectLink(const sockaddr* server, uint32_t server_tag, uint64_t nonce) noexcept {
  std::string why;
  streamwire::LinkParam param;
  param.server_tag = server_tag;
  param.nonce = nonce;
  uint8_t data[streamwire::kLinkBytes];
  streamwire::EncodeLink(param, data);
  link_state_.store(LinkState::kOpening, std::memory_order_release);
  if (!link_.Open(fabric_->domain(), nullptr, server, tx_cq(), cq_.get(), nullptr, tag_, &why) ||
      !PostReceives() || !link_.Connect(server, data, sizeof(data), &why)) {
    SLIP_LOG(kInfo, "fabric: conn %06x cannot connect its endpoint (%s)", tag_, why.c_str());
    link_state_.store(LinkState::kDown, std::memory_order_release);
    return false;
  }
  return true;
}

Link::Step StreamConn::PollLink() noexcept {
  if (link_state_.load(std::memory_order_acquire) != LinkState::kOpening)
    return Link::Step::kFailed;
  std::string why;
  const Link::Step step = link_.PollConnect(&why);
  if (step == Link::Step::kUp) {
    ep_.store(link_.ep(), std::memory_order_release);
    link_state_.store(LinkState::kUp, std::memory_order_release);
    if (fabric_->manual_progress()) WatchFromProgress();
  } else if (step == Link::Step::kFailed) {
    SLIP_LOG(kInfo, "fabric: conn %06x: the listener did not take our endpoint (%s)", tag_,
             why.c_str());
    link_state_.store(LinkState::kDown, std::memory_order_release);
  }
  return step;
}

void StreamConn::ExpectLink(uint64_t nonce) noexcept {
  link_nonce_ = nonce;
  fabric_->ExpectingLinks(+1);
  link_state_.store(LinkState::kExpected, std::memory_order_release);
}

bool StreamConn::OnLinkRequest(InfoPtr* offered, uint64_t nonce, fid_eq* eq) noexcept {
  // One request per connection, with the nonce of the REQ that made it: a stranger learns
  // the tag from no REP of its own connections, and the nonce from no message at all.
  // (The request's source is not checked: a host may reach the fabric from another
  // address than its TCP connections come from.)
  // (The nonce is read only once the state says it was set: ExpectLink stores it before
  // it publishes kExpected, and the request may come from the progress thread before.)
  if (link_state_.load(std::memory_order_acquire) != LinkState::kExpected || nonce != link_nonce_)
    return false;
  LinkState expected = LinkState::kExpected;
  if (!link_state_.compare_exchange_strong(expected, LinkState::kOpening)) return false;
  fabric_->ExpectingLinks(-1);
  InfoPtr request = std::move(*offered);
  std::string why;
  if (!link_.Open(fabric_->domain(), request.get(), nullptr, tx_cq(), cq_.get(), eq, tag_, &why) ||
      !PostReceives() || !link_.Accept(&why)) {
    SLIP_LOG(kInfo, "fabric: conn %06x cannot accept its client's endpoint (%s)", tag_,
             why.c_str());
    // (An endpoint made for the request owns its socket, and closes it; without one the
    // request still does: the caller rejects it.)
    const bool owned = link_.ep() != nullptr;
    link_.Close();
    OnLinkDown(EIO);
    if (!owned) {
      *offered = std::move(request);
      return false;
    }
  }
  return true;
}

void StreamConn::OnLinkUp() noexcept {
  LinkState expected = LinkState::kOpening;
  if (!link_.ep() || !link_state_.compare_exchange_strong(expected, LinkState::kUp)) return;
  ep_.store(link_.ep(), std::memory_order_release);  // (settling waits for it)
  if (fabric_->manual_progress()) WatchFromProgress();
  SLIP_LOG(kDebug, "fabric: conn %06x: endpoint connected", tag_);
}

void StreamConn::OnLinkDown(int error) noexcept {
  link_state_.store(LinkState::kDown, std::memory_order_release);
  SLIP_LOG(kDebug, "fabric: conn %06x: endpoint down (%s)", tag_,
           error ? fi_strerror(error) : "shut down");
  // Held: settling decides. Streaming: nothing here. The event comes on another queue
  // than the peer's last notes, so a peer that said CLOSED and closed its endpoint may
  // be heard shutting down before its CLOSED is taken (failing over then broke orderly
  // closes: semantics.both in the guest). A path that broke shows in our writes'
  // completions (behind any note the peer sent before) and on the anchor.
  if (held()) held_broken_.store(true, std::memory_order_seq_cst);
}

bool StreamConn::PostReceives() noexcept {
  if (!fabric_->posted_receives()) return true;
  const int count = sends_ ? kSendReceives : kPostedReceives;
  for (int i = 0; i < count; ++i)
    if (!PostReceive(uint32_t(i))) return false;
  return true;
}

bool StreamConn::PostReceive(uint32_t slot) noexcept {
  // Writes: empty receives (a note's write lands in the ring memory it names, not here;
  // the buffer is the words' spare room, in the receive registration: FI_MR_LOCAL). Sends:
  // the slot the next message fills, named in the context.
  void* buf = sends_ ? static_cast<void*>(slots_ + size_t(slot) * streamwire::kSendBytes)
                     : static_cast<void*>(const_cast<uint64_t*>(rx_words_) + 2);
  const size_t len = sends_ ? streamwire::kSendBytes : 0;
  void* context = reinterpret_cast<void*>(
      uintptr_t(write_context::Make(tag_, write_context::kReceiveSlot, sends_ ? slot : 0)));
  const ssize_t rc = fi_recv(link_.ep(), buf, len, rx_desc_, FI_ADDR_UNSPEC, context);
  if (rc != 0) SLIP_LOG(kWarn, "fabric: %s", FabricError("fi_recv", int(rc)).c_str());
  return rc == 0;
}

void StreamConn::OnReceive(uint64_t context, size_t len, bool has_note, uint64_t data) noexcept {
  const uint32_t slot = write_context::Seq(context);
  if (sends_) {
    // Taken before the slot is posted again (the next message overwrites it). Every
    // message carries its note: one without is the peer's violation.
    if (slot >= uint32_t(kSendReceives)) return;  // (not a context of ours)
    if (halted_.load(std::memory_order_acquire) || orphaned_.load(std::memory_order_relaxed) ||
        error_.load(std::memory_order_acquire) != 0)
      return;  // (what came before halting or failing is what we received: no more needed)
    if (!has_note || !TakeSent(slot, len, uint32_t(data))) {
      if (!has_note) SLIP_LOG(kWarn, "fabric: a message without its note from the peer; resetting");
      Fail(EPROTO);
      return;
    }
  }
  if (link_.ep() && !PostReceive(slot) && on_transport()) {
    // The peer would stall on a receive it cannot consume: take the anchor instead.
    TransportFailed(wire::FailoverCause::kTransportError);
    return;
  }
  if (has_note && !sends_) OnPeerNote(data);
}

bool StreamConn::TakeSent(uint32_t slot, size_t len, uint32_t data) noexcept {
  // Messages come in the order they were sent and are taken one at a time (DrainOwn): each
  // must say exactly the bytes after ours, within the ring's room. Read once: the note
  // from the completion, the bytes from the slot, which only the next message (posted
  // after this returns) changes.
  const note::Kind kind = note::LinkKindOf(data);
  const uint64_t produced = rx_produced_.load(std::memory_order_acquire);
  if (kind != note::Kind::kData) {
    // Credits, EOF and CLOSED are empty; an EOF says where the bytes end, which is here.
    if (len != 0 || (kind == note::Kind::kEof && note::LinkCursor(data, produced) != produced)) {
      SLIP_LOG(kWarn, "fabric: a malformed %s from the peer; resetting",
               kind == note::Kind::kEof ? "EOF" : "note");
      return false;
    }
    OnLinkNote(data);
    return true;
  }
  if (len == 0 || len > streamwire::kSendBytes ||
      note::LinkCursor(data, produced) != produced + len) {
    SLIP_LOG(kWarn,
             "fabric: a message of %zu bytes whose note disagrees with the stream; resetting", len);
    return false;
  }
  if (produced + len - failover_.consumed() > ring_size()) {
    SLIP_LOG(kWarn, "fabric: the peer overran the ring (produced %llu, consumed %llu); resetting",
             (unsigned long long)(produced + len), (unsigned long long)failover_.consumed());
    return false;
  }
  // Halting waits for a copy under way, or the copy sees it halted and leaves the bytes
  // out of what we received (the peer sends them again over TCP).
  rx_copying_.fetch_add(1, std::memory_order_seq_cst);
  if (halted_.load(std::memory_order_seq_cst)) {
    rx_copying_.fetch_sub(1, std::memory_order_seq_cst);
    return true;
  }
  uint8_t* ring = rx_ring_.load(std::memory_order_relaxed);
  const uint8_t* src = slots_ + size_t(slot) * streamwire::kSendBytes;
  const uint32_t offset = uint32_t(produced & (ring_size() - 1));
  const size_t first = std::min<size_t>(len, ring_size() - offset);
  std::memcpy(ring + offset, src, first);
  if (first < len) std::memcpy(ring, src + first, len - first);
  rx_produced_.store(produced + len, std::memory_order_release);
  rx_copying_.fetch_sub(1, std::memory_order_seq_cst);
  WakeReaderIfSettled();
  return true;
}

void StreamConn::OnPeerNote(uint64_t data) noexcept {
  if (link_notes_) {
    // (4 bytes: the provider's upper ones, if it carries more, are not the peer's.)
    OnLinkNote(uint32_t(data));
    return;
  }
  // Only our peer writes through our endpoint; a note naming another connection is its
  // violation.
  const uint32_t tag = fabric_->word_notes() ? note::ShortTagOf(data) : note::TagOf(data);
  if (tag != tag_) {
    SLIP_LOG(kWarn, "fabric: a note on conn %06x's endpoint names another; resetting", tag_);
    Fail(EPROTO);
    return;
  }
  if (fabric_->word_notes())
    OnShortNote(data);
  else
    OnNote(data);
}

}  // namespace slip::fabric
