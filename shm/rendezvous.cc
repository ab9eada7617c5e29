// The listening side of shm: the published rendezvous and the registrations it collects.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "core/log.h"
#include "core/sys.h"
#include "shm/region.h"
#include "shm/rendezvous_name.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

constexpr uint64_t kRegistrationTtlNs = 30ull * 1000000000ull;
constexpr size_t kMaxPending = 4096;

uint64_t MonotonicNs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

void MakeName(uint16_t port, const char* scope, sockaddr_un* out, socklen_t* len) noexcept {
  std::memset(out, 0, sizeof(*out));
  out->sun_family = AF_UNIX;
  // Abstract name: leading NUL, no terminator.
  int n = std::snprintf(out->sun_path + 1, sizeof(out->sun_path) - 1, "slipstream-v1:%u:%s",
                        unsigned(port), scope);
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
}

void CloseFds(int* fds, int n) noexcept {
  for (int i = 0; i < n; ++i) {
    if (fds[i] >= 0) sys::close(fds[i]);
    fds[i] = -1;
  }
}

}  // namespace

bool RendezvousNameFor(const sockaddr* local, bool v6only, sockaddr_un* out,
                       socklen_t* len) noexcept {
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(local, &ep)) return false;
  char scope[INET6_ADDRSTRLEN + 4];
  static const uint8_t kZero[16] = {};
  bool any = std::memcmp(ep.addr, kZero, ep.family == 4 ? 4 : 16) == 0;
  if (any && local->sa_family == AF_INET) {
    std::strcpy(scope, "*4");
  } else if (any) {
    std::strcpy(scope, v6only ? "*6" : "*");
  } else {
    inet_ntop(ep.family == 4 ? AF_INET : AF_INET6, ep.addr, scope, sizeof(scope));
  }
  MakeName(ep.port, scope, out, len);
  return true;
}

int RendezvousNamesFor(const sockaddr* dest, sockaddr_un out[3], socklen_t lens[3]) noexcept {
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(dest, &ep)) return 0;
  char exact[INET6_ADDRSTRLEN];
  inet_ntop(ep.family == 4 ? AF_INET : AF_INET6, ep.addr, exact, sizeof(exact));
  MakeName(ep.port, exact, &out[0], &lens[0]);
  MakeName(ep.port, ep.family == 4 ? "*4" : "*6", &out[1], &lens[1]);
  MakeName(ep.port, "*", &out[2], &lens[2]);
  return 3;
}

// ---------------------------------------------------------------------------- Registration

Registration::~Registration() {
  if (header) munmap(header, kControlPage);
  CloseFds(fds, 4);
}

Registration::Registration(Registration&& o) noexcept
    : msg(o.msg), received_ns(o.received_ns), header(o.header) {
  std::memcpy(fds, o.fds, sizeof(fds));
  std::fill(o.fds, o.fds + 4, -1);
  o.header = nullptr;
}

Registration& Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    if (header) munmap(header, kControlPage);
    CloseFds(fds, 4);
    msg = o.msg;
    received_ns = o.received_ns;
    header = o.header;
    o.header = nullptr;
    std::memcpy(fds, o.fds, sizeof(fds));
    std::fill(o.fds, o.fds + 4, -1);
  }
  return *this;
}

namespace {

// The claim word of a registration's region, mapping its first page on first use; nullptr
// when the region is not one a Slipstream client builds (its size must be sealed: one the
// client could still shrink would turn our access into a SIGBUS).
std::atomic<uint32_t>* ClaimWord(Registration* reg) noexcept {
  if (!reg->header) {
    struct stat st;
    constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;
    int seals = reg->fds[0] < 0 ? -1 : sys::fcntl(reg->fds[0], F_GET_SEALS);
    if (seals < 0 || (seals & kSizeSeals) != kSizeSeals || fstat(reg->fds[0], &st) != 0 ||
        !S_ISREG(st.st_mode) || uint64_t(st.st_size) < kControlPage)
      return nullptr;
    void* page = mmap(nullptr, kControlPage, PROT_READ | PROT_WRITE, MAP_SHARED, reg->fds[0], 0);
    if (page == MAP_FAILED) return nullptr;
    reg->header = page;
  }
  return &static_cast<RegionControl*>(reg->header)->header.claim;
}

}  // namespace

Claim ReadClaim(Registration* reg) noexcept {
  std::atomic<uint32_t>* word = ClaimWord(reg);
  return word ? Claim(word->load(std::memory_order_acquire)) : Claim::kOpen;
}

Claim Abandon(Registration* reg) noexcept {
  std::atomic<uint32_t>* word = ClaimWord(reg);
  if (!word) return Claim::kAbandoned;  // nobody can confirm it
  uint32_t expected = uint32_t(Claim::kOpen);
  if (word->compare_exchange_strong(expected, uint32_t(Claim::kAbandoned),
                                    std::memory_order_acq_rel))
    return Claim::kAbandoned;
  return Claim(expected);
}

// ---------------------------------------------------------------------------- Rendezvous

std::unique_ptr<Rendezvous> Rendezvous::Publish(const sockaddr* local, bool v6only,
                                                int* error) noexcept {
  sockaddr_un name;
  socklen_t len;
  if (!RendezvousNameFor(local, v6only, &name, &len)) {
    *error = -EAFNOSUPPORT;
    return nullptr;
  }
  int fd = sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *error = -errno;
    return nullptr;
  }
  fd = sys::MoveHigh(fd, sys::HiddenFdFloor());
  if (sys::bind(fd, reinterpret_cast<sockaddr*>(&name), len) != 0 || sys::listen(fd, 4096) != 0) {
    *error = -errno;
    sys::close(fd);
    return nullptr;
  }
  auto rv = std::unique_ptr<Rendezvous>(new (std::nothrow) Rendezvous(fd));
  if (!rv) {
    sys::close(fd);
    *error = -ENOMEM;
  }
  return rv;
}

Rendezvous::~Rendezvous() {
  sys::close(fd_);
  for (int fd : pending_conns_) sys::close(fd);
}

void Rendezvous::ReadOne(int conn, uint64_t now) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  ssize_t n = sys::recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
    pending_conns_.push_back(conn);  // registered but not yet written: read it later
    return;
  }
  Registration reg;
  int nfds = 0;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    int count = int((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    const int* in = reinterpret_cast<const int*>(CMSG_DATA(cm));
    for (int i = 0; i < count; ++i) {
      if (nfds < 4) {
        reg.fds[nfds++] = sys::MoveHigh(in[i], sys::HiddenFdFloor());
      } else {
        sys::close(in[i]);
        nfds = 5;  // too many descriptors: malformed
      }
    }
  }
  sys::close(conn);
  if (n <= 0) return;
  wire::Message msg;
  size_t used;
  wire::ParseStatus st = wire::ParseMessage(buf, size_t(n), &msg, &used);
  if (st != wire::ParseStatus::kOk || used != size_t(n)) {
    SLIP_LOG(kWarn, "rendezvous: dropped a malformed message (%s)",
             st == wire::ParseStatus::kOk ? "trailing bytes" : wire::ParseStatusName(st));
    return;
  }
  // CANCEL is no longer sent (the region's claim word says it; it never arrived anyway,
  // one message being read per connection): an old client's is ignored.
  if (msg.type == wire::Type::kCancel && nfds == 0) return;
  if (msg.type != wire::Type::kRegister || nfds != 4 || msg.reg.fd_count != 4) {
    SLIP_LOG(kWarn, "rendezvous: dropped a registration with %d descriptors", nfds);
    return;
  }
  reg.msg = msg.reg;
  reg.received_ns = now;
  if (pending_.size() >= kMaxPending) {
    DropLocked(&pending_.front());
    pending_.erase(pending_.begin());
  }
  pending_.push_back(std::move(reg));
}

// A registration leaves the table without its connection being accepted (expired, or
// pushed out): its client must not confirm after that. Nothing to do when it already did
// (a CONFIRM queued at accept, with nothing registered, is declined there) or withdrew.
void Rendezvous::DropLocked(Registration* reg) noexcept {
  Abandon(reg);
}

void Rendezvous::DrainLocked() noexcept {
  uint64_t now = MonotonicNs();
  std::vector<int> waiting;
  waiting.swap(pending_conns_);
  for (int conn : waiting) ReadOne(conn, now);
  for (;;) {
    int conn = sys::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) break;
    ReadOne(sys::MoveHigh(conn, sys::HiddenFdFloor()), now);
  }
  ExpireLocked(now);
}

void Rendezvous::ExpireLocked(uint64_t now) noexcept {
  std::erase_if(pending_, [this, now](Registration& r) {
    if (now - r.received_ns <= kRegistrationTtlNs) return false;
    DropLocked(&r);
    return true;
  });
  while (pending_conns_.size() > kMaxPending) {
    sys::close(pending_conns_.front());
    pending_conns_.erase(pending_conns_.begin());
  }
}

void Rendezvous::Drain() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
}

size_t Rendezvous::Take(const wire::Endpoint& client, const wire::Endpoint& server,
                        std::vector<Registration>* out) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  size_t found = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->msg.client == client && it->msg.server == server) {
      out->push_back(std::move(*it));
      it = pending_.erase(it);
      ++found;
    } else {
      ++it;
    }
  }
  return found;
}

// ---------------------------------------------------------------------------- accept

std::unique_ptr<Channel> AcceptRegistration(Registration* reg, const wire::Confirm& confirm,
                                            int* proxy_a, int* proxy_b,
                                            wire::DeclineReason* reason) noexcept {
  *reason = wire::DeclineReason::kBadRegion;
  const wire::Register& msg = reg->msg;
  if (confirm.nonce != msg.nonce) {
    *reason = wire::DeclineReason::kNonceMismatch;
    return nullptr;
  }
  if (confirm.ring_size != msg.ring_size || msg.region_size != RegionSize(msg.ring_size))
    return nullptr;
  struct stat st;
  if (fstat(reg->fds[0], &st) != 0 || !S_ISREG(st.st_mode) ||
      uint64_t(st.st_size) != msg.region_size)
    return nullptr;
  // Only a region whose size is sealed is safe to map: one the client could still shrink
  // would turn the server's next access into a SIGBUS.
  constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;
  int seals = sys::fcntl(reg->fds[0], F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) return nullptr;
  for (int i = 1; i < 4; ++i) {
    if (fstat(reg->fds[i], &st) != 0 || !S_ISSOCK(st.st_mode)) return nullptr;
  }
  void* region = mmap(nullptr, msg.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, reg->fds[0], 0);
  if (region == MAP_FAILED) {
    *reason = wire::DeclineReason::kResources;
    return nullptr;
  }
  const RegionHeader& header = static_cast<RegionControl*>(region)->header;
  if (header.magic != kRegionMagic || header.ring_size != msg.ring_size ||
      header.nonce != msg.nonce) {
    munmap(region, msg.region_size);
    return nullptr;
  }
  auto channel = MakeChannel(region, msg.region_size, reg->fds[0], /*is_client=*/false, reg->fds[3],
                             reg->fds[2]);
  if (!channel) {
    munmap(region, msg.region_size);
    *reason = wire::DeclineReason::kResources;
    return nullptr;
  }
  reg->fds[0] = reg->fds[3] = -1;
  *proxy_a = reg->fds[1];
  *proxy_b = reg->fds[2];
  reg->fds[1] = reg->fds[2] = -1;
  return channel;
}

}  // namespace slip::shm
