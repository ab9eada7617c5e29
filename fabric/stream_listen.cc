// The listener's side of the fabric rendezvous: a UDP socket on the TCP listener's address
// and port, whose REQs are answered (a connection's rings made, our REP sent) and kept
// under their 4-tuple until accept() takes them.
//
// Who may ask: a REQ must come from the client address it names and for this listener's
// port; at most kMaxPending wait per listener, kMaxPerSource from one address (a host that
// floods REQs holds no more than its share of ring memory), each for kPendingMs. One
// request per 4-tuple: a second one with another nonce is refused (the first may be a
// forger's; its client then goes plain, never wrong), a repeat of the same one is answered
// again (its REP was lost).
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "fabric/stream_internal.h"

namespace slip::fabric {

namespace {

constexpr size_t kMaxPending = 1024;
constexpr size_t kMaxPerSource = 64;
constexpr uint64_t kPendingMs = 30000;  // as long as a backlog may hold a connection
constexpr int kServiceBudget = 32;      // datagrams per Service call

bool SameAddress(const wire::Endpoint& a, const wire::Endpoint& b) noexcept {
  return a.family == b.family && std::memcmp(a.addr, b.addr, sizeof(a.addr)) == 0;
}

bool IsAnyAddress(const wire::Endpoint& e) noexcept {
  for (uint8_t b : e.addr)
    if (b != 0) return false;
  return true;
}

}  // namespace

int StreamModuleImpl::Hide(int fd) const noexcept {
  return sys::MoveAbove(fd, floor_);
}

StreamListener* StreamModuleImpl::Listen(const sockaddr* local, bool v6only, Reason* why) noexcept {
  *why = Reason::kResources;
  if (!MakesNew()) return nullptr;
  std::unique_ptr<StreamListener> l(new (std::nothrow) StreamListener);
  if (!l || !wire::EndpointFromSockaddr(local, &l->local)) return nullptr;
  const int family = local->sa_family;
  l->udp = Hide(sys::socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (l->udp < 0) return nullptr;
  if (family == AF_INET6) {
    const int on = v6only ? 1 : 0;
    sys::setsockopt(l->udp, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
  }
  const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (sys::bind(l->udp, local, len) != 0) {
    // Another program's UDP port (or ours, in another process): this listener's
    // connections stay plain.
    SLIP_LOG(kInfo,
             "fabric: cannot listen on UDP port %u beside the TCP listener (%s); its "
             "connections stay plain",
             unsigned(l->local.port), strerror(errno));
    sys::close(l->udp);
    *why = Reason::kUnsupported;
    return nullptr;
  }
  // Connected endpoints: the process's connection listener takes its clients' endpoints.
  if (!fabric_->Listen()) {
    sys::close(l->udp);
    *why = Reason::kUnsupported;
    return nullptr;
  }
  // Its REQs are answered by the progress thread as they come: a client's SYN waits for
  // the REP, and the application may be in poll() rather than accept().
  if (!fabric_->WatchFd(l->udp, &StreamModuleImpl::ServeListener, l.get())) {
    sys::close(l->udp);
    return nullptr;
  }
  l->module = this;
  return l.release();
}

void StreamModuleImpl::ServeListener(void* ctx) noexcept {
  auto* l = static_cast<StreamListener*>(ctx);
  l->module->Service(l);
}

void StreamModuleImpl::Unlisten(StreamListener* l) noexcept {
  fabric_->UnwatchFd(l->udp);
  {
    std::lock_guard<std::mutex> lock(l->mu);
    for (PendingStream& p : l->pending) delete p.conn;
    l->pending.clear();
  }
  sys::close(l->udp);
  delete l;
}

void StreamModuleImpl::ExpireLocked(StreamListener* l, uint64_t now_ms) noexcept {
  for (size_t i = 0; i < l->pending.size();) {
    if (l->pending[i].expires_ms > now_ms) {
      ++i;
      continue;
    }
    delete l->pending[i].conn;
    l->pending[i] = l->pending.back();
    l->pending.pop_back();
  }
}

bool StreamModuleImpl::Service(StreamListener* l) noexcept {
  uint8_t buf[streamwire::kBytes + 1];
  for (int i = 0; i < kServiceBudget; ++i) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof(from);
    const ssize_t n = sys::recvfrom(l->udp, buf, sizeof(buf), MSG_DONTWAIT,
                                    reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) return false;  // (EAGAIN: nothing more; an ICMP error for a REP: ignored)
    Answer(l, buf, size_t(n), reinterpret_cast<const sockaddr*>(&from), from_len);
  }
  return true;
}

void StreamModuleImpl::Answer(StreamListener* l, const uint8_t* in, size_t len,
                              const sockaddr* from, socklen_t from_len) noexcept {
  streamwire::Message req;
  wire::Endpoint source;
  if (!streamwire::Parse(in, len, &req) || req.type != streamwire::Type::kReq ||
      !wire::EndpointFromSockaddr(from, &source)) {
    SLIP_LOG(kDebug, "fabric: a malformed datagram on UDP port %u; dropped",
             unsigned(l->local.port));
    return;
  }
  // The REQ names the TCP connection it is for: its client must be who sends it, and its
  // server this listener.
  if (!SameAddress(req.client, source) || req.server.port != l->local.port ||
      (!IsAnyAddress(l->local) && !SameAddress(req.server, l->local))) {
    SLIP_LOG(kDebug, "fabric: a REQ for a connection its sender does not make; dropped");
    return;
  }
  streamwire::Message rep;
  rep.type = streamwire::Type::kRefuse;
  rep.nonce = req.nonce;
  rep.client = req.client;
  rep.server = req.server;
  const uint32_t ring_size = 1u << req.ring_log2;
  {
    std::lock_guard<std::mutex> lock(l->mu);
    const uint64_t now = sys::MonotonicMs();
    ExpireLocked(l, now);
    PendingStream* same = nullptr;
    size_t from_source = 0;
    for (PendingStream& p : l->pending) {
      if (p.client == req.client && p.server == req.server) same = &p;
      if (SameAddress(p.client, source)) ++from_source;
    }
    if (same && same->nonce == req.nonce) {
      rep.type = streamwire::Type::kRep;  // its REP was lost: the same again
    } else if (same || l->shared.load() || !MakesNew() || ring_size > config_->ring_size ||
               req.note_bytes != NoteBytes(ring_size) || req.endpoints != Endpoints() ||
               l->pending.size() >= kMaxPending || from_source >= kMaxPerSource) {
      SLIP_LOG(kInfo, "fabric: refusing a REQ for port %u (%s)", unsigned(l->local.port),
               same                                     ? "its connection has another request"
               : l->shared.load()                       ? "the listener is shared by processes"
               : !MakesNew()                            ? "this process makes no new connections"
               : ring_size > config_->ring_size         ? "its ring is larger than ours"
               : req.note_bytes != NoteBytes(ring_size) ? "its notes have another form"
               : req.endpoints != Endpoints()           ? "its endpoints are of another type"
                                                        : "too many requests pending");
      // (Not `same`: the request held for that connection settles it, or the deadline.)
      if (!same) {
        RecordRefusalLocked(l, req, now,
                            l->shared.load() || !MakesNew() ? Reason::kAcceptedElsewhere
                            : l->pending.size() >= kMaxPending || from_source >= kMaxPerSource
                                ? Reason::kRendezvousBusy
                                : Reason::kDeclined);
      }
    } else {
      Reason why = Reason::kResources;
      StreamConn* conn = NewConn(ring_size, &why);
      const bool connected = conn && Connect(conn, req);
      // (The provider refusing the client's address: no path, as that client says.)
      if (conn && !connected) why = Reason::kNoRdmaPath;
      if (connected) {
        if (fabric_->connected()) conn->ExpectLink(req.nonce);
        try {
          l->pending.push_back(
              PendingStream{req.client, req.server, req.nonce, now + kPendingMs, conn});
          same = &l->pending.back();
          rep.type = streamwire::Type::kRep;
        } catch (...) {
          delete conn;
          why = Reason::kResources;
        }
      } else {
        delete conn;
      }
      if (rep.type != streamwire::Type::kRep) RecordRefusalLocked(l, req, now, why);
    }
    if (rep.type == streamwire::Type::kRep) {
      rep.ring_log2 = streamwire::RingLog2(same->conn->ring_size());
      rep.ring_key = same->conn->rx_key();
      rep.ring_addr = same->conn->rx_base();
      rep.note_tag = same->conn->tag();
      rep.note_bytes = NoteBytes(same->conn->ring_size());
      rep.endpoints = Endpoints();
      rep.address_len = uint8_t(fabric_->address_len());
      std::memcpy(rep.address, fabric_->address(), fabric_->address_len());
    }
  }
  uint8_t out[streamwire::kBytes];
  if (streamwire::Encode(rep, out))
    sys::sendto(l->udp, out, sizeof(out), MSG_DONTWAIT | MSG_NOSIGNAL, from, from_len);
}

void StreamModuleImpl::RecordRefusalLocked(StreamListener* l, const streamwire::Message& req,
                                           uint64_t now_ms, Reason why) noexcept {
  StreamListener::Refusal& r = l->refused[l->refused_next++ % StreamListener::kRefusals];
  r.client = req.client;
  r.server = req.server;
  r.why = why == Reason::kNone ? Reason::kResources : why;
  r.until_ms = now_ms + kPendingMs;
}

Reason StreamModuleImpl::Refused(StreamListener* l, const wire::Endpoint& client,
                                 const wire::Endpoint& server) noexcept {
  std::lock_guard<std::mutex> lock(l->mu);
  const uint64_t now = sys::MonotonicMs();
  for (const StreamListener::Refusal& r : l->refused) {
    if (r.why != Reason::kNone && now < r.until_ms && r.client == client && r.server == server)
      return r.why;
  }
  return Reason::kNone;
}

bool StreamModuleImpl::HasPending(StreamListener* l, const wire::Endpoint& client,
                                  const wire::Endpoint& server) noexcept {
  // REQs that arrived before the SYN may still wait in the socket: answer them first.
  Service(l);
  std::lock_guard<std::mutex> lock(l->mu);
  for (const PendingStream& p : l->pending)
    if (p.client == client && p.server == server) return true;
  return false;
}

void StreamModuleImpl::DropPending(StreamListener* l, const wire::Endpoint& client,
                                   const wire::Endpoint& server) noexcept {
  std::lock_guard<std::mutex> lock(l->mu);
  for (size_t i = 0; i < l->pending.size(); ++i) {
    if (l->pending[i].client == client && l->pending[i].server == server) {
      delete l->pending[i].conn;
      l->pending[i] = l->pending.back();
      l->pending.pop_back();
      return;
    }
  }
}

std::unique_ptr<Channel> StreamModuleImpl::AcceptPending(StreamListener* l,
                                                         const wire::Endpoint& client,
                                                         const wire::Endpoint& server, int proxy_b,
                                                         Reason* why, bool* committed) noexcept {
  PendingStream taken;
  {
    std::lock_guard<std::mutex> lock(l->mu);
    for (size_t i = 0; i < l->pending.size(); ++i) {
      if (l->pending[i].client == client && l->pending[i].server == server) {
        taken = l->pending[i];
        l->pending[i] = l->pending.back();
        l->pending.pop_back();
        break;
      }
    }
  }
  *why = Reason::kConnectSlow;
  if (!taken.conn) return nullptr;
  *committed = true;  // its client had our REP: its CONFIRM may be on its way
  SLIP_LOG(kDebug, "fabric: conn %06x (peer %06x) accepted from port %u", taken.conn->tag(),
           unsigned(taken.conn->peer_tag()), unsigned(client.port));
  std::unique_ptr<StreamConn> conn(taken.conn);
  const int own_b = sys::DupAbove(proxy_b, floor_);
  *why = Reason::kResources;
  if (own_b < 0) return nullptr;
  conn->Hold(taken.nonce, sys::MonotonicMs() + config_->handshake_timeout_ms);
  conn->SetProxy(own_b);
  return conn;
}

}  // namespace slip::fabric
