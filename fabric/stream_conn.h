// StreamConn: one of the shim's connections over libfabric; the fabric Channel.
//
// Data: the sender copies into its own registered send ring and writes the same offsets of
// the peer's registered receive ring (fi_write; the wrap splits a publish in two). The last
// write of a publish is an fi_writedata whose remote CQ data is a note (fabric/
// stream_note.h): the new `produced`. Credits go back the same way, as empty writes whose
// note is the receiver's `consumed` (every quarter ring), and so do the stream's ends (EOF,
// CLOSED). The endpoint orders writes (FI_ORDER_WAW), so a note's completion at the
// receiver says that every byte before its cursor has landed.
//
// Progress, over the RDM endpoint: the process's one completion queue (StreamFabric) hands
// each note to the connection its tag names. Whoever waits polls it (a spinning reader or
// writer, the stream's adaptive spin), and the module's progress thread sleeps on it
// otherwise, so arrivals are taken whether anybody asks or not (ShowsArrivalsWithoutAsk).
//
// Over a connected endpoint the connection has a completion queue of its own
// (docs/DESIGN.md, "A connection's own completion queue"): a blocking reader sleeps on its
// descriptor (BeginRxSleep); the progress thread watches it, one event at a time, only
// while somebody waits through the proxy (WantsProgress). The queue is armed (fi_trywait)
// before either sleeps on it. Arrivals are taken in only while somebody asks: the stream
// arms the connection before every sleep.
//
// Failover: a write that fails (the peer's endpoint gone, the provider's connection broken)
// moves the stream onto its TCP anchor through core's AnchorFailover, from the byte both
// ends agree on; halting means deregistering the receive ring, so that nothing lands in it
// after our count. A server's connection is held until its client's CONFIRM (RemoteRing's
// settling, core/remote_ring.h; this transport's hooks in stream_settle.cc).
//
// Thread safety: the Channel contract; posting and polling are thread safe (the domain is
// FI_THREAD_SAFE); the switches of the carriage run under failover_.lock().
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/remote_ring.h"
#include "core/wire.h"
#include "fabric/domain.h"
#include "fabric/ring_memory.h"
#include "fabric/stream_link.h"
#include "fabric/stream_note.h"
#include "fabric/write_ledger.h"

namespace slip::fabric {

class StreamFabric;

// Where a peer's receive ring is, as its REQ or REP said.
struct PeerRing {
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  uint64_t key = 0;
  uint64_t base = 0;  // the RMA address of its byte 0
  uint32_t note_tag = 0;
};

// A write's context: its connection's tag (bits 0-23), its cursor word's slot (bits
// 24-31; 0: none) and its number among the connection's writes (bits 32-63). A receive
// posted for remote CQ data (FI_RX_CQ_DATA) or for a message (sends) has kReceiveSlot
// there, and (sends) its receive slot's number in bits 32-63.
namespace write_context {
constexpr uint32_t kReceiveSlot = 0xff;
constexpr uint32_t kDataSlot = 0xfe;  // a write of the stream's bytes (StreamConn::AwaitLanded)
constexpr uint64_t Make(uint32_t tag, uint32_t slot, uint32_t seq) noexcept {
  return uint64_t(seq) << 32 | uint64_t(slot) << 24 | tag;
}
constexpr uint32_t Tag(uint64_t c) noexcept {
  return uint32_t(c) & 0xffffff;
}
constexpr uint32_t Slot(uint64_t c) noexcept {
  return uint32_t(c >> 24) & 0xff;
}
constexpr uint32_t Seq(uint64_t c) noexcept {
  return uint32_t(c >> 32);
}
}  // namespace write_context

class StreamConn final : public RemoteRing {
 public:
  // What the log lines and the stats call the transport.
  static constexpr Names kNames = {TransportKind::kFabric, "fabric", "the fabric",
                                   "a write on the fabric failed"};
  // Receives posted per connected endpoint, where notes consume them (verbs), each posted
  // again once its completion is taken. More than a peer has cursor-word notes in flight
  // (WriteLedger::kWordSlots); cursor notes are bounded by the peer's send queue instead, and one
  // that finds none posted waits at the peer (RNR, retried for ever) until our next poll.
  static constexpr int kPostedReceives = 128;
  // Sends (StreamFabric::sends): receives of streamwire::kSendBytes each, one per message
  // the peer may have in flight before it waits for us (FI_RM_ENABLED).
  static constexpr int kSendReceives = 32;

  // Rings of `ring_size` bytes, registered; a tag in the fabric's table. nullptr with *why.
  static StreamConn* Create(StreamFabric* fabric, uint32_t ring_size, Reason* why) noexcept;
  ~StreamConn() override;

  uint32_t tag() const noexcept { return tag_; }
  uint32_t peer_tag() const noexcept { return peer_.note_tag; }
  // What the REQ or REP tells the peer about our receive ring.
  uint64_t rx_key() const noexcept { return rx_key_; }
  uint64_t rx_base() const noexcept { return rx_base_; }
  // RDM: `ep` is the process's endpoint and `peer.addr` the peer's entry.
  void SetPeer(const PeerRing& peer, fid_ep* ep) noexcept {
    peer_ = peer;
    ep_.store(ep, std::memory_order_release);
  }

  // Connected endpoints (fabric/stream_link.h). A client connects its own, for the
  // listener's connection `server_tag` (the REP's) with the REQ's `nonce`; PollLink says
  // when it is up (LinkEventFd turns readable).
  bool ConnectLink(const sockaddr* server, uint32_t server_tag, uint64_t nonce) noexcept;
  Link::Step PollLink() noexcept;
  int LinkEventFd() const noexcept { return link_.event_fd(); }
  // A server's pending connection takes one connection request, the one whose data has
  // this REQ's nonce; the request is accepted by OnLinkRequest (the progress thread) and
  // up at OnLinkUp. A client that confirms before its endpoint is up here waits for it at
  // settling.
  void ExpectLink(uint64_t nonce) noexcept;
  // Takes *request (leaving it null) only when it is this connection's: one it refuses
  // stays the caller's to reject (a request nobody rejects or accepts holds the
  // provider's socket for good).
  bool OnLinkRequest(InfoPtr* request, uint64_t nonce, fid_eq* eq) noexcept;
  void OnLinkUp() noexcept;
  void OnLinkDown(int error) noexcept;
  // One of our posted receives was consumed (`context` its, write_context), by `len` bytes
  // with the peer's note, where it carries one.
  void OnReceive(uint64_t context, size_t len, bool has_note, uint64_t data) noexcept;
  // Remote CQ data on our own endpoint's queue: only our peer writes there.
  void OnPeerNote(uint64_t data) noexcept;
  // Server: held until the client proves in band that it made the request (a CONFIRM with
  // `nonce`); Settle decides by `deadline_ms` (RemoteRing::Hold; its TCP connection is
  // accepted, so it is no longer unproven).
  void Hold(uint64_t nonce, uint64_t deadline_ms) noexcept;
  // A listener's connection for a request not yet proven by its TCP connection: its rings,
  // should they have to retire (a peer may still write them), count against the budget of
  // unproven requests (StreamFabric::Retire), not the connections'.
  void MarkUnproven() noexcept { unproven_ = true; }

  // The completion queue's news for this connection (any thread that polled it).
  void OnNote(uint64_t data) noexcept;
  // A 4-byte note: its cursor is in our word (fabric/stream_note.h).
  void OnShortNote(uint64_t data) noexcept;
  // A cursor note (connected endpoints, fabric/stream_note.h).
  void OnLinkNote(uint32_t data) noexcept;
  // `context`: the write's (write_context).
  void OnWriteDone(uint64_t context) noexcept;
  void OnWriteFailed(int error, uint64_t context) noexcept;
  // Connected: the progress thread's one shot on our queue fired; its turn that timed out
  // (a queue it could not arm, or one without a descriptor, is polled then).
  void OnWatchEvent() noexcept;
  void OnProgressTurn() noexcept;
  // Waits (bounded) until every posted write completed.
  bool Flush(int timeout_ms) noexcept;

  // --- Channel ---
  const char* provider() const noexcept override;
  const uint8_t* RxData() const noexcept override {
    return rx_ring_.load(std::memory_order_acquire);
  }
  bool ShowsArrivalsWithoutAsk() const noexcept override { return !cq_; }
  int BeginRxSleep() noexcept override;
  void EndRxSleep(bool woken) noexcept override;
  void TxCopy(uint32_t offset, const void* src, size_t len) noexcept override;
  void CloseRx() noexcept override;

  // --- ChannelControl (the rest is RemoteRing's) ---
  void BeforePeerGone() noexcept override;

 private:
  StreamConn(StreamFabric* fabric, uint32_t ring_size) noexcept;
  bool Init(Reason* why) noexcept;

  // Takes what our completion queues hold (connected; else the process's), and has the
  // progress thread watch them when somebody waits through the proxy. Completions taken.
  int Poll() noexcept;
  bool WantsProgress() const noexcept;
  fid_cq* tx_cq() const noexcept { return tx_cq_ ? tx_cq_.get() : cq_.get(); }
  void WatchFromProgress() noexcept;
  // Asks our queue for an event on its next completion (taking what it holds first):
  // false when it could not be armed (the progress thread's turns poll it then).
  bool ArmCq() noexcept;

  // Posts one write of `len` bytes at `src` (in the send registration; len 0: an empty
  // write) to the peer's `remote`, with `note` as its remote CQ data where `with_note`,
  // and `slot` (a cursor word's, or 0) in its context. False when the endpoint refuses (the
  // failover is requested then).
  // `delivered`: complete only once at the peer (a close's last notes: the peer must have
  // them before our TCP connection's FIN, which takes another path and may overtake them).
  bool Post(const void* src, uint32_t len, uint64_t remote, bool with_note, uint64_t note,
            uint32_t slot, bool delivered = false) noexcept;
  // The note that says `cursor` (an 8-byte note, a word with a 4-byte note, or a cursor
  // note on an empty write).
  bool PostNote(note::Kind kind, uint64_t cursor, bool delivered = false) noexcept;
  // A credit note for `consumed` (delivered where it follows our CLOSED).
  bool PostCredit(uint64_t consumed) noexcept override;
  bool PostData(uint64_t from, uint64_t to) noexcept override;
  void PostEnd() noexcept override;
  // While the provider has no room (or no cursor word is free): polls, and gives up when
  // the connection failed, left the fabric or its peer closed or died. False: give up.
  bool AwaitRoom(uint64_t* next_look, uint64_t* ended_since) noexcept;
  // ofi_rxm connects again after its connection failed, so a write posted after one that
  // failed may still land, and a note it carries then claims bytes that never did. True
  // when that cannot have happened: every write completed (waiting up to `timeout_ms`) and
  // none completed after a failed one.
  bool WritesLandedInOrder(int timeout_ms) noexcept;
  // StreamFabric::defers_notes: waits (polling) until every write of our bytes posted so
  // far was delivered. False: one failed, or the connection failed, left the fabric or its
  // peer closed or died; then no note may claim them.
  bool AwaitLanded() noexcept;
  // The anchor says the peer's TCP connection ended (closed, or the peer's FIN in), from
  // TCP_INFO alone: nothing is read, so the control thread still gets a pending reset to
  // report.
  bool AnchorEnded() const noexcept;

  // Failover (stream_settle.cc), under failover_.lock() where it says Locked.
  // Nothing lands in the stream's ring after this (it moves to a copy of the registered
  // one) and notes are ignored: what arrived so far is what we received.
  void HaltLocked() noexcept override;
  bool PeerCountTrusted() noexcept override;
  // Settling (stream_settle.cc): RemoteRing's hooks. A client's REQ carried its ring, so
  // only our endpoint must be up; settling as plain halts.
  PeerCheck ConfirmedPeer(uint64_t now_ms, const char** what) noexcept override;
  void TakeArrivals() const noexcept override { const_cast<StreamConn*>(this)->Poll(); }
  // Receives for remote CQ data on our own endpoint, where the provider needs them; with
  // sends, into the receive slots (slot: which one).
  bool PostReceives() noexcept;
  bool PostReceive(uint32_t slot) noexcept;
  // Sends: a message the peer sent into our receive `slot` (its note `data`), whose bytes
  // go into the ring after the ones before. False: the peer broke the protocol.
  bool TakeSent(uint32_t slot, size_t len, uint32_t data) noexcept;
  // Takes what our own receive queue holds; with sends one thread at a time (messages are
  // copied in their order), and a thread that finds another at it leaves the queue to it.
  int DrainOwn() noexcept;
  enum class LinkState : uint8_t { kNone, kExpected, kOpening, kUp, kDown };

  StreamFabric* const fabric_;
  uint32_t tag_ = 0;
  RingMemory memory_;  // both rings and their words (and the receive slots: sends)
  // The receive ring: the registered one, or its copy once halted (the registered one may
  // still take the peer's last writes, and retires).
  std::atomic<uint8_t*> rx_ring_{nullptr};
  std::unique_ptr<uint8_t[]> rx_copy_;
  uint8_t* tx_ring_ = nullptr;
  // Word notes: the peer writes its cursors to rx_words_ (after the receive ring, in its
  // registration); ours go from the words after the send ring (writes_ hands them out).
  // Cursor notes instead (StreamFabric::link_notes): no words, one write per publish.
  bool link_notes_ = false;
  // Sends instead of writes (StreamFabric::sends): the peer's messages land in our receive
  // slots (kSendReceives of streamwire::kSendBytes, registered for receives) and are copied
  // into the ring by the one thread draining our queue (rx_draining_; rx_drain_wanted_:
  // another found it busy), rx_copying_ while a copy is under way (halting waits for it).
  bool sends_ = false;
  uint8_t* slots_ = nullptr;
  std::atomic<bool> rx_draining_{false};
  std::atomic<bool> rx_drain_wanted_{false};
  std::atomic<uint32_t> rx_copying_{0};
  const volatile uint64_t* rx_words_ = nullptr;
  MrPtr rx_mr_;
  MrPtr tx_mr_;
  void* tx_desc_ = nullptr;
  void* rx_desc_ = nullptr;
  // Connected: our endpoint's completion queues (link_ is bound to them; tx_cq_ null:
  // cq_ takes our writes' too, StreamFabric::OpenConnCqs), cq_'s descriptor (-1: none,
  // polled), whether the progress thread's one shot is set on it (or fired and not yet
  // handled), and whether the descriptor is in its watch (the readers asleep on it are
  // RemoteRing's direct_readers_).
  CqPtr cq_;
  CqPtr tx_cq_;
  int cq_fd_ = -1;
  std::atomic<bool> watched_{false};
  std::atomic<bool> watch_added_{false};
  // What writes go through: the process's RDM endpoint, or our own connected one (link_)
  // once it is up; null before.
  std::atomic<fid_ep*> ep_{nullptr};
  Link link_;
  std::atomic<LinkState> link_state_{LinkState::kNone};
  uint64_t link_nonce_ = 0;
  uint64_t rx_key_ = 0;
  uint64_t rx_base_ = 0;
  PeerRing peer_;
  std::atomic<bool> halted_{false};  // HaltLocked ran: notes are ignored

  // Sender thread only.
  uint64_t data_posted_ = 0;
  std::atomic<bool> closed_posted_{false};
  std::atomic<uint32_t> credits_posting_{0};  // PostCredit under way (CloseRx waits)
  WriteLedger writes_;
  std::atomic<bool> write_failed_{false};  // OnWriteFailed looked at a failure already
  // StreamFabric::defers_notes: writes of our bytes delivered (data_posted_: posted, by
  // the sender); equal, every one landed.
  std::atomic<uint64_t> data_landed_{0};

  bool unproven_ = false;  // MarkUnproven until Hold
};

}  // namespace slip::fabric
