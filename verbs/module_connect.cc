// The verbs module's client side: resolving a destination over RDMA, the REQ, the REP,
// the HELLO, a step at a time (Start, Advance, Request: core/ring_module.h).

#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/module_impl.h"

namespace slip::verbs {

using namespace module_internal;

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

ClientConn* VerbsModule::Start(const sockaddr* dest, sockaddr_storage* source,
                               Reason* why) noexcept {
  source->ss_family = AF_UNSPEC;  // Advance says kResolved with it
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
  if (c->channel) c->channel->fd = sys::MoveLibraryFdHigh(c->channel->fd, sys::HiddenFdFloor());
  if (!c->channel || !SetNonblocking(c->channel->fd) ||
      rdma_create_id(c->channel, &c->id, nullptr, RDMA_PS_TCP) != 0) {
    *why = Reason::kResources;
    ReleaseClient(c);
    return nullptr;
  }
  c->deadline_ms = sys::MonotonicMs() + config_->handshake_timeout_ms;
  // (v4-mapped folded to IPv4, which rdma_cm resolves.)
  if (ep.family == 4)
    wire::SockaddrFromEndpoint(ep, &c->dest_addr);
  else
    std::memcpy(&c->dest_addr, dest, sizeof(sockaddr_in6));  // (its scope id too)
  if (rdma_resolve_addr(c->id, nullptr, reinterpret_cast<sockaddr*>(&c->dest_addr),
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
  // remembered: the next connection there goes plain at once. (Not after a redirect: the
  // destination's listener answered; one member's port failing says nothing of the rest.)
  if (!c->redirected && (why == Reason::kNoRdmaPath || why == Reason::kPeerNotSlipstream))
    negative_.Insert(c->dest, why, sys::MonotonicMs() + options_->negative_ttl_ms);
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
      if (!c->redirected) return Resolved(c, source, why);
      // The TCP socket is bound already: the second request must leave from its address.
      wire::Endpoint local;
      if (!EndpointOf(rdma_get_local_addr(c->id), &local) || !SameAddress(local, c->client)) {
        *why = Reason::kNoRdmaPath;
        return Step::kFailed;
      }
      return SendReq(c, why) ? Step::kWaiting : Step::kFailed;
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
    } else if (int rc = c->conn->Connect(options_->gid_index); rc < 0) {
      SLIP_LOG(kInfo, "verbs: cannot ready the queue pair (%s)", strerror(-rc));
      *why = Reason::kNoRdmaPath;
    } else if (rdma_establish(c->id) != 0) {
      *why = Reason::kNoRdmaPath;
    } else {
      c->conn->SetPeer(rep.ring_addr, rep.rkey, (rep.flags & kFlagSendNotify) != 0);
      // From here the queue pair may bring the TAKEN (even before our connect() returns).
      if (rep.flags & kFlagGroup) c->conn->ExpectTaken(c->nonce);
      ok = true;
    }
    rdma_ack_cm_event(event);
    if (!ok) return Step::kFailed;
  } else {
    Rej rej;
    const bool elsewhere = type == RDMA_CM_EVENT_REJECTED &&
                           ParseRej(static_cast<const uint8_t*>(event->param.conn.private_data),
                                    event->param.conn.private_data_len, &rej) == ParseResult::kOk;
    rdma_ack_cm_event(event);
    if (elsewhere) {
      // A listener that shares its port (SO_REUSEPORT) does not serve the member our SYN
      // will reach: ask that member's process (once), or stay plain; the destination is
      // not remembered either way.
      if (rej.code == RejCode::kRedirect && !c->redirected) return Redirect(c, rej.port, why);
      *why = Reason::kReusePort;
      return Step::kFailed;
    }
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

VerbsModule::Step VerbsModule::Redirect(ClientConn* c, uint16_t rdma_port, Reason* why) noexcept {
  SLIP_LOG(kDebug, "verbs: request from port %u redirected to rdma_cm port %u", c->client.port,
           rdma_port);
  c->redirected = true;
  delete c->conn;  // the first request's queue pair and id (rejected)
  c->conn = nullptr;
  c->id = nullptr;
  sockaddr_storage dst = c->dest_addr;
  if (dst.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&dst)->sin_port = htons(rdma_port);
  else
    reinterpret_cast<sockaddr_in6*>(&dst)->sin6_port = htons(rdma_port);
  c->deadline_ms = sys::MonotonicMs() + config_->handshake_timeout_ms;
  if (rdma_create_id(c->channel, &c->id, nullptr, RDMA_PS_TCP) != 0) {
    c->id = nullptr;
    *why = Reason::kResources;
    return Step::kFailed;
  }
  if (rdma_resolve_addr(c->id, nullptr, reinterpret_cast<sockaddr*>(&dst),
                        int(config_->handshake_timeout_ms)) != 0) {
    *why = Reason::kNoRdmaPath;
    return Step::kFailed;
  }
  c->stage = ClientConn::Stage::kAddr;
  return Step::kWaiting;
}

bool VerbsModule::Request(ClientConn* c, const wire::Endpoint& client, const wire::Endpoint& server,
                          uint64_t nonce, uint32_t ring_size, Reason* why) noexcept {
  if (c->reused) {
    c->nonce = nonce;
    return SendClaim(c, client, server, ring_size, why);
  }
  c->client = client;
  c->server = server;
  c->nonce = nonce;
  c->ring_log2 = uint8_t(__builtin_ctz(ring_size));
  return SendReq(c, why);
}

bool VerbsModule::SendReq(ClientConn* c, Reason* why) noexcept {
  const uint32_t ring_size = 1u << c->ring_log2;
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
  Req req;
  req.flags = send_notify ? kFlagSendNotify : 0;
  req.ring_log2 = c->ring_log2;
  req.nonce = c->nonce;
  req.client = c->client;
  req.server = c->server;
  uint8_t data[kMaxReqPrivateData];
  rdma_conn_param param = ConnParam(data, EncodeReq(req, data, sizeof(data)), c->conn->qp_num());
  if (param.private_data_len == 0 || rdma_connect(c->id, &param) != 0) {
    *why = Reason::kNoRdmaPath;
    return false;
  }
  c->stage = ClientConn::Stage::kRequest;
  c->deadline_ms = sys::MonotonicMs() + config_->handshake_timeout_ms;
  return true;
}

std::unique_ptr<Channel> VerbsModule::Finish(ClientConn* c, int proxy_b) noexcept {
  int b = sys::DupHigh(proxy_b, sys::HiddenFdFloor());
  if (b < 0) {
    Abort(c);
    return nullptr;
  }
  std::unique_ptr<Channel> channel(c->conn);
  // Held before the proxy is set: nothing of the stream moves until the TAKEN.
  if (c->conn->awaits_taken())
    c->conn->HoldForTaken(sys::MonotonicMs() + config_->handshake_timeout_ms);
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

}  // namespace slip::verbs
