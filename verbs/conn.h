// Conn: one accelerated connection over an RC queue pair; the verbs Channel.
//
// Data: the sender copies into its mirror of the peer's ring and posts RDMA WRITEs to the
// same offsets in the peer's ring; the last fragment of a publish carries the new
// `produced` as its immediate (or a SEND follows it where immediates are missing). The
// receiver learns `produced` from its completion queue. Credits: the receiver writes its
// consumer cursor into the sender's credit word with an immediate, every quarter ring.
//
// Progress: whoever needs an answer polls the completion queue (a spinning reader or
// writer, under a spin lock). The queue is armed for events only while a thread sleeps on
// the connection, so a busy connection costs no system call. Its events go to a completion
// channel of its own: a blocking reader sleeps on that channel itself (Stream's direct
// sleep: one wake-up per message), and the process's progress thread watches it (one shot,
// armed only while somebody sleeps through the proxy: epoll/poll/select, a blocking send)
// to turn completions into proxy wake-ups. So the busy polling is done by the waiting
// application thread for at most SLIP_SPIN_US, and an idle connection costs no CPU.
//
// Failover: when the queue pair fails (a completion error, a disconnect without the peer's
// orderly notes, the device going away) or the peer says its own failed, the connection
// stops using RDMA and continues on its TCP anchor: our FAILOVER tells the peer how many
// bytes we received, its FAILOVER tells us where to resend from, and the rings are then
// filled and drained over TCP. The exchange and the stream on TCP are core's
// (core/failover.h, AnchorFailover): this class stops the queue pair and counts what it
// delivered. Carriage: kTransport -> kFailing (ours sent, waiting for the peer's) -> kTcp;
// a server's connection is kHeld until it settles (settle.cc).
//
// Reuse (docs/DESIGN.md "Reusing queue pairs"): a queue pair outlives its stream. When both
// ends close in order, each says in its CLOSED note that it keeps the queue pair, then
// parks it (PARKED); the next connection from the same client to the same listener claims
// it (CLAIM, ANSWER) instead of a new rdma_cm exchange and queue pair. The stream's state
// starts again from zero at the claim: by then both ends' last writes have landed (RC
// delivers in order, and each end's PARKED follows its last write).
//
// Thread safety: the Channel contract (one sender, one receiver at a time); posting to the
// send queue is serialised by a spin lock since both sides post (data and credits); the
// failover steps by a mutex (they run on the control, progress or application threads).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "core/remote_ring.h"
#include "core/wire.h"
#include "verbs/device.h"
#include "verbs/private_data.h"

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

class Conn final : public RemoteRing {
 public:
  // Creates the completion queue, the queue pair on `id` and the rings. Returns nullptr
  // with *error (-errno) on failure; `id` stays the caller's then.
  static Conn* Create(rdma_cm_id* id, Device* device, uint32_t ring_size, bool send_notify,
                      int* error) noexcept;
  ~Conn() override;

  // (Not after ReleaseRdma: the id is gone then.)
  rdma_cm_id* id() const noexcept { return id_; }
  Device* device() const noexcept { return device_; }
  Slot& slot() noexcept { return slot_; }

  uint32_t qp_num() const noexcept { return qp_num_; }
  // Moves the queue pair to RTR and RTS from what rdma_cm learned of the peer (after the
  // REQ on the listening side, after the REP on the connecting side), with the source GID
  // ChooseSourceGid picks (`gid_override`: SLIP_GID_INDEX, or -1). Returns 0 or -errno.
  int Connect(int gid_override) noexcept;
  // The peer's ring (from REP or HELLO); data may flow only once it is known.
  void SetPeer(uint64_t ring_addr, uint32_t rkey, bool send_notify) noexcept;
  // The client's first SEND: its ring for the server.
  bool SendHello(uint64_t nonce) noexcept;
  bool HelloReceived(Hello* hello) const noexcept;

  // --- settling (core/remote_ring.h; verbs/settle.cc) ---
  // A server's connection is held (RemoteRing::Hold) until its client's CONFIRM: the
  // peer's ring is not known meanwhile, and whatever the request's queue pair does (notes,
  // errors, a disconnect) reaches neither the application nor the anchor: the rdma_cm
  // peer may be a forger, and the TCP client a plain one.
  // Client of a listener that shares its port (kFlagGroup): the process that accepts our
  // TCP connection may know nothing of the request, so the CONFIRM waits for its TAKEN.
  // ExpectTaken (at the REP) lets the TAKEN in from then on; HoldForTaken (before
  // SetProxy) holds the stream, like a server's, until Settle sees the TAKEN and sends the
  // CONFIRM, or sees the server's own bytes, a failure or `deadline_ms` and goes plain.
  // (A group's queue pair is never parked: ExpectTaken implies NoReuse.)
  void ExpectTaken(uint64_t nonce) noexcept;
  bool awaits_taken() const noexcept { return expect_taken_.load(std::memory_order_acquire); }
  void HoldForTaken(uint64_t deadline_ms) noexcept;
  // Listener of such a group: the accepting process took the request (a SEND).
  bool SendTaken(uint64_t nonce) noexcept;

  // --- reuse ---
  // Never parked for a later connection (a group's: the claim could not be checked).
  void NoReuse() noexcept { no_reuse_ = true; }
  // The client end of a connection to `dest` (what a later connect() there may reuse).
  void SetClientOf(const wire::Endpoint& dest) noexcept {
    client_role_ = true;
    dest_ = dest;
  }
  bool client_role() const noexcept { return client_role_; }
  // Who takes the Conn back when its stream is destroyed (else it is deleted).
  void SetOwner(ConnOwner* owner) noexcept { owner_ = owner; }
  const wire::Endpoint& dest() const noexcept { return dest_; }
  // The application let go of the stream: the orderly close (notes, then every write
  // acknowledged) or, after failover, the rest on the anchor. With `may_linger` an orderly
  // close keeps the queue pair; returns true when it did (then Park() or delete), false
  // when only deleting is left.
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
  int EventFd() const noexcept { return rdma_released() ? -1 : own_fd_; }
  // Listener: the CLAIM that arrived on this parked queue pair, if any (taken once).
  bool TakeClaim(LinkMsg* claim) noexcept;
  // Listener: starts the claimed connection (its HELLO is the claim) and answers it.
  void BeginClaimed(const LinkMsg& claim) noexcept;
  bool SendAnswer(uint64_t nonce, bool accepted) noexcept;
  bool orphaned() const noexcept { return orphaned_.load(std::memory_order_acquire); }

  // Progress thread: a completion event for this connection's CQ. Drains it and re-arms.
  void OnCompletionEvent() noexcept;
  // rdma_cm says the connection is gone (DISCONNECTED, DEVICE_REMOVAL, errors).
  void OnDisconnect() noexcept;
  // The queue pair or device failed: fail over to the anchor when possible, else Fail.
  // Not under the poll lock.
  void TransportFailed(wire::FailoverCause cause) noexcept override;

  // --- device removal (docs/DESIGN.md "Failover") ---
  // Progress thread: rdma_cm said DEVICE_REMOVAL for this connection's id (and the
  // connection failed over, or failed).
  void MarkDeviceRemoved() noexcept { device_removed_.store(true, std::memory_order_release); }
  // Progress thread, with the registry locked (ReleaseRemovedConns, CheckAllConns): once the
  // connection no longer needs RDMA (it is on TCP, waits for the peer's FAILOVER, or
  // failed), destroys its queue pair, completion queue and channel, deregisters its rings
  // (their memory stays: the TCP path uses it; the pinned budget gets it back) and destroys
  // its rdma_cm id, so that the device can go while the stream lives on. `why` is for the
  // log. Returns false when it still needs them (nothing done).
  bool ReleaseRdma(const char* why) noexcept;
  bool rdma_released() const noexcept { return rdma_released_.load(std::memory_order_acquire); }
  // Waits (bounded) until everything posted has been acknowledged by the peer (or, after
  // failover, written to the anchor).
  bool Flush(int timeout_ms) noexcept;
  // Polls the CQ now (after any concurrent poller).
  bool Poll() const noexcept;

  // --- Channel ---
  const uint8_t* RxData() const noexcept override { return slot_.rx_ring(); }
  // Completions are polled while a reader asks (SomebodyWaitsOnProxy): the end of the
  // stream, say, behind a token the application has not read yet needs a new ask.
  bool ShowsArrivalsWithoutAsk() const noexcept override { return false; }
  void TxCopy(uint32_t offset, const void* src, size_t len) noexcept override;
  // Polls first: a sender that never waits would not see the peer's CLOSED otherwise.
  bool TxPeerClosed() const noexcept override;
  void CloseRx() noexcept override;
  void Destroy() noexcept override {
    if (owner_)
      owner_->Release(this);
    else
      delete this;
  }
  bool OnPeerDecline() noexcept override;

  int BeginRxSleep() noexcept override;
  void EndRxSleep(bool woken) noexcept override;

  // A group's client settles on the TAKEN (SettleClient); a server as RemoteRing says.
  Settlement Settle(uint64_t now_ms, Reason* why) noexcept override;

  // Progress thread: a connection's own completion channel is readable (`key`: its address
  // with bit 0 set). Looks the connection up among the live ones first.
  static void OnWatchEvent(uint64_t key) noexcept;

  // --- liveness (docs/DESIGN.md "Failover": a queue pair that stops silently) ---
  // Progress thread, with the registry locked (CheckAllConns): a stream on RDMA whose
  // waiting thread saw no progress for kQuietMs has its queue pair looked at (a state other
  // than ready to send, which nothing reported: a silent RESET, say, fails over) and the
  // peer's probed with a zero-length RDMA WRITE (a dead peer queue pair ends it with a
  // completion error, which fails over as any other).
  void CheckLiveness(uint64_t now_ms) noexcept;
  static constexpr uint64_t kQuietMs = 2000;

 private:
  Conn(rdma_cm_id* id, Device* device, uint32_t ring_size) noexcept;
  int Init(bool send_notify) noexcept;

  // One WRITE (or none) of ring bytes, then the notification.
  struct Fragment {
    uint32_t offset;
    uint32_t len;
  };
  // `signal`: completes with a completion of its own (what a flush waits for).
  bool PostNote(const Fragment* fragments, int count, Note note, uint64_t cursor,
                bool signal = false) noexcept;
  bool PostCredit(uint64_t consumed) noexcept override;
  bool PostData(uint64_t from, uint64_t to) noexcept override;
  void PostEnd() noexcept override;
  // Posts a chained list of n WRs (signalling one in kSignalEvery), waiting for send-queue
  // space; false (and the channel failed) when the queue pair refuses.
  bool PostChain(ibv_send_wr* wrs, int n, bool signal = false) noexcept;
  // The posting itself, with post_busy_ held and room for n in the send queue; false (the
  // failover requested, for the caller to act on after the lock) when the queue pair refuses.
  bool PostLocked(ibv_send_wr* wrs, int n, bool signal) noexcept;
  bool WaitSendSpace(uint32_t needed) noexcept;
  bool PostRecv(uint32_t index) noexcept;
  bool FlushRdma(int timeout_ms, bool own_anchor) noexcept;

  // Settling (verbs/settle.cc): RemoteRing's hooks. The client's HELLO (its ring) must
  // have come on the request's queue pair; settling as plain puts the queue pair in the
  // error state and disconnects it.
  PeerCheck ConfirmedPeer(uint64_t now_ms, const char** what) noexcept override;
  void StopRequestLocked() noexcept override;
  void TakeArrivals() const noexcept override { Poll(); }
  void OnSettledLocked() noexcept override { stream_live_.store(true, std::memory_order_release); }
  // A stream runs on the queue pair now (live: the peer's ring is set by now).
  void OnProxySet(bool live) noexcept override;
  // A group's client (HoldForTaken): settles on the TAKEN, or goes plain.
  Settlement SettleClient(uint64_t now_ms, Reason* why) noexcept;

  // Failover (under failover_.lock() where it says Locked).
  // The queue pair carries the stream, or will once settled (held): what "on RDMA" meant
  // before failover for every step of the data path.
  bool CanFailover() const noexcept;
  // Under the poll lock (or anywhere): remembers a transport failure for MaybeFailover.
  void RequestFailover(wire::FailoverCause cause) noexcept;
  void MaybeFailover() noexcept;  // a failure noticed under the poll lock, acted on after it
  // Under failover_.lock(): carriage kFailing (a held one stays held), the queue pair in
  // the error state, its completions taken. Nothing lands in our ring after this.
  void HaltLocked() noexcept override;
  bool PeerKnown() const noexcept override { return have_peer_; }
  // Takes a FAILOVER the peer sent on the anchor, waiting up to `timeout_ms` (only when
  // nobody else reads the anchor: the control thread no longer watches it).
  bool TakePeerFailover(int timeout_ms) noexcept;
  // Closing after failover: the peer's FAILOVER if still missing, then every byte out.
  void FinishOnAnchor() noexcept;
  void DrainLocked() const noexcept;
  void Handle(const ibv_wc& wc) const noexcept;
  void HandleNote(uint32_t note) const noexcept;
  void WakeReader() const noexcept;
  bool SomebodyWaits() const noexcept;
  void WakeWriter() const noexcept;
  // Wake-ups found while draining under poll_busy_ are made after it is released: a
  // woken thread that polls at once would otherwise spin on the lock of a preempted holder.
  void RunDeferredWakes() const noexcept;
  bool SendLink(const LinkMsg& msg) noexcept;
  void HandleLink(const LinkMsg& msg) const noexcept;
  // The stream's state back to a new connection's (a claimed queue pair).
  void ResetStream() noexcept;
  // The progress thread drains this queue pair: somebody sleeps through the proxy, or it
  // is parked (its PARKED, CLAIM and the peer's last notes come with nobody polling).
  bool WantsProgress() const noexcept;
  // The connection's own completion channel (see OwnChannel), or the device's.
  ibv_comp_channel* SetUpOwnChannel() noexcept;
  // Takes the completion events waiting on the own channel (non-blocking), at most `max`.
  void TakeEvents(int max) noexcept;
  // Asks the progress thread (one shot) for the next event on the own channel: only while
  // a thread waits through the proxy (epoll/poll/select, a blocking send).
  void WatchFromProgress() const noexcept;
  static constexpr uint32_t kWakeReader = 1;
  static constexpr uint32_t kWakeWriter = 2;

  rdma_cm_id* id_;
  Device* device_;
  bool device_held_ = false;  // counted in device_->users()
  ibv_cq* cq_ = nullptr;
  Slot slot_;
  // Copies taken at Init: the data path reads these, never the registrations themselves,
  // which ReleaseRdma may destroy under it.
  uint32_t remote_lkey_ = 0;
  uint32_t local_lkey_ = 0;
  uint32_t qp_num_ = 0;
  int own_fd_ = -1;  // the own channel's descriptor (a number, still valid as one)
  uint32_t max_inline_ = 0;
  uint32_t sq_depth_ = 0;
  bool send_notify_ = false;
  bool have_peer_ = false;
  uint64_t peer_ring_addr_ = 0;
  uint32_t peer_rkey_ = 0;
  ibv_qp* qp_ = nullptr;  // ours, not attached to id_ (Connect picks its source GID)

  // Receive side, updated by whoever polls (hence mutable: polling is a const read).
  mutable std::atomic<bool> hello_received_{false};

  // A stream runs on the queue pair (SetProxy until CloseStream or a claim's reset): what
  // CheckLiveness may look at.
  std::atomic<bool> stream_live_{false};
  // CheckLiveness's (the progress thread's alone).
  struct Liveness {
    uint64_t progress = 0;  // what the counters said at the last look
    uint64_t quiet_since_ms = 0;
    uint64_t probe_done_at = 0;  // sq_completed_ value that acknowledges the probe, or 0
  };
  Liveness live_;
  bool PostProbe(uint64_t* done_at) noexcept;
  mutable Hello hello_;

  // A group's client: expecting the TAKEN (from the REP on), its nonce, whether it came,
  // how long Settle waits before it looks at the completion queue again, and since when.
  std::atomic<bool> expect_taken_{false};
  uint64_t taken_nonce_ = 0;
  mutable std::atomic<bool> taken_{false};
  uint32_t taken_poll_ms_ = 1;
  uint64_t held_since_ms_ = 0;
  bool no_reuse_ = false;

  // Reuse.
  ConnOwner* owner_ = nullptr;
  bool client_role_ = false;
  wire::Endpoint dest_{};
  bool streamed_ = false;                          // SetProxy: a stream used it
  bool stream_closed_ = false;                     // CloseStream ran
  std::atomic<bool> parked_{false};                // listed by the module
  std::atomic<bool> parked_said_{false};           // and our PARKED posted
  mutable std::atomic<bool> peer_lingers_{false};  // its CLOSED said it keeps the queue pair
  mutable std::atomic<bool> peer_parked_{false};   // its PARKED arrived
  std::atomic<bool> claiming_{false};              // client: CLAIM sent, answer awaited
  uint64_t claim_nonce_ = 0;
  mutable std::atomic<int> answer_{0};            // client: 1 accepted, -1 refused
  mutable std::atomic<bool> claim_taken_{false};  // listener: a CLAIM arrived
  mutable LinkMsg claim_;
  mutable std::atomic<uint64_t> sq_completed_{0};
  mutable std::atomic_flag poll_busy_ = ATOMIC_FLAG_INIT;
  mutable std::atomic<bool> armed_{true};  // under poll_busy_; Init arms the queue once
  mutable bool defer_wakes_ = false;       // under poll_busy_: its holder drains
  mutable std::atomic<uint32_t> deferred_wakes_{0};

  // Sender thread only.
  bool eof_sent_ = false;                       // CloseTx (sender side)
  std::atomic<bool> closed_sent_{false};        // CloseRx or close: we read no more
  std::atomic<bool> peer_disconnected_{false};  // rdma_cm's DISCONNECTED arrived

  // Failover.
  std::atomic<bool> failover_wanted_{false};
  std::atomic<wire::FailoverCause> failover_cause_{wire::FailoverCause::kTransportError};
  // Send queue, under post_busy_.
  std::atomic_flag post_busy_ = ATOMIC_FLAG_INIT;
  uint64_t sq_posted_ = 0;
  uint32_t unsignaled_ = 0;

  // (Direct sleepers, BeginRxSleep: RemoteRing's direct_readers_, on the own channel.)
  mutable std::atomic<bool> watched_{false};  // the progress thread's one shot is armed

  // Device removal. rdma_released_ is set under both spin locks, so a poller or poster
  // that holds one sees it before it touches the queues; the own channel is used outside
  // them (TakeEvents, the watch), counted in channel_users_ (set, then checked: the
  // release waits for those that got in before the flag).
  std::atomic<bool> device_removed_{false};
  std::atomic<bool> rdma_released_{false};
  mutable std::atomic<int> channel_users_{0};
  class ChannelUse {
   public:
    explicit ChannelUse(const Conn* conn) noexcept;
    ~ChannelUse() { conn_->channel_users_.fetch_sub(1, std::memory_order_seq_cst); }
    bool ok() const noexcept { return ok_; }

   private:
    const Conn* conn_;
    bool ok_;
  };
  // The own channel goes (registry locked): out of the watch set and the epoll, destroyed.
  void DropOwnChannelLocked() noexcept;

  // The registry's intrusive list.
  Conn* prev_ = nullptr;
  Conn* next_ = nullptr;
  friend void OrphanAllConns() noexcept;
  friend void FlushAllConns(int timeout_ms) noexcept;
  friend void CheckAllConns(uint64_t now_ms) noexcept;
  friend int ReleaseRemovedConns(const Device* device) noexcept;

  // A completion channel of the connection's own, so that a blocking reader can sleep on
  // it (one wake-up per message, as rsocket's reader) while the progress thread serves
  // proxy sleepers from the same channel. Declared last: destroyed first among the
  // members, after the destructor's body has destroyed the completion queue.
  class OwnChannel {
   public:
    ~OwnChannel();
    ibv_comp_channel* channel = nullptr;  // set once at Init, never changed
    const Conn* conn = nullptr;
    bool dropped = false;  // DropOwnChannelLocked ran
  };
  OwnChannel own_;
};

// The progress thread's epoll descriptor, where connections register their own channels.
void SetConnWatchEpoll(int epoll_fd) noexcept;
// True for an epoll key that Conn registered (Conn::OnWatchEvent takes it).
inline bool IsConnWatchKey(uint64_t key) noexcept {
  return (key & 1) != 0;
}

// Every live Conn of the process (for fork and exit).
void ConnRegistryLock() noexcept;
void ConnRegistryUnlock() noexcept;
void OrphanAllConns() noexcept;  // in a fork child, with the registry locked
void FlushAllConns(int timeout_ms) noexcept;
// Progress thread: CheckLiveness on every connection, and ReleaseRdma on those on TCP for
// good (failed over, or settled as plain): a stream that no longer uses its queue pair
// keeps no pinned memory until the application closes it.
void CheckAllConns(uint64_t now_ms) noexcept;
// Progress thread, after the device's DEVICE_REMOVAL events were acknowledged: releases the
// RDMA objects of every connection on `device` that rdma_cm said lost it (ReleaseRdma).
// Returns how many of those still hold them.
int ReleaseRemovedConns(const Device* device) noexcept;

}  // namespace slip::verbs
