// The client side of shm: building the region and proxies, registering, claiming.
#include <sys/mman.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/sys.h"
#include "shm/region.h"
#include "shm/rendezvous_name.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

void CloseIf(int* fd) noexcept {
  if (*fd >= 0) sys::close(*fd);
  *fd = -1;
}

int SendWithFds(int sock, const uint8_t* msg, size_t len, const int* fds, int nfds) noexcept {
  iovec iov{const_cast<uint8_t*>(msg), len};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds > 0) {
    mh.msg_control = control;
    mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
  }
  ssize_t n = sys::sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0) return -errno;
  return n == ssize_t(len) ? 0 : -EMSGSIZE;
}

}  // namespace

Offer::~Offer() {
  if (region) munmap(region, region_size);
  CloseIf(&memfd);
  CloseIf(&client_a);
  CloseIf(&client_b);
  CloseIf(&server_a);
  CloseIf(&server_b);
}

int FindRendezvous(const sockaddr* dest) noexcept {
  sockaddr_un names[3];
  socklen_t lens[3];
  int count = RendezvousNamesFor(dest, names, lens);
  if (count == 0) return -EAFNOSUPPORT;
  int sock = sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0) return -errno;
  int err = -ECONNREFUSED;
  for (int i = 0; i < count; ++i) {
    // Closed before connect() returns, like the memfd and the server's A below: they
    // need not be moved out of the application's way.
    if (sys::connect(sock, reinterpret_cast<sockaddr*>(&names[i]), lens[i]) == 0) return sock;
    err = -errno;
    if (err == -EAGAIN) break;  // the listener's queue is full: do not try a wider name
  }
  sys::close(sock);
  return err;
}

int PrepareOffer(uint32_t ring_size, Offer* offer) noexcept {
  offer->nonce = sys::RandomNonce();
  offer->ring_size = ring_size;
  offer->region_size = RegionSize(ring_size);
  int fd = memfd_create("slipstream", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -errno;
  offer->memfd = fd;
  if (ftruncate(offer->memfd, off_t(offer->region_size)) != 0) return -errno;
  // The server maps this region: sealed, the client can never shrink it under the server
  // (a SIGBUS there would kill the server process).
  if (sys::fcntl(offer->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return -errno;
  void* region =
      mmap(nullptr, offer->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, offer->memfd, 0);
  if (region == MAP_FAILED) return -errno;
  offer->region = region;
  auto* control = new (region) RegionControl();
  control->header.magic = kRegionMagic;
  control->header.ring_size = ring_size;
  control->header.nonce = offer->nonce;

  int client[2], server[2];
  if (int rc = proxy::CreatePair(client); rc < 0) return rc;
  offer->client_a = client[0];
  offer->client_b = sys::MoveHigh(client[1], sys::HiddenFdFloor());
  if (int rc = proxy::CreatePair(server); rc < 0) return rc;
  offer->server_a = server[0];
  offer->server_b = sys::MoveHigh(server[1], sys::HiddenFdFloor());
  offer->client_a = sys::MoveHigh(offer->client_a, sys::HiddenFdFloor());
  return 0;
}

namespace {

int EncodeAndSend(int rendezvous, const wire::Message& msg, const int* fds, int nfds) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  size_t len = wire::EncodeMessage(msg, buf, sizeof(buf));
  if (len == 0) return -EINVAL;
  return SendWithFds(rendezvous, buf, len, fds, nfds);
}

}  // namespace

int SendRegister(int rendezvous, const Offer& offer, const wire::Endpoint& client,
                 const wire::Endpoint& server) noexcept {
  wire::Message msg;
  msg.type = wire::Type::kRegister;
  msg.reg = wire::Register{client, server, offer.nonce, offer.ring_size, 4, offer.region_size};
  const int fds[4] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b};
  return EncodeAndSend(rendezvous, msg, fds, 4);
}

namespace {

std::atomic<uint32_t>& ClaimOf(Offer* offer) noexcept {
  return static_cast<RegionControl*>(offer->region)->header.claim;
}

}  // namespace

bool ClaimConfirm(Offer* offer) noexcept {
  uint32_t expected = uint32_t(Claim::kOpen);
  return ClaimOf(offer).compare_exchange_strong(expected, uint32_t(Claim::kConfirmed),
                                                std::memory_order_acq_rel) ||
         expected == uint32_t(Claim::kConfirmed);
}

void ClaimWithdraw(Offer* offer) noexcept {
  uint32_t expected = uint32_t(Claim::kOpen);
  ClaimOf(offer).compare_exchange_strong(expected, uint32_t(Claim::kWithdrawn),
                                         std::memory_order_acq_rel);
}

std::unique_ptr<Channel> MakeClientChannel(Offer* offer, int* proxy_a, int* proxy_b) noexcept {
  // The memfd stays open with the channel, out of the application's way.
  offer->memfd = sys::MoveHigh(offer->memfd, sys::HiddenFdFloor());
  auto channel = MakeChannel(offer->region, offer->region_size, offer->memfd,
                             /*is_client=*/true, offer->server_b, offer->client_b);
  if (!channel) return nullptr;
  offer->region = nullptr;  // owned by the channel now
  offer->server_b = -1;
  offer->memfd = -1;
  *proxy_a = offer->client_a;
  *proxy_b = offer->client_b;
  offer->client_a = offer->client_b = -1;
  CloseIf(&offer->server_a);  // the server holds its own end now
  return channel;
}

}  // namespace slip::shm
