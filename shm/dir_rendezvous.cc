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

#include "core/config.h"
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

// The first directory the process trusted, kept (never freed: any thread may be using it).
struct KeptDir {
  char path[Config::kMaxRendezvousDirLength + 1];
  TrustedDir dir;
};
std::atomic<KeptDir*> g_kept{nullptr};
std::atomic<bool> g_untrusted_said{false};

}  // namespace

bool RendezvousDir::Open(const char* path) noexcept {
  KeptDir* kept = g_kept.load(std::memory_order_acquire);
  if (kept && std::strcmp(kept->path, path) == 0 && kept->dir.StillValid()) {
    kept_ = &kept->dir;
    return true;
  }
  const int floor = sys::HiddenFdFloor();
  PathVerdict verdict;
  if (!own_.Open(path, floor, &verdict)) {
    if (!g_untrusted_said.exchange(true, std::memory_order_relaxed))
      SLIP_LOG(kWarn,
               "SLIP_RENDEZVOUS_DIR %s is not trusted: %s; connections to other network "
               "namespaces stay plain (untrusted_rendezvous)",
               path, verdict.why);
    return false;
  }
  if (!kept && std::strlen(path) < sizeof(KeptDir::path)) {
    auto* fresh = new (std::nothrow) KeptDir;
    if (fresh && own_.Duplicate(floor, &fresh->dir)) {
      std::strcpy(fresh->path, path);
      if (g_kept.compare_exchange_strong(kept, fresh, std::memory_order_acq_rel)) fresh = nullptr;
    }
    delete fresh;  // (none made, or another thread's is kept: nobody saw this one)
  }
  return true;
}

bool DirEntryName(const wire::Endpoint& server, char* out, size_t len) noexcept {
  char text[INET6_ADDRSTRLEN];
  if ((server.family != 4 && server.family != 6) ||
      !inet_ntop(server.family == 4 ? AF_INET : AF_INET6, server.addr, text, sizeof(text)))
    return false;
  // "slip3": the registration protocol of the abstract names (shm/rendezvous_name.cc),
  // with the client's TCP socket as a fifth descriptor.
  const int n = std::snprintf(out, len, "slip3-%s-%u", text, unsigned(server.port));
  return n > 0 && size_t(n) < len;
}

bool TrustedEntry(const TrustedDir& dir, const struct stat& st, uid_t peer) noexcept {
  return S_ISSOCK(st.st_mode) && st.st_uid == peer && TrustedInDir(peer, geteuid(), dir.owner());
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

size_t Rendezvous::PublishInDir(const TrustedDir& dir, const wire::Endpoint* reached,
                                size_t count) noexcept {
  const int floor = sys::HiddenFdFloor();
  std::lock_guard<std::mutex> lock(mu_);
  static_assert(sizeof(dir_names_) / sizeof(dir_names_[0]) == kMaxDirNames);
  static_assert(sizeof(DirName::entry) == kDirEntryNameMax);
  if (!dir_.is_open() && !dir.Duplicate(floor, &dir_)) {
    SLIP_LOG(kWarn, "rendezvous: no descriptor for SLIP_RENDEZVOUS_DIR; not publishing there");
    return 0;
  }
  for (size_t i = 0; i < count && dir_count_ < kMaxDirNames; ++i) {
    DirName& name = dir_names_[dir_count_];
    name = DirName();
    name.server = reached[i];
    sockaddr_un path;
    socklen_t len;
    if (!DirEntryName(reached[i], name.entry, sizeof(name.entry)) ||
        !dir_.Address(name.entry, &path, &len))
      continue;
    const auto* addr = reinterpret_cast<const sockaddr*>(&path);
    name.fd = sys::MoveAbove(sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0),
                             floor);
    if (name.fd < 0) break;
    // (bind never follows a link at the name: whatever is there, it fails.)
    int rc = sys::bind(name.fd, addr, len);
    struct stat st;
    if (rc != 0 && errno == EADDRINUSE && dir_.Stat(name.entry, &st) == 0 && S_ISSOCK(st.st_mode) &&
        IsStale(path, len)) {
      unlinkat(dir_.fd(), name.entry, 0);  // (a dead listener's; a live one's is left alone)
      rc = sys::bind(name.fd, addr, len);
    }
    const bool bound = rc == 0;
    if (bound) name.inode = dir_.Stat(name.entry, &st) == 0 ? st.st_ino : 0;
    // Anybody may connect (registrations are bounded per uid); whom a client trusts is the
    // client's check (TrustedEntry).
    if (rc == 0 && (rc = dir_.OpenSocketToAll(name.entry)) != 0) errno = -rc;
    if (rc == 0) rc = sys::listen(name.fd, 4096);
    if (rc == 0 && !Watch(name.fd)) rc = -1;
    if (rc != 0) {
      const int err = errno;
      if (err == EADDRINUSE)
        SLIP_LOG(kInfo, "rendezvous %s is held by another listener; not published", name.entry);
      else
        SLIP_LOG(kWarn,
                 "cannot publish rendezvous %s (%s): clients in other network "
                 "namespaces stay plain",
                 name.entry, strerror(err));
      sys::close(name.fd);
      if (bound) dir_.RemoveSocket(name.entry, name.inode);
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
      SLIP_LOG(kWarn, "rendezvous: no timer; not publishing in SLIP_RENDEZVOUS_DIR");
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
    const bool removed = unlink_names && dir_.RemoveSocket(name.entry, name.inode);
    for (bool drain = removed; drain;) {
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
