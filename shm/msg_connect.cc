// shm's message face: listening, connecting and accepting (shm/msg.h).
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/config.h"
#include "core/log.h"
#include "core/sys.h"
#include "core/trusted_path.h"
#include "shm/dir_rendezvous.h"
#include "shm/fd_passing.h"
#include "shm/msg.h"
#include "shm/msg_internal.h"
#include "shm/msg_wire.h"
#include "shm/region.h"
#include "shm/region_file.h"

namespace slip::shm {

namespace {

using msg::Status;

std::atomic<uint32_t> g_ring_size{1u << 20};
// SLIP_RENDEZVOUS_DIR, set once before the first listen or connect; empty: none.
char g_dir[Config::kMaxRendezvousDirLength + 1];
std::atomic<bool> g_dir_set{false};

// How long an accepted connection may take to send its HELLO before it is dropped (a
// local process that connects and says nothing must not hold a slot for ever).
constexpr uint64_t kHelloWaitMs = 10'000;

socklen_t AbstractName(uint32_t pid, uint64_t token, sockaddr_un* addr) noexcept {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  const int n = snprintf(addr->sun_path + 1, sizeof(addr->sun_path) - 1,
                         "slipstream-nccl:%u:%016" PRIx64, pid, token);
  return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + size_t(n));
}

// The entry in the rendezvous directory, for senders in other network namespaces.
void DirEntry(uint32_t pid, uint64_t token, char (&out)[kDirEntryNameMax]) noexcept {
  snprintf(out, sizeof(out), "nccl-%u-%016" PRIx64, pid, token);
}

// The process's rendezvous directory when there is one and it is trusted (said once when
// not: shm/dir_rendezvous.h).
bool OpenDirectory(RendezvousDir* dir) noexcept {
  return g_dir_set.load(std::memory_order_acquire) && dir->Open(g_dir);
}

int ListeningSocket(const sockaddr_un& addr, socklen_t len) noexcept {
  const int fd = sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (sys::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 ||
      sys::listen(fd, 128) != 0) {
    const int err = errno;
    sys::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

bool PeerCred(int sock, ucred* cred) noexcept {
  socklen_t len = sizeof(*cred);
  return sys::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, cred, &len) == 0;
}

class ShmListener final : public msg::Listener {
 public:
  // `fd`: the abstract name's socket; `dir_fd` (or -1): the one at entry `dir_entry` of
  // `dir`, the socket `dir_inode`.
  ShmListener(int fd, int dir_fd, TrustedDir&& dir, const char* dir_entry, ino_t dir_inode,
              uint64_t secret) noexcept
      : fds_{fd, dir_fd},
        dir_(std::move(dir)),
        dir_inode_(dir_inode),
        owner_(getpid()),
        secret_(secret) {
    snprintf(dir_entry_, sizeof(dir_entry_), "%s", dir_entry);
  }
  ~ShmListener() override {
    for (auto& p : pending_)
      if (p.fd >= 0) sys::close(p.fd);
    for (int fd : fds_)
      if (fd >= 0) sys::close(fd);
    if (fds_[1] >= 0 && getpid() == owner_) dir_.RemoveSocket(dir_entry_, dir_inode_);
  }

  Status Accept(std::unique_ptr<msg::RecvComm>* out) noexcept override {
    AcceptQueued();
    const uint64_t now = sys::MonotonicMs();
    for (auto& p : pending_) {
      if (p.fd < 0) continue;
      if (Status s = ReadHello(&p, out); s != Status::kAgain) return s;
      if (p.fd >= 0 && now - p.since_ms > kHelloWaitMs) {
        SLIP_LOG(kWarn, "NCCL listener over shm: a connection sent no HELLO in %llu s: dropped",
                 (unsigned long long)(kHelloWaitMs / 1000));
        Drop(&p);
      }
    }
    return Status::kAgain;
  }

 private:
  struct Pending {
    int fd = -1;
    uint64_t since_ms = 0;
  };

  void AcceptQueued() noexcept {
    int from = 0;  // the listening socket to take from next
    for (auto& p : pending_) {
      if (p.fd >= 0) continue;
      int fd = -1;
      while (fd < 0 && from < 2) {
        if (fds_[from] >= 0)
          fd = sys::accept4(fds_[from], nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) ++from;
      }
      if (fd < 0) return;
      ucred cred{};
      if (!PeerCred(fd, &cred) || cred.uid != geteuid()) {
        SLIP_LOG(kWarn,
                 "NCCL listener over shm: refused a connection from pid %d uid %u (not this "
                 "process's uid)",
                 int(cred.pid), unsigned(cred.uid));
        sys::close(fd);
        continue;
      }
      p.fd = fd;
      p.since_ms = sys::MonotonicMs();
    }
  }

  void Drop(Pending* p) noexcept {
    sys::close(p->fd);
    p->fd = -1;
  }

  Status ReadHello(Pending* p, std::unique_ptr<msg::RecvComm>* out) noexcept {
    uint8_t buf[msgwire::kHelloBytes + 1];
    iovec iov{buf, sizeof(buf)};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr m = sys::MessageOver(&iov, control, sizeof(control));
    const ssize_t n = sys::recvmsg(p->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Status::kAgain;
    // Whatever descriptors came are ours to close unless exactly one memfd came with a
    // good HELLO.
    int fds[4];
    const int nfds = n >= 0 ? TakeFds(&m, fds, 4) : 0;
    msgwire::Hello hello;
    const bool good = n > 0 && !(m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) && nfds == 1 &&
                      msgwire::ParseHello(buf, size_t(n), &hello) && hello.secret == secret_;
    if (!good) {
      for (int i = 0; i < std::min(nfds, 4); ++i) sys::CloseHandedOver(fds[i]);
      if (n != 0)
        SLIP_LOG(kWarn, "NCCL listener over shm: a malformed or foreign HELLO: connection dropped");
      Drop(p);
      return Status::kAgain;
    }
    int error = 0;
    void* region = MapPeerRegion(fds[0], hello.ring_size, hello.region_nonce, &error);
    sys::close(fds[0]);
    if (region == nullptr) {
      SLIP_LOG(kWarn, "NCCL listener over shm: the sender's region is %s: connection dropped",
               error == -ENOMEM ? "too large to map" : "not a sealed region of its size");
      Drop(p);
      return error == -ENOMEM ? Status::kSystem : Status::kAgain;
    }
    auto comm = MakeRecvComm(region, hello.ring_size, p->fd);
    if (!comm) {
      munmap(region, RegionSize(hello.ring_size));
      Drop(p);
      return Status::kSystem;
    }
    p->fd = -1;  // the comm's now
    *out = std::move(comm);
    return Status::kOk;
  }

  const int fds_[2];
  const TrustedDir dir_;  // where dir_entry_ is (or none)
  char dir_entry_[kDirEntryNameMax];
  const ino_t dir_inode_;
  const pid_t owner_;  // the process that bound the entry (and may remove it)
  const uint64_t secret_;
  Pending pending_[8];
};

class ShmMessageTransport final : public msg::Transport {
 public:
  ShmMessageTransport() noexcept {
    std::strcpy(device_.name, "shm");
    device_.guid = 0x534c495000000000ull;  // "SLIP"
    // The order of one core's copies through a ring (make bench: shm tcp_bw ~110 Gbit/s).
    device_.speed_mbps = 100000;
  }
  const char* name() const noexcept override { return "shm"; }
  const msg::DeviceInfo& device() const noexcept override { return device_; }

  Status Listen(uint8_t* handle, std::unique_ptr<msg::Listener>* out) noexcept override {
    msgwire::Handle h;
    h.host = msgwire::ThisHost();
    h.uid = geteuid();
    h.pid = uint32_t(getpid());
    h.name_token = sys::RandomNonce();
    h.secret = sys::RandomNonce();
    sockaddr_un addr;
    const int fd = ListeningSocket(addr, AbstractName(h.pid, h.name_token, &addr));
    if (fd < 0) {
      SLIP_LOG(kWarn, "NCCL listener over shm: cannot listen: %s", strerror(errno));
      return Status::kSystem;
    }
    // Senders in other network namespaces of this host (pods) reach it in the rendezvous
    // directory, when there is one and it is trusted.
    RendezvousDir opened;
    TrustedDir dir;
    char entry[kDirEntryNameMax];
    DirEntry(h.pid, h.name_token, entry);
    sockaddr_un dir_addr{};
    socklen_t dir_len = 0;
    int dir_fd = -1;
    ino_t dir_inode = 0;
    if (OpenDirectory(&opened) && opened.get().Duplicate(sys::HiddenFdFloor(), &dir) &&
        dir.Address(entry, &dir_addr, &dir_len)) {
      struct stat st;
      dir_fd = ListeningSocket(dir_addr, dir_len);
      if (dir_fd >= 0 && dir.Stat(entry, &st) == 0) dir_inode = st.st_ino;
      if (dir_fd < 0)
        SLIP_LOG(kWarn, "NCCL listener over shm: cannot listen at %s/%s (%s): same namespace only",
                 g_dir, entry, strerror(errno));
      else
        h.flags |= msgwire::kHandleInDir;
    }
    if (dir_fd < 0) dir = TrustedDir();
    auto listener = std::unique_ptr<msg::Listener>(
        new (std::nothrow) ShmListener(fd, dir_fd, std::move(dir), entry, dir_inode, h.secret));
    if (!listener) {
      sys::close(fd);
      if (dir_fd >= 0) {
        sys::close(dir_fd);
        dir.RemoveSocket(entry, dir_inode);  // (not moved from: no listener was made)
      }
      return Status::kSystem;
    }
    msgwire::EncodeHandle(h, handle);
    *out = std::move(listener);
    return Status::kOk;
  }

  Status Connect(const uint8_t* handle, std::unique_ptr<msg::SendComm>* out) noexcept override {
    msgwire::Handle h;
    if (!msgwire::ParseHandle(handle, msg::kHandleBytes, &h)) {
      SLIP_LOG(kWarn, "NCCL connect: the handle is not one of Slipstream's shm listeners");
      return Status::kBadArgument;
    }
    const msgwire::HostId here = msgwire::ThisHost();
    if (!h.host.SameBoot(here)) {
      SLIP_LOG(kWarn, "NCCL connect: the listener is on another host, which shm cannot reach");
      return Status::kSystem;
    }
    // Its abstract name where we share its network namespace; elsewhere on this host, its
    // name in the rendezvous directory.
    const bool same_namespace = h.host == here;
    sockaddr_un addr;
    socklen_t len = 0;
    RendezvousDir opened;
    const TrustedDir* dir = nullptr;
    char entry[kDirEntryNameMax];
    DirEntry(h.pid, h.name_token, entry);
    if (same_namespace) {
      len = AbstractName(h.pid, h.name_token, &addr);
    } else if (!(h.flags & msgwire::kHandleInDir) || !OpenDirectory(&opened) ||
               !(dir = &opened.get())->Address(entry, &addr, &len)) {
      SLIP_LOG(kWarn,
               "NCCL connect: the listener is in another network namespace of this host; shm "
               "reaches it when both set SLIP_RENDEZVOUS_DIR to a directory they share");
      return Status::kSystem;
    }
    if (h.uid != geteuid()) {
      SLIP_LOG(kWarn, "NCCL connect: the listener belongs to uid %u, not this process's: refused",
               unsigned(h.uid));
      return Status::kBadArgument;
    }
    const int fd = sys::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::kSystem;
    if (sys::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      const int err = errno;
      sys::close(fd);
      if (err == EAGAIN || err == EINTR) return Status::kAgain;  // its backlog is full
      SLIP_LOG(kWarn, "NCCL connect over shm: the listener of pid %u is not there: %s",
               unsigned(h.pid), strerror(err));
      return Status::kSystem;
    }
    // The socket must be held by the handle's owner: an abstract name has no owner, so by
    // its process too (a pid in another pid namespace, as from another pod, means nothing
    // here: in the trusted directory, a socket made and held by the uid; connect() follows
    // a link, so the entry is looked at after it).
    ucred cred{};
    struct stat st;
    if (!PeerCred(fd, &cred) || cred.uid != h.uid ||
        (same_namespace && uint32_t(cred.pid) != h.pid) ||
        (!same_namespace && (dir->Stat(entry, &st) != 0 || !TrustedEntry(*dir, st, cred.uid)))) {
      SLIP_LOG(kWarn,
               "NCCL connect over shm: the listener's name is held by pid %d uid %u, not by "
               "the handle's pid %u: refused",
               int(cred.pid), unsigned(cred.uid), unsigned(h.pid));
      sys::close(fd);
      return Status::kBadArgument;
    }
    const uint32_t ring_size = g_ring_size.load(std::memory_order_relaxed);
    msgwire::Hello hello{h.secret, sys::RandomNonce(), ring_size};
    int memfd = -1;
    void* region = nullptr;
    if (int rc = CreateRegion(ring_size, hello.region_nonce, 0, &memfd, &region); rc != 0) {
      SLIP_LOG(kWarn, "NCCL connect over shm: cannot make a region of %u bytes: %s",
               unsigned(RegionSize(ring_size)), strerror(-rc));
      sys::close(fd);
      return Status::kSystem;
    }
    uint8_t buf[msgwire::kHelloBytes];
    msgwire::EncodeHello(hello, buf);
    const int sent = SendWithFds(fd, buf, sizeof(buf), &memfd, 1);
    sys::close(memfd);  // the mapping keeps the region; the listener has its own
    std::unique_ptr<msg::SendComm> comm;
    if (sent == 0) comm = MakeSendComm(region, ring_size, fd);
    if (!comm) {
      munmap(region, RegionSize(ring_size));
      sys::close(fd);
      return sent == 0 ? Status::kSystem : Status::kAgain;
    }
    *out = std::move(comm);
    return Status::kOk;
  }

 private:
  msg::DeviceInfo device_;
};

}  // namespace

msg::Transport* MessageTransport() noexcept {
  static ShmMessageTransport transport;
  return &transport;
}

void SetMessageRendezvousDir(const char* dir) noexcept {
  if (dir == nullptr || dir[0] != '/' || strlen(dir) >= sizeof(g_dir) ||
      g_dir_set.load(std::memory_order_acquire))
    return;
  snprintf(g_dir, sizeof(g_dir), "%s", dir);
  g_dir_set.store(true, std::memory_order_release);
}

void SetMessageRingSize(uint32_t ring_size) noexcept {
  if (ValidRingSize(ring_size)) g_ring_size.store(ring_size, std::memory_order_relaxed);
}

}  // namespace slip::shm
