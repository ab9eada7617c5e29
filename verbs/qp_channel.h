// QpChannel: a byte stream over an RC queue pair; the verbs Channel (a RemoteRing).
//
// Data: the sender copies into its mirror of the peer's ring and posts RDMA WRITEs to the
// same offsets in the peer's ring; the last fragment of a publish carries the new
// `produced` as its immediate (or a SEND follows it where immediates are missing). The
// receiver learns `produced` from its completion queue. Credits: the receiver writes its
// consumer cursor into the sender's credit word with an immediate, every quarter ring.
// The client's ring comes to the server in a HELLO, a SEND on the queue pair that leaves
// before the TCP connection's SYN.
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
// orderly notes, the device going away, a queue pair that stops without telling anyone)
// or the peer says its own failed, the connection stops using RDMA and continues on its
// TCP anchor through core's AnchorFailover (core/remote_ring.h): this class stops the
// queue pair and counts what it delivered. Carriage: kTransport -> kFailing (ours sent,
// waiting for the peer's) -> kTcp; a server's connection is kHeld until it settles.
//
// What a connection does beyond its stream (a group client's TAKEN, parking and claiming
// the queue pair for the next connection) is Conn's (verbs/conn.h), which derives from
// this: its link messages arrive through HandleLink, and its destructor tears the queue
// pair down (Unlist first, Teardown last) while the object is whole, since the progress
// thread may be handling the queue pair's completions until Teardown has waited for them.
//
// Thread safety: the Channel contract (one sender, one receiver at a time); posting to the
// send queue is serialised by a spin lock since both sides post (data and credits); the
// failover steps by a mutex (they run on the control, progress or application threads).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>

#include "core/remote_ring.h"
#include "core/wire.h"
#include "verbs/device.h"
#include "verbs/own_channel.h"
#include "verbs/private_data.h"
#include "verbs/send_queue.h"

namespace slip::verbs {

class QpChannel : public RemoteRing {
 public:
  static constexpr Names kNames = {TransportKind::kVerbs, "verbs", "RDMA", "the queue pair failed"};

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
  int EventFd() const noexcept { return rdma_released() ? -1 : own_.fd(); }
  bool orphaned() const noexcept { return orphaned_.load(std::memory_order_acquire); }

  // Progress thread: a completion event for this connection's CQ. Drains it and re-arms.
  void OnCompletionEvent() noexcept;
  // rdma_cm says the connection is gone (DISCONNECTED, DEVICE_REMOVAL, errors).
  void OnDisconnect() noexcept;

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
  bool OnPeerDecline() noexcept override;
  int BeginRxSleep() noexcept override;
  void EndRxSleep(bool woken) noexcept override;

  // --- liveness (docs/DESIGN.md "Failover": a queue pair that stops silently) ---
  // Progress thread, with the registry locked (CheckAllConns): a stream on RDMA whose
  // waiting thread saw no progress for kQuietMs has its queue pair looked at (a state other
  // than ready to send, which nothing reported: a silent RESET, say, fails over) and the
  // peer's probed with a zero-length RDMA WRITE (a dead peer queue pair ends it with a
  // completion error, which fails over as any other).
  void CheckLiveness(uint64_t now_ms) noexcept;
  static constexpr uint64_t kQuietMs = 2000;

 protected:
  // Listed in the registry of live channels from here on.
  QpChannel(rdma_cm_id* id, Device* device, uint32_t ring_size) noexcept;
  // Creates the completion queue, the queue pair on id() and the rings. 0 or -errno.
  int Init(bool send_notify) noexcept;
  // The derived destructor calls Unlist first (the progress thread's sweeps no longer see
  // the channel) and Teardown last: the queue pair, its completion queue and channel and
  // the rdma_cm id go, the rings go back to the device (a fork child's copy touches none of
  // them: they are the parent's). Destroying the queues waits for the completion events
  // another thread is handling, which may still call the derived class's hooks.
  ~QpChannel() override = default;
  void Unlist() noexcept;
  void Teardown() noexcept;

  // A SEND of the peer that is neither a note nor its HELLO (verbs/private_data.h).
  virtual void HandleLink(const LinkMsg& msg) const noexcept = 0;
  // A SEND of ours: `len` bytes at `offset` in the control block (kept there until it
  // completes). False (and the failover requested) when the queue pair refuses.
  bool PostControl(size_t offset, size_t len) noexcept;
  // A claimed queue pair's new stream: its state starts again from zero, and the
  // listener's (`claim`) takes the claim as its HELLO (the client's ring is the one
  // already known).
  void ResetChannel(const LinkMsg* claim = nullptr) noexcept;
  // The application let go of the stream: the orderly close (a final credit, EOF and
  // CLOSED notes, then every write acknowledged) where a stream ran on the queue pair, or,
  // after failover, the rest on the anchor. `may_keep`: the CLOSED says the queue pair is
  // kept, if the peer stays too. Returns true when it is kept (the stream's descriptors
  // let go), false when only deleting is left.
  bool EndStream(bool may_keep) noexcept;
  // The caller's thread takes the completion events (EventFd) until GiveEventsBack: the
  // progress thread's watch stands down.
  void TakeEventsHere() noexcept;
  void GiveEventsBack() noexcept { claiming_.store(false, std::memory_order_release); }
  // Takes the completion events waiting on the own channel (non-blocking), at most `max`.
  void TakeEvents(int max) noexcept;

  // Settling (core/remote_ring.h) as the queue pair sees it (qp_channel.cc). The client's
  // HELLO (its ring) must have come on the request's queue pair; settling as plain puts the
  // queue pair in the error state and disconnects it: the request's peer (a client that
  // gave up, or a forger) learns it at once.
  PeerCheck ConfirmedPeer(uint64_t now_ms, const char** what) noexcept override;
  void StopRequestLocked() noexcept override;
  void TakeArrivals() const noexcept override { Poll(); }
  void OnSettledLocked() noexcept override { stream_live_.store(true, std::memory_order_release); }
  // A stream runs on the queue pair now (live: the peer's ring is set by now).
  void OnProxySet(bool live) noexcept override;

  // Read by the data path: the progress thread drains a parked queue pair though nobody
  // waits on it (its PARKED, CLAIM and the peer's last notes come with nobody polling); a
  // claiming client takes the events itself (TakeEventsHere).
  std::atomic<bool> parked_{false};
  std::atomic<bool> claiming_{false};
  // The peer's CLOSED said it keeps the queue pair.
  mutable std::atomic<bool> peer_lingers_{false};
  std::atomic<bool> peer_disconnected_{false};  // rdma_cm's DISCONNECTED arrived

 private:
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
  // Posts a chained list of n WRs (verbs/send_queue.h), waiting for room while the stream
  // is on the queue pair; false when it cannot, and the failover begun when the queue pair
  // refuses.
  bool PostChain(ibv_send_wr* wrs, int n, bool signal = false) noexcept;
  bool PostRecv(uint32_t index) noexcept;
  bool FlushRdma(int timeout_ms, bool own_anchor) noexcept;

  // Failover (core/remote_ring.h). Under failover_.lock(): carriage kFailing (a held one
  // stays held), the queue pair in
  // the error state, its completions taken. Nothing lands in our ring after this.
  void HaltLocked() noexcept override;
  bool PeerKnown() const noexcept override { return have_peer_; }
  void DrainLocked() const noexcept;
  void Handle(const ibv_wc& wc) const noexcept;
  void HandleNote(uint32_t note) const noexcept;
  bool SomebodyWaits() const noexcept;
  // Wakes the reader or the writer (kWakeReader, kWakeWriter): at once, or while draining
  // under poll_busy_ after it is released (RunDeferredWakes), since a woken thread that
  // polls at once would otherwise spin on the lock of a preempted holder.
  void Wake(uint32_t which) const noexcept;
  void RunDeferredWakes() const noexcept;
  // The progress thread drains this queue pair: somebody sleeps through the proxy, or it
  // is parked.
  bool WantsProgress() const noexcept;
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
  uint32_t max_inline_ = 0;
  bool send_notify_ = false;
  bool have_peer_ = false;
  uint64_t peer_ring_addr_ = 0;
  uint32_t peer_rkey_ = 0;
  ibv_qp* qp_ = nullptr;  // ours, not attached to id_ (Connect picks its source GID)

  // Receive side, updated by whoever polls (hence mutable: polling is a const read).
  mutable std::atomic<bool> hello_received_{false};
  mutable Hello hello_;

  // A stream used the queue pair (SetProxy), and runs on it (until EndStream or a claim's
  // reset): what CheckLiveness may look at.
  bool streamed_ = false;
  std::atomic<bool> stream_live_{false};
  // CheckLiveness's (the progress thread's alone).
  struct Liveness {
    uint64_t progress = 0;  // what the counters said at the last look
    uint64_t quiet_since_ms = 0;
    uint64_t probe_done_at = 0;  // sq_.completed() that acknowledges the probe, or 0
  };
  Liveness live_;

  mutable std::atomic_flag poll_busy_ = ATOMIC_FLAG_INIT;
  mutable std::atomic<bool> armed_{true};  // under poll_busy_; Init arms the queue once
  mutable bool defer_wakes_ = false;       // under poll_busy_: its holder drains
  mutable std::atomic<uint32_t> deferred_wakes_{0};

  // Sender thread only.
  bool eof_sent_ = false;                 // CloseTx (sender side)
  std::atomic<bool> closed_sent_{false};  // CloseRx or close: we read no more

  SendQueue sq_;

  // A completion channel of the connection's own, so that a blocking reader can sleep on
  // it (one wake-up per message, as rsocket's reader; RemoteRing's direct_readers_) while
  // the progress thread serves proxy sleepers from the same channel.
  OwnChannel own_;

  // Device removal. rdma_released_ is set under the poller's spin lock (and the send
  // queue closed under its own), so a poller or poster sees it before it touches the
  // queues; the own channel, used outside them (TakeEvents, the watch), is retired first
  // (OwnChannel::Retire).
  std::atomic<bool> device_removed_{false};
  std::atomic<bool> rdma_released_{false};

  // The registry's intrusive list.
  QpChannel* prev_ = nullptr;
  QpChannel* next_ = nullptr;
  bool listed_ = true;
  friend void OrphanAllConns() noexcept;
  friend void FlushAllConns(int timeout_ms) noexcept;
  friend void CheckAllConns(uint64_t now_ms) noexcept;
  friend int ReleaseRemovedConns(const Device* device) noexcept;
  friend void OnConnWatchEvent(uint64_t key) noexcept;
};

// The progress thread's epoll descriptor, where connections register their own channels.
inline void SetConnWatchEpoll(int epoll_fd) noexcept {
  OwnChannel::SetEpoll(epoll_fd);
}
// True for an epoll key that a QpChannel registered (OnConnWatchEvent takes it).
inline bool IsConnWatchKey(uint64_t key) noexcept {
  return OwnChannel::IsKey(key);
}
// Progress thread: a connection's own completion channel is readable (`key`). Looks the
// connection up among the live ones first.
void OnConnWatchEvent(uint64_t key) noexcept;

// Every live connection of the process (for fork and exit).
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
