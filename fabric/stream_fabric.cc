#include "fabric/stream_fabric.h"

#include <poll.h>
#include <pthread.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "fabric/stream_conn.h"
#include "fabric/stream_note.h"
#include "fabric/stream_wire.h"

namespace slip::fabric {

namespace {

// Completion queue entries: every connection's writes in flight and the notes for it.
constexpr size_t kCqEntries = 16384;
// How long the progress thread sleeps in the provider's wait, and naps where it has none.
constexpr int kWaitMs = 100;
constexpr int kNapMaxUs = 1000;
// How long a watch whose serve was busy is left alone.
constexpr uint64_t kRestUs = 1000;
// How long a peer must have had no connection before its address may make room for
// another's (StreamFabric::AddPeer), well past a retired ring's 2 s (stream_retire.cc).
constexpr uint64_t kPeerIdleMs = 10000;

}  // namespace

// The domains streams go over, and whether over connected endpoints (options.h,
// SLIP_FABRIC_ENDPOINT). Auto: the reliable-datagram best match's provider, over its own
// connected endpoints where it has them (tcp, verbs), unless the user named ofi_rxm. A
// connection that breaks is then broken for good, and failover resends exactly what the
// peer lacks; ofi_rxm, which layers datagrams over such connections, makes a broken one
// again (defers_notes), and costs 8x the latency over verbs in the guest. Over tcp its
// datagrams were faster, but the tcp provider is no faster than kernel TCP either way.
std::vector<InfoPtr> StreamFabric::Domains(const Options& options, bool* connected, bool* sends,
                                           std::string* why) {
  *sends = false;
  if (options.data == DataChoice::kSend) {
    if (options.endpoint == EndpointChoice::kDatagram) {
      *why =
          "sends (SLIP_FABRIC_DATA=send) run over connected endpoints, not "
          "SLIP_FABRIC_ENDPOINT=rdm";
      return {};
    }
    return SendDomains(options, connected, sends, why);
  }
  std::vector<InfoPtr> found = WriteDomains(options, connected, why);
  if (!found.empty() || options.data == DataChoice::kWrite ||
      options.endpoint == EndpointChoice::kDatagram)
    return found;
  // Auto, and no provider writes: one that sends, if any.
  std::string send_why;
  found = SendDomains(options, connected, sends, &send_why);
  if (found.empty()) *why += "; nor sends over connected endpoints: " + send_why;
  return found;
}

std::vector<InfoPtr> StreamFabric::SendDomains(const Options& options, bool* connected, bool* sends,
                                               std::string* why) {
  // (Connected endpoints are the core provider's own: "tcp;ofi_rxm" names tcp's.)
  std::string core = options.provider;
  if (const size_t semi = core.find(';'); semi != std::string::npos) core.resize(semi);
  std::vector<InfoPtr> domains = FindDomains(core, Use::kStreamSends, why);
  *connected = *sends = !domains.empty();
  return domains;
}

std::vector<InfoPtr> StreamFabric::WriteDomains(const Options& options, bool* connected,
                                                std::string* why) {
  *connected = false;
  const bool names_rxm = options.provider.find("ofi_rxm") != std::string::npos;
  if (options.endpoint == EndpointChoice::kDatagram ||
      (options.endpoint == EndpointChoice::kAuto && names_rxm))
    return FindDomains(options.provider, Use::kStreamRings, why);
  std::string core = options.provider;
  if (core.empty() && options.endpoint == EndpointChoice::kAuto) {
    std::string rdm_why;
    std::vector<InfoPtr> rdm = FindDomains("", Use::kStreamRings, &rdm_why);
    if (!rdm.empty()) core = rdm.front()->fabric_attr->prov_name;
  }
  if (const size_t semi = core.find(';'); semi != std::string::npos) core.resize(semi);
  std::string msg_why;
  std::vector<InfoPtr> domains = FindDomains(core, Use::kStreamConnections, &msg_why);
  if (!domains.empty()) {
    *connected = true;
    return domains;
  }
  if (options.endpoint == EndpointChoice::kConnected) {
    *why = "no connected endpoints (SLIP_FABRIC_ENDPOINT=msg): " + msg_why;
    return domains;
  }
  return FindDomains(options.provider, Use::kStreamRings, why);
}

std::unique_ptr<StreamFabric> StreamFabric::Open(const Options& options, int hidden_fd_floor,
                                                 std::string* why) {
  bool connected = false, sends = false;
  std::vector<InfoPtr> domains = Domains(options, &connected, &sends, why);
  if (domains.empty()) return nullptr;
  std::unique_ptr<StreamFabric> f(new (std::nothrow) StreamFabric);
  if (!f) {
    *why = "out of memory";
    return nullptr;
  }
  f->slots_.reset(new (std::nothrow) Slot[kSlots]);
  if (!f->slots_) {
    *why = "out of memory";
    return nullptr;
  }
  // The first domain that opens: streams go wherever the provider's best interface reaches
  // (one domain per process; a host with several NICs uses the first).
  f->connected_ = connected;
  f->sends_ = sends;
  f->link_sockets_.set_floor(hidden_fd_floor);
  // (Connected: a first queue of a connection's kind, to see that the domain can make them
  // and whether they have a descriptor; it closes at once.)
  CqPtr probe, probe_tx;
  int probe_fd = -1;
  for (InfoPtr& info : domains) {
    std::string domain_why;
    f->domain_ = Domain::Open(std::move(info), &domain_why);
    if (f->domain_) f->manual_progress_ = !MovesDataItself(f->domain_->info());
    if (f->domain_ && connected && f->OpenConnCqs(&probe, &probe_fd, &probe_tx, &domain_why)) break;
    if (f->domain_ && !connected &&
        f->endpoint_.Open(*f->domain_, kCqEntries, FI_CQ_FORMAT_DATA, /*waitable=*/true,
                          &domain_why))
      break;
    f->endpoint_.Close();
    f->domain_.reset();
    *why = domain_why;
  }
  if (!f->domain_) return nullptr;
  const bool waitable = connected ? probe_fd >= 0 : f->endpoint_.wait_fd() >= 0;
  probe.reset();
  probe_tx.reset();
  if (connected) {
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    f->conn_epoll_ = sys::MoveAbove(ep, hidden_fd_floor);
    if (f->conn_epoll_ < 0) {
      *why = std::string("epoll_create1: ") + strerror(errno);
      return nullptr;
    }
  }
  if (!connected) {
    f->address_len_ = sizeof(f->address_);
    if (!f->endpoint_.Name(f->address_, &f->address_len_) ||
        f->address_len_ > streamwire::kMaxAddressBytes) {
      *why = "the endpoint's address does not fit a REQ";
      return nullptr;
    }
  }
  const fi_info& info = f->domain_->info();
  f->posted_receives_ =
      sends ||
      (connected && ((info.mode | (info.rx_attr ? info.rx_attr->mode : 0)) & FI_RX_CQ_DATA) != 0);
  const uint64_t mr_mode = f->domain_->info().domain_attr->mr_mode;
  f->prov_key_ = (mr_mode & FI_MR_PROV_KEY) != 0;
  f->virt_addr_ = (mr_mode & FI_MR_VIRT_ADDR) != 0;
  f->local_mr_ = (mr_mode & FI_MR_LOCAL) != 0;
  // (Where cursor notes do not apply, as with rings above 256 MiB: posted receives are as
  // many as a peer's word writes in flight, and 8-byte notes are not bounded by them.)
  f->word_notes_ =
      options.word_notes || f->domain_->info().domain_attr->cq_data_size < 8 || f->posted_receives_;
  // shm's writes are in the peer's region when they complete (delivered already), and
  // 1.17's shm never completes some writes asked to complete on delivery (seen here).
  f->delivery_refused_.store(strcmp(f->provider(), "shm") == 0);
  // (shm's writes up to its inject size complete when posted: StreamFabric::max_write.)
  if (strcmp(f->provider(), "shm") == 0 && !connected && !sends) {
    const size_t inject =
        info.tx_attr && info.tx_attr->inject_size ? info.tx_attr->inject_size : 4096;
    f->max_write_ = uint32_t(inject);
  }
  f->defers_notes_ = !connected && strstr(f->provider(), "ofi_rxm") != nullptr;
  SLIP_LOG(kInfo, "fabric: streams over %s (domain %s; %s; %s%s; %s progress%s)", f->provider(),
           f->domain_->name(), connected ? "connected endpoints" : "one reliable datagram endpoint",
           sends            ? "sends into posted receives (no RMA)"
           : connected      ? "cursor notes (words for rings above 256 MiB)"
           : f->word_notes_ ? "cursor words, 4-byte doorbells"
                            : "8-byte notes, unchecked",
           f->defers_notes_ ? ", each once its bytes were delivered" : "",
           f->manual_progress_ ? "manual" : "automatic",
           waitable ? "" : "; completions polled, no wait object");
  return f;
}

StreamFabric::~StreamFabric() {
  if (abandoned_.load()) {
    // (A fork child: the parent's objects stay as they are.)
    endpoint_.Forget();
    listener_.Forget();
    (void)domain_.release();
    if (conn_epoll_ >= 0) sys::close(conn_epoll_);  // (our copy; the parent's stays)
    return;
  }
  StopProgress();
  if (conn_epoll_ >= 0) sys::close(conn_epoll_);
}

bool StreamFabric::OpenConnCqs(CqPtr* rx, int* rx_fd, CqPtr* tx, std::string* why,
                               bool* out_of_fds) noexcept {
  // Every completion each can hold at once: a write's per slot of the send queue, a
  // receive's per posted receive, so that neither overruns.
  const fi_info& info = domain_->info();
  const size_t writes = (info.tx_attr ? info.tx_attr->size : 0) + 64;
  const size_t receives = size_t(StreamConn::kPostedReceives) + 64;
  if (!OpenCq(domain_->domain(), manual_progress_ ? writes + receives : receives, FI_CQ_FORMAT_DATA,
              /*waitable=*/true, rx, rx_fd, why, out_of_fds))
    return false;
  int unused_fd = -1;
  return manual_progress_ || OpenCq(domain_->domain(), writes, FI_CQ_FORMAT_DATA,
                                    /*waitable=*/false, tx, &unused_fd, why, out_of_fds);
}

bool StreamFabric::WatchConn(int fd, uint32_t tag, std::atomic<bool>* added) noexcept {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = tag;
  // (The hint may be stale under a race with the event it armed: the other call follows.)
  const bool was_added = added->load(std::memory_order_acquire);
  int rc = sys::epoll_ctl(conn_epoll_, was_added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
  if (rc != 0 && (errno == ENOENT || errno == EEXIST))
    rc = sys::epoll_ctl(conn_epoll_, errno == ENOENT ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev);
  if (rc == 0) added->store(true, std::memory_order_release);
  return rc == 0;
}

void StreamFabric::UnwatchConn(int fd) noexcept {
  sys::epoll_ctl(conn_epoll_, EPOLL_CTL_DEL, fd, nullptr);
}

void StreamFabric::TakeConnEvents() noexcept {
  epoll_event events[64];
  const int n = sys::epoll_wait(conn_epoll_, events, 64, 0);
  for (int i = 0; i < n; ++i)
    WithConn(uint32_t(events[i].data.u64), [](StreamConn* c) { c->OnWatchEvent(); });
}

bool StreamFabric::Register(void* buf, size_t len, uint64_t access, MrPtr* mr, uint64_t* key,
                            void** desc, Reason* why) noexcept {
  fid_mr* out = nullptr;
  int rc = -FI_ENOKEY;
  for (int attempt = 0; attempt < 8 && rc == -FI_ENOKEY; ++attempt) {
    // A key a stranger cannot guess, where we choose it (a key names memory others write).
    uint64_t requested = 0;
    if (!prov_key_ && getrandom(&requested, sizeof(requested), 0) != sizeof(requested)) break;
    const size_t key_size = domain_->info().domain_attr->mr_key_size;
    if (key_size < 8) requested &= (uint64_t(1) << (8 * key_size)) - 1;
    rc = fi_mr_reg(domain_->domain(), buf, len, access, 0, requested, 0, &out, nullptr);
  }
  if (rc != 0) {
    *why = rc == -FI_ENOMEM || rc == -ENOMEM || rc == -FI_EPERM ? Reason::kMemlock
                                                                : Reason::kResources;
    SLIP_LOG(kWarn, "fabric: cannot register a ring of %zu bytes: %s%s", len,
             FabricError("fi_mr_reg", rc).c_str(),
             *why == Reason::kMemlock ? " (RLIMIT_MEMLOCK too low?)" : "");
    return false;
  }
  mr->reset(out);
  *key = fi_mr_key(out);
  *desc = local_mr_ ? fi_mr_desc(out) : nullptr;
  return true;
}

uint64_t StreamFabric::RmaBase(const void* buf) const noexcept {
  return virt_addr_ ? uint64_t(uintptr_t(buf)) : 0;
}

fi_addr_t StreamFabric::AddPeer(const uint8_t* address, size_t len) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (Peer& p : peers_) {
    if (p.address.size() == len && std::memcmp(p.address.data(), address, len) == 0) {
      ++p.users;
      return p.addr;
    }
  }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  // A provider may take only so many peers (shm in libfabric 1.17: 256 inserts into an
  // address vector, fewer only by removals): those long without a connection make room.
  if (!endpoint_.Insert(address, len, &addr) &&
      !(EvictIdlePeersLocked(sys::MonotonicMs()) && endpoint_.Insert(address, len, &addr))) {
    if (!peers_refused_) {
      peers_refused_ = true;
      SLIP_LOG(kWarn,
               "fabric: %s refuses another peer's address (%zu peers known, none idle for %llu "
               "s); connections to new peers stay plain while it does",
               provider(), peers_.size(), (unsigned long long)(kPeerIdleMs / 1000));
    }
    return FI_ADDR_NOTAVAIL;
  }
  try {
    peers_.push_back(Peer{std::vector<uint8_t>(address, address + len), addr, 1, 0});
  } catch (...) {
    return FI_ADDR_NOTAVAIL;  // (the entry stays in the vector, unused)
  }
  return addr;
}

void StreamFabric::RemovePeer(fi_addr_t addr) noexcept {
  // Entries stay in the address vector while the provider has room: removing one tears
  // down ofi_rxm's connection to that host, which a later connection there would build
  // again (EvictIdlePeersLocked).
  std::lock_guard<std::mutex> lock(mu_);
  for (Peer& p : peers_)
    if (p.addr == addr && p.users > 0 && --p.users == 0) p.idle_since_ms = sys::MonotonicMs();
}

bool StreamFabric::EvictIdlePeersLocked(uint64_t now_ms) noexcept {
  // Only a peer idle long past any write of its (its streams' last writes land within a
  // retired ring's 2 s): shm answers some writes through the sender's entry.
  bool evicted = false;
  for (size_t i = 0; i < peers_.size();) {
    Peer& p = peers_[i];
    if (p.users != 0 || now_ms - p.idle_since_ms < kPeerIdleMs || !endpoint_.Remove(p.addr)) {
      ++i;
      continue;
    }
    if (i + 1 != peers_.size()) p = std::move(peers_.back());
    peers_.pop_back();
    evicted = true;
  }
  if (evicted) {
    peers_refused_ = false;
    SLIP_LOG(kInfo,
             "fabric: %s took no more peers: those without a connection for %llu s left its "
             "address vector (%zu peers known now)",
             provider(), (unsigned long long)(kPeerIdleMs / 1000), peers_.size());
  }
  return evicted;
}

void StreamFabric::AddConn(StreamConn* conn, uint32_t* tag_out) noexcept {
  *tag_out = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t tries = 1; tries < kSlots; ++tries) {
    const uint32_t index = next_slot_;
    next_slot_ = next_slot_ + 1 == kSlots ? 1 : next_slot_ + 1;
    Slot& s = slots_[index];
    if (s.conn.load(std::memory_order_relaxed) != nullptr) continue;
    // A new generation each time: a late note for the slot's last connection names a tag
    // that no longer matches.
    s.generation = (s.generation + 1) & ((1u << (24 - kSlotBits)) - 1);
    const uint32_t tag = s.generation << kSlotBits | index;
    *tag_out = tag;
    s.tag.store(tag, std::memory_order_seq_cst);
    s.conn.store(conn, std::memory_order_seq_cst);
    return;
  }
}

void StreamFabric::RemoveConn(uint32_t tag) noexcept {
  Slot& s = slots_[tag & (kSlots - 1)];
  s.conn.store(nullptr, std::memory_order_seq_cst);
  s.tag.store(0, std::memory_order_seq_cst);
  while (s.users.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
}

void StreamFabric::Dispatch(const fi_cq_data_entry& e, StreamConn* owner) noexcept {
  const auto context = uint64_t(uintptr_t(e.op_context));
  // On a connection's own queue, what names the connection is the connection polling it
  // (alive while it polls): no trip through the table.
  auto with_conn = [&](uint32_t tag, auto&& f) {
    if (owner && owner->tag() == tag)
      f(owner);
    else
      WithConn(tag, f);
  };
  if (posted_receives_ && write_context::Slot(context) == write_context::kReceiveSlot) {
    // A receive of ours, consumed by a peer's note (FI_RX_CQ_DATA) or filled by its
    // message (sends): it names the connection whose endpoint took it.
    with_conn(write_context::Tag(context), [&](StreamConn* c) {
      c->OnReceive(context, e.len, (e.flags & FI_REMOTE_CQ_DATA) != 0, e.data);
    });
    return;
  }
  if (e.flags & FI_REMOTE_CQ_DATA) {
    // A note from a peer: on a connection's own queue, its peer's; otherwise its tag names
    // our connection (a stale or forged one names none).
    if (owner)
      owner->OnPeerNote(e.data);
    else if (word_notes_)
      WithConn(note::ShortTagOf(e.data), [&](StreamConn* c) { c->OnShortNote(e.data); });
    else
      WithConn(note::TagOf(e.data), [&](StreamConn* c) { c->OnNote(e.data); });
  } else {
    // One of our writes completed; its context names its connection (write_context).
    with_conn(write_context::Tag(context), [context](StreamConn* c) { c->OnWriteDone(context); });
  }
}

int StreamFabric::Drain(fid_cq* cq, StreamConn* owner) noexcept {
  if (abandoned_.load(std::memory_order_relaxed)) return 0;
  int taken = 0;
  for (;;) {
    fi_cq_data_entry entries[16];
    fi_cq_err_entry err{};
    // (The provider serialises what must be: FI_THREAD_SAFE, no lock of ours.)
    ssize_t n = fi_cq_read(cq, entries, 16);
    if (n == -FI_EAVAIL && fi_cq_readerr(cq, &err, 0) != 1) n = -FI_EAGAIN;
    if (n == -FI_EAVAIL) {
      DispatchError(err);
      ++taken;
      continue;
    }
    if (n <= 0) return taken;
    for (ssize_t i = 0; i < n; ++i) Dispatch(entries[i], owner);
    taken += int(n);
    if (n < 16) return taken;
  }
}

ssize_t StreamFabric::Write(fid_ep* ep, const void* buf, size_t len, void* desc, bool with_data,
                            uint64_t data, fi_addr_t peer, uint64_t remote, uint64_t key,
                            void* context, bool delivered) noexcept {
  if (delivered && !delivery_refused_.load(std::memory_order_relaxed)) {
    iovec iov{const_cast<void*>(buf), len};
    fi_rma_iov rma{remote, len, key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = peer;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = context;
    msg.data = data;
    const uint64_t flags =
        FI_COMPLETION | FI_DELIVERY_COMPLETE | (with_data ? FI_REMOTE_CQ_DATA : 0);
    const ssize_t rc = fi_writemsg(ep, &msg, flags);
    // (A provider that cannot: the write goes as any other, and we stop asking; unless
    // notes wait for delivery, defers_notes: the connection fails over.)
    if (rc == 0 || rc == -FI_EAGAIN || defers_notes_) return rc;
    delivery_refused_.store(true, std::memory_order_relaxed);
  }
  if (with_data) return fi_writedata(ep, buf, len, desc, data, peer, remote, key, context);
  return fi_write(ep, buf, len, desc, peer, remote, key, context);
}

ssize_t StreamFabric::Send(fid_ep* ep, const void* buf, size_t len, void* desc, uint64_t data,
                           void* context, bool delivered) noexcept {
  if (delivered && !delivery_refused_.load(std::memory_order_relaxed)) {
    iovec iov{const_cast<void*>(buf), len};
    fi_msg msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = FI_ADDR_UNSPEC;
    msg.context = context;
    msg.data = data;
    const ssize_t rc =
        fi_sendmsg(ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE | FI_REMOTE_CQ_DATA);
    if (rc == 0 || rc == -FI_EAGAIN) return rc;
    delivery_refused_.store(true, std::memory_order_relaxed);
  }
  return fi_senddata(ep, buf, len, desc, data, FI_ADDR_UNSPEC, context);
}

void StreamFabric::DispatchError(const fi_cq_err_entry& err) noexcept {
  const auto context = uint64_t(uintptr_t(err.op_context));
  if (posted_receives_ && write_context::Slot(context) == write_context::kReceiveSlot) {
    // A receive flushed (its endpoint closed or broke): our writes on it say what
    // happened. But a message longer than the receive it took is the peer's violation.
    if (sends_ && err.err == FI_ETRUNC)
      WithConn(write_context::Tag(context), [](StreamConn* c) { c->OnPeerViolation(); });
    return;
  }
  const int error = err.err ? err.err : EIO;
  SLIP_LOG(kDebug, "fabric: completion error: %s (flags %llx, provider error %d)",
           fi_strerror(error), (unsigned long long)err.flags, err.prov_errno);
  if (err.flags & FI_REMOTE_CQ_DATA) return;  // (a peer's write that failed here: its problem)
  WithConn(write_context::Tag(context),
           [error, context](StreamConn* c) { c->OnWriteFailed(error, context); });
}

bool StreamFabric::Listen() noexcept {
  if (!connected_) return true;
  bool opened = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!listener_.open()) {
      std::string why;
      if (!listener_.Open(*domain_, &why)) {
        SLIP_LOG(kWarn, "fabric: no connection listener (%s); listeners stay plain", why.c_str());
        return false;
      }
      if (listener_.address_len() > streamwire::kMaxAddressBytes) {
        SLIP_LOG(kWarn,
                 "fabric: the connection listener's address does not fit a REP; "
                 "listeners stay plain");
        listener_.Close();
        return false;
      }
      listening_.store(true, std::memory_order_release);
      opened = true;
    }
  }
  // Its events are taken as they come (a client's connect waits for our accept), and at
  // every turn of the progress loop (a provider may progress them only when asked), so a
  // listener the thread could not watch is still served, late.
  if (opened && !WatchFd(listener_.wait_fd(), &StreamFabric::ServeLinks, this))
    SLIP_LOG(
        kWarn,
        "fabric: the connection listener is not watched (all %zu watches taken, or no thread); "
        "connection requests may wait up to %d ms",
        kMaxWatches, kWaitMs);
  return StartProgress();
}

void StreamFabric::ProviderAccepted(int listening, int fd) noexcept {
  if (!connected_ || !listening_.load(std::memory_order_acquire)) return;
  // Ours only if it is the connection listener's socket (an application may use libfabric
  // too, with listeners of its own).
  sockaddr_storage name{};
  socklen_t len = sizeof(name);
  if (sys::getsockname(listening, reinterpret_cast<sockaddr*>(&name), &len) != 0 ||
      len > listener_.address_len() || std::memcmp(&name, listener_.address(), len) != 0)
    return;
  link_sockets_.Accepted(fd, links_expected_.load(std::memory_order_relaxed), sys::MonotonicMs());
}

bool StreamFabric::ServeLinks(void* ctx) noexcept {
  static_cast<StreamFabric*>(ctx)->TakeLinkEvents();
  return false;
}

void StreamFabric::TakeLinkEvents() noexcept {
  if (!listening_.load(std::memory_order_acquire)) return;
  fid_eq* eq = listener_.eq();
  LinkEvent event;
  for (int i = 0; i < 64 && ReadLinkEvent(eq, &event); ++i) {
    if (event.kind == FI_CONNREQ) {
      // A client's fi_connect: the data names the connection that waits for it (the REP's
      // tag) and the REQ's nonce; the connection checks both and who asks.
      if (event.info)
        link_sockets_.Requested(static_cast<const sockaddr*>(event.info->dest_addr),
                                socklen_t(event.info->dest_addrlen));
      bool taken = false;
      streamwire::LinkParam param;
      if (event.info && streamwire::ParseLink(event.param, event.param_len, &param))
        WithConn(param.server_tag, [&](StreamConn* c) {
          taken = c->OnLinkRequest(&event.info, param.nonce, listener_.eq());
        });
      if (!taken) {
        SLIP_LOG(kDebug, "fabric: a connection request for no connection of ours; rejected");
        if (event.info) listener_.Reject(*event.info);
      }
    } else if (event.kind == FI_CONNECTED) {
      WithConn(event.tag, [](StreamConn* c) { c->OnLinkUp(); });
    } else {
      // FI_SHUTDOWN, or an error for an endpoint being accepted.
      WithConn(event.tag, [&](StreamConn* c) { c->OnLinkDown(event.error); });
    }
    event.info.reset();
  }
}

bool StreamFabric::WatchFd(int fd, ServeFn serve, void* ctx) noexcept {
  std::lock_guard<std::mutex> lock(watch_mu_);
  if (watches_.size() >= kMaxWatches) return false;
  try {
    watches_.push_back(Watch{fd, serve, ctx, 0});
  } catch (...) {
    return false;
  }
  return StartProgress();
}

void StreamFabric::UnwatchFd(int fd) noexcept {
  std::lock_guard<std::mutex> lock(watch_mu_);
  for (size_t i = 0; i < watches_.size(); ++i) {
    if (watches_[i].fd == fd) {
      watches_[i] = watches_.back();
      watches_.pop_back();
      return;
    }
  }
}

void StreamFabric::ProgressLoop() noexcept {
  int nap_us = 0;
  int stuck_nap_us = 0;
  fid* cq = connected_ ? nullptr : &endpoint_.cq()->fid;
  const int cq_fd = connected_ ? -1 : endpoint_.wait_fd();
  uint64_t next_turn_ms = 0;
  pollfd fds[kMaxWatches + 1];
  while (!stop_.load(std::memory_order_acquire)) {
    if (Poll() > 0) {
      nap_us = 0;
      continue;
    }
    const uint64_t turn_ms = sys::MonotonicMs();
    ReleaseRetired(turn_ms);
    TakeLinkEvents();
    link_sockets_.Expire(turn_ms);
    if (turn_) turn_(turn_ctx_, turn_ms);
    nfds_t n = 0;
    const uint64_t now_ns = sys::MonotonicNs();
    uint64_t resting_until_ns = 0;  // the first resting watch's (0: none rests)
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      for (const Watch& w : watches_) {
        if (w.rest_until_ns > now_ns) {
          if (resting_until_ns == 0 || w.rest_until_ns < resting_until_ns)
            resting_until_ns = w.rest_until_ns;
          continue;
        }
        fds[n++] = pollfd{w.fd, POLLIN, 0};
      }
    }
    timespec wait{0, 0};
    const bool polled = connected_ ? polled_conns_.load(std::memory_order_relaxed) != 0 : cq_fd < 0;
    const nfds_t conn_watch = n;
    if (connected_) fds[n++] = pollfd{conn_epoll_, POLLIN, 0};
    if (polled) {
      // Polled: naps that grow while nothing comes.
      nap_us = std::min(kNapMaxUs, nap_us ? nap_us * 2 : 20);
      wait.tv_nsec = long(nap_us) * 1000;
    } else if (connected_) {
      wait.tv_nsec = long(kWaitMs) * 1000000;
    } else {
      // The provider says when its descriptor may be slept on (nothing it must progress
      // by hand first); not fi_cq_sread, which may sleep holding a lock posters need.
      if (fi_trywait(domain_->fabric(), &cq, 1) != FI_SUCCESS) continue;
      fds[n++] = pollfd{cq_fd, POLLIN, 0};
      wait.tv_nsec = long(kWaitMs) * 1000000;
    }
    if (resting_until_ns != 0 && long(resting_until_ns - now_ns) < wait.tv_nsec)
      wait.tv_nsec = long(resting_until_ns - now_ns);
    // The raw call: the face's ppoll would take this thread for an application thread
    // going to sleep (arming every stream, spinning first; found in a hung iperf3).
    const int ready = sys::ppoll(fds, n, &wait);
    if (connected_) {
      if (ready > 0 && (fds[conn_watch].revents & POLLIN)) TakeConnEvents();
      // A connection whose queue could not be armed (or has no descriptor) is not lost:
      // every connection that wants progress is polled at least every kWaitMs.
      const uint64_t now = sys::MonotonicMs();
      if (ready == 0 || now >= next_turn_ms) {
        next_turn_ms = now + kWaitMs;
        ForEachConn([](StreamConn* c) { c->OnProgressTurn(); });
      }
    }
    if (ready <= 0) continue;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      for (nfds_t i = 0; i < conn_watch; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLERR))) continue;
        for (Watch& w : watches_) {
          if (w.fd != fds[i].fd || !w.serve(w.ctx)) continue;
          // Busy (many taken at once, more likely queued): it rests, and what comes
          // meanwhile is taken in one go rather than in a wake-up each. (Not stuck.)
          w.rest_until_ns = sys::MonotonicNs() + kRestUs * 1000;
          fds[i].revents = 0;
        }
      }
    }
    // A descriptor that stays readable after its serve took everything (the tcp
    // provider's event queue once spun this thread at 100% CPU: readable, and fi_eq_read
    // empty) would make every turn immediate: such turns nap, longer while it lasts.
    // (The watches only: the queues' descriptors are drained by the next turn, and a busy
    // connection's must not slow the wake-ups of its readers.)
    if (StillReady(fds, conn_watch)) {
      stuck_nap_us = std::min(kNapMaxUs, stuck_nap_us ? stuck_nap_us * 2 : 20);
      const timespec nap{0, long(stuck_nap_us) * 1000};
      nanosleep(&nap, nullptr);
    } else {
      stuck_nap_us = 0;
    }
  }
}

bool StreamFabric::StillReady(pollfd* fds, nfds_t n) noexcept {
  bool any = false;
  for (nfds_t i = 0; i < n; ++i) {
    const bool was = (fds[i].revents & (POLLIN | POLLERR)) != 0;
    any = any || was;
    if (!was) fds[i].fd = -1;  // (one that turned ready meanwhile is news, not stuck)
    fds[i].revents = 0;
  }
  timespec now{0, 0};
  return any && sys::ppoll(fds, n, &now) > 0;
}

bool StreamFabric::StartProgress() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (progress_.joinable()) return true;
  // The application's signals are its own threads' business: the new thread inherits a
  // mask that blocks them all.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  bool started = true;
  try {
    progress_ = std::thread([this] { ProgressLoop(); });
    pthread_setname_np(progress_.native_handle(), "slip-fabric");
  } catch (...) {
    started = false;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return started;
}

void StreamFabric::StopProgress() noexcept {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t.swap(progress_);
  }
  if (!t.joinable()) return;
  stop_.store(true, std::memory_order_release);
  t.join();
}

void StreamFabric::Abandon() noexcept {
  abandoned_.store(true, std::memory_order_release);
  // The parent's thread does not exist here: its handle is forgotten, not joined.
  new (&progress_) std::thread();
}

}  // namespace slip::fabric
