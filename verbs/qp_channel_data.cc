// QpChannel's data path: polling the completion queue (what arrived, and whom it wakes), the
// Channel functions the stream calls, and posting writes and notes to the send queue.
#include <arpa/inet.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/proxy.h"
#include "core/sys.h"
#include "verbs/qp_channel.h"
#include "verbs/qp_channel_internal.h"

namespace slip::verbs {

using namespace qp_channel_internal;

bool QpChannel::Poll() const noexcept {
  if (orphaned_.load(std::memory_order_relaxed)) return true;
  if (!on_transport()) return true;
  {
    // Waits for a concurrent poller rather than skipping: a caller deciding EOF or reset
    // must see every completion that has arrived, and drains are short.
    SpinGuard guard(&poll_busy_);
    defer_wakes_ = true;
    DrainLocked();
    // Completion events only while somebody sleeps on this connection: an event wakes the
    // progress thread (a context switch per message), which spinning threads do not need.
    // The sleeper announced itself (WakeState) before this poll, so arming here, then
    // draining again, cannot miss a completion.
    if (SomebodyWaits() && !armed_.load(std::memory_order_relaxed) &&
        !rdma_released_.load(std::memory_order_relaxed)) {
      armed_.store(true, std::memory_order_relaxed);
      ibv_req_notify_cq(cq_, 0);
      DrainLocked();
    }
    defer_wakes_ = false;
  }
  RunDeferredWakes();
  // The progress thread's one shot, while somebody waits through the proxy (epoll, poll,
  // select, a blocking send) or the queue pair is parked.
  if (own_.get() && !own_.armed() && WantsProgress()) own_.Rearm();
  const_cast<QpChannel*>(this)->MaybeFailover();
  return true;
}

void QpChannel::RunDeferredWakes() const noexcept {
  // A load first: every poll comes here, and a read-modify-write on every one would cost.
  if (deferred_wakes_.load(std::memory_order_relaxed) == 0) return;
  uint32_t wakes = deferred_wakes_.exchange(0, std::memory_order_acquire);
  if (wakes & kWakeReader) WakeReaderIfSettled();
  if (wakes & kWakeWriter) WakeWriterNow();
}

bool QpChannel::SomebodyWaits() const noexcept {
  return SomebodyWaitsOnProxy() || direct_readers_.load(std::memory_order_relaxed) != 0 ||
         parked_.load(std::memory_order_relaxed) || claiming_.load(std::memory_order_relaxed);
}

bool QpChannel::WantsProgress() const noexcept {
  return SomebodyWaitsOnProxy() || parked_.load(std::memory_order_relaxed);
}

void QpChannel::DrainLocked() const noexcept {
  if (rdma_released_.load(std::memory_order_relaxed)) return;  // (under poll_busy_)
  ibv_wc wc[16];
  for (;;) {
    int n = ibv_poll_cq(cq_, 16, wc);
    if (n <= 0) {
      if (n < 0)
        const_cast<QpChannel*>(this)->RequestFailover(wire::FailoverCause::kTransportError);
      return;
    }
    for (int i = 0; i < n; ++i) Handle(wc[i]);
  }
}

void QpChannel::OnCompletionEvent() noexcept {
  {
    SpinGuard guard(&poll_busy_);
    defer_wakes_ = true;
    armed_.store(false, std::memory_order_relaxed);  // an event disarms the queue
    DrainLocked();
    if (SomebodyWaits() && !rdma_released_.load(std::memory_order_relaxed)) {
      armed_.store(true, std::memory_order_relaxed);
      ibv_req_notify_cq(cq_, 0);
      DrainLocked();  // what arrived between the drain and the re-arm
    }
    defer_wakes_ = false;
  }
  RunDeferredWakes();
  MaybeFailover();
  // Last: destroying the queue (Teardown) waits for this, and the channel may go then.
  // (After ReleaseRdma too: it retires the own channel, waiting for this thread's use of
  // it, before destroying cq_.)
  ibv_ack_cq_events(cq_, 1);
}

void QpChannel::Handle(const ibv_wc& wc) const noexcept {
  auto* self = const_cast<QpChannel*>(this);
  if (wc.status != IBV_WC_SUCCESS) {
    // After the peer's orderly close (EOF and CLOSED arrived) its disconnect flushes our
    // queues: the end of the connection, not a failure.
    if (rx_eof_.load(std::memory_order_acquire) && peer_closed_.load(std::memory_order_acquire))
      return;
    if (!on_transport()) return;  // our own stop flushed it
    if (error_.load(std::memory_order_relaxed) == 0 && wc.status != IBV_WC_WR_FLUSH_ERR)
      SLIP_LOG(kWarn, "verbs: %s completion failed: %s", (wc.wr_id & kRecvTag) ? "receive" : "send",
               ibv_wc_status_str(wc.status));
    self->RequestFailover(wire::FailoverCause::kTransportError);
    return;
  }
  if (!(wc.wr_id & kRecvTag)) {
    // A signalled send: everything posted up to it is done.
    sq_.Completed(wc.wr_id);
    return;
  }
  auto index = uint32_t(wc.wr_id & ~kRecvTag);
  if (index >= kRecvDepth) {
    self->Fail(EPROTO);
    return;
  }
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    HandleNote(ntohl(wc.imm_data));
  } else if (wc.opcode == IBV_WC_RECV) {
    const uint8_t* buf = slot_.control() + kRecvBufOffset + index * kRecvBufSize;
    Hello hello;
    if (wc.byte_len == 4) {
      uint32_t note = uint32_t(buf[0]) | uint32_t(buf[1]) << 8 | uint32_t(buf[2]) << 16 |
                      uint32_t(buf[3]) << 24;
      HandleNote(note);
    } else if (!hello_received_.load(std::memory_order_relaxed) &&
               ParseHello(buf, wc.byte_len, &hello) == ParseResult::kOk) {
      hello_ = hello;
      hello_received_.store(true, std::memory_order_release);
    } else if (LinkMsg msg; ParseLink(buf, wc.byte_len, &msg) == ParseResult::kOk) {
      HandleLink(msg);
    } else {
      SLIP_LOG(kWarn, "verbs: malformed message from the peer (%u bytes); resetting", wc.byte_len);
      self->Fail(EPROTO);
      return;
    }
  } else {
    self->Fail(EPROTO);
    return;
  }
  if (error_.load(std::memory_order_relaxed) == 0 && on_transport() && !self->PostRecv(index))
    self->RequestFailover(wire::FailoverCause::kTransportError);
}

void QpChannel::HandleNote(uint32_t note) const noexcept {
  auto* self = const_cast<QpChannel*>(this);  // (polling is a const read; a violation fails it)
  switch (NoteKind(note)) {
    case Note::kData: {
      const uint64_t produced = NoteCursor(note, rx_produced_.load(std::memory_order_relaxed));
      if (self->TakeProduced(produced) == Took::kMoved) Wake(kWakeReader);
      break;
    }
    case Note::kCredit: {
      // The credit word landed before this completion (same WRITE, or an earlier one).
      // It is the authority: the note's 30 bits may be older than a word that a later
      // credit write already replaced, and extending them from a newer value would
      // invent credit.
      const uint64_t credit =
          *reinterpret_cast<volatile uint64_t*>(slot_.control() + kCreditInOffset);
      if (self->TakeCredit(credit) == Took::kMoved) Wake(kWakeWriter);
      break;
    }
    case Note::kEof:
      rx_eof_.store(true, std::memory_order_release);
      if (const int b = proxy_b_.load(); b >= 0) sys::shutdown(b, SHUT_WR);
      break;
    case Note::kClosed:
      peer_lingers_.store((note & kNoteValueMask) == kClosedLingers, std::memory_order_release);
      peer_closed_.store(true, std::memory_order_release);
      Wake(kWakeWriter);
      break;
  }
}

void QpChannel::Wake(uint32_t which) const noexcept {
  if (defer_wakes_) {
    deferred_wakes_.fetch_or(which, std::memory_order_release);
    return;
  }
  if (which & kWakeReader) WakeReaderIfSettled();
  if (which & kWakeWriter) WakeWriterNow();
}

void QpChannel::OnDisconnect() noexcept {
  // Said last, once the notes are taken and the outcome settled: a closing end's flush
  // stops at it and reads peer_closed_ then.
  struct SayDisconnected {
    std::atomic<bool>* flag;
    ~SayDisconnected() { flag->store(true, std::memory_order_release); }
  } say{&peer_disconnected_};
  if (!on_transport()) return;  // the peer's side of a failover
  // The peer's EOF and CLOSED notes, if any, came before its DREQ, but may still sit in
  // the completion queue: take them first. A disconnect without them means the transport
  // (or the peer process) went away under us.
  {
    SpinGuard guard(&poll_busy_);
    DrainLocked();
  }
  if (closed_sent_.load(std::memory_order_acquire) && !peer_closed_.load()) {
    // We told the peer we read no more, and it went (a peer that saw our CLOSED note may
    // close without notes of its own): the end of the connection, not a failing transport.
    // What we still send has no reader, as on TCP after the peer's close.
    rx_eof_.store(true, std::memory_order_release);
    peer_closed_.store(true, std::memory_order_release);
    WakeWriterNow();
    return;
  }
  if (!rx_eof_.load(std::memory_order_acquire) || !peer_closed_.load(std::memory_order_acquire))
    TransportFailed(wire::FailoverCause::kTransportError);
}

// ------------------------------------------------------------------------ Channel

bool QpChannel::TxPeerClosed() const noexcept {
  if (RemoteRing::TxPeerClosed()) return true;
  if (held() || failover_.on_tcp()) return false;
  Poll();
  return peer_closed_.load(std::memory_order_acquire);
}

void QpChannel::TxCopy(uint32_t offset, const void* src, size_t len) noexcept {
  std::memcpy(slot_.tx_mirror() + offset, src, len);
}

bool QpChannel::PostData(uint64_t from, uint64_t to) noexcept {
  const uint32_t mask = ring_size() - 1;
  Fragment frags[2];
  int count = 0;
  while (from < to) {
    uint32_t offset = uint32_t(from & mask);
    uint64_t len = to - from;
    if (len > ring_size() - offset) len = ring_size() - offset;
    frags[count++] = Fragment{offset, uint32_t(len)};
    from += len;
  }
  return PostNote(frags, count, Note::kData, to);
}

void QpChannel::PostEnd() noexcept {
  eof_sent_ = PostNote(nullptr, 0, Note::kEof, 0);
}

void QpChannel::CloseRx() noexcept {
  rx_close_wanted_.store(true, std::memory_order_seq_cst);
  if (failover_.carriage() == Carriage::kTransport && !closed_sent_.load())
    closed_sent_ = PostNote(nullptr, 0, Note::kClosed, 0);
}

// ------------------------------------------------------------------------ posting

bool QpChannel::PostNote(const Fragment* fragments, int count, Note note, uint64_t cursor,
                         bool signal) noexcept {
  if (!have_peer_ || error_.load(std::memory_order_acquire) != 0 || !on_transport()) return false;
  const uint32_t imm = htonl(EncodeNote(note, cursor));
  ibv_send_wr wrs[4]{};
  ibv_sge sges[4]{};
  int n = 0;
  for (int i = 0; i < count; ++i, ++n) {
    sges[n].addr = uint64_t(uintptr_t(slot_.tx_mirror() + fragments[i].offset));
    sges[n].length = fragments[i].len;
    sges[n].lkey = local_lkey_;
    wrs[n].sg_list = &sges[n];
    wrs[n].num_sge = 1;
    wrs[n].opcode = IBV_WR_RDMA_WRITE;
    wrs[n].wr.rdma.remote_addr = peer_ring_addr_ + fragments[i].offset;
    wrs[n].wr.rdma.rkey = peer_rkey_;
    if (fragments[i].len <= max_inline_) wrs[n].send_flags = IBV_SEND_INLINE;
  }
  uint32_t note_le = EncodeNote(note, cursor);  // a SEND carries it little-endian
  if (send_notify_) {
    sges[n].addr = uint64_t(uintptr_t(&note_le));
    sges[n].length = 4;
    wrs[n].sg_list = &sges[n];
    wrs[n].num_sge = 1;
    wrs[n].opcode = IBV_WR_SEND;
    wrs[n].send_flags = IBV_SEND_INLINE;
    ++n;
  } else if (n > 0) {
    wrs[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wrs[n - 1].imm_data = imm;
  } else {
    // A notification without bytes: an empty write with the immediate.
    wrs[n].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wrs[n].imm_data = imm;
    wrs[n].wr.rdma.remote_addr = peer_ring_addr_;
    wrs[n].wr.rdma.rkey = peer_rkey_;
    ++n;
  }
  for (int i = 0; i + 1 < n; ++i) wrs[i].next = &wrs[i + 1];
  return PostChain(wrs, n, signal);
}

bool QpChannel::PostChain(ibv_send_wr* wrs, int n, bool signal) noexcept {
  // Each signalled completion frees a batch of slots: while there is no room, the
  // completion queue is polled (with the send queue's lock held), as long as the stream is
  // on the queue pair.
  const SendQueue::Result result = sq_.Post(wrs, n, signal, [this]() noexcept {
    if (error_.load(std::memory_order_acquire) != 0 || !on_transport()) return false;
    Poll();
    sched_yield();
    return true;
  });
  if (result == SendQueue::Result::kRefused) {
    SLIP_LOG(kWarn, "verbs: queue pair %u: post_send failed (%s)", qp_num_, strerror(errno));
    TransportFailed(wire::FailoverCause::kTransportError);
  }
  return result == SendQueue::Result::kPosted;
}

bool QpChannel::PostCredit(uint64_t consumed) noexcept {
  if (!have_peer_ || error_.load(std::memory_order_acquire) != 0 || !on_transport()) return false;
  // The cursor goes into the peer's credit word (right after its ring).
  uint64_t value = consumed;
  auto* out = reinterpret_cast<uint64_t*>(slot_.control() + kCreditOutOffset);
  ibv_sge sge{};
  if (max_inline_ >= sizeof(value)) {
    sge = ibv_sge{uint64_t(uintptr_t(&value)), sizeof(value), 0};
  } else {
    *out = value;  // a later write may overwrite it: a larger credit is still correct
    sge = ibv_sge{uint64_t(uintptr_t(out)), sizeof(value), remote_lkey_};
  }
  uint32_t note_le = EncodeNote(Note::kCredit, consumed);
  ibv_sge note_sge{uint64_t(uintptr_t(&note_le)), 4, 0};
  ibv_send_wr wrs[2]{};
  wrs[0].sg_list = &sge;
  wrs[0].num_sge = 1;
  wrs[0].wr.rdma.remote_addr = peer_ring_addr_ + ring_size() + kCreditInOffset;
  wrs[0].wr.rdma.rkey = peer_rkey_;
  if (max_inline_ >= sizeof(value)) wrs[0].send_flags = IBV_SEND_INLINE;
  int n = 1;
  if (send_notify_) {
    wrs[0].opcode = IBV_WR_RDMA_WRITE;
    wrs[1].sg_list = &note_sge;
    wrs[1].num_sge = 1;
    wrs[1].opcode = IBV_WR_SEND;
    wrs[1].send_flags = IBV_SEND_INLINE;
    wrs[0].next = &wrs[1];
    n = 2;
  } else {
    wrs[0].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wrs[0].imm_data = htonl(EncodeNote(Note::kCredit, consumed));
  }
  return PostChain(wrs, n);
}

}  // namespace slip::verbs
