#include "core/sock_diag.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/no_destructor.h"
#include "core/sys.h"

namespace slip {

namespace {

struct Netlink {
  std::mutex mu;
  int fd = -1;
  pid_t owner = 0;  // the process that opened fd: a fork child must not share it
  uint32_t seq = 0;
};

Netlink& Get() noexcept {
  static NoDestructor<Netlink> nl;  // used until the process ends
  return *nl;
}

// The socket, opened on first use (and again in a fork child, whose copy of the parent's
// would receive the parent's answers).
int SocketLocked(Netlink& nl) noexcept {
  const pid_t pid = getpid();
  if (nl.fd >= 0 && nl.owner == pid) return nl.fd;
  if (nl.fd >= 0) sys::close(nl.fd);
  nl.fd = -1;
  int fd = sys::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return -errno;
  const int high = sys::MoveAbove(fd, sys::HiddenFdFloor());
  if (high < 0) return -errno;
  nl.fd = high;
  nl.owner = pid;
  return nl.fd;
}

// Fills one side of a lookup key: the address and port of `sa` (IPv4 as the kernel files
// it: a v4-mapped IPv6 address is looked up in the IPv4 table, which includes dual-stack
// IPv6 listeners). Returns the family, or -1 for anything else.
int KeyFor(const sockaddr* sa, __be32* addr, __be16* port, uint32_t* scope) noexcept {
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    *port = in->sin_port;
    std::memcpy(addr, &in->sin_addr, 4);
    return AF_INET;
  }
  if (sa->sa_family != AF_INET6) return -1;
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
  *port = in6->sin6_port;
  if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
    std::memcpy(addr, &in6->sin6_addr.s6_addr[12], 4);
    return AF_INET;
  }
  std::memcpy(addr, &in6->sin6_addr, 16);
  if (scope) *scope = in6->sin6_scope_id;
  return AF_INET6;
}

// The socket whose local end is `local` and remote end `remote` (null: a listener, which
// has none), as the kernel finds it for a packet coming from `remote`.
bool RequestFor(const sockaddr* local, const sockaddr* remote, inet_diag_req_v2* req,
                uint8_t protocol = IPPROTO_TCP) noexcept {
  std::memset(req, 0, sizeof(*req));
  req->sdiag_protocol = protocol;
  req->idiag_states = ~0u;
  req->id.idiag_cookie[0] = req->id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  const int family = KeyFor(local, req->id.idiag_src, &req->id.idiag_sport, &req->id.idiag_if);
  if (family < 0) return false;
  if (remote && KeyFor(remote, req->id.idiag_dst, &req->id.idiag_dport, nullptr) != family)
    return false;
  req->sdiag_family = uint8_t(family);
  return true;
}

// The error an answer carries, or -EAGAIN when `h` is a data message.
int ErrorOf(const nlmsghdr* h) noexcept {
  if (h->nlmsg_type != NLMSG_ERROR) return -EAGAIN;
  if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) return -EPROTO;
  const int err = static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
  return err < 0 ? err : -EPROTO;
}

// Reads one answer to request `seq` out of `buf` (kernel bytes, still checked: lengths
// bound every read).
int ParseAnswer(const uint8_t* buf, size_t len, uint32_t seq, SocketInfo* out) noexcept {
  for (auto* h = reinterpret_cast<const nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
    if (h->nlmsg_seq != seq) continue;  // a late answer to an earlier request
    if (int err = ErrorOf(h); err != -EAGAIN) return err;
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg)))
      return -EPROTO;
    const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
    *out = SocketInfo{};
    if (m->idiag_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&out->local);
      in->sin_family = AF_INET;
      in->sin_port = m->id.idiag_sport;
      std::memcpy(&in->sin_addr, m->id.idiag_src, 4);
    } else if (m->idiag_family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&out->local);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = m->id.idiag_sport;
      std::memcpy(&in6->sin6_addr, m->id.idiag_src, 16);
    } else {
      return -EPROTO;
    }
    out->uid = m->idiag_uid;
    out->inode = m->idiag_inode;
    int attrs = int(h->nlmsg_len) - int(NLMSG_LENGTH(sizeof(*m)));
    for (auto* a = reinterpret_cast<const rtattr*>(m + 1); RTA_OK(a, attrs);
         a = RTA_NEXT(a, attrs)) {
      if (a->rta_type == INET_DIAG_SKV6ONLY && RTA_PAYLOAD(a) >= 1)
        out->v6only = *static_cast<const uint8_t*>(RTA_DATA(a)) != 0;
    }
    out->listening = m->idiag_state == 10;  // TCP_LISTEN
    return 0;
  }
  return -EAGAIN;
}

// Sends `request` (a complete netlink message) and hands the answer with its sequence
// number to `parse` (-EAGAIN from it: not this answer, read on).
template <typename Request, typename Parse>
int Exchange(Request* request, Parse parse) noexcept {
  Netlink& nl = Get();
  std::lock_guard<std::mutex> lock(nl.mu);
  const int fd = SocketLocked(nl);
  if (fd < 0) return fd;
  request->header.nlmsg_len = sizeof(*request);
  request->header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  request->header.nlmsg_flags = NLM_F_REQUEST;
  request->header.nlmsg_seq = ++nl.seq;
  if (sys::send(fd, request, sizeof(*request), MSG_NOSIGNAL) != ssize_t(sizeof(*request)))
    return errno ? -errno : -EIO;
  // The kernel answers inside send(); skip what is left of earlier, abandoned requests.
  alignas(nlmsghdr) uint8_t buf[4096];
  for (int tries = 0; tries < 8; ++tries) {
    ssize_t n = sys::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? -errno : -EPROTO;
    int rc = parse(buf, size_t(n), request->header.nlmsg_seq);
    if (rc != -EAGAIN) return rc;
  }
  return -EPROTO;
}

int ParseUnixPeer(const uint8_t* buf, size_t len, uint32_t seq, uint64_t* peer,
                  int* type) noexcept {
  for (auto* h = reinterpret_cast<const nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
    if (h->nlmsg_seq != seq) continue;
    if (int err = ErrorOf(h); err != -EAGAIN) return err;
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(unix_diag_msg)))
      return -EPROTO;
    const auto* m = static_cast<const unix_diag_msg*>(NLMSG_DATA(h));
    if (type) *type = m->udiag_type;
    int attrs = int(h->nlmsg_len) - int(NLMSG_LENGTH(sizeof(*m)));
    for (auto* a = reinterpret_cast<const rtattr*>(m + 1); RTA_OK(a, attrs);
         a = RTA_NEXT(a, attrs)) {
      if (a->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
        *peer = *static_cast<const uint32_t*>(RTA_DATA(a));
        return 0;
      }
    }
    return -ENOENT;
  }
  return -EAGAIN;
}

}  // namespace

int FindListener(const sockaddr* dest, SocketInfo* out, const sockaddr* source) noexcept {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 body;
  } request{};
  if (!RequestFor(dest, source, &request.body)) return -EAFNOSUPPORT;
  const int rc = Exchange(&request, [out](const uint8_t* buf, size_t len, uint32_t seq) {
    return ParseAnswer(buf, len, seq, out);
  });
  // The lookup finds the socket the packet would reach: only a listener counts (from a
  // bound, unconnected source nothing else can match).
  return rc == 0 && !out->listening ? -ENOENT : rc;
}

int FindConnection(const sockaddr* local, const sockaddr* remote, SocketInfo* out) noexcept {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 body;
  } request{};
  if (!RequestFor(local, remote, &request.body)) return -EAFNOSUPPORT;
  const int rc = Exchange(&request, [out](const uint8_t* buf, size_t len, uint32_t seq) {
    return ParseAnswer(buf, len, seq, out);
  });
  return rc == 0 && out->listening ? -ENOENT : rc;
}

int FindUdpSender(const sockaddr* receiver, const sockaddr* sender, SocketInfo* out) noexcept {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 body;
  } request{};
  // udp_diag looks up the socket a datagram from the request's source to its destination
  // reaches: from us (the receiver) to the sender, the sender's own socket.
  if (!RequestFor(receiver, sender, &request.body, IPPROTO_UDP)) return -EAFNOSUPPORT;
  return Exchange(&request, [out](const uint8_t* buf, size_t len, uint32_t seq) {
    return ParseAnswer(buf, len, seq, out);
  });
}

int UnixPeer(uint64_t inode, uint64_t* peer, int* type) noexcept {
  if (inode > UINT32_MAX) return -ENOENT;  // unix_diag names sockets by 32-bit inode
  struct {
    nlmsghdr header;
    unix_diag_req body;
  } request{};
  request.body.sdiag_family = AF_UNIX;
  request.body.udiag_states = ~0u;
  request.body.udiag_ino = uint32_t(inode);
  request.body.udiag_show = UDIAG_SHOW_PEER;
  request.body.udiag_cookie[0] = request.body.udiag_cookie[1] = ~0u;  // no cookie check
  return Exchange(&request, [peer, type](const uint8_t* buf, size_t len, uint32_t seq) {
    return ParseUnixPeer(buf, len, seq, peer, type);
  });
}

}  // namespace slip
