// StreamConn's set-up, data path and close: the Channel functions the stream calls, the
// notes the completion queue hands in, and the writes that carry bytes and notes.
#include "fabric/stream_conn.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/proxy.h"
#include "core/sanitizer.h"
#include "core/sys.h"
#include "fabric/stream_fabric.h"
#include "fabric/stream_wire.h"

namespace slip::fabric {

namespace {

// The whole cursor a note says, from the one it moves (RemoteRing::TakeProduced and
// TakeCredit take it).
uint64_t CursorOf(uint64_t data, const std::atomic<uint64_t>& known) noexcept {
  return note::Cursor(data, known.load(std::memory_order_acquire));
}

constexpr size_t kPage = 4096;
// How long a close waits for its writes to complete before it leaves their memory behind.
constexpr int kCloseFlushMs = 5000;
// The same when the peer's TCP connection has ended (its writes' completions, if any, are
// already on their way).
constexpr int kEndedFlushMs = 100;
// How long a stream whose peer's TCP connection ended waits for the peer's last notes.
constexpr uint64_t kPeerGoneWaitMs = 50;
// A write the provider refuses (-FI_EAGAIN) this long with its peer alive is said once, at
// info (a peer that is stopped, or slow to take its queue in, does it too).
constexpr uint64_t kRefusedWarnMs = 1000;

// A wait that is said once it has lasted kRefusedWarnMs. The clock is read only while
// waiting, never on the path that does not wait.
class LongWait {
 public:
  // True once: at the first look after the wait has lasted kRefusedWarnMs.
  bool DueNow() noexcept {
    if (said_) return false;
    const uint64_t now = sys::MonotonicMs();
    if (since_ == 0) since_ = now;
    if (now - since_ < kRefusedWarnMs) return false;
    said_ = true;
    waited_ms_ = now - since_;
    return true;
  }
  unsigned long long waited_ms() const noexcept { return waited_ms_; }

 private:
  uint64_t since_ = 0;
  uint64_t waited_ms_ = 0;
  bool said_ = false;
};
}  // namespace

StreamConn::StreamConn(StreamFabric* fabric, uint32_t ring_size) noexcept
    : RemoteRing(kNames, ring_size), fabric_(fabric) {}

StreamConn* StreamConn::Create(StreamFabric* fabric, uint32_t ring_size, Reason* why) noexcept {
  std::unique_ptr<StreamConn> c(new (std::nothrow) StreamConn(fabric, ring_size));
  *why = Reason::kResources;
  if (!c || !c->Init(why)) return nullptr;
  return c.release();
}

bool StreamConn::Init(Reason* why) noexcept {
  sends_ = fabric_->sends();
  if (sends_ && ring_size() > (1u << streamwire::kSendsMaxRingLog2)) {
    SLIP_LOG(kInfo,
             "fabric: sends carry rings of up to %u bytes, not %u; this connection stays "
             "plain",
             1u << streamwire::kSendsMaxRingLog2, ring_size());
    return false;
  }
  // [receive ring | its words] [send ring | its words] [receive slots: sends], each page
  // aligned.
  const size_t rx_bytes = ring_size() + note::kWordBytes;
  const size_t tx_bytes = ring_size() + WriteLedger::kWordSlots * sizeof(uint64_t);
  const size_t tx_at = (rx_bytes + kPage - 1) & ~(kPage - 1);
  const size_t slots_at = (tx_at + tx_bytes + kPage - 1) & ~(kPage - 1);
  const size_t slots_bytes = sends_ ? size_t(kSendReceives) * streamwire::kSendBytes : 0;
  memory_ = RingMemory::Map((slots_at + slots_bytes + kPage - 1) & ~(kPage - 1));
  if (!memory_) return false;
  uint8_t* rx = memory_.get();
  rx_ring_.store(rx, std::memory_order_release);
  tx_ring_ = rx + tx_at;
  std::memset(rx + ring_size(), 0, note::kWordBytes);
  std::memset(tx_ring_ + ring_size(), 0, WriteLedger::kWordSlots * sizeof(uint64_t));
  rx_words_ = reinterpret_cast<const volatile uint64_t*>(rx + ring_size());
  writes_.SetWords(reinterpret_cast<uint64_t*>(tx_ring_ + ring_size()));
  uint64_t unused_key = 0;
  if (sends_) {
    // Nothing of ours is the peer's to write: it sends from its ring into our slots.
    slots_ = rx + slots_at;
    if (!fabric_->Register(slots_, slots_bytes, FI_RECV, &rx_mr_, &unused_key, &rx_desc_, why) ||
        !fabric_->Register(tx_ring_, tx_bytes, FI_SEND, &tx_mr_, &unused_key, &tx_desc_, why))
      return false;
  }
  // The peer writes our receive ring and words; we write from our send ring and words
  // (and post receives into the words' spare room, where notes consume them).
  const uint64_t rx_access = FI_REMOTE_WRITE | (fabric_->posted_receives() ? FI_RECV : 0);
  if (!sends_ &&
      (!fabric_->Register(rx, rx_bytes, rx_access, &rx_mr_, &rx_key_, &rx_desc_, why) ||
       !fabric_->Register(tx_ring_, tx_bytes, FI_WRITE, &tx_mr_, &unused_key, &tx_desc_, why)))
    return false;
  if (!sends_) rx_base_ = fabric_->RmaBase(rx);
  failover_.SetRings(rx, tx_ring_);
  link_notes_ = fabric_->link_notes(ring_size());
  if (fabric_->connected()) {
    std::string cq_why;
    bool out_of_fds = false;
    if (!fabric_->OpenConnCqs(&cq_, &cq_fd_, &tx_cq_, &cq_why, &out_of_fds)) {
      SLIP_LOG(kWarn, "fabric: no completion queue for a connection (%s)", cq_why.c_str());
      if (out_of_fds) *why = Reason::kFdLimit;
      return false;
    }
    if (cq_fd_ < 0) fabric_->CountPolledConn(1);
  }
  fabric_->AddConn(this, &tag_);
  if (tag_ == 0) {
    SLIP_LOG(kWarn, "fabric: the process has as many connections as notes can name");
    *why = Reason::kResources;
    return false;
  }
  return true;
}

StreamConn::~StreamConn() {
  if (orphaned_.load(std::memory_order_acquire)) {
    // A fork child: the registrations and the table are the parent's.
    (void)rx_mr_.release();
    (void)tx_mr_.release();
    link_.Forget();
    (void)cq_.release();
    (void)tx_cq_.release();
    if (const int b = proxy_b_.load(); b >= 0) sys::close(b);
    return;
  }
  // A peer whose TCP connection ended (it closed, or died) takes no notes: its own close
  // said what it had to, and a dead one never completes our writes.
  const bool peer_ended = AnchorEnded();
  SLIP_LOG(kDebug,
           "fabric: conn %06x (peer %06x) closing: streamed %d held %d on the fabric %d peer ended "
           "%d error %d; sent %llu, credited %llu, received %llu, consumed %llu",
           tag_, peer_.note_tag, int(proxy_b_.load() >= 0), int(held()), int(on_transport()),
           int(peer_ended), error_.load(), (unsigned long long)tx_posted_,
           (unsigned long long)tx_credit_.load(), (unsigned long long)rx_produced_.load(),
           (unsigned long long)failover_.consumed());
  if (proxy_b_.load() >= 0 && ep_.load() != nullptr && !held() && on_transport() && !aborting_ &&
      !peer_ended && error_.load(std::memory_order_acquire) == 0) {
    // The last holder closes (fabric connections do not cross fork): as TCP's close, a
    // final exact credit (the peer tells "our bytes were unread" from it), EOF for the
    // peer's reader and CLOSED for its writer, then every write completed.
    // The face closes our TCP connection next, and its FIN may reach the peer before
    // notes on the fabric: the last one completes only once delivered (the endpoint orders
    // writes, so the others are there too), and the flush below waits for it. A peer that
    // saw the FIN first would take its unacknowledged bytes for lost (a reset).
    const uint64_t consumed = failover_.consumed();
    if (consumed != credit_sent_ && PostCredit(consumed)) credit_sent_ = consumed;
    if (!eof_posted_.exchange(true)) PostNote(note::Kind::kEof, tx_posted_);
    if (!closed_posted_.exchange(true)) PostNote(note::Kind::kClosed, consumed, /*delivered=*/true);
  }
  bool flushed = true;
  if (tag_ != 0) {
    flushed = Flush(peer_ended ? kEndedFlushMs : kCloseFlushMs);
    if (!on_transport() && !aborting_ && failover_.on_tcp()) failover_.FinishOnClose(kCloseFlushMs);
    fabric_->RemoveConn(tag_);
    // (No dispatch runs now: nothing else takes it out of kExpected.)
    if (link_state_.load(std::memory_order_acquire) == LinkState::kExpected)
      fabric_->ExpectingLinks(-1);
  }
  // Our own endpoint goes first: nothing of ours is in flight after, and the peer cannot
  // write through it any more.
  const bool own_endpoint = link_.ep() != nullptr;
  link_.Close();
  // Then its queue, out of the progress thread's watch first (its events name our tag,
  // which no dispatch finds any more).
  if (cq_ && cq_fd_ >= 0 && watch_added_.load()) fabric_->UnwatchConn(cq_fd_);
  if (cq_ && cq_fd_ < 0) fabric_->CountPolledConn(-1);
  cq_.reset();
  tx_cq_.reset();
  // Writes still in flight may read our send ring, and the peer's may still land in our
  // receive ring: both stay registered until the provider is surely done with them. Not
  // when every write of ours completed and the peer is done: it said EOF and CLOSED and
  // its TCP connection ended (a credit of its after CLOSED, its close's last exact one,
  // lands before its FIN: PostCredit); nor over connected endpoints, whose peer writes only
  // through our own endpoint, closed now (or never opened: a request nobody connected for).
  const bool peer_done = rx_eof_.load() && peer_closed_.load() && peer_ended;
  if ((flushed && peer_done) || own_endpoint || fabric_->connected()) {
    rx_mr_.reset();
    tx_mr_.reset();
  } else if (rx_mr_ || tx_mr_) {
    const size_t bytes = memory_.size();
    fabric_->Retire(std::move(rx_mr_), std::move(tx_mr_), std::move(memory_), bytes, unproven_);
  }
  if (peer_.addr != FI_ADDR_NOTAVAIL) fabric_->RemovePeer(peer_.addr);
  if (const int b = proxy_b_.load(); b >= 0) sys::close(b);
}

void StreamConn::BeforePeerGone() noexcept {
  // An orderly peer said CLOSED (after its credit and EOF) before it closed its TCP
  // connection, but the notes take the fabric and the FIN the kernel's path: wait for the
  // notes a little (a dead peer sends none: the wait is bounded).
  if (!on_transport() || held() || orphaned_.load()) return;
  const uint64_t until = sys::MonotonicMs() + kPeerGoneWaitMs;
  while (!peer_closed_.load(std::memory_order_acquire) &&
         error_.load(std::memory_order_acquire) == 0 && sys::MonotonicMs() < until) {
    if (Poll() == 0) sched_yield();
  }
}

const char* StreamConn::provider() const noexcept {
  return fabric_->provider();
}

bool StreamConn::Flush(int timeout_ms) noexcept {
  if (failover_.on_tcp()) return failover_.PushAll(timeout_ms);
  const uint64_t until = sys::MonotonicMs() + uint64_t(timeout_ms);
  uint64_t next_look = 0;
  while (!writes_.AllCompleted()) {
    if (Poll() != 0) continue;
    const uint64_t now = sys::MonotonicMs();
    if (now >= until) return false;
    // A peer that is gone never completes them.
    if (now >= next_look) {
      if (AnchorEnded() && now + kEndedFlushMs < until) return Flush(kEndedFlushMs);
      next_look = now + 10;
    }
    sched_yield();
  }
  return true;
}

// ------------------------------------------------------------------------ notes

void StreamConn::OnNote(uint64_t data) noexcept {
  if (halted_.load(std::memory_order_acquire) || orphaned_.load(std::memory_order_relaxed)) return;
  // Two pollers may hand us notes out of order, so each says where its stream stands: the
  // end of the stream carries the last `produced` (it must not overtake the bytes before
  // it), and CLOSED the last `consumed`.
  switch (note::KindOf(data)) {
    case note::Kind::kData:
      // (A reader is woken only for bytes it has not seen: a stale note, or a doorbell
      // whose word an earlier one already read, must not make poll() say readable.)
      if (TakeProduced(CursorOf(data, rx_produced_)) == Took::kMoved) WakeReaderIfSettled();
      break;
    case note::Kind::kCredit:
      if (TakeCredit(CursorOf(data, tx_credit_)) == Took::kMoved) WakeWriterNow();
      break;
    case note::Kind::kEof:
      SLIP_LOG(kDebug, "fabric: conn %06x: EOF at %llu (received %llu)", tag_,
               (unsigned long long)(data & note::kCursorMask),
               (unsigned long long)rx_produced_.load());
      if (TakeProduced(CursorOf(data, rx_produced_)) == Took::kViolation) break;
      rx_eof_.store(true, std::memory_order_release);
      std::atomic_thread_fence(std::memory_order_seq_cst);  // (SetProxy's pair)
      // The proxy's end first: a poll that a token woke before it would report the
      // stream readable without its hang-up (POLLRDHUP).
      if (const int b = proxy_b_.load(); b >= 0 && !held()) sys::shutdown(b, SHUT_WR);
      WakeReaderIfSettled();
      break;
    case note::Kind::kClosed:
      if (TakeCredit(CursorOf(data, tx_credit_)) == Took::kViolation) break;
      peer_closed_.store(true, std::memory_order_release);
      WakeWriterNow();
      break;
    default:
      SLIP_LOG(kWarn, "fabric: a note of unknown kind from the peer; resetting");
      Fail(EPROTO);
      break;
  }
}

void StreamConn::OnShortNote(uint64_t data) noexcept {
  if (!note::ShortWellFormed(data)) {
    SLIP_LOG(kWarn, "fabric: a malformed note from the peer; resetting");
    Fail(EPROTO);
    return;
  }
  // A doorbell: the word it names says what moved (its write put it in place before this
  // completed; a later one's may have moved it further, which is as true). Every change
  // of a word rings its own doorbell, so the other word is left to its own. Read once,
  // into a copy.
  const note::Kind kind = note::ShortKindOf(data);
  if (kind < note::Kind::kData || kind > note::Kind::kClosed) {
    SLIP_LOG(kWarn, "fabric: a note of unknown kind from the peer; resetting");
    Fail(EPROTO);
    return;
  }
  uint64_t word;
  {
    san::PeerMemoryReads peer_writes;  // (the peer may be writing it again: its next doorbell)
    word = rx_words_[note::WordOffset(kind) / sizeof(uint64_t)];
  }
  const uint64_t cursor = word & ~note::kEndFlag;
  const bool produced = note::WordOffset(kind) == note::kProducedWord;
  OnNote(note::Encode(tag_, produced ? note::Kind::kData : note::Kind::kCredit, cursor));
  if ((word & note::kEndFlag) &&
      !(produced ? rx_eof_ : peer_closed_).load(std::memory_order_acquire))
    OnNote(note::Encode(tag_, produced ? note::Kind::kEof : note::Kind::kClosed, cursor));
}

void StreamConn::OnLinkNote(uint32_t data) noexcept {
  // Extended from our copy of the cursor it moves, then as any 8-byte note of ours.
  const note::Kind kind = note::LinkKindOf(data);
  const bool produced = kind == note::Kind::kData || kind == note::Kind::kEof;
  const uint64_t known = (produced ? rx_produced_ : tx_credit_).load(std::memory_order_acquire);
  OnNote(note::Encode(tag_, kind, note::LinkCursor(data, known)));
}

void StreamConn::OnWriteDone(uint64_t context) noexcept {
  writes_.ReleaseWord(write_context::Slot(context));
  if (write_context::Slot(context) == write_context::kDataSlot && fabric_->defers_notes())
    data_landed_.fetch_add(1, std::memory_order_acq_rel);
  writes_.Done(write_context::Seq(context));
}

bool StreamConn::WritesLandedInOrder(int timeout_ms) noexcept {
  if (!Flush(timeout_ms)) return false;
  return writes_.InOrder();
}

void StreamConn::OnWriteFailed(int error, uint64_t context) noexcept {
  writes_.ReleaseWord(write_context::Slot(context));
  writes_.Failed(write_context::Seq(context));
  // After the peer's orderly close its ring may be gone: the end, not a failure.
  if (peer_closed_.load(std::memory_order_acquire) || !on_transport()) return;
  // The first failure only (the others are taken while it waits, and have nothing to add).
  if (write_failed_.exchange(true, std::memory_order_acq_rel)) return;
  // A closing peer closes its endpoint once its last notes were delivered, so a write of
  // ours may fail before we took its CLOSED (the failure can come first in our queue):
  // take the queue in for a moment, until the CLOSED or the peer's FIN shows. Only a
  // failure with neither is the fabric's (seen once in ~40 semantics runs over tcp: an
  // orderly close taken for a failing fabric, and logged as one).
  const uint64_t until = sys::MonotonicMs() + kPeerGoneWaitMs;
  while (!peer_closed_.load(std::memory_order_acquire) && !AnchorEnded() &&
         sys::MonotonicMs() < until) {
    if (Poll() == 0) sched_yield();
  }
  if (peer_closed_.load(std::memory_order_acquire) || !on_transport()) return;
  SLIP_LOG(kInfo, "fabric: a write failed (%s)%s", fi_strerror(error),
           AnchorEnded() ? ", and the peer's TCP connection ended" : "");
  TransportFailed(wire::FailoverCause::kTransportError);
}

// ------------------------------------------------------------------------ Channel

void StreamConn::TxCopy(uint32_t offset, const void* src, size_t len) noexcept {
  std::memcpy(tx_ring_ + offset, src, len);
}

bool StreamConn::PostData(uint64_t from, uint64_t produced) noexcept {
  const uint32_t mask = ring_size() - 1;
  if (sends_) {
    // Messages of at most a receive slot each, every one with the cursor at its end (the
    // receiver checks each against the bytes it has).
    while (from < produced) {
      const uint32_t offset = uint32_t(from & mask);
      uint64_t len = std::min<uint64_t>(produced - from, ring_size() - offset);
      len = std::min<uint64_t>(len, streamwire::kSendBytes);
      from += len;
      if (!Post(tx_ring_ + offset, uint32_t(len), 0, true,
                note::EncodeLink(note::Kind::kData, from), 0))
        return false;
    }
    return true;
  }
  const uint32_t max_write = fabric_->max_write();
  const bool defer = fabric_->defers_notes();
  while (from < produced) {
    const uint32_t offset = uint32_t(from & mask);
    uint64_t len = produced - from;
    if (len > ring_size() - offset) len = ring_size() - offset;
    if (max_write != 0 && len > max_write) len = max_write;
    from += len;
    // The last write of the publish carries its note (a cursor note, or an 8-byte one; a
    // word's write follows it otherwise, and a deferred note follows its bytes' delivery).
    const bool last = from == produced;
    const bool with_note = last && !defer && (link_notes_ || !fabric_->word_notes());
    const uint64_t data = !with_note    ? 0
                          : link_notes_ ? note::EncodeLink(note::Kind::kData, produced)
                                        : note::Encode(peer_.note_tag, note::Kind::kData, produced);
    if (!Post(tx_ring_ + offset, uint32_t(len), peer_.base + offset, with_note, data,
              write_context::kDataSlot, /*delivered=*/defer))
      return false;
  }
  if (defer && !AwaitLanded()) return false;
  return !(defer || (!link_notes_ && fabric_->word_notes())) ||
         PostNote(note::Kind::kData, produced);
}

void StreamConn::PostEnd() noexcept {
  PostNote(note::Kind::kEof, tx_posted_);
}

void StreamConn::CloseRx() noexcept {
  rx_close_wanted_.store(true, std::memory_order_seq_cst);
  if (failover_.carriage() == Carriage::kTransport && !closed_posted_.exchange(true)) {
    // (A credit being posted goes first: none follows CLOSED unannounced, PostCredit.)
    while (credits_posting_.load(std::memory_order_seq_cst) != 0) sched_yield();
    PostNote(note::Kind::kClosed, failover_.consumed());
  }
}

// ------------------------------------------------------------------------ posting

bool StreamConn::PostCredit(uint64_t consumed) noexcept {
  // The peer may let go of its receive ring once it has our EOF and CLOSED and our TCP
  // connection ended: a credit after CLOSED (our end's exact last one, after close() sent
  // CLOSED; or a reader thread still consuming) must have landed before our FIN, so it
  // completes only once delivered (our end's flush waits for it). A write into a
  // registration that is gone breaks ofi_rxm's connection for every stream between the
  // two processes (the cascade of failures seen in one semantics run in 80). CloseRx
  // waits for a credit under way here, so this one knows whether it follows CLOSED.
  credits_posting_.fetch_add(1, std::memory_order_seq_cst);
  const bool after_closed = closed_posted_.load(std::memory_order_seq_cst);
  const bool posted = PostNote(note::Kind::kCredit, consumed, /*delivered=*/after_closed);
  credits_posting_.fetch_sub(1, std::memory_order_seq_cst);
  return posted;
}

bool StreamConn::PostNote(note::Kind kind, uint64_t cursor, bool delivered) noexcept {
  if (link_notes_)
    return Post(tx_ring_, 0, peer_.base, true, note::EncodeLink(kind, cursor), 0, delivered);
  if (!fabric_->word_notes())
    return Post(tx_ring_, 0, peer_.base, true, note::Encode(peer_.note_tag, kind, cursor), 0,
                delivered);
  uint32_t slot;
  uint64_t next_look = 0, ended_since = 0;
  LongWait wait;
  while ((slot = writes_.TakeWord()) == 0) {
    if (!AwaitRoom(&next_look, &ended_since)) return false;
    if (wait.DueNow()) {
      SLIP_LOG(kInfo,
               "fabric: conn %06x: every cursor word has been in flight for %llu ms (%llu writes "
               "posted, %llu completed)",
               tag_, wait.waited_ms(), (unsigned long long)writes_.posted(),
               (unsigned long long)writes_.completed());
    }
  }
  uint64_t* word = writes_.word(slot);
  // The end stays flagged in later writes of the same word (a credit after CLOSED).
  const bool end = kind == note::Kind::kEof || kind == note::Kind::kClosed ||
                   (note::WordOffset(kind) == note::kConsumedWord && closed_posted_.load());
  *word = cursor | (end ? note::kEndFlag : 0);
  san::HappensBefore(word);  // (WriteLedger::ReleaseWord's pair)
  if (Post(word, sizeof(*word), peer_.base + ring_size() + note::WordOffset(kind), true,
           note::EncodeShort(peer_.note_tag, kind), slot, delivered))
    return true;
  writes_.ReleaseWord(slot);
  return false;
}

bool StreamConn::Post(const void* src, uint32_t len, uint64_t remote, bool with_note, uint64_t data,
                      uint32_t slot, bool delivered) noexcept {
  fid_ep* const ep = ep_.load(std::memory_order_acquire);
  if (ep == nullptr || error_.load(std::memory_order_acquire) != 0 ||
      orphaned_.load(std::memory_order_relaxed))
    return false;
  void* context =
      reinterpret_cast<void*>(uintptr_t(write_context::Make(tag_, slot, writes_.Next())));
  uint64_t next_look = 0, ended_since = 0;
  LongWait refused;
  for (;;) {
    const ssize_t rc = sends_ ? fabric_->Send(ep, src, len, tx_desc_, data, context, delivered)
                              : fabric_->Write(ep, src, len, tx_desc_, with_note, data, peer_.addr,
                                               remote, peer_.key, context, delivered);
    if (rc == 0) {
      if (slot == write_context::kDataSlot && delivered) ++data_posted_;
      writes_.Posted();
      return true;
    }
    if (rc != -FI_EAGAIN) {
      SLIP_LOG(kWarn, "fabric: %s",
               FabricError(sends_      ? "fi_senddata"
                           : with_note ? "fi_writedata"
                                       : "fi_write",
                           int(rc))
                   .c_str());
      TransportFailed(wire::FailoverCause::kTransportError);
      return false;
    }
    // The provider's queue is full: completions free it.
    if (!AwaitRoom(&next_look, &ended_since)) return false;
    if (refused.DueNow()) {
      // The peer's process takes nothing in, or the provider holds our writes back for
      // something of its own.
      SLIP_LOG(kInfo,
               "fabric: conn %06x: the provider has refused a write of %u bytes%s for %llu ms "
               "(%llu writes posted, %llu completed)",
               tag_, len, delivered ? " (delivery complete)" : "", refused.waited_ms(),
               (unsigned long long)writes_.posted(), (unsigned long long)writes_.completed());
    }
  }
}

bool StreamConn::AwaitRoom(uint64_t* next_look, uint64_t* ended_since) noexcept {
  if (Poll() == 0) sched_yield();
  if (error_.load(std::memory_order_acquire) != 0 || !on_transport() ||
      peer_closed_.load(std::memory_order_acquire))
    return false;
  // A peer process that died never drains its queue (1.17's shm answers -FI_EAGAIN for
  // ever): its TCP connection tells. Looked at every 10 ms; 100 ms after it ended (its
  // last notes, if any, would have come by then) the connection fails.
  const uint64_t now = sys::MonotonicMs();
  if (now < *next_look) return true;
  *next_look = now + 10;
  if (!AnchorEnded()) {
    *ended_since = 0;
  } else if (*ended_since == 0) {
    *ended_since = now;
  } else if (now - *ended_since >= 100) {
    SLIP_LOG(kInfo, "fabric: the peer is gone with our writes queued; resetting");
    Fail(ECONNRESET);
    return false;
  }
  return true;
}

bool StreamConn::AwaitLanded() noexcept {
  // (A failed write is never counted as landed.)
  uint64_t next_look = 0, ended_since = 0;
  while (data_landed_.load(std::memory_order_acquire) != data_posted_) {
    if (writes_.AnyFailed()) return false;
    if (!AwaitRoom(&next_look, &ended_since)) return false;
  }
  return true;
}

bool StreamConn::AnchorEnded() const noexcept {
  const int fd = failover_.anchor();
  tcp_info info{};
  socklen_t len = sizeof(info);
  // TCP_INFO, not a peek or SO_ERROR: those would take the pending ECONNRESET from the
  // control thread, which reports it to the application.
  return fd >= 0 && sys::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
         (info.tcpi_state == TCP_CLOSE || info.tcpi_state == TCP_CLOSE_WAIT);
}

}  // namespace slip::fabric
