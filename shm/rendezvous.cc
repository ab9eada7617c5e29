// The listening side of shm: the published rendezvous and the registrations it takes.
//
// A registration is answered as soon as it is read: ACCEPT once everything its connection
// will need is held (its descriptors above the floor, the region mapped and checked, the
// server's stream built, a descriptor number kept for the anchor), DECLINE otherwise. The
// client confirms only after ACCEPT, so nothing that can fail is left for accept() after a
// CONFIRM, and a listener short of anything costs its clients acceleration, never their
// connection. What one local user can hold here is bounded (docs/SECURITY.md).
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sock_diag.h"
#include "core/sys.h"
#include "shm/region.h"
#include "shm/rendezvous_name.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

// A registration waits this long for its connection to be accepted (the backlog may hold
// a connection that long); then it is abandoned and dropped.
constexpr uint64_t kRegistrationTtlMs = 30000;
// A client sends REGISTER right after it connects to the rendezvous.
constexpr uint64_t kWaitingTtlMs = 1000;
// Rendezvous connections read per drain: a flood must not keep the control thread here.
constexpr int kDrainBudget = 256;

// How many registrations a listener holds: each keeps four descriptors (the proxy pair,
// the client's B, the anchor's slot), all above the floor. They are the same four its
// connection keeps once accepted, so the space above the floor bounds both together.
size_t CapacityFor() noexcept {
  rlimit rl{};
  uint64_t limit = 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
    limit = rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : uint64_t(rl.rlim_cur);
  const uint64_t floor = uint64_t(sys::HiddenFdFloor());
  // (The rendezvous' own descriptors, the netlink socket, the control thread's, and a
  // registration's while it is read live there too: the table fills before they run out,
  // so that a full table, not a shortage, decides who gives way.)
  constexpr uint64_t kReserve = 32;
  const uint64_t hidden = limit > floor + kReserve ? limit - floor - kReserve : 0;
  return size_t(std::clamp<uint64_t>(hidden / 4, 4, 4096));
}

bool SockaddrFor(const wire::Endpoint& ep, sockaddr_storage* out) noexcept {
  std::memset(out, 0, sizeof(*out));
  if (ep.family == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(out);
    in->sin_family = AF_INET;
    in->sin_port = htons(ep.port);
    std::memcpy(&in->sin_addr, ep.addr, 4);
    return true;
  }
  if (ep.family != 6) return false;
  auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
  in6->sin6_family = AF_INET6;
  in6->sin6_port = htons(ep.port);
  std::memcpy(&in6->sin6_addr, ep.addr, 16);
  return true;
}

uint32_t PeerUid(int conn) noexcept {
  ucred cred{};
  socklen_t len = sizeof(cred);
  // An unknown peer counts as the most constrained one.
  if (sys::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return UINT32_MAX;
  return cred.uid;
}

// Says who holds a rendezvous name we could not bind (an attack, or another listener of
// ours that did not let go).
void LogHolder(const sockaddr_un& name, socklen_t len) noexcept {
  const int probe = sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ucred cred{-1, ~0u, ~0u};
  if (probe >= 0) {
    socklen_t clen = sizeof(cred);
    if (sys::connect(probe, reinterpret_cast<const sockaddr*>(&name), len) != 0 ||
        sys::getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0)
      cred = ucred{-1, ~0u, ~0u};
    sys::close(probe);
  }
  SLIP_LOG(kWarn,
           "rendezvous %.*s is already held by pid %d uid %d; same-host clients of this "
           "listener stay plain (untrusted_rendezvous)",
           int(len - offsetof(sockaddr_un, sun_path) - 1), name.sun_path + 1, int(cred.pid),
           int(cred.uid));
}

}  // namespace

std::unique_ptr<Rendezvous> Rendezvous::Publish(const sockaddr* local, bool v6only,
                                                StreamOptions options, int handshake_timeout_ms,
                                                int* error) noexcept {
  sockaddr_un name;
  socklen_t len;
  if (!RendezvousNameFor(local, v6only, &name, &len)) {
    *error = -EAFNOSUPPORT;
    return nullptr;
  }
  auto rv = std::unique_ptr<Rendezvous>(new (std::nothrow) Rendezvous());
  const size_t capacity = CapacityFor();
  if (rv) rv->table_.reset(new (std::nothrow) Registration[capacity]);
  if (!rv || !rv->table_) {
    *error = -ENOMEM;
    return nullptr;
  }
  rv->capacity_ = capacity;
  // Whatever the others do, a quarter of the table stays theirs (entries whose claim says
  // confirmed cannot be made to give way).
  rv->per_uid_ = std::max<size_t>(2, capacity - capacity / 4);
  rv->options_ = options;
  rv->timeout_ms_ = handshake_timeout_ms;
  const int floor = sys::HiddenFdFloor();
  rv->listen_fd_ =
      sys::MoveAbove(sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), floor);
  if (rv->listen_fd_ < 0) {
    *error = -errno;
    return nullptr;
  }
  if (sys::bind(rv->listen_fd_, reinterpret_cast<sockaddr*>(&name), len) != 0) {
    *error = -errno;
    if (errno == EADDRINUSE) LogHolder(name, len);
    return nullptr;
  }
  rv->epoll_fd_ = sys::MoveAbove(epoll_create1(EPOLL_CLOEXEC), floor);
  if (rv->epoll_fd_ < 0 || sys::listen(rv->listen_fd_, 4096) != 0 || !rv->Watch(rv->listen_fd_)) {
    *error = -errno;
    return nullptr;
  }
  return rv;
}

Rendezvous::~Rendezvous() {
  if (listen_fd_ >= 0) sys::close(listen_fd_);
  if (epoll_fd_ >= 0) sys::close(epoll_fd_);
  for (size_t i = 0; i < waiting_count_; ++i) sys::close(waiting_[i].fd);
  // Registrations still held were never accepted: abandon them (their clients stay
  // plain, or already confirmed, in which case their server is gone anyway).
  for (size_t i = 0; i < used_; ++i) table_[i].Abandon();
}

bool Rendezvous::Watch(int fd) noexcept {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  return sys::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

void Rendezvous::RemoveAt(size_t i) noexcept {
  --used_;
  if (i != used_) {
    table_[i] = std::move(table_[used_]);
  } else {
    table_[i] = Registration();
  }
}

// A full table gives way to a uid that holds fewer entries than the uid holding the
// most: that one's oldest registration whose client has not confirmed yet is abandoned
// (its client, finding the claim so, stays plain: nothing of its connection is lost).
// One local user can thus fill an empty table, but not keep it from anybody else.
bool Rendezvous::MakeRoomFor(uint32_t uid) noexcept {
  // Count per uid in one pass (a few distinct uids are the rule; beyond 32 the rest are
  // not considered).
  struct Count {
    uint32_t uid;
    size_t n;
  } counts[32];
  size_t distinct = 0;
  for (size_t i = 0; i < used_; ++i) {
    size_t k = 0;
    while (k < distinct && counts[k].uid != table_[i].uid) ++k;
    if (k == distinct) {
      if (distinct == std::size(counts)) continue;
      counts[distinct++] = Count{table_[i].uid, 0};
    }
    ++counts[k].n;
  }
  uint32_t heaviest = uid;
  size_t most = 1;  // a uid gives way only to one that holds fewer, after this entry
  for (size_t k = 0; k < distinct; ++k) {
    if (counts[k].uid == uid) most = std::max(most, counts[k].n + 1);
  }
  for (size_t k = 0; k < distinct; ++k) {
    if (counts[k].n > most) {
      most = counts[k].n;
      heaviest = counts[k].uid;
    }
  }
  if (heaviest == uid) return false;
  size_t victim = used_;
  for (size_t i = 0; i < used_; ++i) {
    const Registration& r = table_[i];
    if (r.uid != heaviest || r.ReadClaim() != Claim::kOpen) continue;
    if (victim == used_ || r.received_ms < table_[victim].received_ms) victim = i;
  }
  if (victim == used_ || table_[victim].Abandon() != Claim::kAbandoned) return false;
  RemoveAt(victim);
  return true;
}

size_t Rendezvous::CountForUid(uint32_t uid) const noexcept {
  size_t count = 0;
  for (size_t i = 0; i < used_; ++i) count += table_[i].uid == uid;
  return count;
}

void Rendezvous::Answer(int conn, uint64_t nonce, wire::DeclineReason reason) noexcept {
  wire::Message msg;
  if (reason == wire::DeclineReason::kUnspecified) {
    msg.type = wire::Type::kAccept;
    msg.accept = wire::Accept{nonce};
  } else {
    msg.type = wire::Type::kDecline;
    msg.decline = wire::Decline{nonce, reason};
  }
  uint8_t buf[wire::kMaxMessageSize];
  const size_t len = wire::EncodeMessage(msg, buf, sizeof(buf));
  // A client that went away meanwhile finds nothing; one that stays gets one message.
  sys::send(conn, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void Rendezvous::ReadOne(int conn, uint32_t uid, uint64_t now_ms) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  const ssize_t n = sys::recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
    // Connected, message not written yet: wait for it, within bounds.
    size_t mine = 0;
    for (size_t i = 0; i < waiting_count_; ++i) mine += waiting_[i].uid == uid;
    if (waiting_count_ < kMaxWaiting && mine < kMaxWaitingPerUid && Watch(conn)) {
      waiting_[waiting_count_++] = Waiting{conn, uid, now_ms};
    } else {
      sys::close(conn);  // its client sees EOF and stays plain
    }
    return;
  }
  // Whatever came, the descriptors are ours to close or keep; they go above the floor.
  int fds[4] = {-1, -1, -1, -1};
  int nfds = 0;
  bool moved = true;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const int count = int((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      if (nfds >= 4) {
        sys::close(fd);
        nfds = 5;  // too many descriptors: malformed
        continue;
      }
      fds[nfds] = sys::MoveAbove(fd, sys::HiddenFdFloor());
      moved = moved && fds[nfds] >= 0;
      ++nfds;
    }
  }
  auto close_fds = [&fds] {
    for (int& fd : fds) {
      if (fd >= 0) sys::close(fd);
      fd = -1;
    }
  };
  wire::Message msg;
  size_t used = 0;
  const wire::ParseStatus st =
      n > 0 ? wire::ParseMessage(buf, size_t(n), &msg, &used) : wire::ParseStatus::kNeedMore;
  if (n <= 0 || st != wire::ParseStatus::kOk || used != size_t(n) ||
      msg.type != wire::Type::kRegister) {
    if (n > 0)
      SLIP_LOG(kWarn, "rendezvous: dropped a malformed message (%s)",
               st == wire::ParseStatus::kOk ? "not a lone REGISTER" : wire::ParseStatusName(st));
    close_fds();
    sys::close(conn);
    return;
  }
  const uint64_t nonce = msg.reg.nonce;
  // A truncated control message means the kernel could not give us the descriptors (the
  // limit): the client must know before it confirms.
  wire::DeclineReason why = wire::DeclineReason::kUnspecified;
  if ((mh.msg_flags & MSG_CTRUNC) || !moved) {
    why = wire::DeclineReason::kDescriptors;
  } else if (nfds != 4 || msg.reg.fd_count != 4) {
    SLIP_LOG(kWarn, "rendezvous: dropped a registration with %d descriptors", nfds);
    why = wire::DeclineReason::kBadRegion;
  } else if (CountForUid(uid) >= per_uid_ || (used_ >= capacity_ && !MakeRoomFor(uid))) {
    why = wire::DeclineReason::kBusy;
  }
  // A few registrations per 4-tuple (a forger's next to its real client's: accept() tells
  // them apart); those that can no longer be confirmed make room.
  size_t same_tuple = 0;
  for (size_t i = 0; why == wire::DeclineReason::kUnspecified && i < used_;) {
    Registration& r = table_[i];
    if (!(r.msg.client == msg.reg.client && r.msg.server == msg.reg.server)) {
      ++i;
      continue;
    }
    const Claim claim = r.ReadClaim();
    if (claim == Claim::kWithdrawn || claim == Claim::kAbandoned) {
      RemoveAt(i);
      continue;
    }
    if (++same_tuple >= kMaxPerTuple) why = wire::DeclineReason::kBusy;
    ++i;
  }
  if (why == wire::DeclineReason::kUnspecified && IsLate(msg.reg.client, msg.reg.server)) {
    // Its connection was accepted as plain before this registration was read (the drain
    // then was cut short): confirming now would put a CONFIRM in a plain stream.
    why = wire::DeclineReason::kNoRegistration;
  }
  if (why != wire::DeclineReason::kUnspecified) {
    close_fds();
    Answer(conn, nonce, why);
    sys::close(conn);
    // Short of descriptors while someone holds more than its share: the next one finds room.
    if (why == wire::DeclineReason::kDescriptors) MakeRoomFor(uid);
    return;
  }
  Registration reg;
  reg.msg = msg.reg;
  reg.uid = uid;
  reg.received_ms = now_ms;
  // (A duplicate of the client's B, never of our own: closing any descriptor of a file, as
  // the install's dup3 over the slot does, drops this process's locks on it, and our B
  // carries the lock that says this process holds the connection.)
  reg.anchor_slot = sys::DupAbove(fds[3], sys::HiddenFdFloor());
  int proxy_a = -1, proxy_b = -1;
  std::unique_ptr<Channel> channel;
  if (reg.anchor_slot < 0) {
    why = wire::DeclineReason::kDescriptors;
    close_fds();
  } else {
    // Takes fds (closed on failure).
    channel = AcceptRegistration(msg.reg, fds, reg.anchor_slot, /*held=*/true, timeout_ms_,
                                 &proxy_a, &proxy_b, &reg.claim, &why);
  }
  if (channel) {
    reg.stream.reset(new (std::nothrow) Stream(std::move(channel), proxy_a, proxy_b, options_));
    if (!reg.stream) {  // (the channel, not moved, goes at the end of this scope)
      sys::close(proxy_a);
      sys::close(proxy_b);
      reg.claim = nullptr;
      why = wire::DeclineReason::kResources;
    }
  }
  if (!reg.stream) {
    if (why == wire::DeclineReason::kBadRegion)
      SLIP_LOG(kWarn,
               "rendezvous: declined a registration from uid %u (unusable region or "
               "proxies)",
               unsigned(uid));
    Answer(conn, nonce,
           why == wire::DeclineReason::kUnspecified ? wire::DeclineReason::kResources : why);
    sys::close(conn);
    return;
  }
  reg.proxy_a = proxy_a;
  table_[used_++] = std::move(reg);
  Answer(conn, nonce, wire::DeclineReason::kUnspecified);
  sys::close(conn);
}

Rendezvous::DrainResult Rendezvous::DrainLocked() noexcept {
  const uint64_t now = sys::MonotonicMs();
  DrainResult result = DrainResult::kDone;
  epoll_event events[64];
  int budget = kDrainBudget;
  const int n = sys::epoll_wait(epoll_fd_, events, 64, 0);
  // Connections wait in the listener's backlog only when it says so (or the events did not
  // all fit): most drains find nothing, and skip the accept4 that would say EAGAIN.
  bool backlog = n == 64;
  for (int i = 0; i < n && budget > 0; ++i) {
    const int fd = events[i].data.fd;
    if (fd == listen_fd_) {
      backlog = true;
      continue;
    }
    for (size_t w = 0; w < waiting_count_; ++w) {
      if (waiting_[w].fd != fd) continue;
      const uint32_t uid = waiting_[w].uid;
      waiting_[w] = waiting_[--waiting_count_];
      sys::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      ReadOne(fd, uid, now);
      --budget;
      break;
    }
  }
  while (backlog) {
    if (budget-- <= 0) {
      result = DrainResult::kMore;  // a burst (or a flood): the caller comes back later
      break;
    }
    int conn = sys::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // The queued clients wait for an answer that cannot come now; they give up at
        // their deadline and stay plain. Logged once in a while, not once per client.
        SLIP_LOG(kWarn,
                 "rendezvous: no descriptor to read registrations with; clients stay "
                 "plain meanwhile");
        result = DrainResult::kBlocked;
      }
      break;
    }
    conn = sys::MoveAbove(conn, sys::HiddenFdFloor());
    if (conn < 0) continue;  // (closed: its client sees EOF and stays plain)
    ReadOne(conn, PeerUid(conn), now);
  }
  ExpireLocked(now);
  return result;
}

void Rendezvous::ExpireLocked(uint64_t now_ms) noexcept {
  for (size_t i = 0; i < used_;) {
    if (now_ms - table_[i].received_ms <= kRegistrationTtlMs) {
      ++i;
      continue;
    }
    // Its client must not confirm after this (it did long ago, or never will).
    table_[i].Abandon();
    RemoveAt(i);
  }
  for (size_t w = 0; w < waiting_count_;) {
    if (now_ms - waiting_[w].since_ms <= kWaitingTtlMs) {
      ++w;
      continue;
    }
    sys::close(waiting_[w].fd);  // (its epoll registration goes with it)
    waiting_[w] = waiting_[--waiting_count_];
  }
}

bool Rendezvous::Drain() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return DrainLocked() == DrainResult::kMore;
}

bool Rendezvous::IsLate(const wire::Endpoint& client, const wire::Endpoint& server) noexcept {
  const uint64_t now = sys::MonotonicMs();
  for (size_t i = 0; i < std::size(late_); ++i) {
    Late& l = late_[i];
    if (l.until_ms > now && l.client == client && l.server == server) {
      l.until_ms = 0;
      return true;
    }
  }
  return false;
}

void Rendezvous::NoteLate(const wire::Endpoint& client, const wire::Endpoint& server) noexcept {
  // Long enough for any client still waiting for its answer: it gives up at its deadline.
  late_[late_next_] = Late{client, server, sys::MonotonicMs() + 4 * uint64_t(timeout_ms_) + 1000};
  late_next_ = (late_next_ + 1) % std::size(late_);
}

bool Rendezvous::Take(const wire::Endpoint& client, const wire::Endpoint& server,
                      Registration* out) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  // Whatever arrived is read first: the registration, if the control thread has not
  // read it yet, and any other for the same 4-tuple (a forger's) that the choice below
  // must see.
  const bool complete = DrainLocked() == DrainResult::kDone;
  size_t found[kMaxPerTuple];
  size_t count = 0;
  for (size_t i = 0; i < used_ && count < kMaxPerTuple; ++i) {
    if (table_[i].msg.client == client && table_[i].msg.server == server) found[count++] = i;
  }
  if (count == 0) {
    // A registration sent before this connection's SYN is read by now, unless the drain
    // was cut short: then one may still come, and must be refused when it does.
    if (!complete) NoteLate(client, server);
    return false;
  }
  // Anybody can register any 4-tuple: the registration that counts is the one made by the
  // owner of the TCP connection's client socket, as the kernel sees it (a forger of another
  // uid never gets a connection held for it, not even a plain client's that it predicted;
  // same-uid processes are not told apart, SECURITY.md). The newest of those, if several.
  sockaddr_storage local, remote;
  SocketInfo owner;
  constexpr size_t kNone = SIZE_MAX;
  size_t pick = kNone;  // an index into table_
  if (SockaddrFor(client, &local) && SockaddrFor(server, &remote) &&
      FindConnection(reinterpret_cast<sockaddr*>(&local), reinterpret_cast<sockaddr*>(&remote),
                     &owner) == 0) {
    for (size_t k = 0; k < count; ++k) {
      const Registration& r = table_[found[k]];
      if (r.uid == owner.uid && (pick == kNone || r.received_ms >= table_[pick].received_ms))
        pick = found[k];
    }
  }
  if (pick == kNone) {
    // Nobody who registered owns this connection (or the kernel could not say): plain.
    // Their clients stay plain too (abandoned).
    SLIP_LOG(kWarn,
             "rendezvous: %zu registration(s) for a connection whose client socket "
             "belongs to none of their uids; plain",
             count);
    for (size_t k = count; k-- > 0;) {
      table_[found[k]].Abandon();
      RemoveAt(found[k]);
    }
    return false;
  }
  *out = std::move(table_[pick]);
  // The others can never be confirmed on this connection: they go (highest index first,
  // so that the indexes left stay valid).
  for (size_t k = count; k-- > 0;) {
    if (found[k] != pick) table_[found[k]].Abandon();
    RemoveAt(found[k]);
  }
  return true;
}

}  // namespace slip::shm
