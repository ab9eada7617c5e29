// The listener's side of the fabric rendezvous: a UDP socket on the TCP listener's address
// and port, whose REQs are answered (a connection's rings made, our REP sent) and kept
// under their 4-tuple until accept() takes them (core/pending_requests.h).
//
// Who may ask: a REQ must come from the client address it names and for this listener's
// port; it is answered within the rates of fabric/request_rates.h, and kept within the
// budget and shares of core/pending_requests.h. One request per 4-tuple: a second one
// with another nonce is refused (the first may be a forger's; its client then goes plain,
// never wrong), a repeat of the same one is answered again (its REP was lost).
//
// One thread serves the socket: the module's progress thread, in batches (recvmmsg). A
// client sends its SYN only once it has our REP, so the request of a connection that
// accept() sees is kept already: accept() only looks its 4-tuple up, and a flood of REQs
// never runs on the application's threads.
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sock_diag.h"
#include "core/stand_in_ring.h"
#include "core/sys.h"
#include "fabric/stream_internal.h"

namespace slip::fabric {

namespace {

constexpr unsigned kBatch = 32;  // datagrams per recvmmsg
constexpr int kBatches = 8;      // recvmmsg calls per serve
// A serve that took this many was busy: the socket rests a moment (StreamFabric::ServeFn),
// so that a flood is taken in batches rather than in a wake-up per datagram.
constexpr int kBusy = 16;
// Over connected endpoints each kept request holds its completion queue's descriptors
// (three, the tcp provider's socket pair and epoll set) above the hidden floor: the
// requests may hold a quarter of the numbers there (about as many as the floor), so that
// the connections that do come find theirs.
constexpr size_t kFdsPerRequest = 3;

bool SameAddress(const wire::Endpoint& a, const wire::Endpoint& b) noexcept {
  return a.family == b.family && std::memcmp(a.addr, b.addr, sizeof(a.addr)) == 0;
}

bool IsAnyAddress(const wire::Endpoint& e) noexcept {
  for (uint8_t b : e.addr)
    if (b != 0) return false;
  return true;
}

}  // namespace

void DeleteRequest(RemoteRing* conn) noexcept {
  delete static_cast<StreamConn*>(conn);
}

int StreamModuleImpl::Hide(int fd) const noexcept {
  return sys::MoveAbove(fd, floor_);
}

size_t StreamModuleImpl::Charge(uint32_t ring_size) const noexcept {
  const size_t slots = fabric_->sends() ? StreamConn::kSendReceives * streamwire::kSendBytes : 0;
  return 2 * size_t(ring_size) + 2 * 4096 + slots + PendingRequests::kOverheadBytes;
}

bool StreamModuleImpl::HaveTables() noexcept {
  if (tables_.load(std::memory_order_acquire)) return true;
  std::lock_guard<std::mutex> lock(tables_mu_);
  if (tables_.load(std::memory_order_relaxed)) return true;
  const size_t budget = PendingRequests::DefaultBudget(Charge(config_->ring_size));
  const size_t by_fds = fabric_->connected() ? std::max(PendingRequests::kMinRequests,
                                                        size_t(floor_) / 4 / kFdsPerRequest)
                                             : PendingRequests::kMaxRequests;
  if (!requests_.Make(budget, by_fds) || !rates_.Init()) return false;
  tables_.store(true, std::memory_order_release);
  return true;
}

StreamListener* StreamModuleImpl::Listen(const sockaddr* local, bool v6only, Reason* why) noexcept {
  *why = Reason::kResources;
  if (!MakesNew() || !HaveTables()) return nullptr;
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
  l->module = this;
  if (!fabric_->WatchFd(l->udp, &StreamModuleImpl::ServeListener, l.get())) {
    sys::close(l->udp);
    return nullptr;
  }
  return l.release();
}

bool StreamModuleImpl::ServeListener(void* ctx) noexcept {
  auto* l = static_cast<StreamListener*>(ctx);
  return l->module->Service(l);
}

void StreamModuleImpl::Unlisten(StreamListener* l) noexcept {
  fabric_->UnwatchFd(l->udp);  // (no serve runs from here on)
  requests_.ForgetOwner(&l->requests);
  sys::close(l->udp);
  delete l;
}

bool StreamModuleImpl::Service(StreamListener* l) noexcept {
  uint8_t bufs[kBatch][streamwire::kBytes + 1];  // (one byte more: a longer one is no REQ)
  sockaddr_storage from[kBatch];
  iovec iov[kBatch];
  mmsghdr msgs[kBatch];
  int taken = 0;
  for (int round = 0; round < kBatches; ++round) {
    for (unsigned i = 0; i < kBatch; ++i) {
      iov[i] = iovec{bufs[i], sizeof(bufs[i])};
      msgs[i] = mmsghdr{};
      msgs[i].msg_hdr.msg_name = &from[i];
      msgs[i].msg_hdr.msg_namelen = sizeof(from[i]);
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    const int n = sys::recvmmsg(l->udp, msgs, kBatch, MSG_DONTWAIT);
    if (n <= 0) break;  // (EAGAIN: nothing more)
    for (int i = 0; i < n; ++i)
      Answer(l, bufs[i], msgs[i].msg_len, reinterpret_cast<const sockaddr*>(&from[i]),
             msgs[i].msg_hdr.msg_namelen);
    taken += n;
    if (unsigned(n) < kBatch) break;
  }
  return taken >= kBusy;
}

Principal StreamModuleImpl::WhoSent(const wire::Endpoint& source,
                                    const wire::Endpoint& server) noexcept {
  // The kernel knows the socket that sent it, while it is open (a client's is: it waits
  // for our REP), and whose it is, whichever loopback address it used.
  Principal who;
  sockaddr_storage us{}, them{};
  SocketInfo info;
  if (wire::SockaddrFromEndpoint(server, &us) && wire::SockaddrFromEndpoint(source, &them) &&
      FindUdpSender(reinterpret_cast<sockaddr*>(&us), reinterpret_cast<sockaddr*>(&them), &info) ==
          0) {
    who.kind = Principal::Kind::kUid;
    who.uid = info.uid;
    return who;
  }
  return Principal::OfSource(source);
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
  const uint64_t now_us = sys::MonotonicNs() / 1000;
  const uint64_t now_ms = now_us / 1000;
  if (!rates_.Admit(&l->answers, source, now_us)) {
    // Beyond the rates: dropped, told so while that is cheap (and not recorded by 4-tuple:
    // rates_ remembers the source, for accept()'s reason).
    if (rates_.MayRefuse(now_us)) Refuse(l, req, Reason::kNone, from, from_len, now_ms);
    return;
  }
  PendingRequests* const table = requests_.table();
  if (!table) return;  // (a fork child's: it has no progress thread)
  const Tuple tuple{req.client, req.server};
  PendingRequests::Answer answer;
  switch (table->Find(tuple, req.nonce, &answer)) {
    case PendingRequests::Found::kSame:
      break;  // its REP was lost: the same again
    case PendingRequests::Found::kOther:
      // (Not recorded: the request kept for that connection settles it, or its deadline.)
      SLIP_LOG(kInfo, "fabric: refusing a REQ for port %u (its connection has another request)",
               unsigned(l->local.port));
      Refuse(l, req, Reason::kNone, from, from_len, now_ms);
      return;
    case PendingRequests::Found::kNone: {
      const uint32_t ring_size = 1u << req.ring_log2;
      const char* policy = l->shared.load() ? "the listener is shared by processes"
                           : !MakesNew()    ? "this process makes no new connections"
                           : ring_size > config_->ring_size         ? "its ring is larger than ours"
                           : req.note_bytes != NoteBytes(ring_size) ? "its notes have another form"
                           : req.endpoints != Endpoints() ? "its endpoints are of another type"
                                                          : nullptr;
      if (policy) {
        SLIP_LOG(kInfo, "fabric: refusing a REQ for port %u (%s)", unsigned(l->local.port), policy);
        Refuse(l, req,
               l->shared.load() || !MakesNew() ? Reason::kAcceptedElsewhere : Reason::kDeclined,
               from, from_len, now_ms);
        return;
      }
      PendingRequests::Room room;
      const PendingRequests::Admitted admitted = table->Reserve(
          &l->requests, WhoSent(source, req.server), Charge(ring_size), now_ms, &room);
      for (size_t i = 0; i < room.evicted_count; ++i) DeleteRequest(room.evicted[i]);
      // (Rings that must still retire are the budget's too: the oldest go early.)
      fabric_->ReleaseUnproven(table->budget() - std::min(table->budget(), table->charged()));
      if (admitted != PendingRequests::Admitted::kYes) {
        SLIP_LOG(kDebug, "fabric: refusing a REQ for port %u (%s)", unsigned(l->local.port),
                 admitted == PendingRequests::Admitted::kPrincipalFull
                     ? "its sender has as many requests kept as it may"
                     : "as many requests are kept as the listener may");
        Refuse(l, req, Reason::kRendezvousBusy, from, from_len, now_ms);
        return;
      }
      Reason why = Reason::kResources;
      StreamConn* conn = NewConn(ring_size, &why);
      const bool connected = conn && Connect(conn, req);
      // (The provider refusing the client's address: no path, as that client says.)
      if (conn && !connected) why = Reason::kNoRdmaPath;
      if (!connected) {
        delete conn;
        table->Release(&room);
        Refuse(l, req, why, from, from_len, now_ms);
        return;
      }
      conn->MarkUnproven();
      if (fabric_->connected()) conn->ExpectLink(req.nonce);
      answer.ring_size = conn->ring_size();
      answer.ring_key = conn->rx_key();
      answer.ring_addr = conn->rx_base();
      answer.note_tag = conn->tag();
      SLIP_LOG(kDebug, "fabric: conn %06x answers a REQ from port %u", conn->tag(),
               unsigned(req.client.port));
      table->Keep(&room, tuple, req.nonce, conn, answer, now_ms);  // (accept() may take it now)
      break;
    }
  }
  streamwire::Message rep;
  rep.type = streamwire::Type::kRep;
  rep.nonce = req.nonce;
  rep.client = req.client;
  rep.server = req.server;
  rep.ring_log2 = streamwire::RingLog2(answer.ring_size);
  rep.ring_key = answer.ring_key;
  rep.ring_addr = answer.ring_addr;
  rep.note_tag = answer.note_tag;
  rep.note_bytes = NoteBytes(answer.ring_size);
  rep.endpoints = Endpoints();
  rep.address_len = uint8_t(fabric_->address_len());
  std::memcpy(rep.address, fabric_->address(), fabric_->address_len());
  uint8_t out[streamwire::kBytes];
  if (streamwire::Encode(rep, out))
    sys::sendto(l->udp, out, sizeof(out), MSG_DONTWAIT | MSG_NOSIGNAL, from, from_len);
}

void StreamModuleImpl::Refuse(StreamListener* l, const streamwire::Message& req, Reason why,
                              const sockaddr* from, socklen_t from_len, uint64_t now_ms) noexcept {
  PendingRequests* const table = requests_.table();
  if (table && why != Reason::kNone)
    table->RecordRefusal(Tuple{req.client, req.server}, why, now_ms);
  streamwire::Message rep;
  rep.type = streamwire::Type::kRefuse;
  rep.nonce = req.nonce;
  rep.client = req.client;
  rep.server = req.server;
  uint8_t out[streamwire::kBytes];
  if (streamwire::Encode(rep, out))
    sys::sendto(l->udp, out, sizeof(out), MSG_DONTWAIT | MSG_NOSIGNAL, from, from_len);
}

void StreamModuleImpl::Turn(void* ctx, uint64_t now_ms) noexcept {
  auto* m = static_cast<StreamModuleImpl*>(ctx);
  // A request whose grace is over is kept only if the kernel shows its TCP connection at
  // this host (in the handshake, queued, or accepted): what it is waiting for.
  const size_t gone = m->requests_.CheckDue(now_ms);
  if (gone == 0) return;
  SLIP_LOG(kDebug, "fabric: %zu requests dropped (no TCP connection after their grace) or expired",
           gone);
  PendingRequests* const table = m->requests_.table();
  m->fabric_->ReleaseUnproven(table->budget() - std::min(table->budget(), table->charged()));
}

Reason StreamModuleImpl::RefusedLately(StreamListener* l, const wire::Endpoint& client) noexcept {
  (void)l;
  // Its REQs may have been dropped for their source's rate (nothing recorded by 4-tuple).
  return tables_.load(std::memory_order_acquire) && rates_.DroppedLately(client, sys::MonotonicMs())
             ? Reason::kRendezvousBusy
             : Reason::kNone;
}

void StreamModuleImpl::Accepted(StreamListener* l, const wire::Endpoint& client,
                                const KeptRequest& kept, bool* committed) noexcept {
  (void)committed;                     // (its client had our REP)
  rates_.Refund(&l->answers, client);  // (proven: its tokens come back)
  const auto* conn = static_cast<const StreamConn*>(kept.conn);
  SLIP_LOG(kDebug, "fabric: conn %06x (peer %06x) accepted from port %u", conn->tag(),
           unsigned(conn->peer_tag()), unsigned(client.port));
}

}  // namespace slip::fabric
