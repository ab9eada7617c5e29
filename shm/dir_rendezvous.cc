// Rendezvous through a shared directory (shm/dir_rendezvous.h): names, reachable
// addresses and the proofs, and the listener's side (Rendezvous' names in the directory,
// and its checks of the registrations that come through them).
#include "shm/dir_rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/tcp.h>  // (glibc's tcp_info lacks tcpi_segs_out)
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/local_address.h"
#include "core/log.h"
#include "core/sock_diag.h"
#include "core/sys.h"
#include "shm/region.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

// TCP states (the kernel's include/net/tcp_states.h; uapi has no header for them).
constexpr uint8_t kTcpSynSent = 2;
constexpr uint8_t kTcpClose = 7;
constexpr uint8_t kTcpListen = 10;

// A registration from another namespace whose connection this process accepted is taken
// in the same accept() call: seen accepted and still here this much later, another process
// accepted it (its client is told, as a client here sees it itself: shm/channel.cc).
constexpr uint64_t kAcceptedElsewhereMs = 100;

bool IsWildcard(const wire::Endpoint& ep) noexcept {
  static const uint8_t kZero[16] = {};
  return std::memcmp(ep.addr, kZero, ep.family == 4 ? 4 : 16) == 0;
}

// fe80::/10: reached only on one link, with a scope the name cannot carry.
bool IsLinkLocal(const wire::Endpoint& ep) noexcept {
  return ep.family == 6 && ep.addr[0] == 0xfe && (ep.addr[1] & 0xc0) == 0x80;
}

bool SameAddress(const wire::Endpoint& a, const wire::Endpoint& b) noexcept {
  return a.family == b.family && std::memcmp(a.addr, b.addr, 16) == 0;
}

// Whether a name nobody serves is left at `path` (its listener died without removing it).
bool IsStale(const sockaddr_un& path, socklen_t len) noexcept {
  const int probe = sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (probe < 0) return false;
  const bool stale = sys::connect(probe, reinterpret_cast<const sockaddr*>(&path), len) != 0 &&
                     errno == ECONNREFUSED;
  sys::close(probe);
  return stale;
}

}  // namespace

bool DirRendezvousName(const char* dir, const wire::Endpoint& server, sockaddr_un* out,
                       socklen_t* len) noexcept {
  char text[INET6_ADDRSTRLEN];
  if ((server.family != 4 && server.family != 6) ||
      !inet_ntop(server.family == 4 ? AF_INET : AF_INET6, server.addr, text, sizeof(text)))
    return false;
  std::memset(out, 0, sizeof(*out));
  out->sun_family = AF_UNIX;
  // "slip3": the registration protocol of the abstract names (shm/rendezvous_name.cc),
  // with the client's TCP socket as a fifth descriptor.
  const int n = std::snprintf(out->sun_path, sizeof(out->sun_path), "%s/slip3-%s-%u", dir, text,
                              unsigned(server.port));
  if (n <= 0 || size_t(n) >= sizeof(out->sun_path)) return false;
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + size_t(n) + 1);
  return true;
}

size_t ReachableEndpoints(const wire::Endpoint& local, bool v6only, wire::Endpoint* out,
                          size_t max) noexcept {
  if (max == 0 || IsLoopback(local)) return 0;
  if (!IsWildcard(local)) {
    out[0] = local;
    return 1;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return 0;
  size_t count = 0;
  for (ifaddrs* it = list; it && count < max; it = it->ifa_next) {
    wire::Endpoint ep;
    if (!it->ifa_addr || !wire::EndpointFromSockaddr(it->ifa_addr, &ep)) continue;
    const bool family_ok = ep.family == local.family || (local.family == 6 && !v6only);
    if (!family_ok || IsLoopback(ep) || IsLinkLocal(ep)) continue;
    ep.port = local.port;
    bool seen = false;
    for (size_t i = 0; i < count; ++i) seen = seen || SameAddress(out[i], ep);
    if (!seen) out[count++] = ep;
  }
  freeifaddrs(list);
  return count;
}

bool SourceToward(const sockaddr* dest, sockaddr_storage* out) noexcept {
  const socklen_t len =
      dest->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : socklen_t(sizeof(sockaddr_in));
  // A UDP socket's connect() only asks the routing table.
  const int probe = sys::socket(dest->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return false;
  socklen_t out_len = sizeof(*out);
  const bool ok = sys::connect(probe, dest, len) == 0 &&
                  sys::getsockname(probe, reinterpret_cast<sockaddr*>(out), &out_len) == 0;
  sys::close(probe);
  if (!ok) return false;
  if (out->ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(out)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(out)->sin6_port = 0;
  return true;
}

ClientSocket LookAtClientSocket(int sock, const wire::Endpoint& client,
                                const wire::Endpoint& server) noexcept {
  int type = 0, protocol = 0;
  socklen_t len = sizeof(int);
  if (sys::getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
    return ClientSocket::kNotIt;
  len = sizeof(int);
  if (sys::getsockopt(sock, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 ||
      protocol != IPPROTO_TCP)
    return ClientSocket::kNotIt;
  wire::Endpoint local;
  if (!LocalEndpoint(sock, &local) || !(local == client)) return ClientSocket::kNotIt;
  tcp_info info{};
  len = sizeof(info);
  if (sys::getsockopt(sock, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return ClientSocket::kNotIt;
  // (Bound and not connecting yet: the client registers before its SYN, as here.)
  if (info.tcpi_state == kTcpSynSent || (info.tcpi_state == kTcpClose && info.tcpi_segs_out == 0))
    return ClientSocket::kConnecting;
  // (The kernel names the peer only once the handshake is complete.)
  wire::Endpoint peer;
  if (info.tcpi_state == kTcpClose || info.tcpi_state == kTcpListen || !PeerEndpoint(sock, &peer) ||
      !(peer == server))
    return ClientSocket::kNotIt;
  return ClientSocket::kConnected;
}

// ----------------------------------------------------------------------------- listener

size_t Rendezvous::PublishInDir(const char* dir, const wire::Endpoint* reached,
                                size_t count) noexcept {
  const int floor = sys::HiddenFdFloor();
  std::lock_guard<std::mutex> lock(mu_);
  static_assert(sizeof(dir_names_) / sizeof(dir_names_[0]) == kMaxDirNames);
  for (size_t i = 0; i < count && dir_count_ < kMaxDirNames; ++i) {
    DirName& name = dir_names_[dir_count_];
    name = DirName();
    name.server = reached[i];
    if (!DirRendezvousName(dir, reached[i], &name.path, &name.len)) continue;
    const auto* path = reinterpret_cast<const sockaddr*>(&name.path);
    name.fd = sys::MoveAbove(sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0),
                             floor);
    if (name.fd < 0) break;
    int rc = sys::bind(name.fd, path, name.len);
    if (rc != 0 && errno == EADDRINUSE && IsStale(name.path, name.len)) {
      unlink(name.path.sun_path);  // (a dead listener's; a live one's is left alone)
      rc = sys::bind(name.fd, path, name.len);
    }
    const bool bound = rc == 0;
    // Anybody may connect (registrations are bounded per uid); whom a client trusts is the
    // client's check (TrustedInDir).
    if (rc == 0) rc = chmod(name.path.sun_path, 0666);
    if (rc == 0) rc = sys::listen(name.fd, 4096);
    if (rc == 0 && !Watch(name.fd)) rc = -1;
    if (rc != 0) {
      const int err = errno;
      if (err == EADDRINUSE)
        SLIP_LOG(kInfo, "rendezvous %s is held by another listener; not published",
                 name.path.sun_path);
      else
        SLIP_LOG(kWarn,
                 "cannot publish rendezvous %s (%s): clients in other network "
                 "namespaces stay plain",
                 name.path.sun_path, strerror(err));
      sys::close(name.fd);
      if (bound) unlink(name.path.sun_path);
      name = DirName();
      continue;
    }
    ++dir_count_;
  }
  if (dir_count_ > 0) {
    publisher_ = getpid();
    if (timer_fd_ < 0) {
      timer_fd_ =
          sys::MoveAbove(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK), floor);
      if (timer_fd_ >= 0 && !Watch(timer_fd_)) {
        sys::close(timer_fd_);
        timer_fd_ = -1;
      }
    }
    if (timer_fd_ < 0) {
      // (Without it a client whose connection went elsewhere would wait for its own 30 s.)
      SLIP_LOG(kWarn, "rendezvous: no timer; not publishing in %s", dir);
      WithdrawDirNames(/*unlink_names=*/true);
    }
  }
  return dir_count_;
}

void Rendezvous::ArmTimer(bool on) noexcept {
  if (timer_fd_ < 0 || on == timer_armed_) return;
  constexpr long kTickNs = 20'000'000;  // kExpireEveryMs
  itimerspec spec{};
  if (on) spec.it_interval.tv_nsec = spec.it_value.tv_nsec = kTickNs;
  if (timerfd_settime(timer_fd_, 0, &spec, nullptr) == 0) timer_armed_ = on;
}

bool Rendezvous::IsDirName(int fd) const noexcept {
  for (size_t i = 0; i < dir_count_; ++i) {
    if (dir_names_[i].fd == fd) return true;
  }
  return false;
}

void Rendezvous::WithdrawDirNames(bool unlink_names) noexcept {
  for (size_t i = 0; i < dir_count_; ++i) {
    DirName& name = dir_names_[i];
    // Clients already queued are told at once (EOF: they stay plain), not left waiting for
    // an answer nobody reads. (A process that only inherited the names leaves them and
    // their queue to the publisher.)
    for (bool drain = unlink_names && unlink(name.path.sun_path) == 0; drain;) {
      const int conn = sys::accept4(name.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) break;
      sys::close(conn);
    }
    sys::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, name.fd, nullptr);
    sys::close(name.fd);
    name = DirName();
  }
  dir_count_ = 0;
}

void Rendezvous::Share() noexcept {
  if (shared_.exchange(true, std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  listener_flags_ |= kListenerShared;  // (its clients wait less for a sibling's accept)
  // (Whichever process shares first removes the names: the others' copies are the same.)
  WithdrawDirNames(/*unlink_names=*/true);
  // What came through them is not watched any more either: those clients go plain now.
  for (size_t i = 0; i < used_;) {
    if (table_[i].client_socket < 0) {
      ++i;
      continue;
    }
    table_[i].Abandon();
    RemoveAt(i);
  }
  for (size_t w = 0; w < waiting_count_;) {
    if (!waiting_[w].via_dir) {
      ++w;
      continue;
    }
    sys::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, waiting_[w].fd, nullptr);  // (shared since fork)
    sys::close(waiting_[w].fd);
    waiting_[w] = waiting_[--waiting_count_];
  }
  ArmTimer(false);
}

wire::DeclineReason Rendezvous::CheckAcrossNamespaces(const wire::Register& msg,
                                                      int client_socket) noexcept {
  // The server end must be one of the names we published, and the client socket one of
  // this 4-tuple (its handshake may not have started yet): anything else is not ours.
  bool published = false;
  for (size_t i = 0; i < dir_count_; ++i)
    published = published || dir_names_[i].server == msg.server;
  if (!published ||
      LookAtClientSocket(client_socket, msg.client, msg.server) == ClientSocket::kNotIt)
    return wire::DeclineReason::kBadRegion;
  // Which listener the SYN will reach is this namespace's kernel's choice: for an
  // SO_REUSEPORT group, maybe another member, which has no registration (the client could
  // not ask: it is in another namespace). Then the connection is plain from the start.
  sockaddr_storage dest, source;
  if (!wire::SockaddrFromEndpoint(msg.server, &dest) ||
      !wire::SockaddrFromEndpoint(msg.client, &source))
    return wire::DeclineReason::kBadRegion;
  const auto* to = reinterpret_cast<sockaddr*>(&dest);
  const auto* from = reinterpret_cast<sockaddr*>(&source);
  SocketInfo found;
  if (FindListener(to, &found, from) == 0)
    return found.inode == listener_inode_ ? wire::DeclineReason::kUnspecified
                                          : wire::DeclineReason::kNoRegistration;
  // The SYN came first: the lookup finds its connection, queued or accepted, not the
  // listener. Whose it is shows at accept (Take) or to GoneElsewhere.
  return FindConnection(to, from, &found) == 0 ? wire::DeclineReason::kUnspecified
                                               : wire::DeclineReason::kNoRegistration;
}

bool Rendezvous::GoneElsewhere(Registration* r, uint64_t now_ms) noexcept {
  switch (LookAtClientSocket(r->client_socket, r->msg.client, r->msg.server)) {
    case ClientSocket::kConnecting:
      return false;
    case ClientSocket::kNotIt:
      return true;  // closed or reset before anybody took it
    case ClientSocket::kConnected:
      break;
  }
  // The client's SYN was answered: by this namespace (its end is here, queued or accepted)
  // or by another one with the same address (then nothing here ever takes it).
  sockaddr_storage local, remote;
  SocketInfo end;
  if (!wire::SockaddrFromEndpoint(r->msg.server, &local) ||
      !wire::SockaddrFromEndpoint(r->msg.client, &remote))
    return true;
  const int rc = FindConnection(reinterpret_cast<sockaddr*>(&local),
                                reinterpret_cast<sockaddr*>(&remote), &end);
  if (rc == -ENOENT) return true;
  if (rc != 0 || end.inode == 0) return false;  // (unknown, or queued: it may yet come)
  if (r->accepted_seen_ms == 0) r->accepted_seen_ms = now_ms;
  return now_ms - r->accepted_seen_ms >= kAcceptedElsewhereMs;
}

}  // namespace slip::shm
