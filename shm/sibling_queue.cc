// The siblings' queue of rendezvous connections (shm/sibling_queue.h).
#include "shm/sibling_queue.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "shm/fd_passing.h"

namespace slip::shm {

namespace {

constexpr uint32_t kPassMagic = 0x51534c53;  // "SLSQ"
// A sibling holds a connection for a few microseconds unless it is descheduled: this
// long after it took one, it is presumed gone rather than waited for.
constexpr uint64_t kHoldWindowMs = 5;

struct PassHeader {
  uint32_t magic;
  uint32_t passer;
  uint64_t first_read_ms;
  uint64_t seq;
};

}  // namespace

std::unique_ptr<SiblingQueue> SiblingQueue::Create() noexcept {
  auto q = std::unique_ptr<SiblingQueue>(new (std::nothrow) SiblingQueue());
  if (!q) return nullptr;
  // A stream, not SEQPACKET: a socketpair's datagram queue holds net.unix.max_dgram_qlen
  // entries (10 here), far too few for a burst; a stream holds what its buffer does. Each
  // pass is one fixed-size write with its descriptor (one skb, never merged with another
  // carrying descriptors) and each read takes exactly one, under the socket's read lock,
  // so the siblings' reads and writes never split a pass.
  int ends[2];
  if (sys::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, ends) != 0) {
    SLIP_LOG(kWarn, "shared listener: no sibling queue (errno %d)", errno);
    return nullptr;
  }
  const int buffer = 1 << 20;  // (capped by net.core.wmem_max)
  sys::setsockopt(ends[0], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  const int floor = sys::HiddenFdFloor();
  q->ends_[0] = sys::MoveAbove(ends[0], floor);
  q->ends_[1] = sys::MoveAbove(ends[1], floor);
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (q->ends_[0] < 0 || q->ends_[1] < 0 || page == MAP_FAILED) {
    SLIP_LOG(kWarn, "shared listener: no sibling queue (no descriptor or memory)");
    return nullptr;  // (the destructor closes what was made)
  }
  q->shared_ = new (page) Shared{};
  return q;
}

SiblingQueue::~SiblingQueue() {
  if (shared_) {
    if (holding_here_) shared_->holding.fetch_sub(holding_here_, std::memory_order_relaxed);
    munmap(shared_, 4096);
  }
  for (int fd : ends_)
    if (fd >= 0) sys::close(fd);
}

uint64_t SiblingQueue::Pass(int conn, uint64_t first_read_ms) noexcept {
  const uint64_t seq = ++passes_;
  PassHeader header{kPassMagic, uint32_t(getpid()), first_read_ms, seq};
  const int rc = SendWithFds(ends_[0], &header, sizeof(header), &conn, 1);
  const bool sent = rc == 0;
  if (!sent)
    SLIP_LOG(kWarn, "shared listener: cannot pass a registration to a sibling (errno %d); plain",
             -rc);
  sys::close(conn);  // (in flight, the queue holds it; not sent, its client sees EOF)
  return sent ? seq : 0;
}

int SiblingQueue::Receive(Passed* passed) noexcept {
  PassHeader header{};
  iovec iov{&header, sizeof(header)};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  msghdr mh = sys::MessageOver(&iov, control, sizeof(control));
  const ssize_t n = sys::recvmsg(ends_[1], &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return -1;
  int conn = -1;
  TakeFds(&mh, &conn, 1);  // (a second is closed: only one is ever passed)
  // (Only the processes that forked from the listener's holder hold the queue: anything
  // else in it is a bug, dropped all the same.)
  if (n != ssize_t(sizeof(header)) || header.magic != kPassMagic || conn < 0) {
    if (conn >= 0) sys::close(conn);
    return -1;
  }
  *passed = Passed{header.first_read_ms, header.passer, header.seq};
  return sys::MoveAbove(conn, sys::HiddenFdFloor());
}

bool SiblingQueue::PassedHereSince(const Passed& passed, uint64_t seq) const noexcept {
  return seq != 0 && passed.seq >= seq && passed.passer == uint32_t(getpid());
}

void SiblingQueue::BeginHold(uint64_t now_ms) noexcept {
  ++holding_here_;
  shared_->holding.fetch_add(1, std::memory_order_acq_rel);
  shared_->last_hold_ms.store(now_ms, std::memory_order_release);
}

void SiblingQueue::EndHold() noexcept {
  --holding_here_;
  shared_->holding.fetch_sub(1, std::memory_order_acq_rel);
}

bool SiblingQueue::SiblingHolds(uint64_t now_ms) const noexcept {
  if (shared_->holding.load(std::memory_order_acquire) <= holding_here_) return false;
  return now_ms - shared_->last_hold_ms.load(std::memory_order_acquire) <= kHoldWindowMs;
}

}  // namespace slip::shm
