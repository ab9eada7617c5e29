// The verbs module's progress thread: rdma_cm events, completion events, connection
// requests as they arrive (checked, bounded, answered) and as they come due (core's table).
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>

#include <cerrno>
#include <mutex>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/module_impl.h"

namespace slip::verbs {

using namespace module_internal;

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
        OnConnWatchEvent(events[i].data.u64);
      } else if (IsDirectoryKey(events[i].data.u64)) {
        ServeDirectory(DirectoryFd(events[i].data.u64));
      } else {
        HandleCompletions(static_cast<Device*>(events[i].data.ptr));
      }
    }
    ServeClaims();
    CheckRequests(sys::MonotonicMs());
    SweepParked();
    if (const uint64_t now = sys::MonotonicMs(); now - last_housekeeping_ms_ >= 500) {
      last_housekeeping_ms_ = now;
      TrimIdleSlots(now);
      CheckAllConns(now);
      TakeOverPorts();
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
    static_cast<QpChannel*>(context)->OnCompletionEvent();  // acks the event
}

void VerbsModule::HandleCmEvent(rdma_cm_event* event) noexcept {
  Conn* withdrawn = nullptr;  // deleted after the ack (rdma_destroy_id waits for it)
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
        PendingRequests* table = event->event == RDMA_CM_EVENT_DISCONNECTED && !conn->client_role()
                                     ? requests_.table()
                                     : nullptr;
        if (table &&
            table->Withdraw(conn->request(), conn, Reason::kConnectSlow, sys::MonotonicMs())) {
          // A kept request whose client gave up (it is plain): its queue pair goes now, and
          // accept() finds nothing for its connection.
          withdrawn = conn;
        } else if (event->event == RDMA_CM_EVENT_DISCONNECTED) {
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
  delete withdrawn;  // (disconnected: its peer learns nothing new)
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
  const Tuple tuple{req.client, req.server};
  PendingRequests* const table = Requests();
  PendingRequests::Room room;  // (reserved last, given back on every failure after it)
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
  } else if (uint16_t port = 0;
             listener->group && MemberFor(listener, req, &port) != MemberAnswer::kOurs) {
    // The SYN will reach another member of the SO_REUSEPORT group: another Slipstream
    // process's (the client asks again at its rdma_cm port) or a plain one's (that
    // connection stays plain). Either way the client must not take this for "no
    // Slipstream here": its other connections may reach our members.
    SLIP_LOG(kDebug, "verbs: the request from port %u is for another member of port %u's group%s",
             req.client.port, listener->port, port ? " (redirected)" : "");
    uint8_t data[kRejSize];
    Rej rej;
    rej.code = port ? RejCode::kRedirect : RejCode::kMemberElsewhere;
    rej.port = port;
    rdma_reject(id, data, uint8_t(EncodeRej(rej, data, sizeof(data))));
    rdma_ack_cm_event(event);
    rdma_destroy_id(id);
    return;
  } else if ((1u << req.ring_log2) > config_->ring_size) {
    // The listener decides what it pins: rings up to its own SLIP_RING_SIZE.
    SLIP_LOG(kWarn,
             "verbs: rejecting a connection request for %u KiB rings (this listener's limit "
             "is SLIP_RING_SIZE, %u KiB)",
             (1u << req.ring_log2) >> 10, config_->ring_size >> 10);
    ok = false;
  } else if (!table) {
    ok = false;
  } else if (PendingRequests::Answer unused;
             table->Find(tuple, req.nonce, &unused) != PendingRequests::Found::kNone) {
    // One request per 4-tuple (a connection makes one): the first may be a forger's, and
    // this client then goes plain, never wrong.
    SLIP_LOG(kInfo, "verbs: rejecting a request for port %u (its connection has another one)",
             listener->port);
    ok = false;
  } else {
    ok = ReserveRequest(listener, tuple, 1u << req.ring_log2, &room);
    for (size_t i = 0; i < room.evicted_count; ++i) DeleteRequest(room.evicted[i]);
  }
  Conn* conn = nullptr;
  if (ok) {
    int err = 0;
    Device* dev = DeviceFor(id->verbs, &err);
    bool send_notify = dev && (SendNotify(dev) || (req.flags & kFlagSendNotify));
    conn = dev ? Conn::Create(id, dev, 1u << req.ring_log2, send_notify, &err) : nullptr;
    if (!conn && dev && EvictParked())  // parked rings may hold what the limit allows
      conn = Conn::Create(id, dev, 1u << req.ring_log2, send_notify, &err);
    int ready = conn ? conn->Connect(options_->gid_index) : -1;
    if (conn && ready < 0) {
      SLIP_LOG(kInfo, "verbs: cannot ready a queue pair for a request (%s)", strerror(-ready));
    } else if (conn) {
      Rep rep;
      rep.flags = uint8_t((send_notify ? kFlagSendNotify : 0) | (listener->group ? kFlagGroup : 0));
      rep.ring_log2 = req.ring_log2;
      rep.nonce = req.nonce;
      rep.ring_addr = uint64_t(uintptr_t(conn->slot().rx_ring()));
      rep.rkey = conn->slot().remote_mr->rkey;
      uint8_t data[kRepSize];
      rdma_conn_param param = ConnParam(data, EncodeRep(rep, data, sizeof(data)), conn->qp_num());
      // A group's connections do not keep their queue pairs: a claim names the port, and
      // the member a later SYN reaches is not known when the queue pair is parked.
      if (listener->group) conn->NoReuse();
      // Kept before the REP: the client's SYN follows it.
      PendingRequests::Answer answer;
      answer.ring_size = conn->ring_size();
      conn->SetRequest(tuple);
      table->Keep(&room, tuple, req.nonce, conn, answer, sys::MonotonicMs());
      if (rdma_accept(id, &param) == 0) {
        SLIP_LOG(kDebug, "verbs: request from port %u pending", req.client.port);
        rdma_ack_cm_event(event);
        return;
      }
      SLIP_LOG(kInfo, "verbs: cannot accept a connection request (%s)", strerror(errno));
      if (!table->Withdraw(tuple, conn, Reason::kResources, sys::MonotonicMs())) {
        // (A forger's SYN had accept() take it first: the connection is accept()'s, and
        // settles plain, its client never having had our REP.)
        rdma_ack_cm_event(event);
        return;
      }
    } else {
      if (err == -ENOBUFS)
        SLIP_LOG(kWarn,
                 "verbs: rejecting a connection request: %zu KiB of rings already pinned, the "
                 "budget (SLIP_VERBS_PIN_MAX) has no room for more",
                 Device::PinnedBytes() / 1024);
      else
        SLIP_LOG(kInfo, "verbs: no resources for a connection request (%s)", strerror(-err));
      table->RecordRefusal(tuple, Reason::kResources, sys::MonotonicMs());
    }
  }
  if (table) table->Release(&room);
  Reject(id);
  rdma_ack_cm_event(event);
  // The id is ours to destroy (after the ack): with its Conn, or alone.
  if (conn) {
    delete conn;
  } else {
    rdma_destroy_id(id);
  }
}

void VerbsModule::CheckRequests(uint64_t now_ms) noexcept {
  // A request whose grace is over is kept only if the kernel shows its TCP connection at
  // this host (in the handshake, queued, or accepted): what it is waiting for. (Its events
  // were acknowledged: this runs after them.)
  if (const size_t gone = requests_.CheckDue(now_ms))
    SLIP_LOG(kDebug, "verbs: %zu requests dropped (no TCP connection after their grace) or expired",
             gone);
}

}  // namespace slip::verbs
