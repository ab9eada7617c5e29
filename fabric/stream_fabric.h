// StreamFabric: what every stream of one process shares over libfabric. One domain (the
// provider's best, or SLIP_FABRIC_PROVIDER's), the table that turns a note's tag into its
// connection, and the progress thread that takes completions while nobody waits for them.
// And either:
//
// - one RDM endpoint for all streams, with its address vector and its completion queue,
//   which the progress thread always watches: a peer host costs one provider connection
//   (ofi_rxm's) however many TCP connections go there, and a connection costs only its
//   two registered rings; or
// - connected endpoints (FI_EP_MSG), one per stream (fabric/stream_link.h), each with
//   completion queues of its own (OpenConnCqs), as verbs' queue pairs: a blocking reader
//   sleeps on its receive queue's descriptor, and the progress thread watches that queue
//   only while somebody waits through the proxy (one shot, WatchConn); and the process's
//   connection listener, whose events the progress thread takes.
//
// Thread safety: everything may be called from any thread. The domain is FI_THREAD_SAFE:
// calls into libfabric take no lock of ours (the provider serialises what it must), and a
// connection may post from the completion it is handed. A
// connection is dispatched to only while it is in the table; RemoveConn waits for
// dispatches that already found it.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/stats.h"
#include "fabric/domain.h"
#include "fabric/link_sockets.h"
#include "fabric/options.h"
#include "fabric/ring_memory.h"
#include "fabric/stream_link.h"
#include "fabric/stream_note.h"

namespace slip::fabric {

class StreamConn;

class StreamFabric {
  static constexpr uint32_t kSlotBits = 12;
  static constexpr uint32_t kSlots = 1u << kSlotBits;  // at most 4095 connections
  static constexpr size_t kMaxWatches = 256;           // listeners per process
  struct Slot {
    std::atomic<StreamConn*> conn{nullptr};
    std::atomic<uint32_t> tag{0};
    std::atomic<uint32_t> users{0};  // dispatches in progress
    uint32_t generation = 0;         // under mu_
  };

 public:
  // `hidden_fd_floor`: where the descriptors of our own go (the connections' watch).
  static std::unique_ptr<StreamFabric> Open(const Options& options, int hidden_fd_floor,
                                            std::string* why);
  ~StreamFabric();
  StreamFabric(const StreamFabric&) = delete;
  StreamFabric& operator=(const StreamFabric&) = delete;

  const char* provider() const noexcept { return domain_->provider(); }
  const Domain& domain() const noexcept { return *domain_; }
  // One connected endpoint per stream (else the RDM endpoint, ep()).
  bool connected() const noexcept { return connected_; }
  // Bytes go as sends into the peer's posted receives (SLIP_FABRIC_DATA=send, or a
  // provider without RMA), which it copies into its ring; notes are cursor notes on sends.
  bool sends() const noexcept { return sends_; }
  // Remote CQ data consumes a posted receive (FI_RX_CQ_DATA), or sends do: connections
  // post them.
  bool posted_receives() const noexcept { return posted_receives_; }
  // The provider moves data only while it is asked (FI_PROGRESS_MANUAL: tcp): a connected
  // stream's writes in flight want the progress thread, as its waiters do.
  bool manual_progress() const noexcept { return manual_progress_; }
  // A connected endpoint's own completion queues: `rx` for what the peer sends (its notes),
  // with *rx_fd its descriptor, or -1 where the provider has none (the progress thread
  // polls such a queue at every turn: CountPolledConn); and `tx` for our writes, polled
  // only, so that a reader asleep on `rx` is not woken by its own writes' completions.
  // Where the provider moves data only when asked, `tx` stays null and `rx` takes both
  // (whoever is woken progresses everything). Each is sized for all it may hold at once.
  // *out_of_fds (when given): it failed for want of a descriptor.
  bool OpenConnCqs(CqPtr* rx, int* rx_fd, CqPtr* tx, std::string* why,
                   bool* out_of_fds = nullptr) noexcept;
  void CountPolledConn(int delta) noexcept {
    polled_conns_.fetch_add(uint32_t(delta), std::memory_order_relaxed);
  }
  // The progress thread watches `fd` (a connection's queue) for one event, then hands it
  // to the connection `tag` names (StreamConn::OnWatchEvent); *added says whether the
  // descriptor is in the watch already. UnwatchConn before the descriptor closes.
  bool WatchConn(int fd, uint32_t tag, std::atomic<bool>* added) noexcept;
  void UnwatchConn(int fd) noexcept;
  // Notes are 4 bytes and cursors go in words (fabric/stream_note.h), else 8-byte notes;
  // a connection with rings of `ring_size` over a connected endpoint puts its cursor in
  // the 4 bytes instead (link_notes), where it fits.
  bool word_notes() const noexcept { return word_notes_; }
  // The most bytes one write may carry (0: a ring's worth). shm moves a larger write by the
  // receiver's process_vm_readv and completes it only once the receiver answered, and
  // 1.17's shm never answers a write whose key it refuses: one write into a registration
  // that is gone, or whose key a hostile peer made up, leaves every later completion of
  // ours behind it for good. Up to its inject size a write completes when posted.
  uint32_t max_write() const noexcept { return max_write_; }
  // A publish's note goes only once its bytes were delivered (FI_DELIVERY_COMPLETE), not
  // behind them in the provider's order: ofi_rxm makes a peer's connection again after it
  // broke, so a note written after bytes that were lost with the old connection could land
  // on the new one and claim them (seen: a receiver's application read bytes its peer never
  // sent, in 18 of 40 runs with the provider's connections cut). Costs a round trip per
  // publish on such providers' reliable datagrams.
  bool defers_notes() const noexcept { return defers_notes_; }
  // Whether a failover must first check that no write of ours completed after one that
  // failed (StreamConn::WritesLandedInOrder): over reliable datagrams whose notes go behind
  // their bytes, a later write's note would claim the failed one's bytes. Not over a
  // connected endpoint (nothing lands after it broke; a delivery-complete write can fail on
  // its lost acknowledgement while a later one completed when sent: a reset for nothing),
  // nor where notes wait for their bytes' delivery.
  bool checks_write_order() const noexcept { return !connected_ && !defers_notes_; }
  // (Sends always carry cursor notes: bigger rings are refused there, StreamConn::Init.)
  bool link_notes(uint32_t ring_size) const noexcept {
    return connected_ && (sends_ || ring_size <= (1u << note::kLinkMaxRingLog2));
  }
  fid_ep* ep() const noexcept { return endpoint_.ep(); }
  // Our endpoint's address, for REQ and REP (connected: the listener's, for REP, once
  // Listen succeeded; none for REQ).
  const uint8_t* address() const noexcept { return connected_ ? listener_.address() : address_; }
  size_t address_len() const noexcept {
    return connected_ ? listener_.address_len() : address_len_;
  }
  // Connected: the connection listener, opened once and watched by the progress thread
  // (its requests go to the connection their data names: StreamConn::OnLinkRequest).
  bool Listen() noexcept;
  // The face's news that the provider accepted `fd` on `listening`: if that is the
  // connection listener's socket, `fd` waits for its connection request in link_sockets_.
  void ProviderAccepted(int listening, int fd) noexcept;
  // A pending connection of ours starts (+1) or stops (-1) waiting for its client's
  // endpoint: what the connection listener's silent sockets are bounded by.
  void ExpectingLinks(int delta) noexcept {
    links_expected_.fetch_add(size_t(ptrdiff_t(delta)), std::memory_order_relaxed);
  }

  // Registers `len` bytes at `buf` for `access` (FI_WRITE, FI_REMOTE_WRITE). *key is what
  // a peer names it by, *desc what a local operation passes (null unless FI_MR_LOCAL).
  // False with *why (kMemlock when the provider could not pin it).
  bool Register(void* buf, size_t len, uint64_t access, MrPtr* mr, uint64_t* key, void** desc,
                Reason* why) noexcept;
  // The RMA address of `buf`'s byte 0 within its registration: the virtual address, or 0
  // where the provider addresses registrations by offset.
  uint64_t RmaBase(const void* buf) const noexcept;

  // A receive ring whose connection is done with it, while its peer's last writes may still
  // be on their way: it stays registered (and allocated) for a while, since a write into a
  // registration that is gone breaks the provider's connection to that peer for every
  // stream it carries (ofi_rxm over tcp: EPIPE). The progress thread lets go of it later.
  // (The send ring's registration goes with it: writes of ours still in flight read it.)
  // At most kRetiredMax bytes wait: past it the oldest go early (a peer that slow risks
  // its connection, not our memory). `unproven`: the rings of a request whose TCP
  // connection never came, kept apart and counted in unproven_retired_bytes(): they are
  // the pending requests' budget's (core/pending_requests.h), and go early when a new
  // request needs the room (ReleaseUnproven), since their peer is most likely whoever
  // floods us with requests.
  void Retire(MrPtr rx, MrPtr tx, RingMemory memory, size_t bytes, bool unproven) noexcept;
  size_t unproven_retired_bytes() const noexcept {
    return unproven_bytes_.load(std::memory_order_relaxed);
  }
  // Lets go of unproven rings, the oldest first, until at most `keep` bytes of them wait.
  void ReleaseUnproven(size_t keep) noexcept;

  // A peer's endpoint address into the address vector (counted per address: a peer host
  // with many connections is one entry). FI_ADDR_NOTAVAIL when the provider rejects it,
  // even after peers long without a connection made room.
  fi_addr_t AddPeer(const uint8_t* address, size_t len) noexcept;
  void RemovePeer(fi_addr_t addr) noexcept;

  // Lists `conn` under a new tag (1 .. streamwire::kMaxNoteTag), stored at `*tag` before
  // any other thread can find the connection (the progress thread reads it from there as
  // soon as it does); 0 there when the table is full.
  void AddConn(StreamConn* conn, uint32_t* tag) noexcept;
  // After this returns no thread is in or enters a dispatch to the tag's connection.
  void RemoveConn(uint32_t tag) noexcept;

  // Calls f(conn) for every connection in the table (FlushAll, a fork child's orphaning).
  template <typename F>
  void ForEachConn(F&& f) noexcept {
    for (uint32_t i = 1; i < kSlots; ++i) {
      const uint32_t tag = slots_[i].tag.load(std::memory_order_acquire);
      if (tag != 0) WithConn(tag, f);
    }
  }

  // Takes what the RDM endpoint's completion queue holds and hands it to the connections
  // (connected: 0, each connection polls its own). Returns the number of completions taken.
  int Poll() noexcept { return connected_ ? 0 : Drain(endpoint_.cq(), nullptr); }
  // The same for one queue; `owner`: the connection whose own queue it is, which takes
  // the peer's notes there whatever they say (only its peer writes through its endpoint).
  int Drain(fid_cq* cq, StreamConn* owner) noexcept;
  // One write of `len` bytes at `buf` (registered: `desc`) to the peer's `remote` address of
  // the registration `key`, with `data` as remote CQ data where `with_data`; `context` comes
  // back with its completion. The provider's return code.
  // `delivered`: it completes only once it is at the peer (FI_DELIVERY_COMPLETE), where
  // the provider can do that (else as any write).
  // `ep`: the RDM endpoint, or the connection's own (`peer` is ignored then).
  ssize_t Write(fid_ep* ep, const void* buf, size_t len, void* desc, bool with_data, uint64_t data,
                fi_addr_t peer, uint64_t remote, uint64_t key, void* context,
                bool delivered = false) noexcept;
  // One send of `len` bytes at `buf` (registered: `desc`) through a connected endpoint,
  // into the peer's next posted receive, with `data` as its remote CQ data.
  ssize_t Send(fid_ep* ep, const void* buf, size_t len, void* desc, uint64_t data, void* context,
               bool delivered = false) noexcept;

  // A descriptor the progress thread watches beside the completion queue (a listener's
  // UDP socket: its REQs are answered as they come, whether the application is in accept()
  // or not), and what it calls when the descriptor turns readable. After UnwatchFd returns
  // the call is not running and will not run again. A serve that returns true was busy
  // (it took many at once; more are likely queued): the descriptor rests for a millisecond,
  // so that a flood of datagrams is taken in batches, not in a wake-up each.
  using ServeFn = bool (*)(void* ctx) noexcept;
  bool WatchFd(int fd, ServeFn serve, void* ctx) noexcept;
  void UnwatchFd(int fd) noexcept;
  // What the progress thread calls at every turn (at least every 100 ms): the listeners'
  // timers. Set before the thread starts, once.
  using TurnFn = void (*)(void* ctx, uint64_t now_ms) noexcept;
  void SetTurn(TurnFn turn, void* ctx) noexcept {
    turn_ = turn;
    turn_ctx_ = ctx;
  }

  // The progress thread (started with the first connection or listener), and fork's view of it.
  bool StartProgress() noexcept;
  void StopProgress() noexcept;
  // In a fork child: the parent's objects are never touched again (not even closed).
  void Abandon() noexcept;
  // At exit: new peers no longer find the endpoint (shm's region file goes).
  void Unpublish() noexcept { endpoint_.Unpublish(); }

 private:
  StreamFabric() = default;
  // The domains streams go over: *connected, over connected endpoints; *sends, with sends
  // into posted receives (no RMA).
  static std::vector<InfoPtr> Domains(const Options& options, bool* connected, bool* sends,
                                      std::string* why);
  static std::vector<InfoPtr> WriteDomains(const Options& options, bool* connected,
                                           std::string* why);
  static std::vector<InfoPtr> SendDomains(const Options& options, bool* connected, bool* sends,
                                          std::string* why);
  void ProgressLoop() noexcept;
  // After the watches in fds[0..n) that were ready were served: whether one still is.
  static bool StillReady(pollfd* fds, nfds_t n) noexcept;
  // Hands the connections' queues whose one shot fired to their connections.
  void TakeConnEvents() noexcept;
  void Dispatch(const fi_cq_data_entry& entry, StreamConn* owner) noexcept;
  void DispatchError(const fi_cq_err_entry& err) noexcept;
  // The progress thread's call for the connection listener's event queue.
  static bool ServeLinks(void* ctx) noexcept;
  void TakeLinkEvents() noexcept;
  // Calls f(conn) if `tag` names a connection in the table, which stays there until f
  // returns (RemoveConn waits).
  template <typename F>
  void WithConn(uint32_t tag, F&& f) noexcept {
    const uint32_t index = tag & (kSlots - 1);
    if (index == 0 || tag >= (1u << 24)) return;
    Slot& s = slots_[index];
    s.users.fetch_add(1, std::memory_order_seq_cst);
    StreamConn* conn = s.conn.load(std::memory_order_seq_cst);
    if (conn && s.tag.load(std::memory_order_seq_cst) == tag) f(conn);
    s.users.fetch_sub(1, std::memory_order_seq_cst);
  }

  std::unique_ptr<Domain> domain_;
  Endpoint endpoint_;  // RDM
  bool connected_ = false;
  bool sends_ = false;
  bool posted_receives_ = false;
  bool manual_progress_ = false;
  int conn_epoll_ = -1;  // connected: the connections' queues the progress thread watches
  std::atomic<uint32_t> polled_conns_{0};  // connections whose queue has no descriptor
  LinkListener listener_;                  // under mu_ until open
  std::atomic<bool> listening_{false};
  LinkSockets link_sockets_;  // the listener's sockets before their request
  std::atomic<size_t> links_expected_{0};
  uint8_t address_[64] = {};
  size_t address_len_ = 0;
  bool prov_key_ = false;
  bool virt_addr_ = false;
  bool local_mr_ = false;
  bool word_notes_ = false;
  uint32_t max_write_ = 0;
  bool defers_notes_ = false;
  std::atomic<bool> delivery_refused_{false};  // the provider said no to FI_DELIVERY_COMPLETE

  std::mutex mu_;  // the table's free slots, the peers, the thread
  std::unique_ptr<Slot[]> slots_;
  uint32_t next_slot_ = 1;
  struct Peer {
    std::vector<uint8_t> address;
    fi_addr_t addr;
    uint32_t users;
    uint64_t idle_since_ms;  // when users fell to 0
  };
  // Under mu_: takes the peers without a connection for kPeerIdleMs out of the address
  // vector. Whether any went.
  bool EvictIdlePeersLocked(uint64_t now_ms) noexcept;
  std::vector<Peer> peers_;
  bool peers_refused_ = false;  // under mu_: the provider refused a new peer (logged once)
  struct Watch {
    int fd;
    ServeFn serve;
    void* ctx;
    uint64_t rest_until_ns;  // busy: not polled until then
  };
  TurnFn turn_ = nullptr;
  void* turn_ctx_ = nullptr;
  struct Retired {
    RingMemory memory;  // (first: unmapped after both registrations went)
    MrPtr rx;
    MrPtr tx;
    uint64_t until_ms;
    size_t bytes;
  };
  static constexpr size_t kRetiredMax = size_t(512) << 20;
  size_t retired_bytes_ = 0;  // under retired_mu_
  std::mutex retired_mu_;
  std::vector<Retired> retired_;
  std::vector<Retired> unproven_;  // under retired_mu_, oldest first
  std::atomic<size_t> unproven_bytes_{0};
  // Under retired_mu_: moves the front of `from` whose `take` holds into *done.
  template <typename Take>
  static void TakeFrontLocked(std::vector<Retired>* from, std::vector<Retired>* done,
                              Take take) noexcept;
  std::atomic<uint64_t> next_expiry_ms_{0};  // 0: nothing retired
  // `force`: the oldest go whatever their time, until retired_bytes_ fits kRetiredMax.
  void ReleaseRetired(uint64_t now_ms, bool force = false) noexcept;
  std::mutex watch_mu_;  // the watches; held while one is served
  std::vector<Watch> watches_;
  std::thread progress_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> abandoned_{false};
};

}  // namespace slip::fabric
