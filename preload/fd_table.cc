#include "preload/fd_table.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <vector>

#include "core/no_destructor.h"
#include "core/sys.h"
#include "preload/accel_list.h"
#include "preload/closer.h"
#include "preload/control.h"
#include "preload/handshake.h"

namespace slip::preload {

namespace {

// The table is one anonymous mapping sized for the hard descriptor limit; untouched pages
// cost nothing. Descriptors beyond it are simply never accelerated.
struct Table {
  std::atomic<SlipSocket*>* slots = nullptr;
  size_t size = 0;
};

Table& GetTable() noexcept {
  static Table table = [] {
    Table t;
    rlimit rl{};
    size_t n = 1u << 16;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY) n = rl.rlim_max;
    if (n > (1u << 20)) n = 1u << 20;
    void* p = mmap(nullptr, n * sizeof(std::atomic<SlipSocket*>), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      t.slots = static_cast<std::atomic<SlipSocket*>*>(p);
      t.size = n;
    }
    return t;
  }();
  return table;
}

std::atomic<bool> g_in_use{false};

// Sockets live in chunks that are never freed, so addresses stay stable as the pool grows.
// (Nothing here allocates before the first socket: a std::deque would, when the pool is
// built, where a failure could only terminate the program.)
struct Pool {
  static constexpr size_t kChunk = 256;
  static constexpr size_t kSpare = 16;
  std::mutex mu;
  std::vector<std::unique_ptr<SlipSocket[]>> chunks;
  size_t count = 0;  // sockets ever made: [0, count) exist
  std::vector<uint32_t> free_list;

  SlipSocket* At(size_t i) noexcept { return &chunks[i / kChunk][i % kChunk]; }
};

Pool& GetPool() noexcept {
  static NoDestructor<Pool> pool;  // sockets may be used during exit
  return *pool;
}

void Teardown(SlipSocket* s) noexcept;

}  // namespace

bool HasTwins(const SlipSocket* s) noexcept {
  for (const auto& twin : s->twins) {
    if (twin) return true;
  }
  return false;
}

void CloseTwins(SlipSocket* s) noexcept {
  for (auto& twin : s->twins) twin.reset();
}

namespace {

void Teardown(SlipSocket* s) noexcept {
  if (s->kind == SockKind::kAccel) {
    AccelListRemove(s);
    ControlUnwatch(s);
  }
  // No Close(): a forked process may still hold this connection. The peer learns that the
  // last holder is gone from the anchor's FIN, which the kernel sends when the last
  // descriptor of the TCP socket closes.
  bool lingering = false;
  if (s->stream && s->anchor_fd >= 0) {
    // An abortive close resets the anchor (the kernel sends RST); the transport must not
    // announce an orderly end before it. The reset goes first, before the transport is
    // torn down, so that the peer sees the reset rather than a failing transport.
    linger lg{};
    socklen_t len = sizeof(lg);
    if (sys::getsockopt(s->anchor_fd, SOL_SOCKET, SO_LINGER, &lg, &len) == 0 && lg.l_onoff) {
      if (lg.l_linger == 0) {
        s->stream->control()->Abort();
        s->stream->control()->SetAnchor(-1);
        sys::close(s->anchor_fd);
        s->anchor_fd = -1;
      }
      lingering = lg.l_linger > 0;
    }
  }
  // A verbs connection's orderly end takes round trips (a TCP close does not wait for its
  // own): the closer thread does it, unless the application asked close() to wait
  // (SO_LINGER with a timeout).
  if (s->stream && s->anchor_fd >= 0 && !lingering &&
      s->stream->channel()->kind() == TransportKind::kVerbs) {
    CloseLater(std::move(s->stream), s->anchor_fd);
    s->anchor_fd = -1;
  }
  s->stream.reset();
  if (s->anchor_fd >= 0) sys::close(s->anchor_fd);
  s->anchor_fd = -1;
  CloseTwins(s);
  if (s->judged && s->stats) NoteClientClosed(s->judged_dest, *s->stats);
  if (s->stats) StatsClose(s->stats);
  s->stats = nullptr;
}

}  // namespace

void SlipSocket::Reset() noexcept {
  epoll_regs.clear();
  table_fds.store(0, std::memory_order_relaxed);
  no_offer = Reason::kPeerNotSlipstream;
  acceptor_pid = 0;
  forked.store(false, std::memory_order_relaxed);
  stats_pending.store(false, std::memory_order_relaxed);
  pending_reason = Reason::kNone;
  judged = false;
  connecting.store(false, std::memory_order_relaxed);
  rcvbuf.store(0, std::memory_order_relaxed);
  sndbuf.store(0, std::memory_order_relaxed);
  kernel_only.store(false, std::memory_order_relaxed);
  kind = SockKind::kTcp;
  family = 0;
  nonblocking.store(false, std::memory_order_relaxed);
}

SlipSocket* NewSocket(SockKind kind, int family) noexcept {
  Pool& pool = GetPool();
  SlipSocket* s = nullptr;
  try {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (!pool.free_list.empty()) {
      s = pool.At(pool.free_list.back());
      pool.free_list.pop_back();
    } else {
      // The next chunk is made while some of this one are still free, so that a failed
      // allocation rarely costs a socket (an accepted connection we could not track).
      if (pool.chunks.size() * Pool::kChunk - pool.count <= Pool::kSpare) {
        std::unique_ptr<SlipSocket[]> chunk(new (std::nothrow) SlipSocket[Pool::kChunk]);
        if (chunk) pool.chunks.push_back(std::move(chunk));
      }
      if (pool.count == pool.chunks.size() * Pool::kChunk) return nullptr;
      s = pool.At(pool.count);
      s->index = uint32_t(pool.count++);
    }
  } catch (...) {
    return nullptr;
  }
  s->Reset();
  s->kind = kind;
  s->family = family;
  s->generation.fetch_add(1, std::memory_order_relaxed);
  s->refs.store(1, std::memory_order_release);
  g_in_use.store(true, std::memory_order_relaxed);
  return s;
}

SlipSocket* SocketAt(uint32_t index) noexcept {
  Pool& pool = GetPool();
  std::lock_guard<std::mutex> lock(pool.mu);
  return index < pool.count ? pool.At(index) : nullptr;
}

bool TryAcquire(SlipSocket* s, uint32_t gen) noexcept {
  int r = s->refs.load(std::memory_order_acquire);
  while (r > 0) {
    if (s->refs.compare_exchange_weak(r, r + 1, std::memory_order_acq_rel)) {
      if (s->generation.load(std::memory_order_acquire) == gen) return true;
      Release(s);
      return false;
    }
  }
  return false;
}

void Acquire(SlipSocket* s) noexcept {
  s->refs.fetch_add(1, std::memory_order_relaxed);
}

void Release(SlipSocket* s) noexcept {
  if (s->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Teardown(s);
  Pool& pool = GetPool();
  std::lock_guard<std::mutex> lock(pool.mu);
  try {
    pool.free_list.push_back(s->index);
  } catch (...) {
    // Losing one pooled slot is harmless.
  }
}

SlipSocket* Lookup(int fd) noexcept {
  Table& t = GetTable();
  if (fd < 0 || size_t(fd) >= t.size) return nullptr;
  for (;;) {
    SlipSocket* s = t.slots[fd].load(std::memory_order_acquire);
    if (!s) return nullptr;
    uint32_t gen = s->generation.load(std::memory_order_acquire);
    if (!TryAcquire(s, gen)) continue;
    if (t.slots[fd].load(std::memory_order_acquire) == s) return s;
    Release(s);
  }
}

void Install(int fd, SlipSocket* s) noexcept {
  Table& t = GetTable();
  if (fd < 0 || size_t(fd) >= t.size) return;
  Acquire(s);
  s->table_fds.fetch_add(1, std::memory_order_relaxed);
  SlipSocket* old = t.slots[fd].exchange(s, std::memory_order_acq_rel);
  if (old) {
    old->table_fds.fetch_sub(1, std::memory_order_relaxed);
    Release(old);
  }
}

void Remove(int fd) noexcept {
  Table& t = GetTable();
  if (fd < 0 || size_t(fd) >= t.size) return;
  SlipSocket* old = t.slots[fd].exchange(nullptr, std::memory_order_acq_rel);
  if (old) {
    old->table_fds.fetch_sub(1, std::memory_order_relaxed);
    Release(old);
  }
}

bool WatchedEdgeTriggered(const SlipSocket* s) noexcept {
  return std::any_of(s->epoll_regs.begin(), s->epoll_regs.end(),
                     [](const SlipSocket::EpollReg& r) { return (r.event.events & EPOLLET) != 0; });
}

void ForgetEpollLocked(SlipSocket* s, int fd) noexcept {
  // Accelerated and connecting sockets: the shim holds its own descriptor of the proxy's
  // file, so the kernel would not end these registrations when the application closes its
  // last descriptor.
  if (s->kind != SockKind::kAccel && s->kind != SockKind::kConnecting) return;
  const bool last = s->table_fds.load(std::memory_order_relaxed) == 1;
  std::erase_if(s->epoll_regs, [fd, last](const SlipSocket::EpollReg& r) {
    if (r.fd != fd) return false;
    if (last) sys::epoll_ctl(r.epfd, EPOLL_CTL_DEL, fd, nullptr);
    return true;
  });
}

void ForgetEpollOnClose(int fd) noexcept {
  SlipSocket* s = Lookup(fd);
  if (!s) return;
  if (s->kind == SockKind::kAccel || s->kind == SockKind::kConnecting) {
    std::lock_guard<std::mutex> lock(s->mu);
    ForgetEpollLocked(s, fd);
  }
  Release(s);
}

bool TableHolds(int fd, const SlipSocket* s) noexcept {
  Table& t = GetTable();
  return fd >= 0 && size_t(fd) < t.size && t.slots[fd].load(std::memory_order_acquire) == s;
}

bool TableInUse() noexcept {
  return g_in_use.load(std::memory_order_relaxed);
}

void ForEachTrackedFd(void (*fn)(int fd, SlipSocket* s, void* ctx), void* ctx) noexcept {
  Table& t = GetTable();
  if (!TableInUse()) return;
  for (size_t fd = 0; fd < t.size; ++fd) {
    if (!t.slots[fd].load(std::memory_order_relaxed)) continue;
    if (SlipSocket* s = Lookup(int(fd))) {
      fn(int(fd), s, ctx);
      Release(s);
    }
  }
}

void ForEachLiveSocket(void (*fn)(SlipSocket* s, void* ctx), void* ctx) noexcept {
  Pool& pool = GetPool();
  std::lock_guard<std::mutex> lock(pool.mu);
  for (size_t i = 0; i < pool.count; ++i) {
    SlipSocket* s = pool.At(i);
    if (s->refs.load(std::memory_order_acquire) > 0) fn(s, ctx);
  }
}

void TableForkPrepare() noexcept {
  GetPool().mu.lock();
}
void TableForkParent() noexcept {
  GetPool().mu.unlock();
}
void TableForkChild() noexcept {
  GetPool().mu.unlock();
}  // the forking thread holds it

}  // namespace slip::preload
