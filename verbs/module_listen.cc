// The verbs module's listeners: the rdma_cm twin of a TCP listener, and the requests that
// accept() finds pending for a connection.
#include <algorithm>
#include <cerrno>
#include <mutex>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/module_impl.h"

namespace slip::verbs {

using namespace module_internal;

int module_internal::BindListener(rdma_event_channel* channel, Listener* l, uint16_t port,
                                  rdma_cm_id** id) noexcept {
  const sockaddr* local = reinterpret_cast<const sockaddr*>(&l->local);
  const wire::Endpoint& ep = l->addr;
  if (rdma_create_id(channel, id, l, RDMA_PS_TCP) != 0) {
    *id = nullptr;
    return errno ? errno : ENOMEM;
  }
  // (From the endpoint: a v4-mapped address, as an IPv6 socket bound to an IPv4 address
  // has (gRPC's), is an IPv4 one to rdma_cm.)
  sockaddr_storage addr{};
  wire::Endpoint at = ep;
  at.port = port;
  if (ep.family == 4) {
    wire::SockaddrFromEndpoint(at, &addr);
  } else {
    std::memcpy(&addr, local, sizeof(sockaddr_in6));  // (its scope id too)
    reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(port);
  }
  if (rdma_bind_addr(*id, reinterpret_cast<sockaddr*>(&addr)) == 0 &&
      rdma_listen(*id, kListenBacklog) == 0)
    return 0;
  const int error = errno ? errno : EINVAL;
  rdma_destroy_id(*id);
  *id = nullptr;
  return error;
}

namespace {

// What a request with rings of `ring_size` is charged against the table's budget: its two
// rings, and its queues.
size_t Charge(uint32_t ring_size) noexcept {
  return 2 * size_t(ring_size) + PendingRequests::kOverheadBytes;
}

}  // namespace

PendingRequests* VerbsModule::Requests() noexcept {
  // (Each kept request's completion channel has a descriptor above the floor, or shares
  // its device's: the table needs no limit by descriptors.)
  if (!requests_.Make(PendingRequests::DefaultBudget(Charge(config_->ring_size)),
                      PendingRequests::kMaxRequests))
    return nullptr;
  return requests_.table();
}

bool VerbsModule::ReserveRequest(Listener* l, const Tuple& t, uint32_t ring_size,
                                 PendingRequests::Room* room) noexcept {
  PendingRequests* table = requests_.table();
  const uint64_t now = sys::MonotonicMs();
  // The kernel names no user for a request that came over rdma_cm: its source address
  // is its principal.
  const PendingRequests::Admitted admitted =
      table->Reserve(&l->requests, Principal::OfSource(t.client), Charge(ring_size), now, room);
  if (admitted == PendingRequests::Admitted::kYes) return true;
  SLIP_LOG(kWarn, "verbs: rejecting a request for port %u: %s", l->port,
           admitted == PendingRequests::Admitted::kPrincipalFull
               ? "its sender has as many requests kept as it may"
               : "as many requests are kept as the listener may");
  table->RecordRefusal(t, Reason::kRendezvousBusy, now);
  return false;
}

Listener* VerbsModule::Listen(const sockaddr* local, uint64_t group_member, Reason* why) noexcept {
  *why = Reason::kNoRdmaPath;
  if (forked_.load()) return nullptr;
  *why = Reason::kResources;
  if (!Requests()) return nullptr;
  *why = Reason::kNoRdmaPath;
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(local, &ep)) return nullptr;
  if (group_member != 0) {
    // Another socket of this process in the same SO_REUSEPORT group listens already: one
    // rdma_cm listener serves them all (requests are matched by 4-tuple at accept, by
    // whichever of them the kernel hands the SYN).
    std::lock_guard<std::mutex> lock(mu_);
    for (Listener* l : listeners_) {
      if (!l->group || l->port != ep.port || !(l->addr == ep)) continue;
      *why = Reason::kResources;
      GroupMember member{group_member, -1};
      if (l->rdma_port != l->port && !PublishMember(l, &member)) return nullptr;
      try {
        l->members.push_back(member);
      } catch (...) {
        UnpublishMember(&member);
        return nullptr;
      }
      *why = Reason::kNone;
      return l;
    }
  }
  auto* l = new (std::nothrow) Listener();
  if (!l) return nullptr;
  l->port = l->rdma_port = ep.port;
  l->addr = ep;
  l->wildcard = true;
  for (uint8_t byte : ep.addr) l->wildcard = l->wildcard && byte == 0;
  l->group = group_member != 0;
  std::memcpy(&l->local, local,
              local->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  int error = BindListener(cm_channel_, l, ep.port, &l->id);
  if (error == EADDRINUSE && l->group) {
    // Another process of the group holds the port's rdma_cm listener: this one listens on
    // a port of its own, where the holder sends the requests for our members' SYNs.
    error = BindListener(cm_channel_, l, 0, &l->id);
    if (error == 0) l->rdma_port = ntohs(rdma_get_src_port(l->id));
  }
  if (error == 0 && l->id->verbs && !DeviceAllowed(l->id->verbs)) {
    rdma_destroy_id(l->id);
    l->id = nullptr;
    error = ENODEV;
  }
  if (error != 0) {
    SLIP_LOG(kInfo, "verbs: no rdma_cm listener on port %u (%s)", ep.port, strerror(error));
    delete l;
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  GroupMember member{group_member, -1};
  bool ok = !l->group || l->rdma_port == l->port || PublishMember(l, &member);
  if (ok) {
    try {
      if (l->group) l->members.push_back(member);
      listeners_.push_back(l);
    } catch (...) {
      ok = false;
      UnpublishMember(&member);
    }
  }
  if (!ok) {
    *why = l->group ? Reason::kReusePort : Reason::kResources;
    rdma_destroy_id(l->id);
    delete l;
    return nullptr;
  }
  if (l->rdma_port != l->port)
    SLIP_LOG(kInfo,
             "verbs: port %u's rdma_cm listener is another process's (SO_REUSEPORT); this "
             "member listens on rdma_cm port %u, where that process sends its requests",
             l->port, l->rdma_port);
  *why = Reason::kNone;
  return l;
}

void VerbsModule::Unlisten(Listener* l, uint64_t group_member) noexcept {
  if (!l) return;
  rdma_cm_id* id = nullptr;
  rdma_cm_id* port_id = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (l->group) {
      auto it = std::find_if(l->members.begin(), l->members.end(),
                             [&](const GroupMember& m) { return m.inode == group_member; });
      if (it != l->members.end()) {
        UnpublishMember(&*it);
        l->members.erase(it);
      }
      if (!l->members.empty()) return;  // other sockets of the group still listen
    }
    for (size_t i = 0; i < listeners_.size(); ++i) {
      if (listeners_[i] == l) {
        listeners_.erase(listeners_.begin() + long(i));
        break;
      }
    }
    id = l->id;  // null once its device was removed (ReapRemoval destroyed it)
    l->id = nullptr;
    port_id = l->port_id;
    l->port_id = nullptr;
  }
  if (forked_.load()) return;  // the parent's objects: leave them alone
  if (id) rdma_destroy_id(id);
  if (port_id) rdma_destroy_id(port_id);
  requests_.ForgetOwner(&l->requests);
  delete l;
}

void VerbsModule::Accepted(Listener* l, const wire::Endpoint& client, const KeptRequest& kept,
                           bool* committed) noexcept {
  auto* conn = static_cast<Conn*>(kept.conn);
  // A client sends its HELLO before its SYN: until it came, its CONFIRM has not been sent
  // either, and plain TCP is safe should the stream not be installed.
  Hello hello;
  *committed = conn->HelloReceived(&hello) && hello.nonce == kept.nonce;
  conn->SetOwner(this);
  SLIP_LOG(kDebug, "verbs: request from port %u accepted", unsigned(client.port));
  // A group's client waits for this before its CONFIRM: the process that took the request
  // is the one that accepted the connection. (Lost, the client goes plain by its deadline,
  // and so does this end: its CONFIRM never comes.)
  if (l->group && !conn->SendTaken(kept.nonce))
    SLIP_LOG(kInfo, "verbs: cannot say TAKEN to a request's client; it will continue on TCP");
}

}  // namespace slip::verbs
