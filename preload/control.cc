#include "preload/control.h"

#include <sched.h>
#include <sys/epoll.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include "core/log.h"
#include "core/sys.h"
#include "core/wire.h"
#include "preload/fd_table.h"
#include "preload/libc.h"

namespace slip::preload {

namespace {

struct ControlState {
  std::mutex mu;
  int epfd = -1;
  // Odd while the thread handles the events of one epoll_wait.
  std::atomic<uint64_t> batches{0};
};

ControlState& State() noexcept {
  static ControlState* state = new ControlState();
  return *state;
}

uint64_t Key(const SlipSocket* s) noexcept {
  return (uint64_t(s->index) << 32) | s->generation.load(std::memory_order_relaxed);
}

// The peer failed over: from the next byte on, the anchor carries the stream, and its
// readiness (both ways now) is the channel's business.
void TakeFailover(SlipSocket* s, int epfd, const wire::Failover& failover) noexcept {
  Channel* channel = s->stream->channel();
  if (!channel->OnPeerFailover(failover)) {
    SLIP_LOG(kWarn, "anchor fd %d: the peer failed over, and this end cannot; reset", s->anchor_fd);
    sys::epoll_ctl(epfd, EPOLL_CTL_DEL, s->anchor_fd, nullptr);
    s->stream->MarkPeerGone(true);
    return;
  }
  StatsSetTransport(s->stats, TransportKind::kTcp, Reason::kFailover);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = Key(s);
  if (sys::epoll_ctl(epfd, EPOLL_CTL_MOD, s->anchor_fd, &ev) != 0)
    SLIP_LOG(kWarn, "control thread: cannot watch fd %d for writing (errno %d)", s->anchor_fd,
             errno);
  // Bytes that followed the message raised no edge of their own.
  channel->OnAnchorReady(EPOLLIN | EPOLLOUT);
}

// Reads the in-band messages that may follow the handshake; consumes only whole ones.
void HandleAnchor(SlipSocket* s, int epfd, uint32_t events) noexcept {
  if (s->stream->channel()->AnchorCarriesStream()) {
    s->stream->channel()->OnAnchorReady(events);
    return;
  }
  uint8_t buf[wire::kMaxMessageSize];
  for (;;) {
    ssize_t n = sys::recv(s->anchor_fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      bool reset = n < 0 && errno == ECONNRESET;
      SLIP_LOG(kDebug, "anchor fd %d: peer gone (%s)", s->anchor_fd,
               n == 0  ? "EOF"
               : reset ? "reset"
                       : "error");
      sys::epoll_ctl(epfd, EPOLL_CTL_DEL, s->anchor_fd, nullptr);
      s->stream->MarkPeerGone(reset);
      return;
    }
    wire::Message msg;
    size_t used = 0;
    wire::ParseStatus st = wire::ParseMessage(buf, size_t(n), &msg, &used);
    if (st == wire::ParseStatus::kNeedMore) return;  // edge-triggered: the rest wakes us
    if (st != wire::ParseStatus::kOk) {
      SLIP_LOG(kError, "anchor fd %d: unexpected bytes on the control channel (%s); closing",
               s->anchor_fd, wire::ParseStatusName(st));
      sys::epoll_ctl(epfd, EPOLL_CTL_DEL, s->anchor_fd, nullptr);
      s->stream->MarkPeerGone();
      return;
    }
    sys::recv(s->anchor_fd, buf, used, MSG_DONTWAIT);
    if (msg.type == wire::Type::kDecline) {
      SLIP_LOG(kWarn, "connection declined by the peer after registration (reason %u); reset",
               unsigned(msg.decline.reason));
      StatsSetTransport(s->stats, TransportKind::kTcp, Reason::kDeclined);
      s->stream->MarkPeerGone();
    } else if (msg.type == wire::Type::kFailover) {
      TakeFailover(s, epfd, msg.failover);
      return;  // what follows is the stream's
    }
  }
}

void* ControlMain(void* arg) {
  int epfd = int(reinterpret_cast<intptr_t>(arg));
  std::atomic<uint64_t>& batches = State().batches;
  epoll_event events[64];
  for (;;) {
    // The real call: the interposed one would prepare every stream for a sleep of ours.
    int n = Libc().epoll_pwait(epfd, events, 64, -1, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      SLIP_LOG(kError, "control thread: epoll_wait failed (errno %d); exiting", errno);
      return nullptr;
    }
    batches.fetch_add(1, std::memory_order_seq_cst);
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64;
      SlipSocket* s = SocketAt(uint32_t(key >> 32));
      if (!s || !TryAcquire(s, uint32_t(key))) continue;
      if (s->kind == SockKind::kAccel && s->stream) HandleAnchor(s, epfd, events[i].events);
      Release(s);
    }
    batches.fetch_add(1, std::memory_order_seq_cst);
  }
}

int StartLocked(ControlState& st) noexcept {
  if (st.epfd >= 0) return st.epfd;
  int epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) return -1;
  epfd = sys::MoveHigh(epfd, sys::HiddenFdFloor());
  if (int rc = sys::StartServiceThread(ControlMain, reinterpret_cast<void*>(intptr_t(epfd)),
                                       "slipstream-ctl");
      rc != 0) {
    sys::close(epfd);
    SLIP_LOG(kError, "cannot start the control thread (error %d)", rc);
    return -1;
  }
  st.epfd = epfd;
  return epfd;
}

}  // namespace

bool ControlReady() noexcept {
  ControlState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return StartLocked(st) >= 0;
}

void ControlWatch(SlipSocket* s) noexcept {
  ControlState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  int epfd = StartLocked(st);
  if (epfd < 0) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = Key(s);
  if (sys::epoll_ctl(epfd, EPOLL_CTL_ADD, s->anchor_fd, &ev) != 0)
    SLIP_LOG(kWarn, "control thread: cannot watch fd %d (errno %d)", s->anchor_fd, errno);
}

void ControlUnwatch(SlipSocket* s) noexcept {
  ControlState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.epfd >= 0 && s->anchor_fd >= 0)
    sys::epoll_ctl(st.epfd, EPOLL_CTL_DEL, s->anchor_fd, nullptr);
}

void ControlQuiesce() noexcept {
  std::atomic<uint64_t>& batches = State().batches;
  const uint64_t seen = batches.load(std::memory_order_seq_cst);
  if (seen & 1) {
    while (batches.load(std::memory_order_seq_cst) == seen) sched_yield();
  }
}

void ControlResetAfterFork() noexcept {
  ControlState& st = State();
  st.batches.store(0, std::memory_order_relaxed);
  // Runs in the single-threaded child: the parent's lock state is meaningless here.
  new (&st.mu) std::mutex();
  if (st.epfd >= 0) sys::close(st.epfd);
  st.epfd = -1;
}

}  // namespace slip::preload
