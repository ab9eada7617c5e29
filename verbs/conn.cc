#include "verbs/conn.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_set>

#include "core/log.h"
#include "core/proxy.h"
#include "core/sys.h"
#include "verbs/gid.h"

namespace slip::verbs {

namespace {

constexpr uint32_t kSendDepth = 256;
constexpr uint32_t kInlineWanted = 220;
constexpr uint32_t kSignalEvery = 32;  // one signalled WR per this many: reclaims SQ slots
constexpr uint64_t kRecvTag = 1ull << 63;

// Spin lock for short, uncontended critical sections on the data path.
class SpinGuard {
 public:
  explicit SpinGuard(std::atomic_flag* flag) noexcept : flag_(flag) {
    while (flag_->test_and_set(std::memory_order_acquire)) sched_yield();
  }
  ~SpinGuard() { flag_->clear(std::memory_order_release); }

 private:
  std::atomic_flag* flag_;
};

// The registry: a mutex-protected intrusive list of live connections.
std::mutex g_registry_mu;
Conn* g_registry_head = nullptr;
// Connections with an own completion channel watched by the progress thread, which may
// hold an event for one that is being destroyed: it looks the key up here first (under
// g_registry_mu, which it keeps while it handles the event).
std::unordered_set<const void*>* g_watched = nullptr;
int g_watch_epoll = -1;

}  // namespace

Conn::Conn(rdma_cm_id* id, Device* device, uint32_t ring_size) noexcept
    : Channel(ring_size), id_(id), device_(device) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  next_ = g_registry_head;
  if (next_) next_->prev_ = this;
  g_registry_head = this;
}

void ConnRegistryLock() noexcept {
  g_registry_mu.lock();
}
void ConnRegistryUnlock() noexcept {
  g_registry_mu.unlock();
}

void OrphanAllConns() noexcept {
  for (Conn* c = g_registry_head; c; c = c->next_) c->Orphan();
}

void FlushAllConns(int timeout_ms) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (Conn* c = g_registry_head; c; c = c->next_) {
    if (c->have_peer_ && c->Error() == 0) c->Flush(timeout_ms);
  }
}

Conn* Conn::Create(rdma_cm_id* id, Device* device, uint32_t ring_size, bool send_notify,
                   int* error) noexcept {
  auto* conn = new (std::nothrow) Conn(id, device, ring_size);
  if (!conn) {
    *error = -ENOMEM;
    return nullptr;
  }
  if (int rc = conn->Init(send_notify); rc < 0) {
    conn->id_ = nullptr;  // the caller keeps the id
    delete conn;
    *error = rc;
    return nullptr;
  }
  id->context = conn;
  return conn;
}

int Conn::Init(bool send_notify) noexcept {
  send_notify_ = send_notify;
  device_->Use();
  device_held_ = true;
  if (int rc = device_->GetSlot(ring_size(), &slot_); rc < 0) return rc;
  remote_lkey_ = slot_.remote_mr->lkey;
  local_lkey_ = slot_.local_mr->lkey;
  cq_ = ibv_create_cq(device_->context(), int(kSendDepth + kRecvDepth), this, SetUpOwnChannel(), 0);
  if (!cq_) return -(errno ? errno : ENOMEM);
  if (ibv_req_notify_cq(cq_, 0) != 0) return -(errno ? errno : EIO);
  if (own_.channel) {
    // The first event (armed above) goes to the progress thread, as with the device's channel.
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.u64 = uint64_t(uintptr_t(this)) | 1;
    watched_.store(true, std::memory_order_relaxed);
    if (sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_ADD, own_.channel->fd, &ev) != 0)
      return -(errno ? errno : EIO);
  }
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_;
  attr.recv_cq = cq_;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = kSendDepth;
  attr.cap.max_recv_wr = kRecvDepth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  // Devices differ in how much they inline; ask for plenty, settle for what they give.
  for (uint32_t want : {kInlineWanted, 64u, 16u}) {
    attr.cap.max_inline_data = want;
    attr.cap.max_send_wr = kSendDepth;
    attr.cap.max_recv_wr = kRecvDepth;
    qp_ = ibv_create_qp(slot_.pd, &attr);  // the slot's own: only this queue pair reaches it
    if (qp_) break;
  }
  if (!qp_) return -(errno ? errno : EINVAL);
  qp_num_ = qp_->qp_num;
  // The queue pair is ours, not rdma_cm's (rdma_create_qp would move it through its states
  // itself): so that Connect can choose the source GID. INIT now, for the receives.
  ibv_qp_attr init{};
  int mask = 0;
  init.qp_state = IBV_QPS_INIT;
  if (rdma_init_qp_attr(id_, &init, &mask) != 0) return -(errno ? errno : EINVAL);
  if (ibv_modify_qp(qp_, &init, mask) != 0) return -(errno ? errno : EINVAL);
  max_inline_ = attr.cap.max_inline_data;
  sq_depth_ = attr.cap.max_send_wr < kSendDepth ? attr.cap.max_send_wr : kSendDepth;
  for (uint32_t i = 0; i < kRecvDepth; ++i) {
    if (!PostRecv(i)) return -(errno ? errno : EIO);
  }
  return 0;
}

Conn::~Conn() {
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    if (prev_) prev_->next_ = next_;
    if (next_) next_->prev_ = prev_;
    if (g_registry_head == this) g_registry_head = next_;
  }
  if (orphaned_.load(std::memory_order_acquire)) {
    // A forked child: these objects are the parent's. Only our own descriptor goes.
    if (proxy_b_ >= 0) sys::close(proxy_b_);
    return;
  }
  if (!stream_closed_) CloseStream(false);
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
      DropOwnChannelLocked();  // after the queue that reports to it
    }
    if (slot_.base) device_->PutSlot(slot_);
  }
  // Last: the device may be destroyed from here on (once removed).
  if (device_held_) device_->Unuse();
  if (proxy_b_ >= 0) sys::close(proxy_b_);
}

bool Conn::ReleaseRdma() noexcept {
  if (rdma_released_.load(std::memory_order_acquire) || orphaned_.load()) return true;
  // A stream still on RDMA needs all of it (it has not failed over or failed yet).
  if (mode_.load(std::memory_order_seq_cst) == Mode::kRdma &&
      error_.load(std::memory_order_acquire) == 0)
    return false;
  {
    // Pollers and posters check the flag under their lock before they touch the queues.
    SpinGuard post(&post_busy_);
    SpinGuard poll(&poll_busy_);
    rdma_released_.store(true, std::memory_order_seq_cst);
  }
  // A thread in TakeEvents or the watch got in before the flag: it acknowledges the event
  // it took (destroying the queue would wait for that) and lets go of the channel.
  while (channel_users_.load(std::memory_order_seq_cst) != 0) sched_yield();
  // A reader asleep on the channel (BeginRxSleep) would not wake for it going away: a token
  // moves it to the proxy (BeginRxSleep refuses from now on), and its sleep no longer holds
  // the device's file.
  if (direct_readers_.load(std::memory_order_seq_cst) != 0) WakeReaderNow();
  if (qp_) ibv_destroy_qp(qp_);
  if (cq_) ibv_destroy_cq(cq_);
  DropOwnChannelLocked();
  Device::DeregisterSlot(&slot_);  // the memory stays: RxData, TxCopy and the TCP path
  // Every event of the id was acknowledged (the progress thread calls this after its
  // events), so this does not wait.
  if (id_) rdma_destroy_id(id_);
  if (device_held_) {
    device_held_ = false;
    device_->Unuse();
  }
  SLIP_LOG(kDebug, "verbs: queue pair %u released (its device went away)", qp_num_);
  return true;
}

int ReleaseRemovedConns(const Device* device) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  int holding = 0;
  for (Conn* c = g_registry_head; c; c = c->next_) {
    // Parked queue pairs are deleted instead (SweepParked: a removal fails them); one an
    // application thread still sets up is not told yet (its own events will fail it).
    if (c->device_ != device || !c->device_removed_.load(std::memory_order_acquire) ||
        c->parked_.load(std::memory_order_acquire))
      continue;
    if (!c->ReleaseRdma()) ++holding;
  }
  return holding;
}

Conn::ChannelUse::ChannelUse(const Conn* conn) noexcept : conn_(conn) {
  conn->channel_users_.fetch_add(1, std::memory_order_seq_cst);
  ok_ = conn->own_.channel && !conn->rdma_released_.load(std::memory_order_seq_cst) &&
        !conn->orphaned_.load(std::memory_order_relaxed);
}

bool Conn::CloseStream(bool may_linger) noexcept {
  if (stream_closed_ || orphaned_.load(std::memory_order_acquire)) return false;
  stream_closed_ = true;
  stream_live_.store(false, std::memory_order_relaxed);
  closing_.store(true, std::memory_order_release);
  // Closed before it settled: nothing was carried either way, and the queue pair may be a
  // forger's. It goes, and its peer (if real) fails over to an anchor that is closed.
  if (held()) return false;
  // A FAILOVER the peer sent while we were closing: the control thread no longer reads the
  // anchor, and the bytes the peer lost must still go out, on TCP.
  if (mode_.load() == Mode::kRdma && CanFailover()) TakePeerFailover(0);
  // The peer's notes may still sit in the completion queue: take them first (a peer that
  // closed without keeping its queue pair is about to disconnect, and we would wait for
  // acknowledgements from a queue pair that is going away).
  if (cq_ && qp_ && have_peer_) Poll();
  const bool peer_leaves = peer_closed_.load(std::memory_order_acquire) &&
                           !peer_lingers_.load(std::memory_order_acquire);
  bool linger = may_linger && own_.channel && !closed_sent_.load() && !aborting_ && !peer_leaves &&
                !peer_disconnected_.load(std::memory_order_acquire);
  bool orderly = false;
  if (mode_.load() == Mode::kRdma && id_ && qp_ && have_peer_ && streamed_ &&
      error_.load(std::memory_order_acquire) == 0 && !peer_leaves && !aborting_) {
    // The last holder in this process closes (a forked child cannot hold a verbs
    // connection): as TCP's close, EOF for the peer's reader and EPIPE for its writer,
    // delivered before the disconnect so that the peer tells a close from a crash. A final
    // exact credit first: the peer decides "reset, our bytes were unread" from it, and
    // credits otherwise go out only every quarter ring.
    uint64_t consumed = rx_consumed_.load(std::memory_order_acquire);
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
    if (!flushed && mode_.load() == Mode::kRdma)
      SLIP_LOG(kWarn, "verbs: closing with writes not acknowledged by the peer");
    orderly = eof && closed && flushed;
  }
  MaybeFailover();
  if (mode_.load() != Mode::kRdma && !aborting_) FinishOnAnchor();
  linger = linger && orderly && mode_.load() == Mode::kRdma &&
           error_.load(std::memory_order_acquire) == 0 &&
           !peer_disconnected_.load(std::memory_order_acquire);
  if (!linger) return false;
  // The stream is over: its descriptors are the application's (the anchor) or go now.
  anchor_fd_.store(-1, std::memory_order_release);
  if (proxy_b_ >= 0) {
    const int b = proxy_b_;
    proxy_b_ = -1;
    sys::close(b);
  }
  return true;
}

int Conn::Connect(int gid_override) noexcept {
  // INIT again, now with what the connection exchange settled (access rights: before it,
  // rdma_cm grants none), as librdmacm does for the queue pairs it manages. The peer
  // writes into our ring: remote write always.
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = IBV_QPS_INIT;
  if (rdma_init_qp_attr(id_, &attr, &mask) != 0) return -(errno ? errno : EINVAL);
  attr.qp_access_flags |= IBV_ACCESS_REMOTE_WRITE;
  mask |= IBV_QP_ACCESS_FLAGS;
  if (ibv_modify_qp(qp_, &attr, mask) != 0) return -(errno ? errno : EINVAL);
  attr = ibv_qp_attr{};
  mask = 0;
  attr.qp_state = IBV_QPS_RTR;
  if (rdma_init_qp_attr(id_, &attr, &mask) != 0) return -(errno ? errno : EINVAL);
  if (attr.ah_attr.is_global) {
    const uint8_t port = attr.ah_attr.port_num ? attr.ah_attr.port_num : id_->port_num;
    int index =
        ChooseSourceGid(device_->context(), port, attr.ah_attr.grh.sgid_index, gid_override);
    if (index < 0) return index;
    if (index != attr.ah_attr.grh.sgid_index)
      SLIP_LOG(kDebug, "verbs: source GID index %d instead of rdma_cm's %u", index,
               unsigned(attr.ah_attr.grh.sgid_index));
    attr.ah_attr.grh.sgid_index = uint8_t(index);
    SLIP_LOG(kDebug, "verbs: queue pair %u: source GID index %d (%s)", qp_->qp_num, index,
             GidTypeName(device_->context(), port, uint8_t(index)));
  }
  if (ibv_modify_qp(qp_, &attr, mask) != 0) return -(errno ? errno : EINVAL);
  attr = ibv_qp_attr{};
  mask = 0;
  attr.qp_state = IBV_QPS_RTS;
  if (rdma_init_qp_attr(id_, &attr, &mask) != 0) return -(errno ? errno : EINVAL);
  // A peer queue pair that stops answering must end in a completion error (retry
  // exceeded), never in an endless wait: the transport timeout is never "infinite" (0).
  if (!(mask & IBV_QP_TIMEOUT) || attr.timeout == 0) {
    attr.timeout = kTransportTimeout;
    mask |= IBV_QP_TIMEOUT;
  }
  SLIP_LOG(kDebug, "verbs: queue pair %u: transport timeout %u, retries %u, rnr retries %u",
           qp_->qp_num, unsigned(attr.timeout), unsigned(attr.retry_cnt), unsigned(attr.rnr_retry));
  if (ibv_modify_qp(qp_, &attr, mask) != 0) return -(errno ? errno : EINVAL);
  return 0;
}

void Conn::SetPeer(uint64_t ring_addr, uint32_t rkey, bool send_notify) noexcept {
  peer_ring_addr_ = ring_addr;
  peer_rkey_ = rkey;
  send_notify_ = send_notify_ || send_notify;
  have_peer_ = true;
}

void Conn::SetProxy(int proxy_b) noexcept {
  proxy_b_ = proxy_b;
  streamed_ = true;
  // Held: nothing of the request's reaches the stream before it settles (settle.cc).
  if (held()) return;
  // Anything that arrived before the stream existed must still wake its first sleeper.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (rx_eof_.load() || error_.load()) sys::shutdown(proxy_b_, SHUT_WR);
  stream_live_.store(true, std::memory_order_release);  // the peer's rings are set by now
}

bool Conn::PostRecv(uint32_t index) noexcept {
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

bool Conn::SendHello(uint64_t nonce) noexcept {
  Hello hello;
  hello.ring_log2 = uint8_t(__builtin_ctz(ring_size()));
  hello.nonce = nonce;
  hello.ring_addr = uint64_t(uintptr_t(slot_.rx_ring()));
  hello.rkey = slot_.remote_mr->rkey;
  uint8_t* buf = slot_.control() + kHelloOutOffset;
  size_t len = EncodeHello(hello, buf, kRecvBufSize);
  ibv_sge sge{uint64_t(uintptr_t(buf)), uint32_t(len), remote_lkey_};
  ibv_send_wr wr{};
  wr.wr_id = 0;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  SpinGuard guard(&post_busy_);
  if (rdma_released_.load(std::memory_order_relaxed)) return false;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_, &wr, &bad) != 0) return false;
  ++sq_posted_;
  ++unsignaled_;
  return true;
}

bool Conn::HelloReceived(Hello* hello) const noexcept {
  Poll();
  if (!hello_received_.load(std::memory_order_acquire)) return false;
  *hello = hello_;
  return true;
}

// ------------------------------------------------------------------------ reuse

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
  return error_.load(std::memory_order_acquire) != 0 || mode_.load() != Mode::kRdma ||
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
  rx_consumed_.store(0);
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
  gate_up_.store(false);
  gate_tripped_.store(false);
  closed_sent_.store(false);
  closing_.store(false);
  aborting_ = false;
  anchor_fd_.store(-1);
  failover_wanted_.store(false);
  tx_published_.store(0);
  tx_finished_.store(false);
  rx_received_ = 0;
  rx_end_woken_.store(false);
  tx_end_woken_.store(false);
  streamed_ = false;
  stream_closed_ = false;
  answer_.store(0);
  claim_taken_.store(false);
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

bool Conn::SendAnswer(uint64_t nonce, bool accepted) noexcept {
  LinkMsg answer;
  answer.kind = LinkKind::kAnswer;
  answer.accepted = accepted;
  answer.nonce = nonce;
  return SendLink(answer);
}

// ------------------------------------------------------------------------ polling

bool Conn::Poll() const noexcept {
  if (orphaned_.load(std::memory_order_relaxed)) return true;
  if (mode_.load(std::memory_order_acquire) != Mode::kRdma) return true;
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
  if (own_.channel && !watched_.load(std::memory_order_relaxed) && WantsProgress())
    WatchFromProgress();
  const_cast<Conn*>(this)->MaybeFailover();
  return true;
}

void Conn::RunDeferredWakes() const noexcept {
  // A load first: every poll comes here, and a read-modify-write on every one would cost.
  if (deferred_wakes_.load(std::memory_order_relaxed) == 0) return;
  uint32_t wakes = deferred_wakes_.exchange(0, std::memory_order_acquire);
  if (wakes & kWakeReader) WakeReaderNow();
  if (wakes & kWakeWriter) WakeWriterNow();
}

bool Conn::SomebodyWaits() const noexcept {
  return SomebodyWaitsOnProxy() || direct_readers_.load(std::memory_order_relaxed) != 0 ||
         parked_.load(std::memory_order_relaxed) || claiming_.load(std::memory_order_relaxed);
}

bool Conn::WantsProgress() const noexcept {
  return SomebodyWaitsOnProxy() || parked_.load(std::memory_order_relaxed);
}

bool Conn::SomebodyWaitsOnProxy() const noexcept {
  return rx_wake_.reader_waiting.load(std::memory_order_relaxed) != 0 ||
         tx_wake_.writer_waiting.load(std::memory_order_relaxed) != 0;
}

void Conn::DrainLocked() const noexcept {
  if (rdma_released_.load(std::memory_order_relaxed)) return;  // (under poll_busy_)
  ibv_wc wc[16];
  for (;;) {
    int n = ibv_poll_cq(cq_, 16, wc);
    if (n <= 0) {
      if (n < 0) const_cast<Conn*>(this)->RequestFailover(wire::FailoverCause::kTransportError);
      return;
    }
    for (int i = 0; i < n; ++i) Handle(wc[i]);
  }
}

void Conn::OnCompletionEvent() noexcept {
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
  // (After ReleaseRdma too: it waits for this thread's ChannelUse before destroying cq_.)
  ibv_ack_cq_events(cq_, 1);
  MaybeFailover();
}

void Conn::Handle(const ibv_wc& wc) const noexcept {
  auto* self = const_cast<Conn*>(this);
  if (wc.status != IBV_WC_SUCCESS) {
    // After the peer's orderly close (EOF and CLOSED arrived) its disconnect flushes our
    // queues: the end of the connection, not a failure.
    if (rx_eof_.load(std::memory_order_acquire) && peer_closed_.load(std::memory_order_acquire))
      return;
    if (mode_.load(std::memory_order_relaxed) != Mode::kRdma) return;  // our own stop flushed it
    if (error_.load(std::memory_order_relaxed) == 0 && wc.status != IBV_WC_WR_FLUSH_ERR)
      SLIP_LOG(kWarn, "verbs: %s completion failed: %s", (wc.wr_id & kRecvTag) ? "receive" : "send",
               ibv_wc_status_str(wc.status));
    self->RequestFailover(wire::FailoverCause::kTransportError);
    return;
  }
  if (!(wc.wr_id & kRecvTag)) {
    // A signalled send: everything posted up to it is done.
    uint64_t done = wc.wr_id;
    uint64_t prev = sq_completed_.load(std::memory_order_relaxed);
    while (done > prev && !sq_completed_.compare_exchange_weak(prev, done)) {
    }
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
  if (error_.load(std::memory_order_relaxed) == 0 &&
      mode_.load(std::memory_order_relaxed) == Mode::kRdma && !self->PostRecv(index))
    self->RequestFailover(wire::FailoverCause::kTransportError);
}

void Conn::HandleNote(uint32_t note) const noexcept {
  switch (NoteKind(note)) {
    case Note::kData: {
      uint64_t produced = NoteCursor(note, rx_produced_.load(std::memory_order_relaxed));
      // A peer that claims more than the ring can hold would make us read garbage.
      if (produced - rx_consumed_.load(std::memory_order_acquire) > ring_size()) {
        SLIP_LOG(kWarn,
                 "verbs: the peer overran the ring (produced %llu, consumed %llu, last %llu, "
                 "note %08x); resetting",
                 (unsigned long long)produced, (unsigned long long)rx_consumed_.load(),
                 (unsigned long long)rx_produced_.load(), note);
        const_cast<Conn*>(this)->Fail(EPROTO);
        return;
      }
      rx_produced_.store(produced, std::memory_order_release);
      WakeReader();
      break;
    }
    case Note::kCredit: {
      // The credit word landed before this completion (same WRITE, or an earlier one).
      // It is the authority: the note's 30 bits may be older than a word that a later
      // credit write already replaced, and extending them from a newer value would
      // invent credit.
      auto* word = reinterpret_cast<volatile uint64_t*>(slot_.control() + kCreditInOffset);
      uint64_t credit = *word;
      if (credit > tx_credit_.load(std::memory_order_relaxed))
        tx_credit_.store(credit, std::memory_order_release);
      WakeWriter();
      break;
    }
    case Note::kEof:
      rx_eof_.store(true, std::memory_order_release);
      if (proxy_b_ >= 0) sys::shutdown(proxy_b_, SHUT_WR);
      break;
    case Note::kClosed:
      peer_lingers_.store((note & kNoteValueMask) == kClosedLingers, std::memory_order_release);
      peer_closed_.store(true, std::memory_order_release);
      WakeWriter();
      break;
  }
}

void Conn::WakeReader() const noexcept {
  if (defer_wakes_) {
    deferred_wakes_.fetch_or(kWakeReader, std::memory_order_release);
    return;
  }
  WakeReaderNow();
}

void Conn::WakeReaderNow() const noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (proxy_b_ >= 0 && rx_wake_.reader_waiting.load(std::memory_order_relaxed) &&
      rx_wake_.reader_waiting.exchange(0)) {
    proxy::WriteToken(&rx_wake_, proxy_b_);
  } else if (proxy_b_ >= 0 && direct_readers_.load(std::memory_order_relaxed) != 0 &&
             rx_wake_.tokens.load(std::memory_order_relaxed) == 0) {
    // A reader asleep on the own channel whose event another thread took (the progress
    // thread, or another reader): its ppoll would not return for it, the proxy wakes it.
    proxy::WriteToken(&rx_wake_, proxy_b_);
  }
}

void Conn::WakeWriter() const noexcept {
  if (defer_wakes_) {
    deferred_wakes_.fetch_or(kWakeWriter, std::memory_order_release);
    return;
  }
  WakeWriterNow();
}

void Conn::WakeWriterNow() const noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (proxy_b_ >= 0 && tx_wake_.writer_waiting.load(std::memory_order_relaxed) &&
      tx_wake_.writer_waiting.exchange(0))
    proxy::Unfill(proxy_b_);
}

void Conn::Fail(int error) noexcept {
  if (held_.load(std::memory_order_seq_cst)) {
    // (The request's queue pair, not the connection's client: settling decides.)
    held_broken_.store(true, std::memory_order_seq_cst);
    return;
  }
  int expected = 0;
  if (!error_.compare_exchange_strong(expected, error)) return;
  SLIP_LOG(kDebug, "verbs: connection failed (%s; eof %d, peer closed %d)", strerror(error),
           int(rx_eof_.load()), int(peer_closed_.load()));
  // Readers see the error after what already arrived; writers wake to it.
  if (proxy_b_ >= 0) {
    sys::shutdown(proxy_b_, SHUT_WR);
    proxy::Unfill(proxy_b_);
  }
}

void Conn::OnDisconnect() noexcept {
  // Said last, once the notes are taken and the outcome settled: a closing end's flush
  // stops at it and reads peer_closed_ then.
  struct SayDisconnected {
    std::atomic<bool>* flag;
    ~SayDisconnected() { flag->store(true, std::memory_order_release); }
  } say{&peer_disconnected_};
  if (mode_.load(std::memory_order_acquire) != Mode::kRdma)
    return;  // the peer's side of a failover
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

void Conn::Orphan() noexcept {
  orphaned_.store(true, std::memory_order_release);
  error_.store(ECONNRESET, std::memory_order_release);
}

// ------------------------------------------------------------------------ failover

bool Conn::CanFailover() const noexcept {
  return anchor_fd_.load(std::memory_order_acquire) >= 0 && have_peer_ &&
         !orphaned_.load(std::memory_order_acquire) && !aborting_ &&
         error_.load(std::memory_order_acquire) == 0;
}

void Conn::RequestFailover(wire::FailoverCause cause) noexcept {
  if (held_.load(std::memory_order_seq_cst)) {
    held_broken_.store(true, std::memory_order_seq_cst);
    return;
  }
  if (!CanFailover()) {
    Fail(ECONNRESET);
    return;
  }
  failover_cause_.store(cause, std::memory_order_relaxed);
  failover_wanted_.store(true, std::memory_order_release);
}

void Conn::TransportFailed(wire::FailoverCause cause) noexcept {
  RequestFailover(cause);
  MaybeFailover();
}

void Conn::MaybeFailover() noexcept {
  if (!failover_wanted_.load(std::memory_order_acquire) || mode_.load() != Mode::kRdma) return;
  std::lock_guard<std::mutex> lock(failover_mu_);
  if (mode_.load() != Mode::kRdma || error_.load(std::memory_order_acquire) != 0) return;
  if (!CanFailover()) {  // (an abortive close took the anchor since the request)
    Fail(ECONNRESET);
    return;
  }
  if (AnchorGone()) {
    // The peer reset the connection (SO_LINGER {1, 0} closes its anchor before its queue
    // pair, or it died with bytes unread): its reset, not a failing transport.
    SLIP_LOG(kDebug, "verbs: the queue pair went down after the peer reset the connection");
    Fail(ECONNRESET);
    return;
  }
  // The peer answers with its own FAILOVER, which the control thread hands to
  // OnPeerFailover.
  if (!StopRdmaLocked(failover_cause_.load(std::memory_order_relaxed))) Fail(ECONNRESET);
}

bool Conn::AnchorGone() const noexcept {
  const int fd = anchor_fd_.load();
  tcp_info info{};
  socklen_t len = sizeof(info);
  // TCP_INFO, not a peek or SO_ERROR: those would take the pending ECONNRESET from the
  // control thread, which reports it to the application.
  return fd >= 0 && sys::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
         info.tcpi_state == TCP_CLOSE;
}

namespace {

const char* CauseText(wire::FailoverCause cause) noexcept {
  switch (cause) {
    case wire::FailoverCause::kPeerRequest:
      return "the peer's RDMA path failed";
    case wire::FailoverCause::kTransportError:
      return "the queue pair failed";
    case wire::FailoverCause::kDeviceRemoved:
      return "the RDMA device went away";
    case wire::FailoverCause::kHandBack:
      return "the peer handed the connection back to TCP (exec)";
  }
  return "?";
}

}  // namespace

void Conn::HaltRdmaLocked() noexcept {
  SpinGuard guard(&poll_busy_);
  mode_.store(Mode::kFailing, std::memory_order_seq_cst);
  // Nothing may land in our ring after we count what arrived: the queue pair goes to the
  // error state first (late writes are dropped), then the completions that made it are
  // taken.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (qp_ && !rdma_released_.load(std::memory_order_relaxed))
    ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
  DrainLocked();
}

bool Conn::StopRdmaLocked(wire::FailoverCause cause) noexcept {
  HaltRdmaLocked();
  rx_received_ = rx_produced_.load(std::memory_order_acquire);
  const wire::Failover mine{.received = rx_received_,
                            .sent = tx_published_.load(std::memory_order_seq_cst),
                            .cause = cause};
  if (!SendFailover(anchor_fd_.load(), mine, 0)) {
    // A peer that reset the connection meanwhile is gone, not a failure of ours to report.
    const LogLevel level =
        errno == ECONNRESET || errno == EPIPE ? LogLevel::kDebug : LogLevel::kWarn;
    if (LogEnabled(level))
      LogWrite(level, "verbs: %s, and the TCP connection cannot take FAILOVER (%s); resetting",
               CauseText(cause), strerror(errno));
    return false;
  }
  // While closing (the application has let go) the outcome is what matters, and
  // FinishOnAnchor says it if bytes may be lost.
  const LogLevel level = closing_.load() ? LogLevel::kInfo : LogLevel::kWarn;
  if (LogEnabled(level))
    LogWrite(level, "verbs: %s: the connection continues on TCP (%llu bytes received over RDMA)",
             CauseText(cause), (unsigned long long)rx_received_);
  return true;
}

bool Conn::OnPeerFailover(const wire::Failover& peer) noexcept {
  if (anchor_fd_.load() < 0 || !have_peer_ || orphaned_.load()) return false;
  std::lock_guard<std::mutex> lock(failover_mu_);
  if (error_.load(std::memory_order_acquire) != 0 || mode_.load() == Mode::kTcp) return false;
  if (peer.cause == wire::FailoverCause::kHandBack)
    SLIP_LOG(kInfo, "verbs: the peer handed the connection back to TCP (exec)");
  if (mode_.load() == Mode::kRdma && !StopRdmaLocked(wire::FailoverCause::kPeerRequest)) {
    Fail(ECONNRESET);
    return false;
  }
  return EnterTcpLocked(peer);
}

bool Conn::EnterTcpLocked(const wire::Failover& peer) noexcept {
  const uint64_t published = tx_published_.load(std::memory_order_seq_cst);
  // Only what the peer did not receive is still in our ring.
  if (!FailoverFits(peer, tx_credit_.load(std::memory_order_acquire), published, rx_received_)) {
    Fail(EPROTO);
    return false;
  }
  const uint64_t peer_received = peer.received;
  anchor_path_.Start(anchor_fd_.load(), slot_.rx_ring(), slot_.tx_mirror(), ring_size(),
                     rx_received_, peer_received);
  mode_.store(Mode::kTcp, std::memory_order_seq_cst);
  SLIP_LOG(kInfo, "verbs: on TCP from here: resending %llu bytes from byte %llu",
           (unsigned long long)(published - peer_received), (unsigned long long)peer_received);
  if (tx_finished_.load(std::memory_order_seq_cst)) anchor_path_.Finish(tx_published_.load());
  OnAnchorReady(EPOLLIN | EPOLLOUT);
  // Send credit jumped from the last credit note to what the peer received (often with
  // nothing to resend): a writer asleep on a full ring must look again, and a reader
  // asleep on the completion channel must move to the proxy.
  WakeWriterNow();
  WakeReaderNow();
  return true;
}

void Conn::OnAnchorReady(uint32_t events) noexcept {
  if (mode_.load(std::memory_order_acquire) != Mode::kTcp) return;
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && PassGate()) {
    uint64_t before = anchor_path_.received();
    anchor_path_.Pull(rx_consumed_.load(std::memory_order_acquire));
    // (Never under the poll lock: the wake-ups go out at once.)
    if (anchor_path_.received() != before) WakeReaderNow();
  }
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) {
    uint64_t before = anchor_path_.sent();
    anchor_path_.Push(tx_published_.load(std::memory_order_acquire));
    if (anchor_path_.sent() != before) WakeWriterNow();
  }
  if (anchor_path_.eof() || anchor_path_.error() || anchor_path_.peer_closed()) WakeAtEnd();
}

void Conn::WakeAtEnd() const noexcept {
  if (proxy_b_ < 0) return;
  // As the EOF note and Fail do: readers see EOF (or the error) on A, writers wake. Once
  // each: every later read of the ring would come here again.
  if ((anchor_path_.eof() || anchor_path_.error()) && !rx_end_woken_.exchange(true))
    sys::shutdown(proxy_b_, SHUT_WR);
  if ((anchor_path_.peer_closed() || anchor_path_.error()) && !tx_end_woken_.exchange(true))
    proxy::Unfill(proxy_b_);
}

bool Conn::TakePeerFailover(int timeout_ms) noexcept {
  const int fd = anchor_fd_.load();
  wire::Failover peer;
  return fd >= 0 && ReceiveFailover(fd, timeout_ms, &peer) && OnPeerFailover(peer);
}

bool Conn::HandBack(uint64_t consumed, int timeout_ms) noexcept {
  const int fd = anchor_fd_.load();
  if (!CanFailover()) return false;
  std::lock_guard<std::mutex> lock(failover_mu_);
  // After a failover the bytes the application did not read came over TCP already: they
  // cannot be given back to the anchor.
  if (mode_.load() != Mode::kRdma || error_.load(std::memory_order_acquire) != 0) return false;
  // Whatever happens now, this end never speaks on the anchor again (the new program owns
  // its bytes): no close notes, no failover of our own.
  aborting_ = true;
  HaltRdmaLocked();
  // What our last writes did not deliver is still in the send mirror.
  return HandBackOnAnchor(fd, slot_.tx_mirror(), ring_size(), consumed,
                          tx_credit_.load(std::memory_order_acquire),
                          tx_published_.load(std::memory_order_seq_cst),
                          tx_finished_.load(std::memory_order_seq_cst), timeout_ms);
}

void Conn::FinishOnAnchor() noexcept {
  const uint64_t published = tx_published_.load();
  if (mode_.load() == Mode::kFailing && !TakePeerFailover(5000)) {
    // A peer that closed its TCP connection too (EOF or reset) has ended, as a TCP peer
    // that closes with bytes unread would: nothing is lost that it still wanted.
    uint8_t byte;
    const int fd = anchor_fd_.load();
    const bool peer_ended =
        AnchorGone() || (fd >= 0 && sys::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0);
    if (published != tx_credit_.load() && !peer_ended)
      SLIP_LOG(kWarn,
               "verbs: closed during failover without the peer's answer: up to %llu bytes "
               "not confirmed as received",
               (unsigned long long)(published - tx_credit_.load()));
    return;
  }
  if (mode_.load() != Mode::kTcp) return;
  // Closing ends the stream (the last holder: verbs connections do not cross fork).
  anchor_path_.Finish(published);
  if (!anchor_path_.PushAll(published, 5000))
    SLIP_LOG(kWarn, "verbs: closing with %llu bytes not taken by the TCP connection",
             (unsigned long long)(published - anchor_path_.sent()));
}

bool Conn::Flush(int timeout_ms) noexcept {
  switch (mode_.load()) {
    case Mode::kTcp:
      return anchor_path_.PushAll(tx_published_.load(), timeout_ms);
    case Mode::kFailing:
      return false;  // where to resend from is not known yet
    case Mode::kRdma:
      break;
  }
  return FlushRdma(timeout_ms, false);
}

bool Conn::FlushRdma(int timeout_ms, bool own_anchor) noexcept {
  {
    SpinGuard guard(&post_busy_);
    if (mode_.load() != Mode::kRdma || rdma_released_.load(std::memory_order_relaxed)) return false;
    if (sq_completed_.load(std::memory_order_acquire) >= sq_posted_) return true;
    // Unsignalled writes complete silently: a signalled empty write behind them tells
    // when they are all acknowledged.
    if (unsignaled_ != 0) {
      ibv_send_wr wr{};
      wr.wr_id = sq_posted_ + 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = peer_ring_addr_;
      wr.wr.rdma.rkey = peer_rkey_;
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(qp_, &wr, &bad) != 0) return false;
      ++sq_posted_;
      unsignaled_ = 0;
    }
  }
  const uint64_t deadline = sys::MonotonicMs() + uint64_t(timeout_ms);
  for (;;) {
    Poll();
    if (error_.load(std::memory_order_acquire) != 0 || mode_.load() != Mode::kRdma) return false;
    // A peer that failed over waits for our answer, not for acknowledgements.
    if (own_anchor && TakePeerFailover(0)) return false;
    // A peer that went away acknowledges nothing more (our queue pair, ours and not
    // rdma_cm's, would retry for seconds). One that only closed still acknowledges: its
    // queue pair lives until its own notes are acknowledged, and ours (EOF, CLOSED) must
    // arrive, or it would take our disconnect for a failing transport.
    if (peer_disconnected_.load(std::memory_order_acquire))
      return peer_closed_.load(std::memory_order_acquire);
    {
      SpinGuard guard(&post_busy_);
      if (sq_completed_.load(std::memory_order_acquire) >= sq_posted_) return true;
    }
    if (sys::MonotonicMs() > deadline) return false;
    sched_yield();
  }
}

// ------------------------------------------------------------------------ liveness

void CheckAllConns(uint64_t now_ms) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (Conn* c = g_registry_head; c; c = c->next_) c->CheckLiveness(now_ms);
}

void Conn::CheckLiveness(uint64_t now_ms) noexcept {
  // (stream_live_ first: it orders the peer's ring address and key before their use.)
  if (!stream_live_.load(std::memory_order_acquire) || orphaned_.load(std::memory_order_relaxed) ||
      parked_.load(std::memory_order_relaxed) || mode_.load() != Mode::kRdma ||
      error_.load(std::memory_order_acquire) != 0 || rdma_released_.load()) {
    live_ = Liveness{};
    return;
  }
  // Anything that moved: bytes in, credit back, sends acknowledged (each only grows, so
  // their sum changes whenever one does).
  const uint64_t progress = rx_produced_.load(std::memory_order_relaxed) +
                            tx_credit_.load(std::memory_order_relaxed) +
                            sq_completed_.load(std::memory_order_relaxed);
  if (progress != live_.progress || live_.quiet_since_ms == 0 || !SomebodyWaits()) {
    // (Nobody waiting: nobody can hang on it; the first to wait starts the clock.)
    live_ = Liveness{progress, now_ms, 0};
    return;
  }
  if (now_ms - live_.quiet_since_ms < kQuietMs) return;
  // Quiet while somebody waits: the data or credit may simply not be sent yet (a peer
  // that computes), or the path may be dead without anybody having been told.
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp_, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state != IBV_QPS_RTS &&
      attr.qp_state != IBV_QPS_SQD) {
    SLIP_LOG(kWarn,
             "verbs: queue pair %u is in state %d with nothing reported: its RDMA path "
             "is taken as failed",
             qp_num_, int(attr.qp_state));
    live_ = Liveness{};
    TransportFailed(wire::FailoverCause::kTransportError);
    return;
  }
  if (live_.probe_done_at == 0) {
    // The peer's queue pair must acknowledge a write; one that died without telling (no
    // disconnect) lets it run into the transport's retry limit: a completion error.
    uint64_t done_at = 0;
    if (PostProbe(&done_at)) live_.probe_done_at = done_at;
    return;
  }
  if (sq_completed_.load(std::memory_order_acquire) >= live_.probe_done_at) {
    live_ = Liveness{progress, now_ms, 0};  // the peer answered: alive, and quiet
  }
}

bool Conn::PostProbe(uint64_t* done_at) noexcept {
  // Never wait for the send queue here (the progress thread serves every connection): a
  // writer holding it, or a full queue, already has writes in flight for the transport to
  // judge.
  if (post_busy_.test_and_set(std::memory_order_acquire)) return false;
  bool posted = false, refused = false;
  if (!rdma_released_.load(std::memory_order_relaxed) &&
      sq_posted_ + 1 - sq_completed_.load(std::memory_order_acquire) <= sq_depth_) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_WRITE;  // zero length: nothing lands, only the acknowledgement
    wr.wr.rdma.remote_addr = peer_ring_addr_;
    wr.wr.rdma.rkey = peer_rkey_;
    posted = PostLocked(&wr, 1, /*signal=*/true);
    refused = !posted;
    if (posted) *done_at = sq_posted_;
  }
  post_busy_.clear(std::memory_order_release);
  if (refused) MaybeFailover();
  return posted;
}

// ------------------------------------------------------------------------ own channel

void SetConnWatchEpoll(int epoll_fd) noexcept {
  g_watch_epoll = epoll_fd;
}

ibv_comp_channel* Conn::SetUpOwnChannel() noexcept {
  if (g_watch_epoll < 0) return device_->comp_channel();
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    if (!g_watched) g_watched = new (std::nothrow) std::unordered_set<const void*>();
    if (!g_watched) return device_->comp_channel();
    try {
      g_watched->insert(this);
    } catch (...) {
      return device_->comp_channel();
    }
  }
  own_.conn = this;
  ibv_comp_channel* channel = ibv_create_comp_channel(device_->context());
  if (!channel) return device_->comp_channel();  // ~OwnChannel drops the registration
  // Above the floor, or not at all: a connection (a pending request of a remote peer's
  // above all) never takes a descriptor number the application would get. The kernel
  // finds the channel by its number when the queue is created, after this.
  const int high = sys::DupAbove(channel->fd, sys::HiddenFdFloor());
  if (high < 0) {
    ibv_destroy_comp_channel(channel);
    return device_->comp_channel();  // the device's shared one serves it instead
  }
  sys::close(channel->fd);
  channel->fd = high;
  sys::fcntl(channel->fd, F_SETFL, sys::fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
  own_.channel = channel;
  own_fd_ = channel->fd;
  return channel;
}

void Conn::DropOwnChannelLocked() noexcept {
  if (own_.dropped) return;
  own_.dropped = true;
  if (own_.conn && g_watched) g_watched->erase(own_.conn);  // OnWatchEvent ignores it now
  if (!own_.channel) return;
  sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_DEL, own_.channel->fd, nullptr);
  ibv_destroy_comp_channel(own_.channel);
}

Conn::OwnChannel::~OwnChannel() {
  if (dropped) return;  // ~Conn or ReleaseRdma did it
  if (conn) {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_watched->erase(conn);
  }
  if (!channel) return;
  if (conn->orphaned_.load(std::memory_order_acquire)) {
    // A forked child: the channel and the epoll registration are the parent's.
    sys::close(channel->fd);
    return;
  }
  sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_DEL, channel->fd, nullptr);
  ibv_destroy_comp_channel(channel);
}

void Conn::OnWatchEvent(uint64_t key) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto* conn = reinterpret_cast<Conn*>(uintptr_t(key & ~uint64_t(1)));
  if (!g_watched || g_watched->count(conn) == 0) return;  // destroyed since
  // A client waiting for its claim's answer takes its events itself (they are what wakes
  // it): taken here, the answer would come without waking it.
  if (conn->claiming_.load(std::memory_order_acquire)) return;
  // The one shot fired. Cleared before taking the events: a proxy sleeper that announces
  // itself after this store arms it again (Poll), one that did before is seen below.
  conn->watched_.store(false, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  conn->TakeEvents(1 << 30);
  if (conn->WantsProgress()) conn->WatchFromProgress();
}

void Conn::WatchFromProgress() const noexcept {
  ChannelUse use(this);
  if (!use.ok() || watched_.exchange(true, std::memory_order_seq_cst)) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = uint64_t(uintptr_t(this)) | 1;
  sys::epoll_ctl(g_watch_epoll, EPOLL_CTL_MOD, own_fd_, &ev);
}

void Conn::TakeEvents(int max) noexcept {
  if (!own_.channel || orphaned_.load(std::memory_order_relaxed)) return;
  ChannelUse use(this);
  if (!use.ok()) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  for (int i = 0; i < max && ibv_get_cq_event(own_.channel, &cq, &context) == 0; ++i)
    OnCompletionEvent();  // acks
}

int Conn::BeginRxSleep() noexcept {
  if (!own_.channel || proxy_b_ < 0 || orphaned_.load(std::memory_order_relaxed)) return -1;
  // After failover the news come from the anchor, through the control thread and the proxy.
  if (mode_.load(std::memory_order_acquire) != Mode::kRdma) return -1;
  direct_readers_.fetch_add(1, std::memory_order_seq_cst);
  // Announced, then checked: ReleaseRdma sets the flag, then looks for us (and wakes us).
  if (rdma_released_.load(std::memory_order_seq_cst)) {
    direct_readers_.fetch_sub(1, std::memory_order_seq_cst);
    return -1;
  }
  return own_fd_;
}

void Conn::EndRxSleep(bool woken) noexcept {
  direct_readers_.fetch_sub(1, std::memory_order_seq_cst);
  // One event at most: an event disarms the queue until OnCompletionEvent arms it again, so
  // a second one can only follow that; it stays readable on the channel for the next
  // sleeper (whose ppoll then returns at once) or the progress thread's one shot (epoll
  // reports it when armed). Not woken by the channel: nothing to take now, the same way.
  if (woken) TakeEvents(1);
}

// ------------------------------------------------------------------------ Channel

uint64_t Conn::RxProduced() const noexcept {
  if (held_.load(std::memory_order_acquire)) return 0;
  if (mode_.load(std::memory_order_acquire) == Mode::kTcp) {
    if (!PassGate()) return 0;  // (nothing was delivered before the gate opens)
    uint64_t received = anchor_path_.Pull(rx_consumed_.load(std::memory_order_acquire));
    if (anchor_path_.eof() || anchor_path_.error()) WakeAtEnd();
    return received;
  }
  Poll();
  return rx_produced_.load(std::memory_order_acquire);
}

bool Conn::RxEof() const noexcept {
  if (held_.load(std::memory_order_acquire)) return false;
  if (rx_eof_.load(std::memory_order_acquire)) return true;
  if (mode_.load(std::memory_order_acquire) == Mode::kTcp) return anchor_path_.eof();
  Poll();
  return rx_eof_.load(std::memory_order_acquire);
}

int Conn::Error() const noexcept {
  if (held_.load(std::memory_order_acquire)) return 0;
  int error = error_.load(std::memory_order_acquire);
  if (error == 0 && mode_.load(std::memory_order_acquire) == Mode::kTcp)
    error = anchor_path_.error();
  return error;
}

void Conn::RxConsumed(uint64_t consumed) noexcept {
  rx_consumed_.store(consumed, std::memory_order_release);
  if (mode_.load(std::memory_order_acquire) != Mode::kRdma) return;  // TCP has its own window
  // A sender waits only on a full ring, and a reader that wants more bytes must first
  // empty it, so credit every quarter ring can never leave the two waiting on each other.
  if (consumed - credit_sent_ >= ring_size() / 4 && PostCredit(consumed)) credit_sent_ = consumed;
}

uint64_t Conn::TxConsumed() const noexcept {
  // Held: nothing published, nothing credited, so a full ring: nothing can be sent.
  if (held_.load(std::memory_order_acquire))
    return tx_published_.load(std::memory_order_relaxed) - ring_size();
  // After failover the ring frees as the kernel takes its bytes.
  if (mode_.load(std::memory_order_acquire) == Mode::kTcp)
    return anchor_path_.Push(tx_published_.load(std::memory_order_acquire));
  Poll();
  return tx_credit_.load(std::memory_order_acquire);
}

void Conn::TxCopy(uint32_t offset, const void* src, size_t len) noexcept {
  std::memcpy(slot_.tx_mirror() + offset, src, len);
}

void Conn::TxPublish(uint64_t produced) noexcept {
  // Published before the mode is read, as EnterTcpLocked sets the mode before it pushes
  // what is published: a publish racing with failover is sent by one of the two.
  tx_published_.store(produced, std::memory_order_seq_cst);
  switch (mode_.load(std::memory_order_seq_cst)) {
    case Mode::kTcp:
      anchor_path_.Push(produced);
      return;
    case Mode::kFailing:
      return;  // resent from where the peer says, once it says
    case Mode::kRdma:
      break;
  }
  if (produced == tx_posted_) return;
  const uint32_t mask = ring_size() - 1;
  Fragment frags[2];
  int count = 0;
  uint64_t from = tx_posted_;
  while (from < produced) {
    uint32_t offset = uint32_t(from & mask);
    uint64_t len = produced - from;
    if (len > ring_size() - offset) len = ring_size() - offset;
    frags[count++] = Fragment{offset, uint32_t(len)};
    from += len;
  }
  if (PostNote(frags, count, Note::kData, produced)) tx_posted_ = produced;
}

bool Conn::TxPeerClosed() const noexcept {
  if (held_.load(std::memory_order_acquire)) return false;
  if (peer_closed_.load(std::memory_order_acquire)) return true;
  if (mode_.load(std::memory_order_acquire) == Mode::kTcp) return anchor_path_.peer_closed();
  Poll();
  return peer_closed_.load(std::memory_order_acquire);
}

void Conn::CloseTx() noexcept {
  tx_finished_.store(true, std::memory_order_seq_cst);  // (the same race as TxPublish's)
  switch (mode_.load(std::memory_order_seq_cst)) {
    case Mode::kTcp:
      anchor_path_.Finish(tx_published_.load());
      break;
    case Mode::kFailing:
      break;
    case Mode::kRdma:
      // Held: settling sends it (the same race as TxPublish's, on held_).
      if (held_.load(std::memory_order_seq_cst)) break;
      if (!eof_posted_.exchange(true)) eof_sent_ = PostNote(nullptr, 0, Note::kEof, 0);
      break;
  }
}

void Conn::CloseRx() noexcept {
  rx_close_wanted_.store(true, std::memory_order_seq_cst);
  if (held_.load(std::memory_order_seq_cst)) return;  // settling sends it
  if (mode_.load(std::memory_order_acquire) == Mode::kRdma && !closed_sent_.load())
    closed_sent_ = PostNote(nullptr, 0, Note::kClosed, 0);
}

// ------------------------------------------------------------------------ posting

bool Conn::WaitSendSpace(uint32_t needed) noexcept {
  // Called with post_busy_ held. Each signalled completion frees a batch of slots.
  while (sq_posted_ + needed - sq_completed_.load(std::memory_order_acquire) > sq_depth_) {
    if (error_.load(std::memory_order_acquire) != 0 || mode_.load() != Mode::kRdma) return false;
    Poll();
    sched_yield();
  }
  return true;
}

bool Conn::PostNote(const Fragment* fragments, int count, Note note, uint64_t cursor,
                    bool signal) noexcept {
  if (!have_peer_ || error_.load(std::memory_order_acquire) != 0 || mode_.load() != Mode::kRdma)
    return false;
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

bool Conn::PostChain(ibv_send_wr* wrs, int n, bool signal) noexcept {
  bool posted = false;
  {
    SpinGuard guard(&post_busy_);
    if (rdma_released_.load(std::memory_order_relaxed) || !WaitSendSpace(uint32_t(n))) return false;
    posted = PostLocked(wrs, n, signal);
  }
  if (!posted) MaybeFailover();
  return posted;
}

bool Conn::PostLocked(ibv_send_wr* wrs, int n, bool signal) noexcept {
  unsignaled_ += uint32_t(n);
  if (unsignaled_ >= kSignalEvery || signal) {
    wrs[n - 1].send_flags |= IBV_SEND_SIGNALED;
    wrs[n - 1].wr_id = sq_posted_ + uint64_t(n);
    unsignaled_ = 0;
  }
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_, wrs, &bad);
  if (rc == 0) {
    sq_posted_ += uint64_t(n);
    return true;
  }
  SLIP_LOG(kWarn, "verbs: queue pair %u: post_send failed (%s)", qp_num_, strerror(rc));
  RequestFailover(wire::FailoverCause::kTransportError);
  return false;
}

bool Conn::PostCredit(uint64_t consumed) noexcept {
  if (!have_peer_ || error_.load(std::memory_order_acquire) != 0 || mode_.load() != Mode::kRdma)
    return false;
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
