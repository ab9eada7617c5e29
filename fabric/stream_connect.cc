// The client's side of the fabric rendezvous: a UDP socket connected to the TCP
// destination (its source address is the one the TCP socket binds to), the REQ, sent again
// at a third of the handshake budget if no answer came, and the listener's REP.
//
// A plain peer answers with ICMP port unreachable, which the connected socket reports as
// ECONNREFUSED: that, silence until the deadline, and a host we cannot reach are
// remembered per destination (the negative cache), so the next connection there goes
// plain at once. A REFUSE is not remembered: the listener is Slipstream's, only busy.
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "fabric/stream_internal.h"

namespace slip::fabric {

namespace {

constexpr int kSends = 3;

}  // namespace

StreamClient* StreamModuleImpl::Start(const sockaddr* dest, sockaddr_storage* source,
                                      Reason* why) noexcept {
  *why = Reason::kResources;
  if (!MakesNew()) return nullptr;
  std::unique_ptr<StreamClient> c(new (std::nothrow) StreamClient);
  if (!c || !wire::EndpointFromSockaddr(dest, &c->dest)) return nullptr;
  if (negative_.Lookup(c->dest, sys::MonotonicMs(), why)) return nullptr;
  const int family = dest->sa_family;
  const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  c->udp = Hide(sys::socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  *why = Reason::kFdLimit;
  if (c->udp < 0) return nullptr;
  socklen_t source_len = sizeof(*source);
  if (sys::connect(c->udp, dest, len) != 0 ||
      getsockname(c->udp, reinterpret_cast<sockaddr*>(source), &source_len) != 0) {
    *why = Reason::kNoRdmaPath;  // no route to the destination
    sys::close(c->udp);
    return nullptr;
  }
  // The TCP socket binds to the address, not the UDP socket's port.
  if (source->ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(source)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(source)->sin6_port = 0;
  return c.release();
}

bool StreamModuleImpl::Request(StreamClient* c, const wire::Endpoint& from,
                               const wire::Endpoint& to, uint64_t nonce, uint32_t ring_size,
                               Reason* why) noexcept {
  c->conn = NewConn(ring_size, why);
  if (!c->conn) return false;
  streamwire::Message req;
  req.type = streamwire::Type::kReq;
  req.ring_log2 = streamwire::RingLog2(ring_size);
  req.nonce = nonce;
  req.client = from;
  req.server = to;
  req.ring_key = c->conn->rx_key();
  req.ring_addr = c->conn->rx_base();
  req.note_tag = c->conn->tag();
  req.note_bytes = NoteBytes(ring_size);
  req.endpoints = Endpoints();
  if (!fabric_->connected()) {
    req.address_len = uint8_t(fabric_->address_len());
    std::memcpy(req.address, fabric_->address(), fabric_->address_len());
  }
  *why = Reason::kResources;
  if (!streamwire::Encode(req, c->req)) return false;
  c->nonce = nonce;
  const uint64_t now = sys::MonotonicMs();
  c->deadline_ms = now + config_->handshake_timeout_ms;
  c->resend_ms = now;  // Advance sends the first one
  return true;
}

int StreamModuleImpl::EventFd(StreamClient* c) noexcept {
  const int link_fd = c->linking ? c->conn->LinkEventFd() : -1;
  return link_fd >= 0 ? link_fd : c->udp;
}

uint64_t StreamModuleImpl::Deadline(StreamClient* c) noexcept {
  // (An endpoint whose events have no descriptor is looked at every millisecond.)
  if (c->linking)
    return c->conn->LinkEventFd() >= 0 ? c->deadline_ms
                                       : std::min(c->deadline_ms, sys::MonotonicMs() + 1);
  return c->resend_ms < c->deadline_ms ? c->resend_ms : c->deadline_ms;
}

bool StreamModuleImpl::ConnectLink(StreamClient* c, const streamwire::Message& rep) noexcept {
  // The REP's address is where the listener's connection listener is; one bound to every
  // address is reached where the TCP connection goes.
  sockaddr_storage server{};
  if (rep.address_len > sizeof(server)) return false;
  std::memcpy(&server, rep.address, rep.address_len);
  sockaddr_storage dest{};
  if (!wire::SockaddrFromEndpoint(c->dest, &dest)) return false;
  if (server.ss_family == AF_INET && dest.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&server);
    if (in->sin_addr.s_addr == htonl(INADDR_ANY))
      in->sin_addr = reinterpret_cast<const sockaddr_in*>(&dest)->sin_addr;
  } else if (server.ss_family == AF_INET6 && dest.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&server);
    if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))
      in6->sin6_addr = reinterpret_cast<const sockaddr_in6*>(&dest)->sin6_addr;
  } else if (server.ss_family != AF_INET && server.ss_family != AF_INET6) {
    return false;
  }
  return c->conn->ConnectLink(reinterpret_cast<const sockaddr*>(&server), rep.note_tag, c->nonce);
}

// (The source was Start's: never kResolved here.)
StreamModule::Step StreamModuleImpl::Advance(StreamClient* c, sockaddr_storage* source,
                                             Reason* why) noexcept {
  if (c->linking) {
    // Answered; our endpoint is connecting to the listener's.
    switch (c->conn->PollLink()) {
      case Link::Step::kUp:
        return Step::kAccepted;
      case Link::Step::kFailed:
        *why = Reason::kNoRdmaPath;
        return Step::kFailed;
      case Link::Step::kWaiting:
        break;
    }
    if (sys::MonotonicMs() < c->deadline_ms) return Step::kWaiting;
    SLIP_LOG(kInfo, "fabric: conn %06x: our endpoint did not connect in time", c->conn->tag());
    *why = Reason::kHandshakeTimeout;
    return Step::kFailed;
  }
  // The answers first: a REP, a REFUSE, or the ICMP error of a plain peer.
  for (;;) {
    uint8_t buf[streamwire::kBytes + 1];
    const ssize_t n = sys::recv(c->udp, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      // ECONNREFUSED (no UDP twin: a plain listener, or none), unreachable host or net.
      *why = Reason::kPeerNotSlipstream;
      negative_.Insert(c->dest, *why, sys::MonotonicMs() + options_->negative_ttl_ms);
      SLIP_LOG(kDebug, "fabric: no rendezvous at the destination (%s)", strerror(errno));
      return Step::kFailed;
    }
    streamwire::Message rep;
    if (!streamwire::Parse(buf, size_t(n), &rep) || rep.nonce != c->nonce ||
        rep.type == streamwire::Type::kReq) {
      SLIP_LOG(kDebug, "fabric: a datagram that answers no REQ of ours; dropped");
      continue;  // (a stranger's, or an answer to an earlier REQ: the next is ours)
    }
    if (rep.type == streamwire::Type::kRefuse) {
      *why = Reason::kDeclined;
      return Step::kFailed;
    }
    if ((1u << rep.ring_log2) != c->conn->ring_size() ||
        rep.note_bytes != NoteBytes(c->conn->ring_size()) || rep.endpoints != Endpoints()) {
      SLIP_LOG(kWarn,
               "fabric: the listener's REP names a ring of another size, notes of another "
               "form or endpoints of another type; plain");
      *why = Reason::kDeclined;
      return Step::kFailed;
    }
    if (!Connect(c->conn, rep)) {
      *why = Reason::kNoRdmaPath;
      negative_.Insert(c->dest, *why, sys::MonotonicMs() + options_->negative_ttl_ms);
      return Step::kFailed;
    }
    SLIP_LOG(kDebug, "fabric: conn %06x (peer %06x) answered for port %u", c->conn->tag(),
             unsigned(rep.note_tag), unsigned(rep.client.port));
    if (!fabric_->connected()) return Step::kAccepted;
    if (!ConnectLink(c, rep)) {
      *why = Reason::kNoRdmaPath;
      return Step::kFailed;
    }
    c->linking = true;
    return Advance(c, source, why);
  }
  const uint64_t now = sys::MonotonicMs();
  if (now >= c->deadline_ms) {
    // Silence: UDP dropped on the way (a firewall), or a listener that never answers.
    *why = Reason::kHandshakeTimeout;
    negative_.Insert(c->dest, *why, now + options_->negative_ttl_ms);
    return Step::kFailed;
  }
  if (now >= c->resend_ms && c->sends < kSends) {
    if (sys::send(c->udp, c->req, sizeof(c->req), MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
        errno == ECONNREFUSED) {
      *why = Reason::kPeerNotSlipstream;
      negative_.Insert(c->dest, *why, now + options_->negative_ttl_ms);
      return Step::kFailed;
    }
    ++c->sends;
    c->resend_ms =
        c->sends < kSends ? now + config_->handshake_timeout_ms / kSends : c->deadline_ms;
  }
  return Step::kWaiting;
}

std::unique_ptr<Channel> StreamModuleImpl::Finish(StreamClient* c, int proxy_b) noexcept {
  std::unique_ptr<StreamConn> conn(c->conn);
  c->conn = nullptr;
  Abort(c);
  const int own_b = sys::DupAbove(proxy_b, floor_);
  if (own_b < 0) return nullptr;
  conn->SetProxy(own_b);
  return conn;
}

void StreamModuleImpl::Abort(StreamClient* c) noexcept {
  // (A connection never streamed says nothing to its peer: the listener's pending request
  // expires, or goes with the connection that accept() settles as plain.)
  delete c->conn;
  if (c->udp >= 0) sys::close(c->udp);
  delete c;
}

}  // namespace slip::fabric
