// The client side of shm: finding and verifying the rendezvous, building the region and
// proxies, registering, and the client's channel.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sock_diag.h"
#include "core/sys.h"
#include "shm/dir_rendezvous.h"
#include "shm/fd_passing.h"
#include "shm/region.h"
#include "shm/region_file.h"
#include "shm/rendezvous_name.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

void CloseIf(int* fd) noexcept {
  if (*fd >= 0) sys::close(*fd);
  *fd = -1;
}

// A rendezvous socket connected to `name`, above the floor; -errno on failure: -EAGAIN (its
// queue is full), -ENOENT (no such path name), -ECONNREFUSED (nobody serves it, or any
// other failure to connect), or what socket(2) or the move said (-EMFILE...). Moved above
// the floor only once connected: a plain peer's connect costs one refused connect(2).
int ConnectRendezvous(const sockaddr_un& name, socklen_t len) noexcept {
  const int sock = sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0) return -errno;
  if (sys::connect(sock, reinterpret_cast<const sockaddr*>(&name), len) != 0) {
    const int err = errno;
    sys::close(sock);
    return err == EAGAIN || err == ENOENT ? -err : -ECONNREFUSED;
  }
  const int high = sys::MoveAbove(sock, sys::HiddenFdFloor());
  return high < 0 ? -errno : high;
}

// The rendezvous at `name` must belong to the owner of the listener the SYN will reach.
// Same-uid processes are not told apart (they may ptrace each other anyway; SECURITY.md).
bool OwnedByListener(int sock, const SocketInfo& listener, const sockaddr_un& name,
                     socklen_t len) noexcept {
  ucred peer{};
  socklen_t plen = sizeof(peer);
  if (sys::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &plen) != 0) return false;
  if (peer.uid == listener.uid) return true;
  SLIP_LOG(kWarn,
           "rendezvous %.*s is held by pid %d uid %u, but the TCP listener belongs to uid %u: "
           "not registering there (plain TCP)",
           int(len - offsetof(sockaddr_un, sun_path) - 1), name.sun_path + 1, int(peer.pid),
           unsigned(peer.uid), unsigned(listener.uid));
  return false;
}

}  // namespace

Offer::~Offer() {
  if (region) munmap(region, region_size);
  CloseIf(&memfd);
  CloseIf(&client_a);
  CloseIf(&client_b);
  CloseIf(&server_a);
  CloseIf(&server_b);
  CloseIf(&anchor_slot);
}

namespace {
// Lock-free: a race at worst notes an inode twice or overwrites a recent entry early.
constexpr size_t kSoloListeners = 64;
std::atomic<uint64_t> solo_listeners[kSoloListeners];
std::atomic<uint32_t> solo_next{0};
}  // namespace

void NoteSoloListener(uint64_t inode) noexcept {
  if (inode == 0 || IsSoloListener(inode)) return;
  const uint32_t slot = solo_next.fetch_add(1, std::memory_order_relaxed) % kSoloListeners;
  solo_listeners[slot].store(inode, std::memory_order_relaxed);
}

bool IsSoloListener(uint64_t inode) noexcept {
  if (inode == 0) return false;
  for (const auto& entry : solo_listeners)
    if (entry.load(std::memory_order_relaxed) == inode) return true;
  return false;
}

int FindRendezvous(const sockaddr* dest, const sockaddr* source, uint64_t* member) noexcept {
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(dest, &ep)) return -EAFNOSUPPORT;
  // Which rendezvous serves the connection is the kernel's choice of listener (with the
  // source, the very member of an SO_REUSEPORT group the SYN will reach), and only that
  // listener's owner may answer. A plain listener costs this lookup and one refused
  // connect(2), nothing more.
  SocketInfo listener;
  if (int rc = FindListener(dest, &listener, source); rc < 0)
    return rc == -ENOENT ? -ECONNREFUSED : rc;  // nothing listens: connect() will say so
  if (member) *member = listener.inode;
  sockaddr_un name;
  socklen_t len;
  RendezvousName(ep.port, listener.inode, &name, &len);
  const int sock = ConnectRendezvous(name, len);
  if (sock < 0) return sock == -ENOENT ? -ECONNREFUSED : sock;
  if (!OwnedByListener(sock, listener, name, len)) {
    sys::close(sock);
    return -EPERM;
  }
  return sock;
}

int FindDirRendezvous(const char* dir_path, const sockaddr* dest) noexcept {
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(dest, &ep)) return -EAFNOSUPPORT;
  char entry[kDirEntryNameMax];
  if (!DirEntryName(ep, entry, sizeof(entry))) return -ENAMETOOLONG;
  // A directory another user could change is no proof of anything (said once).
  RendezvousDir handle;
  if (!handle.Open(dir_path)) return -EPERM;
  const TrustedDir* dir = &handle.get();
  // No name, no Slipstream listener there in any namespace of this host: the usual answer
  // for a remote or plain peer, found with one lookup rather than a socket's five calls.
  struct stat st;
  if (int rc = dir->Stat(entry, &st); rc != 0) return rc == -ENOENT ? -ENOENT : -ECONNREFUSED;
  sockaddr_un name;
  socklen_t len;
  if (!dir->Address(entry, &name, &len)) return -ENAMETOOLONG;
  const int sock = ConnectRendezvous(name, len);
  if (sock < 0) return sock;  // (-ENOENT: no Slipstream listener there, in any namespace)
  // Whoever can create entries in the directory can publish any name: only a socket made
  // by its owner or our own uid, and held by that uid, is used (docs/SECURITY.md, "The
  // rendezvous directory"). The entry is looked at again after connect(), which follows a
  // link: whatever it reached, the name must be that uid's socket now.
  ucred peer{};
  socklen_t plen = sizeof(peer);
  if (sys::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &plen) != 0 ||
      dir->Stat(entry, &st) != 0 || !TrustedEntry(*dir, st, peer.uid)) {
    SLIP_LOG(kWarn,
             "rendezvous %s/%s is held by pid %d uid %u, not a socket of this process's uid "
             "or of the directory's owner: not registering there (plain TCP)",
             dir_path, entry, int(peer.pid), unsigned(peer.uid));
    sys::close(sock);
    return -EPERM;
  }
  return sock;
}

int PrepareOffer(uint32_t ring_size, Offer* offer) noexcept {
  const int floor = sys::HiddenFdFloor();
  offer->nonce = sys::RandomNonce();
  offer->ring_size = ring_size;
  offer->region_size = RegionSize(ring_size);
  if (int rc = CreateRegion(ring_size, offer->nonce, floor, &offer->memfd, &offer->region); rc != 0)
    return rc;

  // Every descriptor the connection will hold is taken now, above the floor, so that
  // nothing after the SYN (when the listener may claim it) can fail for want of one.
  int client[2], server[2];
  if (int rc = proxy::CreatePair(client); rc < 0) return rc;
  offer->client_a = sys::MoveAbove(client[0], floor);
  offer->client_b = sys::MoveAbove(client[1], floor);
  if (offer->client_a < 0 || offer->client_b < 0) return -EMFILE;
  if (int rc = proxy::CreatePair(server); rc < 0) return rc;
  offer->server_a = sys::MoveAbove(server[0], floor);
  offer->server_b = sys::MoveAbove(server[1], floor);
  if (offer->server_a < 0 || offer->server_b < 0) return -EMFILE;
  // (A duplicate of the peer's B, never of our own: closing any descriptor of a file, as
  // the install's dup3 over the slot does, drops this process's locks on it, and our B
  // carries the lock that says this process holds the connection.)
  offer->anchor_slot = sys::DupAbove(offer->server_b, floor);
  return offer->anchor_slot < 0 ? -EMFILE : 0;
}

int SendRegister(int rendezvous, const Offer& offer, const wire::Endpoint& client,
                 const wire::Endpoint& server, int tcp) noexcept {
  const uint32_t count = tcp >= 0 ? 5 : 4;
  wire::Message msg;
  msg.type = wire::Type::kRegister;
  msg.reg = wire::Register{client, server, offer.nonce, offer.ring_size, count, offer.region_size};
  uint8_t buf[wire::kMaxMessageSize];
  const size_t len = wire::EncodeMessage(msg, buf, sizeof(buf));
  if (len == 0) return -EINVAL;
  const int fds[5] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b, tcp};
  return SendWithFds(rendezvous, buf, len, fds, int(count));
}

bool ClaimWithdraw(Offer* offer) noexcept {
  return !offer->region || WithdrawClaim(&static_cast<RegionControl*>(offer->region)->header.claim);
}

std::unique_ptr<Channel> MakeClientChannel(Offer* offer, int rendezvous,
                                           const wire::Endpoint& client,
                                           const wire::Endpoint& server, int* proxy_a, int* proxy_b,
                                           bool across_namespaces,
                                           uint64_t listener_inode) noexcept {
  ChannelSetup setup;
  setup.region = offer->region;
  setup.region_size = offer->region_size;
  setup.ring_size = offer->ring_size;
  setup.nonce = offer->nonce;
  setup.is_client = true;
  setup.peer_b = offer->server_b;
  setup.own_b = offer->client_b;
  setup.anchor = offer->anchor_slot;
  setup.rendezvous = rendezvous;
  setup.client = client;
  setup.server = server;
  setup.across_namespaces = across_namespaces;
  setup.listener_inode = listener_inode;
  auto channel = MakeChannel(setup);
  if (!channel) return nullptr;
  offer->region = nullptr;  // owned by the channel now
  offer->server_b = -1;
  CloseIf(&offer->memfd);  // the mapping keeps the region
  *proxy_a = offer->client_a;
  *proxy_b = offer->client_b;
  offer->client_a = offer->client_b = -1;
  CloseIf(&offer->server_a);  // the server holds its own end now
  return channel;
}

}  // namespace slip::shm
