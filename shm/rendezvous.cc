// The listening side of shm: the published rendezvous and the registrations it takes.
//
// A registration is read as soon as it arrives and kept once everything its connection
// will need is held (its descriptors above the floor, the region mapped and checked, the
// server's stream built, a descriptor number kept for the anchor); otherwise it is
// declined at once. It is answered ACCEPT only when this process accepts its connection
// and claims it (Registration::Commit), so nothing that can fail is left for accept(), a
// listener short of anything costs its clients acceleration, never their connection, and
// a connection that another process accepted never meets a byte of ours. What one local
// user can hold here is bounded (docs/SECURITY.md).
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sock_diag.h"
#include "core/sys.h"
#include "shm/dir_rendezvous.h"
#include "shm/fd_passing.h"
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
// ... in steps of this many, the lock let go between them (the control thread) or the
// table searched again (accept()): each read maps a region, and a client that sees its
// connection accepted waits for the claim only so long (shm/channel.cc, kTakeGraceMs).
constexpr int kTakeDrainBudget = 16;
// How long accept() reads the queue for its registration at most (well within the client's
// wait, kTakeGraceMs): a flood must not keep accept() here either.
constexpr uint64_t kTakeSearchMs = 20;
// How often the table is looked through for registrations to drop.
constexpr uint64_t kExpireEveryMs = 20;

// Remembering a connection accepted as plain while registrations were left unread: its
// registration, queued before its SYN, is read within a few drains.
constexpr uint64_t kLateMemoryMs = 10000;

// How many registrations a listener holds: each keeps five descriptors (the proxy pair,
// the client's B, the anchor's slot, the rendezvous connection its answer goes to), all
// above the floor, and one from another namespace a sixth (its client's TCP socket).
// Four of them are the ones its connection keeps once accepted, so the space above the
// floor bounds both together.
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
  return size_t(std::clamp<uint64_t>(hidden / 6, 4, 4096));
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

// (Only a TCP socket's inode can match a connection's client socket at accept, so nothing
// more is asked.)
uint64_t Rendezvous::SocketInode(int fd) noexcept {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return uint64_t(st.st_ino);
}

uint32_t Rendezvous::PeerUid(int conn) noexcept {
  ucred cred{};
  socklen_t len = sizeof(cred);
  // An unknown peer counts as the most constrained one.
  if (sys::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return UINT32_MAX;
  return cred.uid;
}

std::unique_ptr<Rendezvous> Rendezvous::Publish(uint16_t port, uint64_t listener_inode,
                                                StreamOptions options, int* error,
                                                bool solo) noexcept {
  sockaddr_un name;
  socklen_t len;
  RendezvousName(port, listener_inode, &name, &len);
  auto rv = std::unique_ptr<Rendezvous>(new (std::nothrow) Rendezvous());
  const size_t capacity = CapacityFor();
  if (rv) rv->table_.reset(new (std::nothrow) Registration[capacity]);
  if (!rv || !rv->table_) {
    *error = -ENOMEM;
    return nullptr;
  }
  rv->capacity_ = capacity;
  // Whatever the others do, a quarter of the table stays theirs.
  rv->per_uid_ = std::max<size_t>(2, capacity - capacity / 4);
  rv->options_ = options;
  rv->listener_inode_ = listener_inode;
  rv->listener_flags_ = solo ? kListenerSolo : 0;
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
  // (A process that inherited the names closes them without removing them: they are the
  // publisher's.)
  WithdrawDirNames(publisher_ == getpid() && !shared());
  if (listen_fd_ >= 0) sys::close(listen_fd_);
  if (timer_fd_ >= 0) sys::close(timer_fd_);
  if (epoll_fd_ >= 0) sys::close(epoll_fd_);
  for (size_t i = 0; i < waiting_count_; ++i) sys::close(waiting_[i].fd);
  // Registrations still held were never accepted here: abandon them (their clients stay
  // plain).
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
// most: that one's oldest registration whose client has not withdrawn is abandoned
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

void Rendezvous::ReadOne(int conn, uint32_t uid, uint64_t now_ms, bool via_dir) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))];
  msghdr mh = sys::MessageOver(&iov, control, sizeof(control));
  const ssize_t n = sys::recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
    // Connected, message not written yet: wait for it, within bounds.
    size_t mine = 0;
    for (size_t i = 0; i < waiting_count_; ++i) mine += waiting_[i].uid == uid;
    if (waiting_count_ < kMaxWaiting && mine < kMaxWaitingPerUid && Watch(conn)) {
      waiting_[waiting_count_++] = Waiting{conn, uid, now_ms, via_dir};
    } else {
      sys::close(conn);  // its client sees EOF and stays plain
    }
    return;
  }
  // Whatever came, the descriptors are ours to close or keep; they go above the floor.
  // (Through the directory, or registered by its socket, a fifth: the client's TCP socket.)
  constexpr int kMostFds = 5;
  int fds[kMostFds] = {-1, -1, -1, -1, -1};
  int nfds = n >= 0 ? TakeFds(&mh, fds, kMostFds) : 0;  // (beyond kMostFds: closed)
  bool moved = true;
  for (int i = 0; i < std::min(nfds, kMostFds); ++i) {
    // (Never a plain close of what the client handed over: it may linger.)
    const int fd = fds[i];
    fds[i] = sys::DupAbove(fd, sys::HiddenFdFloor());
    if (fds[i] >= 0)
      sys::close(fd);  // (not the last reference: the duplicate holds the file)
    else
      sys::CloseHandedOver(fd);
    moved = moved && fds[i] >= 0;
  }
  if (nfds > kMostFds) nfds = kMostFds + 1;  // too many descriptors: malformed
  auto close_fds = [&fds] {
    for (int& fd : fds) {
      sys::CloseHandedOver(fd);  // (never blocks, whatever the client handed over)
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
  // No client port: registered by its socket, the fifth descriptor (same namespace only).
  const bool keyed = !via_dir && msg.reg.client.port == 0;
  const int expected = via_dir || keyed ? 5 : 4;
  uint64_t client_inode = 0;
  // A truncated control message means the kernel could not give us the descriptors (the
  // limit): the client must know.
  wire::DeclineReason why = wire::DeclineReason::kUnspecified;
  if ((mh.msg_flags & MSG_CTRUNC) || !moved) {
    why = wire::DeclineReason::kDescriptors;
  } else if (nfds != expected || msg.reg.fd_count != uint32_t(expected)) {
    SLIP_LOG(kWarn, "rendezvous: dropped a registration with %d descriptors", nfds);
    why = wire::DeclineReason::kBadRegion;
  } else if (keyed && (client_inode = SocketInode(fds[4])) == 0) {
    SLIP_LOG(kWarn, "rendezvous: dropped a registration without a port and without its socket");
    why = wire::DeclineReason::kBadRegion;
  } else if (via_dir &&
             (why = CheckAcrossNamespaces(msg.reg, fds[4])) != wire::DeclineReason::kUnspecified) {
    if (why == wire::DeclineReason::kBadRegion)
      SLIP_LOG(kWarn,
               "rendezvous: dropped a registration from uid %u through the directory "
               "for a connection that is not its own or not ours",
               unsigned(uid));
  } else if (CountForUid(uid) >= per_uid_ || (used_ >= capacity_ && !MakeRoomFor(uid))) {
    why = wire::DeclineReason::kBusy;
  }
  // A few registrations per 4-tuple (a forger's next to its real client's: accept() tells
  // them apart); those withdrawn or abandoned make room.
  // (Registered by its socket: a few per socket.)
  size_t same_tuple = 0;
  for (size_t i = 0; why == wire::DeclineReason::kUnspecified && i < used_;) {
    Registration& r = table_[i];
    if (keyed ? r.client_inode != client_inode
              : !(r.msg.client == msg.reg.client && r.msg.server == msg.reg.server)) {
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
  if (why == wire::DeclineReason::kUnspecified && IsLate(msg.reg, client_inode)) {
    // Its connection was accepted as plain before this registration was read (the drain
    // then was cut short): its client learns it at once rather than at its deadline.
    why = wire::DeclineReason::kNoRegistration;
  }
  if (why != wire::DeclineReason::kUnspecified) {
    close_fds();
    AnswerRegistration(conn, nonce, why);
    sys::close(conn);
    // Short of descriptors while someone holds more than its share: the next one finds room.
    if (why == wire::DeclineReason::kDescriptors) MakeRoomFor(uid);
    return;
  }
  Registration reg;
  reg.msg = msg.reg;
  reg.uid = uid;
  reg.received_ms = now_ms;
  // (Through the directory, the socket is kept: checked again at accept. Registered by
  // its socket, its inode is all we need: held, it would keep the client's connection
  // open after the client closed it.)
  if (keyed) {
    sys::CloseHandedOver(fds[4]);
  } else {
    reg.client_socket = fds[4];  // (-1 but through the directory)
  }
  reg.client_inode = client_inode;
  fds[4] = -1;
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
    channel =
        AcceptRegistration(msg.reg, fds, reg.anchor_slot, &proxy_a, &proxy_b, &reg.claim, &why,
                           /*across_namespaces=*/via_dir, listener_flags_);
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
    AnswerRegistration(
        conn, nonce,
        why == wire::DeclineReason::kUnspecified ? wire::DeclineReason::kResources : why);
    sys::close(conn);
    return;
  }
  reg.proxy_a = proxy_a;
  reg.answer = conn;  // answered when its connection is accepted, or the entry dropped
  if (reg.client_socket >= 0) ArmTimer(true);
  table_[used_++] = std::move(reg);
}

Rendezvous::DrainResult Rendezvous::DrainLocked(int budget) noexcept {
  const uint64_t now = sys::MonotonicMs();
  DrainResult result = DrainResult::kDone;
  epoll_event events[64];
  const int n = sys::epoll_wait(epoll_fd_, events, 64, 0);
  // Connections wait in the listener's backlog only when it says so (or the events did not
  // all fit): most drains find nothing, and skip the accept4 that would say EAGAIN.
  bool backlog = n == 64;
  bool dir_backlog = n == 64 && dir_count_ > 0;
  int i = 0;
  for (; i < n && budget > 0; ++i) {
    const int fd = events[i].data.fd;
    if (fd == listen_fd_) {
      backlog = true;
      continue;
    }
    if (IsDirName(fd)) {
      dir_backlog = true;
      continue;
    }
    if (fd == timer_fd_) {  // (ExpireLocked does what it is for, below)
      uint64_t ticks;
      (void)!sys::read(timer_fd_, &ticks, sizeof(ticks));
      next_expire_ms_ = 0;
      continue;
    }
    for (size_t w = 0; w < waiting_count_; ++w) {
      if (waiting_[w].fd != fd) continue;
      const Waiting waiting = waiting_[w];
      waiting_[w] = waiting_[--waiting_count_];
      sys::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      ReadOne(fd, waiting.uid, now, waiting.via_dir);
      --budget;
      break;
    }
  }
  // Events left unread (the budget ran out): they are still ready, for the next call.
  if (i < n) return DrainResult::kMore;
  if (backlog) result = AcceptQueued(listen_fd_, /*via_dir=*/false, &budget, now);
  for (size_t d = 0; dir_backlog && d < dir_count_ && result == DrainResult::kDone; ++d)
    result = AcceptQueued(dir_names_[d].fd, /*via_dir=*/true, &budget, now);
  ExpireLocked(now);
  return result;
}

Rendezvous::DrainResult Rendezvous::AcceptQueued(int listen_fd, bool via_dir, int* budget,
                                                 uint64_t now_ms) noexcept {
  for (;;) {
    if ((*budget)-- <= 0) return DrainResult::kMore;  // a burst (or a flood): come back later
    int conn = sys::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno != EMFILE && errno != ENFILE) return DrainResult::kDone;
      // The queued clients wait for an answer that cannot come now; they give up at their
      // deadline and stay plain. Logged once in a while, not once per client.
      SLIP_LOG(kWarn,
               "rendezvous: no descriptor to read registrations with; clients stay "
               "plain meanwhile");
      return DrainResult::kBlocked;
    }
    conn = sys::MoveAbove(conn, sys::HiddenFdFloor());
    if (conn < 0) continue;  // (closed: its client sees EOF and stays plain)
    ReadOne(conn, PeerUid(conn), now_ms, via_dir);
  }
}

void Rendezvous::ExpireLocked(uint64_t now_ms) noexcept {
  // (A look at every entry's claim: not at every step of a drain, which would make
  // reading a burst quadratic.)
  if (now_ms < next_expire_ms_) return;
  next_expire_ms_ = now_ms + kExpireEveryMs;
  bool across = false;  // registrations from the directory still wait
  for (size_t i = 0; i < used_;) {
    // A client that withdrew (its connection went to another process) will never be
    // accepted here; one waiting longer than anybody accepts is told so, and so is one
    // from another namespace whose connection went elsewhere (it cannot see that itself).
    Registration& r = table_[i];
    if (now_ms - r.received_ms <= kRegistrationTtlMs && r.ReadClaim() != Claim::kWithdrawn &&
        (r.client_socket < 0 || !GoneElsewhere(&r, now_ms))) {
      across = across || r.client_socket >= 0;
      ++i;
      continue;
    }
    table_[i].Abandon();
    RemoveAt(i);
  }
  ArmTimer(across);
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
  if (shared()) return false;  // accept() reads, in whichever process accepts
  // In steps, the lock let go between them, and none while an accept() waits for it: an
  // accept() reads what its connection needs itself, and must not wait for a burst (a
  // mutex is not fair: the control thread would take it back step after step).
  for (int read = 0; read < kDrainBudget; read += kTakeDrainBudget) {
    if (takers_.load(std::memory_order_acquire) > 0) return true;  // (back after it)
    std::lock_guard<std::mutex> lock(mu_);
    if (DrainLocked(kTakeDrainBudget) != DrainResult::kMore) return false;
  }
  return true;
}

bool Rendezvous::IsLate(const wire::Register& msg, uint64_t client_inode) noexcept {
  const uint64_t now = sys::MonotonicMs();
  for (size_t i = 0; i < std::size(late_); ++i) {
    Late& l = late_[i];
    if (l.until_ms <= now || !(l.server == msg.server)) continue;
    if (client_inode != 0 ? l.client_inode == client_inode : l.client == msg.client) {
      l.until_ms = 0;
      return true;
    }
  }
  return false;
}

void Rendezvous::NoteLate(const wire::Endpoint& client, const wire::Endpoint& server,
                          uint64_t client_inode) noexcept {
  late_[late_next_] = Late{client, server, client_inode, sys::MonotonicMs() + kLateMemoryMs};
  late_next_ = (late_next_ + 1) % std::size(late_);
}

bool Rendezvous::Take(const wire::Endpoint& client, const wire::Endpoint& server,
                      Registration* out) noexcept {
  // The connection's client socket as the kernel sees it (its owner, its inode), asked once
  // and only when a registration may be this connection's (a plain client's connection
  // costs no lookup): one counts only if it was made by that owner, or with that very
  // socket. (From another namespace the kernel here cannot see it: ENOENT.)
  SocketInfo owner;
  int owner_rc = 1;  // (not asked yet)
  auto ask_owner = [&]() -> const SocketInfo* {
    if (owner_rc == 1) {
      owner_rc = -ENOENT;
      sockaddr_storage local, remote;
      if (wire::SockaddrFromEndpoint(client, &local) && wire::SockaddrFromEndpoint(server, &remote))
        owner_rc = FindConnection(reinterpret_cast<sockaddr*>(&local),
                                  reinterpret_cast<sockaddr*>(&remote), &owner);
    }
    return owner_rc == 0 ? &owner : nullptr;
  };
  takers_.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard<std::mutex> lock(mu_);
  takers_.fetch_sub(1, std::memory_order_acq_rel);
  // The registration was queued before the SYN: read until it is in the table (the
  // control thread usually read it already), a little at a time, so that accept() claims
  // it soon after it returned from the kernel even behind a burst of registrations.
  size_t found[kMaxPerTuple];
  size_t count = 0;
  auto find = [&] {
    count = 0;
    for (size_t i = 0; i < used_ && count < kMaxPerTuple; ++i) {
      const Registration& r = table_[i];
      if (!(r.msg.server == server)) continue;
      if (r.client_inode != 0 ? ask_owner() && r.client_inode == owner.inode
                              : r.msg.client == client)
        found[count++] = i;
    }
  };
  bool complete = true;
  find();
  // (For a bounded time, not a count: a queue a flood left behind is mostly connections
  // already closed, cheap to read, with the registration behind them.)
  const uint64_t give_up_ms = sys::MonotonicMs() + kTakeSearchMs;
  if (count == 0 && shared() && siblings_) {
    // Forked workers: the registration may be a sibling's to pass on (shm/shared_listener.cc).
    auto owner_inode = [](void* ctx) -> uint64_t {
      const SocketInfo* info = (*static_cast<decltype(ask_owner)*>(ctx))();
      return info ? info->inode : 0;
    };
    complete = SearchSiblings(client, server, owner_inode, &ask_owner, give_up_ms);
    find();
  } else {
    const int step = shared() ? 1 : kTakeDrainBudget;  // (a sibling's stays queued for it)
    while (count == 0) {
      const DrainResult drained = DrainLocked(step);
      find();
      complete = drained == DrainResult::kDone;
      if (drained != DrainResult::kMore || sys::MonotonicMs() >= give_up_ms) break;
    }
  }
  if (count == 0) {
    // A registration sent before this connection's SYN is read by now, unless the drain
    // was cut short: then one may still come, and must be refused when it does.
    if (!complete) NoteLate(client, server, ask_owner() ? owner.inode : 0);
    return false;
  }
  // Anybody can register any 4-tuple: the registration that counts is the one made by the
  // owner of the TCP connection's client socket, as the kernel sees it (a forger of another
  // uid never gets a connection held for it, not even a plain client's that it predicted;
  // same-uid processes are not told apart, SECURITY.md). Registered by its socket, it was
  // found by that socket's inode: only a holder of the socket could hand it over. From
  // another namespace, where the kernel here cannot see the client socket, the one that
  // came with that very socket, handshake complete. The newest of those, if several.
  constexpr size_t kNone = SIZE_MAX;
  size_t pick = kNone;  // an index into table_
  for (size_t k = 0; k < count; ++k) {
    const Registration& r = table_[found[k]];
    bool proven = false;
    if (r.client_socket >= 0) {
      proven = LookAtClientSocket(r.client_socket, client, server) == ClientSocket::kConnected;
    } else if (r.client_inode != 0) {
      proven = true;  // (found by it)
    } else {
      proven = ask_owner() && r.uid == owner.uid;
    }
    if (proven && (pick == kNone || r.received_ms >= table_[pick].received_ms)) pick = found[k];
  }
  if (pick == kNone) {
    // Nobody who registered owns this connection (or the kernel could not say): plain.
    // Their clients stay plain too (abandoned).
    SLIP_LOG(kWarn,
             "rendezvous: %zu registration(s) for a connection whose client socket "
             "is none of theirs; plain",
             count);
    for (size_t k = count; k-- > 0;) {
      table_[found[k]].Abandon();
      RemoveAt(found[k]);
    }
    return false;
  }
  *out = std::move(table_[pick]);
  // (Held, the client's socket would keep its connection open after the client closed it.)
  sys::CloseHandedOver(out->client_socket);
  out->client_socket = -1;
  // The others can never carry this connection: they go (highest index first,
  // so that the indexes left stay valid).
  for (size_t k = count; k-- > 0;) {
    if (found[k] != pick) table_[found[k]].Abandon();
    RemoveAt(found[k]);
  }
  return true;
}

}  // namespace slip::shm
