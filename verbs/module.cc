// The verbs module: devices, the progress thread, listeners and the client handshake.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/conn.h"
#include "verbs/device.h"
#include "verbs/negative_cache.h"
#include "verbs/private_data.h"
#include "verbs/verbs.h"

namespace slip::verbs {

namespace {

constexpr int kListenBacklog = 1024;
// A request waits for its TCP connection to be accepted: the application may leave it in
// the backlog for a while (as long as shm's registrations: 30 s). A bound on how many
// may wait keeps a flood of requests without SYNs from pinning unbounded memory.
constexpr uint64_t kPendingTtlMs = 30000;
constexpr size_t kMaxPendingPerListener = 1024;
// One source address may hold this many of them: a host that floods requests (each pins
// a slot until it expires) takes no more than its share of the listener's.
constexpr size_t kMaxPendingPerSource = 64;
// Parked queue pairs (docs/DESIGN.md "Reusing queue pairs"): one whose peer has not closed
// yet waits this long for it; a client's idle one this long for a connection to claim it;
// a listener's (which the client drops first) longer.
constexpr uint64_t kLingerMs = 30000;
constexpr uint64_t kClientIdleMs = 10000;
constexpr uint64_t kListenerIdleMs = 60000;

bool SetNonblocking(int fd) noexcept {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// The wire endpoint of an rdma_cm address (v4-mapped folds to IPv4, as in core/wire).
bool EndpointOf(const sockaddr* sa, wire::Endpoint* ep) noexcept {
  return sa && wire::EndpointFromSockaddr(sa, ep);
}

bool SameAddress(const wire::Endpoint& a, const wire::Endpoint& b) noexcept {
  return a.family == b.family && std::memcmp(a.addr, b.addr, 16) == 0;
}

// Moves the elements for which `take` holds from *from to the end of *out, keeping the
// others in their order (the parked list is oldest first). One that cannot be moved (out
// of memory) stays where it is, for a later round.
template <typename T, typename Take>
void MoveOutIf(std::vector<T>* from, std::vector<T>* out, Take take) noexcept {
  size_t kept = 0;
  for (size_t i = 0; i < from->size(); ++i) {
    bool moved = false;
    if (take((*from)[i])) {
      try {
        out->push_back((*from)[i]);
        moved = true;
      } catch (...) {
      }
    }
    if (!moved) (*from)[kept++] = (*from)[i];
  }
  from->erase(from->begin() + long(kept), from->end());
}

}  // namespace

struct Pending {
  wire::Endpoint client, server;
  uint64_t nonce = 0;
  uint8_t ring_log2 = 0;
  // Null once withdrawn: the queue pair and its slot are given back at once (a flood of
  // requests that disconnect pins nothing), the record stays until it expires so that
  // accept() knows the client gave up.
  Conn* conn = nullptr;
  uint64_t expires_ms = 0;
  bool withdrawn = false;  // the client disconnected before confirming
};

struct Listener {
  rdma_cm_id* id = nullptr;
  uint16_t port = 0;
  wire::Endpoint addr{};  // as bound (claims must name it, unless it is the wildcard)
  bool wildcard = false;
  std::mutex mu;
  std::vector<Pending> pending;

  // Requests that hold a queue pair (under mu).
  size_t Live() const noexcept {
    size_t n = 0;
    for (const Pending& p : pending) n += p.conn != nullptr;
    return n;
  }
  // Makes room for one more record: the oldest withdrawn one goes (its client is plain
  // already). False when every record holds a queue pair and the table is full.
  bool RoomForOne(size_t limit) noexcept {
    if (pending.size() < limit) return true;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (pending[i].conn) continue;
      pending.erase(pending.begin() + long(i));
      return true;
    }
    return false;
  }
};

struct ClientConn {
  // Where the client stands: resolving the address, then the route; resolved (the caller
  // binds its TCP socket); the REQ sent; the REP taken (the id now reports to the module's
  // channel). A parked queue pair taken for the connection: kReused (resolved, not yet
  // said), kResolved, the CLAIM sent (kClaim), the ANSWER taken (kAccepted).
  enum class Stage : uint8_t { kAddr, kRoute, kResolved, kRequest, kAccepted, kReused, kClaim };
  rdma_event_channel* channel = nullptr;  // private until Finish/Abort
  rdma_cm_id* id = nullptr;
  Conn* conn = nullptr;
  wire::Endpoint dest;
  uint64_t nonce = 0;
  uint8_t ring_log2 = 0;
  Stage stage = Stage::kAddr;
  uint64_t deadline_ms = 0;
  bool reused = false;  // conn is a parked queue pair (no rdma_cm exchange of its own)
};

struct ParkedConn {
  Conn* conn = nullptr;
  uint64_t since_ms = 0;
  // Release lists a queue pair before its PARKED goes out and marks it ready after: until
  // then its closing thread still uses it, and nothing else may take or delete it.
  bool ready = true;
};

// A device that rdma_cm said was removed (DEVICE_REMOVAL), from the event to the end of the
// process: the context is never handed out again (librdmacm may still name it in an id
// resolved before the removal).
struct Removal {
  ibv_context* context = nullptr;
  Device* device = nullptr;  // ours on it, until nothing uses it any more
  bool retired = false;      // RetireContext done
  bool superseded = false;   // under mu_: the address now holds a new context (DeviceFor)
};

class VerbsModule final : public Module, public ConnOwner {
 public:
  explicit VerbsModule(const Config* config) noexcept : config_(config) {}
  int Start(char* error, size_t error_len) noexcept;

  Listener* Listen(const sockaddr* local, Reason* why) noexcept override;
  void Unlisten(Listener* listener) noexcept override;
  bool HasPending(Listener* listener, const wire::Endpoint& client,
                  const wire::Endpoint& server) noexcept override;
  void DropPending(Listener* listener, const wire::Endpoint& client,
                   const wire::Endpoint& server) noexcept override;
  std::unique_ptr<Channel> AcceptPending(Listener* listener, const wire::Endpoint& client,
                                         const wire::Endpoint& server, int proxy_b, Reason* why,
                                         bool* committed) noexcept override;
  ClientConn* Resolve(const sockaddr* dest, sockaddr_storage* source,
                      Reason* why) noexcept override;
  bool Handshake(ClientConn* conn, const wire::Endpoint& client, const wire::Endpoint& server,
                 uint64_t nonce, uint32_t ring_size, Reason* why) noexcept override;
  ClientConn* StartResolve(const sockaddr* dest, Reason* why) noexcept override;
  bool StartHandshake(ClientConn* conn, const wire::Endpoint& client, const wire::Endpoint& server,
                      uint64_t nonce, uint32_t ring_size, Reason* why) noexcept override;
  Step Advance(ClientConn* conn, sockaddr_storage* source, Reason* why) noexcept override;
  int EventFd(ClientConn* conn) noexcept override {
    return conn->channel ? conn->channel->fd : conn->conn->EventFd();
  }
  uint64_t Deadline(ClientConn* conn) noexcept override { return conn->deadline_ms; }
  std::unique_ptr<Channel> Finish(ClientConn* conn, int proxy_b) noexcept override;
  void Abort(ClientConn* conn) noexcept override;
  void ForkPrepare() noexcept override;
  void ForkParent() noexcept override;
  void ForkChild() noexcept override;
  void FlushAll(int timeout_ms) noexcept override;
  void Release(Conn* conn) noexcept override;

 private:
  void Run() noexcept;
  void HandleCmEvent(rdma_cm_event* event) noexcept;
  void OnConnectRequest(rdma_cm_event* event) noexcept;
  void HandleCompletions(Device* device) noexcept;
  void ExpirePending() noexcept;
  void TrimIdleSlots(uint64_t now_ms) noexcept;
  Device* DeviceFor(ibv_context* context, int* error) noexcept;
  bool DeviceAllowed(ibv_context* context) const noexcept;
  bool SendNotify(Device* device) const noexcept;
  static void Reject(rdma_cm_id* id) noexcept;
  void DestroyPending(std::vector<Pending>* dropped) noexcept;
  Reason MemlockReason(int error, uint32_t ring_size) noexcept;
  bool IsListenerId(rdma_cm_id* id) noexcept;
  void ReleaseClient(ClientConn* c) noexcept;
  Step TakeEvent(ClientConn* c, rdma_cm_event* event, sockaddr_storage* source,
                 Reason* why) noexcept;
  Step Fail(ClientConn* c, Reason why, Reason* out) noexcept;
  Step Resolved(ClientConn* c, sockaddr_storage* source, Reason* why) noexcept;
  // Blocking use of Advance: waits on the event descriptor until a step is decided.
  Step WaitStep(ClientConn* c, sockaddr_storage* source, Reason* why) noexcept;
  // Reuse: a parked client queue pair to `dest` whose listener parked too, or nullptr.
  Conn* TakeParked(const wire::Endpoint& dest) noexcept;
  void PutParked(Conn* conn) noexcept;
  size_t ParkedCount() noexcept;
  ClientConn* Reuse(const wire::Endpoint& dest) noexcept;
  bool SendClaim(ClientConn* c, const wire::Endpoint& client, const wire::Endpoint& server,
                 uint32_t ring_size, Reason* why) noexcept;
  // Progress thread: CLAIMs that arrived on the listener's parked queue pairs, and the
  // parked queue pairs that died or waited too long.
  void ServeClaims() noexcept;
  void ServeClaim(Conn* conn, const LinkMsg& claim) noexcept;
  void SweepParked() noexcept;
  // Deletes the oldest parked queue pair (its ring slot goes back to the device's pool):
  // a new connection that could not get resources tries once more. False if none.
  bool EvictParked() noexcept;
  Listener* ListenerFor(const wire::Endpoint& server) noexcept;
  // Device removal (docs/DESIGN.md "Failover"): the event's context is noted (and no longer
  // handed out); after the events were acknowledged, ReapRemoved destroys what the process
  // holds on it: listener ids bound to it, requests pending on it, parked queue pairs, the
  // RDMA objects of its connections (which live on over TCP), and then the device.
  void NoteRemoved(ibv_context* context) noexcept;
  void ReapRemoved() noexcept;
  bool ReapRemoval(Removal* removal) noexcept;  // true once nothing is left to do

  const Config* config_;
  rdma_event_channel* cm_channel_ = nullptr;
  int epoll_fd_ = -1;
  std::thread thread_;
  std::mutex mu_;  // devices_, listeners_
  std::map<ibv_context*, Device*> devices_;
  std::vector<Listener*> listeners_;
  NegativeCache negative_;
  std::atomic<bool> forked_{false};
  std::atomic<bool> memlock_reported_{false};
  std::mutex park_mu_;  // parked_ (a leaf: nothing else is taken under it)
  std::vector<ParkedConn> parked_;
  std::vector<Removal> removals_;      // written by the progress thread under mu_
  bool reaping_ = false;               // progress thread: a removal is not finished yet
  uint64_t last_housekeeping_ms_ = 0;  // progress thread: TrimIdleSlots, CheckAllConns
};

// ------------------------------------------------------------------------ start

int VerbsModule::Start(char* error, size_t error_len) noexcept {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  int usable = 0;
  for (int i = 0; list && i < count; ++i) {
    if (config_->device.empty() || config_->device == ibv_get_device_name(list[i])) ++usable;
  }
  if (list) ibv_free_device_list(list);
  if (usable == 0) {
    snprintf(error, error_len,
             config_->device.empty() ? "no RDMA device" : "RDMA device %s not found",
             config_->device.c_str());
    return -ENODEV;
  }
  cm_channel_ = rdma_create_event_channel();
  if (cm_channel_) cm_channel_->fd = sys::MoveHigh(cm_channel_->fd, sys::HiddenFdFloor());
  if (!cm_channel_ || !SetNonblocking(cm_channel_->fd)) {
    snprintf(error, error_len, "cannot open the rdma_cm event channel (%s)", strerror(errno));
    return -ENODEV;
  }
  epoll_fd_ = sys::MoveHigh(epoll_create1(EPOLL_CLOEXEC), sys::HiddenFdFloor());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // null: the rdma_cm channel; otherwise a Device
  if (epoll_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, cm_channel_->fd, &ev) != 0) {
    snprintf(error, error_len, "epoll: %s", strerror(errno));
    return -EIO;
  }
  SetConnWatchEpoll(epoll_fd_);  // connections' own completion channels (odd keys)
  // The pinned-memory budget: what the user set, or a quarter of physical memory (a peer
  // that asks for connections must not pin what the host needs, RLIMIT_MEMLOCK or not).
  uint64_t budget = config_->verbs_pin_max;
  if (budget == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    budget = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) / 4 : 0;
  }
  Device::SetPinBudget(size_t(budget));
  // Rings must be pinned: say once, clearly, when the limit cannot hold even one.
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur < SlotBytes(config_->ring_size) && geteuid() != 0) {
    SLIP_LOG(kWarn,
             "verbs: RLIMIT_MEMLOCK is %lu KiB but one connection pins %zu KiB; verbs "
             "connections will stay on TCP (raise it: ulimit -l, or limits.conf memlock)",
             (unsigned long)(rl.rlim_cur / 1024), SlotBytes(config_->ring_size) / 1024);
    memlock_reported_ = true;
  }
  try {
    thread_ = std::thread([this] { Run(); });
    thread_.detach();
  } catch (...) {
    snprintf(error, error_len, "cannot start the progress thread");
    return -EAGAIN;
  }
  return 0;
}

Device* VerbsModule::DeviceFor(ibv_context* context, int* error) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = devices_.find(context);
  if (it != devices_.end()) return it->second;
  for (Removal& r : removals_) {
    if (r.context != context || r.superseded) continue;
    if (r.retired && !ContextRetired(context)) {
      // librdmacm closed the retired context and opened a new one at the same address
      // (the device came back).
      r.superseded = true;
      break;
    }
    *error = -ENODEV;  // removed: an id resolved before it went still names it
    if (r.retired) {
      // The device may have come back under the same GUID, which librdmacm matched to its
      // old entry: a fresh look at the device list marks that entry dead, so the next id
      // binds to the new device (this one stays plain).
      if (ibv_context** list = rdma_get_devices(nullptr)) rdma_free_devices(list);
    }
    return nullptr;
  }
  Device* dev = Device::Open(context, error);
  if (!dev) return nullptr;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = dev;
  try {
    devices_[context] = dev;
  } catch (...) {
    delete dev;
    *error = -ENOMEM;
    return nullptr;
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, dev->comp_channel()->fd, &ev);
  return dev;
}

bool VerbsModule::DeviceAllowed(ibv_context* context) const noexcept {
  return context &&
         (config_->device.empty() || config_->device == ibv_get_device_name(context->device));
}

bool VerbsModule::SendNotify(Device* device) const noexcept {
  if (config_->verbs_notify == VerbsNotify::kSend) return true;
  if (config_->verbs_notify == VerbsNotify::kImm) return false;
  return device->iwarp();
}

Reason VerbsModule::MemlockReason(int error, uint32_t ring_size) noexcept {
  if (error == -ENOBUFS) {
    SLIP_LOG(kWarn,
             "verbs: %zu KiB of rings already pinned, the budget (SLIP_VERBS_PIN_MAX) has no "
             "room for %zu KiB more: this connection stays on TCP",
             Device::PinnedBytes() / 1024, SlotBytes(ring_size) / 1024);
    return Reason::kResources;
  }
  rlimit rl{};
  bool limited = getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
  if (error != -ENOMEM && error != -EPERM && error != -EAGAIN) return Reason::kResources;
  if (!limited) return Reason::kResources;
  if (!memlock_reported_.exchange(true))
    SLIP_LOG(kWarn,
             "verbs: cannot register %zu KiB of rings: RLIMIT_MEMLOCK is %lu KiB; this and "
             "further verbs connections stay on TCP (raise it: ulimit -l)",
             SlotBytes(ring_size) / 1024, (unsigned long)(rl.rlim_cur / 1024));
  return Reason::kMemlock;
}

// ------------------------------------------------------------------------ progress

void VerbsModule::Run() noexcept {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  pthread_setname_np(pthread_self(), "slip-verbs");
  epoll_event events[16];
  for (;;) {
    // The raw call: the interposed epoll_wait would prepare every accelerated stream for a
    // sleep (arming all their proxies) and spin SLIP_SPIN_US first, on every wake-up.
    // While a removed device still has users, looked at often: `rdma link delete` waits.
    int n = sys::epoll_wait(epoll_fd_, events, 16, reaping_ ? 20 : 500);
    if (forked_.load(std::memory_order_acquire)) return;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {
        rdma_cm_event* event = nullptr;
        while (rdma_get_cm_event(cm_channel_, &event) == 0) HandleCmEvent(event);
      } else if (IsConnWatchKey(events[i].data.u64)) {
        Conn::OnWatchEvent(events[i].data.u64);
      } else {
        HandleCompletions(static_cast<Device*>(events[i].data.ptr));
      }
    }
    ServeClaims();
    ExpirePending();
    SweepParked();
    if (const uint64_t now = sys::MonotonicMs(); now - last_housekeeping_ms_ >= 500) {
      last_housekeeping_ms_ = now;
      TrimIdleSlots(now);
      CheckAllConns(now);
    }
    ReapRemoved();
  }
}

void VerbsModule::TrimIdleSlots(uint64_t now_ms) noexcept {
  // Devices are deleted only by this thread (ReapRemoval), so they outlive the copy.
  Device* devices[16];
  size_t count = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& entry : devices_) {
      if (count < std::size(devices)) devices[count++] = entry.second;
    }
  }
  for (size_t i = 0; i < count; ++i) devices[i]->TrimIdle(now_ms);
}

void VerbsModule::HandleCompletions(Device* device) noexcept {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(device->comp_channel(), &cq, &context) == 0)
    static_cast<Conn*>(context)->OnCompletionEvent();  // acks the event
}

void VerbsModule::HandleCmEvent(rdma_cm_event* event) noexcept {
  switch (event->event) {
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      OnConnectRequest(event);  // acks
      return;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR: {
      // Listener ids carry a Listener, connection ids their Conn.
      auto* conn = IsListenerId(event->id) ? nullptr : static_cast<Conn*>(event->id->context);
      if (conn) {
        if (event->event == RDMA_CM_EVENT_DISCONNECTED) {
          // A pending request whose client gave up: accept() must not wait for it.
          std::lock_guard<std::mutex> lock(mu_);
          for (Listener* l : listeners_) {
            std::lock_guard<std::mutex> llock(l->mu);
            for (Pending& p : l->pending) {
              if (p.conn == conn) p.withdrawn = true;
            }
          }
          conn->OnDisconnect();
        } else if (event->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
          conn->TransportFailed(wire::FailoverCause::kDeviceRemoved);
          conn->MarkDeviceRemoved();
        } else {
          conn->Fail(ECONNRESET);
        }
      }
      // The id cannot be destroyed before this event is acknowledged (rdma_destroy_id
      // would wait for it): ReapRemoved does it, after the events.
      if (event->event == RDMA_CM_EVENT_DEVICE_REMOVAL) NoteRemoved(event->id->verbs);
      break;
    }
    default:
      break;  // ESTABLISHED, TIMEWAIT_EXIT, ADDR_CHANGE: nothing to do
  }
  rdma_ack_cm_event(event);
}

void VerbsModule::Reject(rdma_cm_id* id) noexcept {
  rdma_reject(id, nullptr, 0);
}

void VerbsModule::OnConnectRequest(rdma_cm_event* event) noexcept {
  rdma_cm_id* id = event->id;
  auto* listener = static_cast<Listener*>(event->listen_id->context);
  Req req;
  ParseResult pr = ParseReq(static_cast<const uint8_t*>(event->param.conn.private_data),
                            event->param.conn.private_data_len, &req);
  wire::Endpoint peer, local;
  bool ok = pr == ParseResult::kOk;
  if (!ok) {
    SLIP_LOG(kInfo, "verbs: rejecting a connection request: %s private data", ParseResultName(pr));
  } else if (!EndpointOf(rdma_get_peer_addr(id), &peer) ||
             !EndpointOf(rdma_get_local_addr(id), &local) || !SameAddress(peer, req.client) ||
             !SameAddress(local, req.server) || req.server.port != listener->port) {
    // The tuple must be the one this request really comes from and goes to.
    SLIP_LOG(kInfo, "verbs: rejecting a connection request whose 4-tuple does not match");
    ok = false;
  } else if (!DeviceAllowed(id->verbs)) {
    ok = false;
  } else if ((1u << req.ring_log2) > config_->ring_size) {
    // The listener decides what it pins: rings up to its own SLIP_RING_SIZE.
    SLIP_LOG(kWarn,
             "verbs: rejecting a connection request for %u KiB rings (this listener's limit "
             "is SLIP_RING_SIZE, %u KiB)",
             (1u << req.ring_log2) >> 10, config_->ring_size >> 10);
    ok = false;
  } else {
    std::lock_guard<std::mutex> lock(listener->mu);
    size_t live = 0, from_source = 0;
    for (const Pending& p : listener->pending) {
      if (!p.conn) continue;  // withdrawn: holds nothing
      ++live;
      from_source += SameAddress(p.client, req.client);
    }
    if (live >= kMaxPendingPerListener || !listener->RoomForOne(2 * kMaxPendingPerListener)) {
      SLIP_LOG(kWarn, "verbs: %zu requests already wait on port %u; rejecting", live,
               listener->port);
      ok = false;
    } else if (from_source >= kMaxPendingPerSource) {
      SLIP_LOG(kWarn, "verbs: %zu requests from one address already wait on port %u; rejecting",
               from_source, listener->port);
      ok = false;
    }
  }
  Conn* conn = nullptr;
  if (ok) {
    int err = 0;
    Device* dev = DeviceFor(id->verbs, &err);
    bool send_notify = dev && (SendNotify(dev) || (req.flags & kFlagSendNotify));
    conn = dev ? Conn::Create(id, dev, 1u << req.ring_log2, send_notify, &err) : nullptr;
    if (!conn && dev && EvictParked())  // parked rings may hold what the limit allows
      conn = Conn::Create(id, dev, 1u << req.ring_log2, send_notify, &err);
    int ready = conn ? conn->Connect(config_->gid_index) : -1;
    if (conn && ready < 0) {
      SLIP_LOG(kInfo, "verbs: cannot ready a queue pair for a request (%s)", strerror(-ready));
    } else if (conn) {
      Rep rep;
      rep.flags = send_notify ? kFlagSendNotify : 0;
      rep.ring_log2 = req.ring_log2;
      rep.nonce = req.nonce;
      rep.ring_addr = uint64_t(uintptr_t(conn->slot().rx_ring()));
      rep.rkey = conn->slot().remote_mr->rkey;
      uint8_t data[kRepSize];
      rdma_conn_param param{};
      param.private_data = data;
      param.private_data_len = uint8_t(EncodeRep(rep, data, sizeof(data)));
      param.retry_count = 7;
      param.rnr_retry_count = 7;
      param.qp_num = conn->qp_num();
      Pending p;
      p.client = req.client;
      p.server = req.server;
      p.nonce = req.nonce;
      p.ring_log2 = req.ring_log2;
      p.conn = conn;
      p.expires_ms = sys::MonotonicMs() +
                     std::max<uint64_t>(kPendingTtlMs, 2 * uint64_t(config_->handshake_timeout_ms));
      bool queued = false;
      {
        std::lock_guard<std::mutex> lock(listener->mu);
        try {
          listener->pending.push_back(p);
          queued = true;
        } catch (...) {
        }
      }
      if (queued && rdma_accept(id, &param) == 0) {
        SLIP_LOG(kDebug, "verbs: request from port %u pending", req.client.port);
        rdma_ack_cm_event(event);
        return;
      }
      if (queued) {
        std::lock_guard<std::mutex> lock(listener->mu);
        for (size_t i = 0; i < listener->pending.size(); ++i) {
          if (listener->pending[i].conn == conn) {
            listener->pending.erase(listener->pending.begin() + long(i));
            break;
          }
        }
      }
      SLIP_LOG(kInfo, "verbs: cannot accept a connection request (%s)", strerror(errno));
    } else {
      if (err == -ENOBUFS)
        SLIP_LOG(kWarn,
                 "verbs: rejecting a connection request: %zu KiB of rings already pinned, the "
                 "budget (SLIP_VERBS_PIN_MAX) has no room for more",
                 Device::PinnedBytes() / 1024);
      else
        SLIP_LOG(kInfo, "verbs: no resources for a connection request (%s)", strerror(-err));
    }
  }
  Reject(id);
  rdma_ack_cm_event(event);
  // The id is ours to destroy (after the ack): with its Conn, or alone.
  if (conn) {
    delete conn;
  } else {
    rdma_destroy_id(id);
  }
}

void VerbsModule::DestroyPending(std::vector<Pending>* dropped) noexcept {
  for (Pending& p : *dropped) delete p.conn;  // disconnects: the client learns
  dropped->clear();
}

void VerbsModule::ExpirePending() noexcept {
  std::vector<Pending> expired;
  uint64_t now = sys::MonotonicMs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Listener* l : listeners_) {
      std::lock_guard<std::mutex> llock(l->mu);
      MoveOutIf(&l->pending, &expired, [now](const Pending& p) { return p.expires_ms <= now; });
      // Withdrawn ones give their queue pair back now (their events were acknowledged:
      // this runs after them), and keep only their record.
      for (Pending& p : l->pending) {
        if (!p.withdrawn || !p.conn) continue;
        try {
          expired.push_back(p);
          p.conn = nullptr;
        } catch (...) {
        }
      }
    }
  }
  if (!expired.empty()) SLIP_LOG(kDebug, "verbs: %zu request(s) expired", expired.size());
  DestroyPending(&expired);
}

// ------------------------------------------------------------------------ listening

Listener* VerbsModule::Listen(const sockaddr* local, Reason* why) noexcept {
  *why = Reason::kNoRdmaPath;
  if (forked_.load()) return nullptr;
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(local, &ep)) return nullptr;
  auto* l = new (std::nothrow) Listener();
  if (!l) return nullptr;
  l->port = ep.port;
  l->addr = ep;
  l->wildcard = true;
  for (uint8_t byte : ep.addr) l->wildcard = l->wildcard && byte == 0;
  if (rdma_create_id(cm_channel_, &l->id, l, RDMA_PS_TCP) != 0) {
    delete l;
    return nullptr;
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, local,
              local->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  if (rdma_bind_addr(l->id, reinterpret_cast<sockaddr*>(&addr)) != 0 ||
      (l->id->verbs && !DeviceAllowed(l->id->verbs)) || rdma_listen(l->id, kListenBacklog) != 0) {
    SLIP_LOG(kInfo, "verbs: no rdma_cm listener on port %u (%s)", ep.port, strerror(errno));
    rdma_destroy_id(l->id);
    delete l;
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  try {
    listeners_.push_back(l);
  } catch (...) {
    rdma_destroy_id(l->id);
    delete l;
    return nullptr;
  }
  *why = Reason::kNone;
  return l;
}

void VerbsModule::Unlisten(Listener* l) noexcept {
  if (!l) return;
  rdma_cm_id* id = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < listeners_.size(); ++i) {
      if (listeners_[i] == l) {
        listeners_.erase(listeners_.begin() + long(i));
        break;
      }
    }
    id = l->id;  // null once its device was removed (ReapRemoval destroyed it)
    l->id = nullptr;
  }
  if (forked_.load()) return;  // the parent's objects: leave them alone
  if (id) rdma_destroy_id(id);
  std::vector<Pending> dropped;
  {
    std::lock_guard<std::mutex> lock(l->mu);
    dropped.swap(l->pending);
  }
  DestroyPending(&dropped);
  delete l;
}

bool VerbsModule::HasPending(Listener* l, const wire::Endpoint& client,
                             const wire::Endpoint& server) noexcept {
  std::lock_guard<std::mutex> lock(l->mu);
  for (const Pending& p : l->pending) {
    if (p.client == client && p.server == server) return true;
  }
  return false;
}

// Moves every request pending for the tuple out of the listener's table.
static void TakeTuple(Listener* l, const wire::Endpoint& client, const wire::Endpoint& server,
                      std::vector<Pending>* out) noexcept {
  std::lock_guard<std::mutex> lock(l->mu);
  MoveOutIf(&l->pending, out,
            [&](const Pending& p) { return p.client == client && p.server == server; });
}

void VerbsModule::DropPending(Listener* l, const wire::Endpoint& client,
                              const wire::Endpoint& server) noexcept {
  std::vector<Pending> dropped;
  TakeTuple(l, client, server, &dropped);
  if (!dropped.empty())
    SLIP_LOG(kInfo, "verbs: dropping %zu connection request(s) of a plain connection",
             dropped.size());
  DestroyPending(&dropped);
}

std::unique_ptr<Channel> VerbsModule::AcceptPending(Listener* l, const wire::Endpoint& client,
                                                    const wire::Endpoint& server, int proxy_b,
                                                    Reason* why, bool* committed) noexcept {
  std::vector<Pending> taken;
  TakeTuple(l, client, server, &taken);
  // One connection makes one request; a client sends its HELLO before its SYN, so the one
  // that did is the likelier real one. Which it is, the CONFIRM says when it comes.
  size_t chosen = taken.size();
  *committed = false;
  for (size_t i = 0; i < taken.size(); ++i) {
    if (!taken[i].conn || taken[i].withdrawn) continue;  // its client gave up
    Hello hello;
    const bool said = taken[i].conn->HelloReceived(&hello) && hello.nonce == taken[i].nonce;
    *committed = *committed || said;
    if (chosen == taken.size() || said) chosen = i;
    if (said) break;
  }
  *why = Reason::kConnectSlow;  // (every client of the tuple gave up)
  std::unique_ptr<Conn> conn;
  uint64_t nonce = 0;
  if (chosen != taken.size()) {
    conn.reset(taken[chosen].conn);
    nonce = taken[chosen].nonce;
    taken.erase(taken.begin() + long(chosen));
  }
  const size_t live = size_t(std::count_if(
      taken.begin(), taken.end(), [](const Pending& p) { return p.conn && !p.withdrawn; }));
  if (live)
    SLIP_LOG(kWarn, "verbs: %zu other connection request(s) for one connection: rejected", live);
  DestroyPending(&taken);
  if (!conn) return nullptr;
  *why = Reason::kFdLimit;
  int b = proxy_b < 0 ? -1 : sys::DupHigh(proxy_b, sys::HiddenFdFloor());
  if (b < 0) return nullptr;
  conn->Hold(nonce, sys::MonotonicMs() + config_->handshake_timeout_ms);
  conn->SetProxy(b);
  conn->SetOwner(this);
  return conn;
}

// ------------------------------------------------------------------------ connecting

void VerbsModule::ReleaseClient(ClientConn* c) noexcept {
  if (c->conn && c->reused &&
      (c->stage == ClientConn::Stage::kReused || c->stage == ClientConn::Stage::kResolved)) {
    PutParked(c->conn);  // not claimed yet: still the peer's parked queue pair too
  } else if (c->conn) {
    delete c->conn;  // destroys the id too
  } else if (c->id) {
    rdma_destroy_id(c->id);
  }
  if (c->channel) rdma_destroy_event_channel(c->channel);
  delete c;
}

ClientConn* VerbsModule::StartResolve(const sockaddr* dest, Reason* why) noexcept {
  *why = Reason::kNoRdmaPath;
  if (forked_.load()) {
    *why = Reason::kUnsupported;
    return nullptr;
  }
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(dest, &ep)) return nullptr;
  if (Reason cached; negative_.Lookup(ep, sys::MonotonicMs(), &cached)) {
    SLIP_LOG(kDebug, "verbs: destination in the negative cache (%s)", ReasonName(cached));
    *why = cached;
    return nullptr;
  }
  if (ClientConn* c = Reuse(ep)) return c;
  auto* c = new (std::nothrow) ClientConn();
  if (!c) {
    *why = Reason::kResources;
    return nullptr;
  }
  c->dest = ep;
  c->channel = rdma_create_event_channel();
  // Each connecting id has a channel of its own (its descriptor is what a caller waits
  // on); it lives among the hidden descriptors, since it may outlive the connect() call.
  if (c->channel) c->channel->fd = sys::MoveHigh(c->channel->fd, sys::HiddenFdFloor());
  if (!c->channel || !SetNonblocking(c->channel->fd) ||
      rdma_create_id(c->channel, &c->id, nullptr, RDMA_PS_TCP) != 0) {
    *why = Reason::kResources;
    ReleaseClient(c);
    return nullptr;
  }
  c->deadline_ms = sys::MonotonicMs() + config_->handshake_timeout_ms;
  sockaddr_storage dst{};
  std::memcpy(&dst, dest, dest->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  if (rdma_resolve_addr(c->id, nullptr, reinterpret_cast<sockaddr*>(&dst),
                        int(config_->handshake_timeout_ms)) != 0) {
    Fail(c, Reason::kNoRdmaPath, why);
    ReleaseClient(c);
    return nullptr;
  }
  c->stage = ClientConn::Stage::kAddr;
  return c;
}

VerbsModule::Step VerbsModule::Fail(ClientConn* c, Reason why, Reason* out) noexcept {
  // A destination without an RDMA path, or whose rdma_cm peer is not Slipstream, is
  // remembered: the next connection there goes plain at once.
  if (why == Reason::kNoRdmaPath || why == Reason::kPeerNotSlipstream)
    negative_.Insert(c->dest, why, sys::MonotonicMs() + config_->negative_ttl_ms);
  *out = why;
  return Step::kFailed;
}

// The id's local address (port 0) is where the caller binds its TCP socket.
VerbsModule::Step VerbsModule::Resolved(ClientConn* c, sockaddr_storage* source,
                                        Reason* why) noexcept {
  const sockaddr* src = rdma_get_local_addr(c->id);
  std::memset(source, 0, sizeof(*source));
  std::memcpy(source, src, src->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  if (source->ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(source)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(source)->sin6_port = 0;
  c->stage = ClientConn::Stage::kResolved;
  *why = Reason::kNone;
  return Step::kResolved;
}

VerbsModule::Step VerbsModule::Advance(ClientConn* c, sockaddr_storage* source,
                                       Reason* why) noexcept {
  if (c->stage == ClientConn::Stage::kReused) {
    // The parked queue pair's own address is the source (its listener knows it).
    return Resolved(c, source, why);
  }
  if (c->stage == ClientConn::Stage::kClaim) {
    const int answer = c->conn->TakeAnswer();
    if (answer > 0) {
      c->stage = ClientConn::Stage::kAccepted;
      *why = Reason::kNone;
      return Step::kAccepted;
    }
    if (answer < 0 || sys::MonotonicMs() >= c->deadline_ms) {
      // Not remembered: the listener's process refused this one queue pair (its listener
      // went, say), or is slow; the next connection asks rdma_cm as usual.
      *why = answer < 0 ? Reason::kDeclined : Reason::kHandshakeTimeout;
      SLIP_LOG(kInfo, "verbs: the claim of a parked queue pair failed (%s)", ReasonName(*why));
      return Step::kFailed;
    }
    return Step::kWaiting;
  }
  for (;;) {
    if (c->stage == ClientConn::Stage::kAccepted || c->stage == ClientConn::Stage::kResolved)
      return c->stage == ClientConn::Stage::kAccepted ? Step::kAccepted : Step::kWaiting;
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(c->channel, &event) == 0) {
      Step step = TakeEvent(c, event, source, why);  // acks
      if (step != Step::kWaiting) return step;
      continue;
    }
    if (errno != EAGAIN && errno != EINTR) return Fail(c, Reason::kNoRdmaPath, why);
    if (sys::MonotonicMs() < c->deadline_ms) return Step::kWaiting;
    if (c->stage == ClientConn::Stage::kRequest) {
      // No answer to the REQ: remembered as no path, reported as a timeout.
      Fail(c, Reason::kNoRdmaPath, why);
      *why = Reason::kHandshakeTimeout;
      return Step::kFailed;
    }
    return Fail(c, Reason::kNoRdmaPath, why);
  }
}

VerbsModule::Step VerbsModule::TakeEvent(ClientConn* c, rdma_cm_event* event,
                                         sockaddr_storage* source, Reason* why) noexcept {
  const rdma_cm_event_type type = event->event;
  switch (c->stage) {
    case ClientConn::Stage::kAddr: {
      rdma_ack_cm_event(event);
      if (type != RDMA_CM_EVENT_ADDR_RESOLVED) return Fail(c, Reason::kNoRdmaPath, why);
      if (!DeviceAllowed(c->id->verbs)) {
        *why = Reason::kNoRdmaDevice;
        return Step::kFailed;
      }
      const int left =
          int(c->deadline_ms > sys::MonotonicMs() ? c->deadline_ms - sys::MonotonicMs() : 1);
      if (rdma_resolve_route(c->id, left) != 0) return Fail(c, Reason::kNoRdmaPath, why);
      c->stage = ClientConn::Stage::kRoute;
      return Step::kWaiting;
    }
    case ClientConn::Stage::kRoute: {
      rdma_ack_cm_event(event);
      if (type != RDMA_CM_EVENT_ROUTE_RESOLVED) return Fail(c, Reason::kNoRdmaPath, why);
      return Resolved(c, source, why);
    }
    case ClientConn::Stage::kRequest:
      break;
    default:
      rdma_ack_cm_event(event);  // nothing is expected now (an address change, say)
      return Step::kWaiting;
  }
  bool ok = false;
  // The queue pair is not rdma_cm's, so the REP arrives as CONNECT_RESPONSE: we move the
  // queue pair to RTS ourselves and then complete the exchange (rdma_establish sends RTU).
  if (type == RDMA_CM_EVENT_CONNECT_RESPONSE) {
    Rep rep;
    ParseResult pr = ParseRep(static_cast<const uint8_t*>(event->param.conn.private_data),
                              event->param.conn.private_data_len, &rep);
    if (pr != ParseResult::kOk || rep.nonce != c->nonce || rep.ring_log2 != c->ring_log2) {
      SLIP_LOG(kWarn, "verbs: the listener answered with bad private data (%s)",
               ParseResultName(pr));
      *why = Reason::kDeclined;
    } else if (int rc = c->conn->Connect(config_->gid_index); rc < 0) {
      SLIP_LOG(kInfo, "verbs: cannot ready the queue pair (%s)", strerror(-rc));
      *why = Reason::kNoRdmaPath;
    } else if (rdma_establish(c->id) != 0) {
      *why = Reason::kNoRdmaPath;
    } else {
      c->conn->SetPeer(rep.ring_addr, rep.rkey, (rep.flags & kFlagSendNotify) != 0);
      ok = true;
    }
    rdma_ack_cm_event(event);
    if (!ok) return Step::kFailed;
  } else {
    rdma_ack_cm_event(event);
    // REJECTED: no Slipstream listener there (or it refused us): plain, and remembered
    // for a while. Anything else (UNREACHABLE, CONNECT_ERROR): no path.
    return Fail(
        c, type == RDMA_CM_EVENT_REJECTED ? Reason::kPeerNotSlipstream : Reason::kNoRdmaPath, why);
  }
  if (!c->conn->SendHello(c->nonce)) {
    *why = Reason::kResources;
    return Step::kFailed;
  }
  // From now on the progress thread sees this id's events (DISCONNECTED). The private
  // channel stays open (its descriptor may still be in a caller's wait set) until Finish
  // or Abort.
  if (rdma_migrate_id(c->id, cm_channel_) != 0) {
    *why = Reason::kResources;
    return Step::kFailed;
  }
  c->stage = ClientConn::Stage::kAccepted;
  *why = Reason::kNone;
  return Step::kAccepted;
}

VerbsModule::Step VerbsModule::WaitStep(ClientConn* c, sockaddr_storage* source,
                                        Reason* why) noexcept {
  for (;;) {
    Step step = Advance(c, source, why);
    if (step != Step::kWaiting) return step;
    uint64_t now = sys::MonotonicMs();
    pollfd p{EventFd(c), POLLIN, 0};
    sys::poll(&p, 1, c->deadline_ms > now ? int(c->deadline_ms - now) : 0);
  }
}

ClientConn* VerbsModule::Resolve(const sockaddr* dest, sockaddr_storage* source,
                                 Reason* why) noexcept {
  ClientConn* c = StartResolve(dest, why);
  if (!c) return nullptr;
  if (WaitStep(c, source, why) == Step::kResolved) return c;
  ReleaseClient(c);
  return nullptr;
}

bool VerbsModule::StartHandshake(ClientConn* c, const wire::Endpoint& client,
                                 const wire::Endpoint& server, uint64_t nonce, uint32_t ring_size,
                                 Reason* why) noexcept {
  if (c->reused) {
    c->nonce = nonce;
    return SendClaim(c, client, server, ring_size, why);
  }
  int err = 0;
  Device* dev = DeviceFor(c->id->verbs, &err);
  bool send_notify = dev && SendNotify(dev);
  c->conn = dev ? Conn::Create(c->id, dev, ring_size, send_notify, &err) : nullptr;
  if (!c->conn && dev && EvictParked())  // parked rings may hold what the limit allows
    c->conn = Conn::Create(c->id, dev, ring_size, send_notify, &err);
  if (!c->conn) {
    *why = MemlockReason(err, ring_size);
    return false;
  }
  c->nonce = nonce;
  c->ring_log2 = uint8_t(__builtin_ctz(ring_size));
  Req req;
  req.flags = send_notify ? kFlagSendNotify : 0;
  req.ring_log2 = c->ring_log2;
  req.nonce = nonce;
  req.client = client;
  req.server = server;
  uint8_t data[kMaxReqPrivateData];
  rdma_conn_param param{};
  param.private_data = data;
  param.private_data_len = uint8_t(EncodeReq(req, data, sizeof(data)));
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  param.qp_num = c->conn->qp_num();
  if (param.private_data_len == 0 || rdma_connect(c->id, &param) != 0) {
    *why = Reason::kNoRdmaPath;
    return false;
  }
  c->stage = ClientConn::Stage::kRequest;
  c->deadline_ms = sys::MonotonicMs() + config_->handshake_timeout_ms;
  return true;
}

bool VerbsModule::Handshake(ClientConn* c, const wire::Endpoint& client,
                            const wire::Endpoint& server, uint64_t nonce, uint32_t ring_size,
                            Reason* why) noexcept {
  if (!StartHandshake(c, client, server, nonce, ring_size, why)) return false;
  sockaddr_storage unused;
  return WaitStep(c, &unused, why) == Step::kAccepted;
}

std::unique_ptr<Channel> VerbsModule::Finish(ClientConn* c, int proxy_b) noexcept {
  int b = sys::DupHigh(proxy_b, sys::HiddenFdFloor());
  if (b < 0) {
    Abort(c);
    return nullptr;
  }
  std::unique_ptr<Channel> channel(c->conn);
  c->conn->SetProxy(b);
  c->conn->SetClientOf(c->dest);
  c->conn->SetOwner(this);
  c->conn = nullptr;
  c->id = nullptr;
  ReleaseClient(c);
  return channel;
}

void VerbsModule::Abort(ClientConn* c) noexcept {
  ReleaseClient(c);
}

// ------------------------------------------------------------------------ reuse

void VerbsModule::Release(Conn* conn) noexcept {
  // The closing thread (the closer, or close() itself with SO_LINGER) runs the close: the
  // notes and their acknowledgements, as before reuse existed.
  const bool room = !forked_.load() && config_->verbs_reuse > 0 &&
                    ParkedCount() < config_->verbs_reuse && !conn->orphaned();
  if (!conn->CloseStream(room)) {
    delete conn;
    return;
  }
  // Listed before PARKED goes out: a claim that follows it must find the queue pair here.
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    try {
      parked_.push_back(ParkedConn{conn, sys::MonotonicMs(), false});
    } catch (...) {
      conn = nullptr;
    }
  }
  if (!conn) return;  // (out of memory: leaked, as nothing else could be done safely)
  conn->Park();
  {
    // (A claim may have taken it meanwhile: then it is no longer listed, and a stream's.)
    std::lock_guard<std::mutex> lock(park_mu_);
    for (ParkedConn& p : parked_) {
      if (p.conn == conn) p.ready = true;
    }
  }
  SLIP_LOG(kDebug, "verbs: queue pair %u parked for reuse", conn->qp_num());
}

size_t VerbsModule::ParkedCount() noexcept {
  std::lock_guard<std::mutex> lock(park_mu_);
  return parked_.size();
}

Conn* VerbsModule::TakeParked(const wire::Endpoint& dest) noexcept {
  std::lock_guard<std::mutex> lock(park_mu_);
  // The newest first: its peer is the most likely still there.
  for (size_t i = parked_.size(); i-- > 0;) {
    Conn* conn = parked_[i].conn;
    if (!parked_[i].ready || !conn->client_role() || !(conn->dest() == dest) ||
        conn->ring_size() != config_->ring_size || !conn->Claimable())
      continue;
    parked_.erase(parked_.begin() + long(i));
    return conn;
  }
  return nullptr;
}

void VerbsModule::PutParked(Conn* conn) noexcept {
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    try {
      parked_.push_back(ParkedConn{conn, sys::MonotonicMs()});
      return;
    } catch (...) {
    }
  }
  delete conn;
}

ClientConn* VerbsModule::Reuse(const wire::Endpoint& dest) noexcept {
  if (config_->verbs_reuse == 0) return nullptr;
  Conn* conn = TakeParked(dest);
  if (!conn) return nullptr;
  auto* c = new (std::nothrow) ClientConn();
  if (!c) {
    PutParked(conn);
    return nullptr;
  }
  c->conn = conn;
  c->id = conn->id();
  c->dest = dest;
  c->reused = true;
  c->stage = ClientConn::Stage::kReused;
  c->deadline_ms = sys::MonotonicMs();  // nothing to wait for: Advance says kResolved
  SLIP_LOG(kDebug, "verbs: reusing parked queue pair %u", conn->qp_num());
  return c;
}

bool VerbsModule::SendClaim(ClientConn* c, const wire::Endpoint& client,
                            const wire::Endpoint& server, uint32_t ring_size,
                            Reason* why) noexcept {
  *why = Reason::kResources;
  if (c->stage != ClientConn::Stage::kResolved || ring_size != c->conn->ring_size() ||
      !(server == c->dest))
    return false;
  c->ring_log2 = uint8_t(__builtin_ctz(ring_size));
  c->stage = ClientConn::Stage::kClaim;  // from here on the queue pair is this connection's
  c->deadline_ms = sys::MonotonicMs() + config_->handshake_timeout_ms;
  if (!c->conn->SendClaim(c->nonce, client.port, server.port)) return false;
  *why = Reason::kNone;
  return true;
}

Listener* VerbsModule::ListenerFor(const wire::Endpoint& server) noexcept {
  for (Listener* l : listeners_) {
    if (l->port == server.port && (l->wildcard || SameAddress(l->addr, server))) return l;
  }
  return nullptr;
}

void VerbsModule::ServeClaims() noexcept {
  std::vector<ParkedConn> claimed;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    LinkMsg unused;
    MoveOutIf(&parked_, &claimed, [&](const ParkedConn& p) { return p.conn->TakeClaim(&unused); });
  }
  for (const ParkedConn& p : claimed) {
    LinkMsg claim;
    if (p.conn->TakeClaim(&claim)) ServeClaim(p.conn, claim);
  }
}

void VerbsModule::ServeClaim(Conn* conn, const LinkMsg& claim) noexcept {
  // The claim names ports only: the addresses are the queue pair's own, which rdma_cm
  // checked when it was made (OnConnectRequest).
  Pending p;
  bool ok = EndpointOf(rdma_get_peer_addr(conn->id()), &p.client) &&
            EndpointOf(rdma_get_local_addr(conn->id()), &p.server) &&
            (1u << claim.ring_log2) == conn->ring_size();
  p.client.port = claim.client_port;
  p.server.port = claim.server_port;
  p.nonce = claim.nonce;
  p.ring_log2 = claim.ring_log2;
  p.conn = conn;
  p.expires_ms = sys::MonotonicMs() +
                 std::max<uint64_t>(kPendingTtlMs, 2 * uint64_t(config_->handshake_timeout_ms));
  bool queued = false;
  if (ok) {
    std::lock_guard<std::mutex> lock(mu_);
    Listener* l = ListenerFor(p.server);
    if (l) {
      std::lock_guard<std::mutex> llock(l->mu);
      if (l->Live() < kMaxPendingPerListener && l->RoomForOne(2 * kMaxPendingPerListener)) {
        // Pending before the answer: the client's SYN follows the answer.
        conn->BeginClaimed(claim);
        try {
          l->pending.push_back(p);
          queued = true;
        } catch (...) {
        }
      }
    }
  }
  SLIP_LOG(kDebug, "verbs: claim of queue pair %u for port %u: %s", conn->qp_num(),
           claim.server_port, queued ? "pending" : "refused");
  if (queued && conn->SendAnswer(claim.nonce, true)) return;
  if (queued) {
    // The answer could not go: the request is withdrawn before anyone waits for it.
    std::lock_guard<std::mutex> lock(mu_);
    if (Listener* l = ListenerFor(p.server)) {
      std::lock_guard<std::mutex> llock(l->mu);
      std::erase_if(l->pending, [conn](const Pending& q) { return q.conn == conn; });
    }
  } else {
    conn->SendAnswer(claim.nonce, false);
  }
  delete conn;  // the client learns from its disconnect too
}

void VerbsModule::SweepParked() noexcept {
  std::vector<ParkedConn> gone;
  const uint64_t now = sys::MonotonicMs();
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    MoveOutIf(&parked_, &gone, [now](const ParkedConn& p) {
      const uint64_t idle = p.conn->client_role() ? kClientIdleMs : kListenerIdleMs;
      const uint64_t limit = p.conn->PeerParked() ? idle : kLingerMs;
      return p.ready && (p.conn->ParkedDead() || now - p.since_ms >= limit);
    });
  }
  for (const ParkedConn& p : gone) delete p.conn;  // disconnects: the peer drops its end
}

bool VerbsModule::EvictParked() noexcept {
  Conn* oldest = nullptr;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    auto it =
        std::find_if(parked_.begin(), parked_.end(), [](const ParkedConn& p) { return p.ready; });
    if (it == parked_.end()) return false;
    oldest = it->conn;
    parked_.erase(it);
  }
  SLIP_LOG(kDebug, "verbs: dropping parked queue pair %u for a new connection", oldest->qp_num());
  delete oldest;
  return true;
}

// ------------------------------------------------------------------------ device removal

void VerbsModule::NoteRemoved(ibv_context* context) noexcept {
  if (!context) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Removal& r : removals_) {
    if (r.context == context && !r.superseded) return;
  }
  Removal r;
  r.context = context;
  auto it = devices_.find(context);
  if (it != devices_.end()) r.device = it->second;
  try {
    removals_.push_back(r);
  } catch (...) {
    SLIP_LOG(kWarn, "verbs: out of memory: the removed device stays open until exit");
    return;
  }
  if (it != devices_.end()) devices_.erase(it);  // a later connection opens a new one
  reaping_ = true;
  SLIP_LOG(kInfo, "verbs: RDMA device %s removed: releasing what this process holds of it",
           ibv_get_device_name(context->device));
}

void VerbsModule::ReapRemoved() noexcept {
  if (!reaping_) return;
  bool done = true;
  // Only this thread adds removals (under mu_, which DeviceFor reads them under), so it
  // reads them without the lock; ReapRemoval takes mu_ itself.
  for (size_t i = 0; i < removals_.size(); ++i) done = ReapRemoval(&removals_[i]) && done;
  reaping_ = !done;
}

bool VerbsModule::ReapRemoval(Removal* r) noexcept {
  if (r->retired) return true;
  // Listener ids bound to the device (a wildcard listener has none: rdma_cm keeps its own
  // per-device listeners): the TCP listener goes on serving, plain. Requests pending on
  // the device are dropped (their clients failed over nothing yet: they go plain).
  std::vector<rdma_cm_id*> ids;
  std::vector<Pending> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Listener* l : listeners_) {
      if (l->id && l->id->verbs == r->context) {
        try {
          ids.push_back(l->id);
          l->id = nullptr;
        } catch (...) {
          return false;  // tried again on the next round
        }
      }
      std::lock_guard<std::mutex> llock(l->mu);
      MoveOutIf(&l->pending, &dropped, [r](const Pending& p) {
        return r->device && p.conn && p.conn->device() == r->device;
      });
    }
  }
  for (rdma_cm_id* id : ids) rdma_destroy_id(id);  // its events were acknowledged
  if (!dropped.empty())
    SLIP_LOG(kDebug, "verbs: dropping %zu request(s) pending on the removed device",
             dropped.size());
  DestroyPending(&dropped);
  if (r->device) {
    // Parked queue pairs on it are deleted (their peers see them go); the connections
    // that failed over keep their rings and release the rest.
    std::vector<ParkedConn> gone;
    {
      std::lock_guard<std::mutex> lock(park_mu_);
      MoveOutIf(&parked_, &gone,
                [r](const ParkedConn& p) { return p.ready && p.conn->device() == r->device; });
    }
    for (const ParkedConn& p : gone) delete p.conn;
    ReleaseRemovedConns(r->device);
    // A connection that an application thread is still setting up on the device holds it
    // until that thread lets go (its handshake fails, bounded by its timeout).
    if (r->device->users() != 0) return false;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, r->device->comp_channel()->fd, nullptr);
    delete r->device;  // its idle slots, channel and protection domain
    r->device = nullptr;
  }
  RetireContext(r->context);
  r->retired = true;
  SLIP_LOG(kInfo, "verbs: released the removed RDMA device");
  return true;
}

void VerbsModule::ForkPrepare() noexcept {
  // Lock order: module, listeners, connection registry (as the progress thread takes them).
  mu_.lock();
  for (Listener* l : listeners_) l->mu.lock();
  ConnRegistryLock();
}

void VerbsModule::ForkParent() noexcept {
  ConnRegistryUnlock();
  for (Listener* l : listeners_) l->mu.unlock();
  mu_.unlock();
}

void VerbsModule::ForkChild() noexcept {
  forked_.store(true, std::memory_order_release);
  OrphanAllConns();
  for (Listener* l : listeners_) l->pending.clear();  // the parent's requests, not ours
  ConnRegistryUnlock();
  for (Listener* l : listeners_) l->mu.unlock();
  mu_.unlock();
}

void VerbsModule::FlushAll(int timeout_ms) noexcept {
  if (!forked_.load()) FlushAllConns(timeout_ms);
}

bool VerbsModule::IsListenerId(rdma_cm_id* id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (Listener* l : listeners_) {
    if (l->id == id) return true;
  }
  return false;
}

}  // namespace slip::verbs

extern "C" __attribute__((visibility("default"))) slip::verbs::Module* slip_verbs_module(
    const slip::Config* config, int hidden_fd_floor, char* error, size_t error_len) {
  static std::mutex mu;
  static slip::verbs::VerbsModule* module = nullptr;
  static bool tried = false;
  std::lock_guard<std::mutex> lock(mu);
  if (tried) {
    if (!module) snprintf(error, error_len, "unavailable (see the first message)");
    return module;
  }
  tried = true;
  slip::sys::SetHiddenFdFloor(hidden_fd_floor);
  slip::LogInit(config->log_level, config->log_file.c_str());
  auto* m = new (std::nothrow) slip::verbs::VerbsModule(config);
  if (!m) {
    snprintf(error, error_len, "out of memory");
    return nullptr;
  }
  if (m->Start(error, error_len) < 0) return nullptr;  // half-started: kept, never used
  module = m;
  return module;
}
