// The verbs module's SO_REUSEPORT groups (docs/DESIGN.md "Servers that share a port", over
// verbs): which member of a group the SYN of a request will reach, and the directory where
// the holder of the group's port learns the rdma_cm port of another process's member.
//
// rdma_cm has one listener per port, and the first process of the group to listen holds
// it. A member in another process listens on rdma_cm at a port of its own and publishes
// it under an abstract AF_UNIX name of its TCP listening socket's inode; the holder, when
// the kernel's lookup names that socket for a request's 4-tuple, connects to the name,
// checks that the process answering runs as the uid that owns the socket (abstract names
// belong to nobody: a squatter of another uid is ignored, and the kernel keeps other uids
// out of the group anyway), reads the port and redirects the client there (a REJECT whose
// private data names the port). The client asks once more, at that port, and that
// process's own lookup decides again.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstdio>
#include <mutex>

#include "core/log.h"
#include "core/sock_diag.h"
#include "core/sys.h"
#include "verbs/module_impl.h"

namespace slip::verbs {

using namespace module_internal;

namespace {

// The holder waits this long for a member's process to answer (its progress thread), and
// keeps the answer (or its absence) this long.
constexpr int kAskTimeoutMs = 50;
constexpr uint64_t kMemberPortTtlMs = 1000;

// The abstract name (leading NUL) of a member's directory socket; returns its length.
socklen_t DirectoryName(uint16_t port, uint64_t inode, sockaddr_un* out) noexcept {
  *out = sockaddr_un{};
  out->sun_family = AF_UNIX;
  const int n =
      snprintf(out->sun_path + 1, sizeof(out->sun_path) - 1, "slipstream-verbs-group-v1:%u:%llu",
               unsigned(port), static_cast<unsigned long long>(inode));
  return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + size_t(n));
}

// Asks the directory of the member socket `inode` of port `port`, which must be held by
// `uid`, for its process's rdma_cm port.
bool AskMemberPort(uint16_t port, uint64_t inode, uint32_t uid, uint16_t* rdma_port) noexcept {
  sockaddr_un name;
  const socklen_t len = DirectoryName(port, inode, &name);
  // (Above the floor: the application never finds one of its numbers taken by this.)
  const int fd = sys::MoveHigh(sys::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0),
                               sys::HiddenFdFloor());
  if (fd < 0) return false;
  bool ok = false;
  ucred cred{};
  socklen_t clen = sizeof(cred);
  uint8_t answer[2];
  pollfd p{fd, POLLIN, 0};
  if (sys::connect(fd, reinterpret_cast<const sockaddr*>(&name), len) != 0) {
    // No such name: the member runs without Slipstream (or not verbs).
  } else if (sys::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != uid) {
    SLIP_LOG(kWarn,
             "verbs: the directory name of port %u's member %llu is held by pid %d, uid %u, "
             "not by the socket's owner (uid %u); ignored",
             unsigned(port), static_cast<unsigned long long>(inode), int(cred.pid),
             unsigned(cred.uid), unsigned(uid));
  } else if (sys::poll(&p, 1, kAskTimeoutMs) == 1 &&
             sys::recv(fd, answer, sizeof(answer), 0) == ssize_t(sizeof(answer))) {
    *rdma_port = uint16_t(answer[0] | answer[1] << 8);
    ok = *rdma_port != 0;
  }
  sys::close(fd);
  return ok;
}

}  // namespace

VerbsModule::MemberAnswer VerbsModule::MemberFor(Listener* listener, const Req& req,
                                                 uint16_t* port) noexcept {
  *port = 0;
  // The kernel's own listener lookup for the SYN this request announces (its hash of the
  // 4-tuple picks the member, as for the SYN itself). Where it cannot say (the tuple sits
  // in TIME_WAIT here, netlink fails), nobody's.
  sockaddr_storage server{}, client{};
  if (!wire::SockaddrFromEndpoint(req.server, &server) ||
      !wire::SockaddrFromEndpoint(req.client, &client))
    return MemberAnswer::kElsewhere;
  SocketInfo info;
  if (FindListener(reinterpret_cast<const sockaddr*>(&server), &info,
                   reinterpret_cast<const sockaddr*>(&client)) != 0 ||
      !info.listening)
    return MemberAnswer::kElsewhere;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const GroupMember& m : listener->members) {
      if (m.inode == info.inode) return MemberAnswer::kOurs;
    }
  }
  // (Inodes are unique while the socket lives; a port cached for a member that went sends
  // a client to a port nobody listens on any more: that connection is plain, no more.)
  const uint64_t now = sys::MonotonicMs();
  MemberPort* slot = &member_ports_[0];
  for (MemberPort& m : member_ports_) {
    if (m.inode == info.inode && now < m.until_ms) {
      *port = m.port;
      return m.port ? MemberAnswer::kRedirect : MemberAnswer::kElsewhere;
    }
    if (m.until_ms < slot->until_ms) slot = &m;  // the stalest is replaced
  }
  const bool answered = AskMemberPort(listener->port, info.inode, info.uid, port);
  *slot = MemberPort{info.inode, answered ? *port : uint16_t(0), now + kMemberPortTtlMs};
  return answered ? MemberAnswer::kRedirect : MemberAnswer::kElsewhere;
}

bool VerbsModule::PublishMember(Listener* listener, GroupMember* member) noexcept {
  sockaddr_un name;
  const socklen_t len = DirectoryName(listener->port, member->inode, &name);
  const int fd = sys::MoveHigh(sys::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0),
                               sys::HiddenFdFloor());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = DirectoryKey(fd);
  if (fd < 0 || sys::bind(fd, reinterpret_cast<const sockaddr*>(&name), len) != 0 ||
      sys::listen(fd, 64) != 0 || sys::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    SLIP_LOG(kWarn,
             "verbs: cannot publish port %u's member %llu for the group's holder (%s): its "
             "connections stay plain over RDMA",
             unsigned(listener->port), static_cast<unsigned long long>(member->inode),
             strerror(errno));
    if (fd >= 0) sys::close(fd);
    return false;
  }
  member->directory_fd = fd;
  return true;
}

void VerbsModule::UnpublishMember(GroupMember* member) noexcept {
  if (member->directory_fd < 0) return;
  // (A fork child's epoll is the parent's: its registration stays the parent's.)
  if (!forked_.load()) sys::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, member->directory_fd, nullptr);
  sys::close(member->directory_fd);
  member->directory_fd = -1;
}

void VerbsModule::TakeOverPorts() noexcept {
  // Every half second per member process that does not hold its group's port: one try to
  // bind it (a create and a failed bind while the holder lives). Under mu_, so that
  // Unlisten cannot delete the listener meanwhile (rdma_cm calls take no lock of ours).
  std::lock_guard<std::mutex> lock(mu_);
  if (forked_.load()) return;
  for (Listener* l : listeners_) {
    if (!l->group || l->rdma_port == l->port || l->port_id || !l->id) continue;
    if (BindListener(cm_channel_, l, l->port, &l->port_id) != 0) continue;
    // Our own members' requests come here now; the others' we redirect, as the holder did.
    // (Those sent to our own port before this keep coming there too.)
    SLIP_LOG(kInfo, "verbs: port %u's rdma_cm listener is this process's now (its holder went)",
             l->port);
  }
}

void VerbsModule::ServeDirectory(int fd) noexcept {
  // Under mu_: Unlisten closes directory sockets under it, so `fd` is still ours here (a
  // number reused meanwhile by the application is never accepted on).
  std::lock_guard<std::mutex> lock(mu_);
  uint16_t rdma_port = 0, listener_port = 0;
  for (const Listener* l : listeners_) {
    for (const GroupMember& m : l->members) {
      if (m.directory_fd != fd) continue;
      rdma_port = l->rdma_port;
      listener_port = l->port;
    }
  }
  if (rdma_port == 0) return;
  const uint8_t answer[2] = {uint8_t(rdma_port), uint8_t(rdma_port >> 8)};
  for (;;) {
    const int c = sys::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c >= 0) {
      sys::send(c, answer, sizeof(answer), MSG_NOSIGNAL);
      sys::close(c);
      continue;
    }
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return;  // all answered
    // (EMFILE, say: the socket stays readable, and this thread would spin on it.) Deaf from
    // now on: the holder's asks time out, and this member's connections are plain.
    SLIP_LOG(kWarn,
             "verbs: cannot answer the holder of port %u's group (%s); this member's "
             "connections stay plain over RDMA",
             unsigned(listener_port), strerror(errno));
    epoll_event ev{};
    ev.data.u64 = DirectoryKey(fd);
    sys::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
    return;
  }
}

}  // namespace slip::verbs
