// QpChannel's lifetime: creation (completion queue, queue pair, rings), the queue pair's
// way to ready-to-send, the peer's ring, the HELLO and settling on it, ending the stream,
// and teardown; the registry of live channels. The rest by concern: qp_channel_data.cc
// (polling, the Channel data path, posting), qp_channel_failover.cc (failover, flush,
// liveness), qp_channel_events.cc (the own completion channel).
#include "verbs/qp_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>

#include "core/log.h"
#include "core/proxy.h"
#include "core/sys.h"
#include "verbs/qp.h"
#include "verbs/qp_channel_internal.h"

namespace slip::verbs {

using namespace qp_channel_internal;

std::mutex qp_channel_internal::g_registry_mu;
QpChannel* qp_channel_internal::g_registry_head = nullptr;

QpChannel::QpChannel(rdma_cm_id* id, Device* device, uint32_t ring_size) noexcept
    : RemoteRing(kNames, ring_size), id_(id), device_(device) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  next_ = g_registry_head;
  if (next_) next_->prev_ = this;
  g_registry_head = this;
}

void QpChannel::Unlist() noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  if (!listed_) return;
  listed_ = false;
  if (prev_) prev_->next_ = next_;
  if (next_) next_->prev_ = prev_;
  if (g_registry_head == this) g_registry_head = next_;
}

void ConnRegistryLock() noexcept {
  g_registry_mu.lock();
}
void ConnRegistryUnlock() noexcept {
  g_registry_mu.unlock();
}

void OrphanAllConns() noexcept {
  for (QpChannel* c = g_registry_head; c; c = c->next_) c->Orphan();
}

void FlushAllConns(int timeout_ms) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (QpChannel* c = g_registry_head; c; c = c->next_) {
    if (c->have_peer_ && c->Error() == 0) c->Flush(timeout_ms);
  }
}

int QpChannel::Init(bool send_notify) noexcept {
  const int rc = [&]() noexcept -> int {
    send_notify_ = send_notify;
    device_->Use();
    device_held_ = true;
    if (int err = device_->GetSlot(ring_size(), &slot_); err < 0) return err;
    remote_lkey_ = slot_.remote_mr->lkey;
    local_lkey_ = slot_.local_mr->lkey;
    failover_.SetRings(slot_.rx_ring(), slot_.tx_mirror());
    // The connection's own completion channel, or the device's shared one.
    ibv_comp_channel* channel = own_.Open(device_->context(), this);
    cq_ = ibv_create_cq(device_->context(), int(kSendDepth + kRecvDepth), this,
                        channel ? channel : device_->comp_channel(), 0);
    if (!cq_) return -(errno ? errno : ENOMEM);
    if (ibv_req_notify_cq(cq_, 0) != 0) return -(errno ? errno : EIO);
    // The first event (armed above) goes to the progress thread, as with the device's channel.
    if (channel && !own_.Watch()) return -(errno ? errno : EIO);
    QueuePairCaps caps;
    caps.send_depth = kSendDepth;
    caps.recv_depth = kRecvDepth;
    caps.inline_wanted = kInlineWanted;
    // In the slot's own protection domain: only this queue pair reaches the slot.
    uint32_t depth = 0;
    qp_ = CreateQueuePair(slot_.pd, cq_, caps, &max_inline_, &depth);
    if (!qp_) return -(errno ? errno : EINVAL);
    sq_.Init(qp_, depth);
    qp_num_ = qp_->qp_num;
    // The queue pair is ours, not rdma_cm's (rdma_create_qp would move it through its states
    // itself): so that Connect can choose the source GID. INIT now, for the receives.
    if (int err = InitQueuePair(id_, qp_); err < 0) return err;
    for (uint32_t i = 0; i < kRecvDepth; ++i) {
      if (!PostRecv(i)) return -(errno ? errno : EIO);
    }
    return 0;
  }();
  if (rc < 0) id_ = nullptr;  // the caller keeps the id
  return rc;
}

void QpChannel::Teardown() noexcept {
  Unlist();
  if (orphaned_.load(std::memory_order_acquire)) {
    // A forked child: these objects are the parent's. Only our own descriptors go.
    {
      std::lock_guard<std::mutex> lock(g_registry_mu);
      own_.CloseLocked(/*orphan=*/true);
    }
    if (const int b = proxy_b_.exchange(-1); b >= 0) sys::close(b);
    return;
  }
  {
    // No reposting of receives once the queue pair starts going away.
    SpinGuard guard(&poll_busy_);
    error_.store(ECONNRESET, std::memory_order_release);
  }
  if (rdma_released_.load(std::memory_order_acquire)) {
    // ReleaseRdma destroyed the verbs objects and left the rings' memory to us.
    Device::FreeRings(&slot_);
  } else {
    if (id_) rdma_disconnect(id_);
    if (qp_) ibv_destroy_qp(qp_);
    if (id_) rdma_destroy_id(id_);  // waits until the progress thread acknowledged its events
    if (cq_) ibv_destroy_cq(cq_);   // likewise for completion events
    {
      std::lock_guard<std::mutex> lock(g_registry_mu);
      own_.CloseLocked(/*orphan=*/false);  // after the queue that reports to it
    }
    if (slot_.base) device_->PutSlot(slot_);
  }
  // Last: the device may be destroyed from here on (once removed).
  if (device_held_) {
    device_held_ = false;
    device_->Unuse();
  }
  if (const int b = proxy_b_.exchange(-1); b >= 0) sys::close(b);
}

bool QpChannel::ReleaseRdma(const char* why) noexcept {
  if (rdma_released_.load(std::memory_order_acquire) || orphaned_.load()) return true;
  // A stream still on RDMA needs all of it (it has not failed over or failed yet).
  if (on_transport() && error_.load(std::memory_order_acquire) == 0) return false;
  {
    // Pollers check the flag under their lock before they touch the queues, and posters
    // find the send queue closed.
    sq_.Close();
    SpinGuard poll(&poll_busy_);
    rdma_released_.store(true, std::memory_order_seq_cst);
  }
  // A thread in TakeEvents or the watch got in before the flag: it acknowledges the event
  // it took (destroying the queue would wait for that) and lets go of the channel.
  own_.Retire();
  // A reader asleep on the channel (BeginRxSleep) would not wake for it going away: a token
  // moves it to the proxy (BeginRxSleep refuses from now on), and its sleep no longer holds
  // the device's file.
  if (direct_readers_.load(std::memory_order_seq_cst) != 0) WakeReaderNow();
  if (qp_) ibv_destroy_qp(qp_);
  if (cq_) ibv_destroy_cq(cq_);
  own_.CloseLocked(/*orphan=*/false);
  Device::DeregisterSlot(&slot_);  // the memory stays: RxData, TxCopy and the TCP path
  // Every event of the id was acknowledged (the progress thread calls this after its
  // events), so this does not wait.
  if (id_) rdma_destroy_id(id_);
  if (device_held_) {
    device_held_ = false;
    device_->Unuse();
  }
  SLIP_LOG(kDebug, "verbs: queue pair %u released (%s)", qp_num_, why);
  return true;
}

int ReleaseRemovedConns(const Device* device) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  int holding = 0;
  for (QpChannel* c = g_registry_head; c; c = c->next_) {
    // Parked queue pairs are deleted instead (SweepParked: a removal fails them); one an
    // application thread still sets up is not told yet (its own events will fail it).
    if (c->device_ != device || !c->device_removed_.load(std::memory_order_acquire) ||
        c->parked_.load(std::memory_order_acquire))
      continue;
    if (!c->ReleaseRdma("its device went away")) ++holding;
  }
  return holding;
}

bool QpChannel::EndStream(bool may_keep) noexcept {
  stream_live_.store(false, std::memory_order_relaxed);
  closing_.store(true, std::memory_order_release);
  // Closed before it settled: nothing was carried either way, and the queue pair may be a
  // forger's. It goes, and its peer (if real) fails over to an anchor that is closed.
  if (held()) return false;
  // A FAILOVER the peer sent while we were closing: the control thread no longer reads the
  // anchor, and the bytes the peer lost must still go out, on TCP.
  if (on_transport() && CanFailover()) TakePeerFailover(0);
  // The peer's notes may still sit in the completion queue: take them first (a peer that
  // closed without keeping its queue pair is about to disconnect, and we would wait for
  // acknowledgements from a queue pair that is going away).
  if (cq_ && qp_ && have_peer_) Poll();
  const bool peer_leaves = peer_closed_.load(std::memory_order_acquire) &&
                           !peer_lingers_.load(std::memory_order_acquire);
  bool linger = may_keep && own_.get() && !closed_sent_.load() && !aborting_ && !peer_leaves &&
                !peer_disconnected_.load(std::memory_order_acquire);
  bool orderly = false;
  if (on_transport() && id_ && qp_ && have_peer_ && streamed_ &&
      error_.load(std::memory_order_acquire) == 0 && !peer_leaves && !aborting_) {
    // The last holder in this process closes (a forked child cannot hold a verbs
    // connection): as TCP's close, EOF for the peer's reader and EPIPE for its writer,
    // delivered before the disconnect so that the peer tells a close from a crash. A final
    // exact credit first: the peer decides "reset, our bytes were unread" from it, and
    // credits otherwise go out only every quarter ring.
    uint64_t consumed = failover_.consumed();
    if (consumed != credit_sent_ && PostCredit(consumed)) credit_sent_ = consumed;
    bool eof = eof_sent_ || eof_posted_.exchange(true) || PostNote(nullptr, 0, Note::kEof, 0);
    // Said before the note goes: a disconnect from then on is the end we ask for.
    // Signalled: the flush below waits for its completion rather than posting a write of
    // its own for that.
    bool closed = closed_sent_.exchange(true) ||
                  PostNote(nullptr, 0, Note::kClosed, linger ? kClosedLingers : 0, true);
    SLIP_LOG(kDebug, "verbs: closing: credit %llu, eof %d, closed %d, keeping the queue pair %d",
             (unsigned long long)credit_sent_, int(eof), int(closed), int(linger));
    const bool flushed = FlushRdma(5000, true);
    if (!flushed && on_transport())
      SLIP_LOG(kWarn, "verbs: closing with writes not acknowledged by the peer");
    orderly = eof && closed && flushed;
  }
  MaybeFailover();
  if (!on_transport() && !aborting_) FinishOnAnchor();
  linger = linger && orderly && on_transport() && error_.load(std::memory_order_acquire) == 0 &&
           !peer_disconnected_.load(std::memory_order_acquire);
  if (!linger) return false;
  // The stream is over: its descriptors are the application's (the anchor) or go now.
  failover_.SetAnchor(-1);
  if (const int b = proxy_b_.exchange(-1); b >= 0) {
    sys::close(b);
  }
  return true;
}

int QpChannel::Connect(int gid_override) noexcept {
  // The peer writes into our ring: remote write always.
  return ReadyQueuePair(id_, qp_, gid_override, IBV_ACCESS_REMOTE_WRITE);
}

void QpChannel::SetPeer(uint64_t ring_addr, uint32_t rkey, bool send_notify) noexcept {
  peer_ring_addr_ = ring_addr;
  peer_rkey_ = rkey;
  send_notify_ = send_notify_ || send_notify;
  have_peer_ = true;
}

void QpChannel::OnProxySet(bool live) noexcept {
  streamed_ = true;
  if (live) stream_live_.store(true, std::memory_order_release);
}

bool QpChannel::PostRecv(uint32_t index) noexcept {
  ibv_sge sge{};
  sge.addr = uint64_t(uintptr_t(slot_.control() + kRecvBufOffset + index * kRecvBufSize));
  sge.length = kRecvBufSize;
  sge.lkey = remote_lkey_;
  ibv_recv_wr wr{};
  wr.wr_id = kRecvTag | index;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp_, &wr, &bad) == 0;
}

bool QpChannel::SendHello(uint64_t nonce) noexcept {
  Hello hello;
  hello.ring_log2 = uint8_t(__builtin_ctz(ring_size()));
  hello.nonce = nonce;
  hello.ring_addr = uint64_t(uintptr_t(slot_.rx_ring()));
  hello.rkey = slot_.remote_mr->rkey;
  uint8_t* buf = slot_.control() + kHelloOutOffset;
  const size_t len = EncodeHello(hello, buf, kRecvBufSize);
  // Before the stream exists: posted as it is, never waiting for room (the queue is empty).
  ibv_sge sge{uint64_t(uintptr_t(buf)), uint32_t(len), remote_lkey_};
  ibv_send_wr wr{};
  wr.wr_id = 0;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  return sq_.PostNow(&wr) == SendQueue::Result::kPosted;
}

bool QpChannel::PostControl(size_t offset, size_t len) noexcept {
  ibv_sge sge{uint64_t(uintptr_t(slot_.control() + offset)), uint32_t(len), remote_lkey_};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  if (len <= max_inline_) wr.send_flags = IBV_SEND_INLINE;
  return PostChain(&wr, 1);
}

bool QpChannel::HelloReceived(Hello* hello) const noexcept {
  Poll();
  if (!hello_received_.load(std::memory_order_acquire)) return false;
  *hello = hello_;
  return true;
}

void QpChannel::ResetChannel(const LinkMsg* claim) noexcept {
  // Both ends' last writes of the old stream landed before the PARKED that preceded this
  // (the client's claim, or the listener's answer to it): nothing old arrives any more.
  ResetStreamState();
  *reinterpret_cast<volatile uint64_t*>(slot_.control() + kCreditInOffset) = 0;
  stream_live_.store(false, std::memory_order_relaxed);
  streamed_ = false;
  peer_lingers_.store(false);
  deferred_wakes_.store(0);
  eof_sent_ = false;
  closed_sent_.store(false);
  if (!claim) return;
  Hello hello;
  hello.ring_log2 = claim->ring_log2;
  hello.nonce = claim->nonce;
  hello.ring_addr = peer_ring_addr_;
  hello.rkey = peer_rkey_;
  hello_ = hello;
  hello_received_.store(true, std::memory_order_release);
}

// ------------------------------------------------------------------------ settling

RemoteRing::PeerCheck QpChannel::ConfirmedPeer(uint64_t now_ms, const char** what) noexcept {
  Hello hello;
  if (!HelloReceived(&hello)) {
    // Its HELLO left before its SYN, on the queue pair: it is in flight, or in the
    // completion queue (unless the queue pair broke, or time is up).
    if (!held_broken_.load() && now_ms < deadline_ms_) return PeerCheck::kWait;
    *what = "no HELLO on its queue pair";
    return PeerCheck::kMismatch;
  }
  if (hello.nonce != held_nonce_ || (1u << hello.ring_log2) != ring_size()) {
    *what = "its queue pair's HELLO is another request's";
    return PeerCheck::kMismatch;
  }
  SetPeer(hello.ring_addr, hello.rkey, false);
  return PeerCheck::kReady;
}

void QpChannel::StopRequestLocked() noexcept {
  // Nothing lands in our ring from here on (the queue pair is in the error state).
  HaltLocked();
  // The request's peer learns it at once (a client that gave up, or a forger).
  if (id_ && !rdma_released_.load(std::memory_order_acquire)) rdma_disconnect(id_);
}

}  // namespace slip::verbs
