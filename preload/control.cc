#include "preload/control.h"

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>

#include "core/anchor_path.h"
#include "core/failover.h"
#include "core/log.h"
#include "core/no_destructor.h"
#include "core/sys.h"
#include "core/wire.h"
#include "preload/exec.h"
#include "preload/fd_table.h"
#include "preload/libc.h"

namespace slip::preload {

namespace {

// What an event is about: the key's top two bits.
enum Tag : uint64_t {
  kAnchor = 0,    // an accelerated socket's anchor
  kSettleFd = 1,  // the descriptor that may settle a connection (ChannelControl::SettleFd)
  kTwins = 2,     // a listener's twins' service descriptors (ListenerTwin::ServiceFd)
  kWake = 3,      // the thread's own eventfd: the list of deadlines changed
};

struct ControlState {
  std::mutex mu;  // everything below
  int epfd = -1;
  int wake_fd = -1;
  SlipSocket* settling = nullptr;  // intrusive list (SlipSocket::settle_next)
  size_t settling_count = 0;
  uint64_t next_wake = 0;  // the earliest deadline the thread will wake for (0: none)
  // Odd while the thread handles the events of one epoll_wait.
  std::atomic<uint64_t> batches{0};
  // SettleNow calls under way, on any thread. A connection's deadline reads 0 from inside
  // Settle on, before SettleNow has recorded how it ended: ControlWaitSettled counts these
  // too, or the exit record could say shm for a connection that went on TCP.
  std::atomic<uint32_t> settling_now{0};
};

ControlState& State() noexcept {
  static NoDestructor<ControlState> state;
  return *state;
}

uint64_t Key(const SlipSocket* s, Tag tag) noexcept {
  return (uint64_t(tag) << 62) | (uint64_t(s->index & 0x3fffffffu) << 32) |
         s->generation.load(std::memory_order_relaxed);
}

SlipSocket* AcquireKey(uint64_t key) noexcept {
  SlipSocket* s = SocketAt(uint32_t(key >> 32) & 0x3fffffffu);
  return s && TryAcquire(s, uint32_t(key)) ? s : nullptr;
}

// The peer failed over: from the next byte on, the anchor carries the stream, and its
// readiness (both ways now) is the channel's business.
void CarryOnAnchor(SlipSocket* s, int epfd) noexcept {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = Key(s, kAnchor);
  if (sys::epoll_ctl(epfd, EPOLL_CTL_MOD, s->anchor_fd, &ev) != 0)
    SLIP_LOG(kWarn, "control thread: cannot watch fd %d for writing (errno %d)", s->anchor_fd,
             errno);
  // Bytes that came before raised no edge of their own.
  s->stream->control()->OnAnchorReady(EPOLLIN | EPOLLOUT);
}

// Neither path can carry the stream: both ends see a reset (no FIN first, which the peer
// would take for an orderly end). A TCP socket connected to AF_UNSPEC is disconnected
// with a RST at once, and its descriptor stays ours (shutdown would send a FIN, and the
// RST of a lingering close would come only when the process closes it, after the FIN of
// an exit: a truncated stream that the peer took for a whole one).
void ResetAnchor(SlipSocket* s, int epfd) noexcept {
  sockaddr unspec{};
  unspec.sa_family = AF_UNSPEC;
  sys::connect(s->anchor_fd, &unspec, sizeof(unspec));
  sys::shutdown(s->anchor_fd, SHUT_RDWR);  // (wakes our own waiters; no FIN on a reset one)
  sys::epoll_ctl(epfd, EPOLL_CTL_DEL, s->anchor_fd, nullptr);
  s->stream->MarkPeerGone(true);
}

void TakeFailover(SlipSocket* s, int epfd, const wire::Failover& failover) noexcept {
  ChannelControl* channel = s->stream->control();
  if (!channel->OnPeerFailover(failover)) {
    SLIP_LOG(kWarn, "anchor fd %d: the peer failed over, and this end cannot; reset", s->anchor_fd);
    ResetAnchor(s, epfd);
    return;
  }
  StatsSetTransport(s->stats, TransportKind::kTcp, Reason::kFailover);
  CarryOnAnchor(s, epfd);
}

// One attempt to settle `s` (an accelerated socket the caller holds a reference on).
void SettleNow(SlipSocket* s, int epfd, uint64_t now_ms) noexcept {
  ChannelControl* channel = s->stream->control();
  if (channel->SettleDeadline() == 0) return;
  // Counted before Settle clears the deadline, until the outcome is recorded: a connection
  // settled as plain carries its stream on TCP from inside Settle, and its application
  // may finish with it and exit before the stats below say so.
  struct InFlight {
    std::atomic<uint32_t>& count;
    explicit InFlight(std::atomic<uint32_t>& c) noexcept : count(c) {
      count.fetch_add(1, std::memory_order_seq_cst);
    }
    ~InFlight() { count.fetch_sub(1, std::memory_order_release); }
  } in_flight(State().settling_now);
  Reason why = Reason::kNone;
  switch (channel->Settle(now_ms, &why)) {
    case ChannelControl::Settlement::kSettled:
    case ChannelControl::Settlement::kPending:
      return;
    case ChannelControl::Settlement::kPlain:
      SLIP_LOG(kInfo, "anchor fd %d: the connection is plain TCP (%s)", s->anchor_fd,
               ReasonName(why));
      StatsSetTransport(s->stats, TransportKind::kTcp, why);
      CarryOnAnchor(s, epfd);
      return;
    case ChannelControl::Settlement::kReset:
      ResetAnchor(s, epfd);
      return;
  }
}

// Reads the in-band messages that may follow the handshake; consumes only whole ones.
void HandleAnchor(SlipSocket* s, int epfd, uint32_t events) noexcept {
  ChannelControl* channel = s->stream->control();
  // Unsettled, the anchor's news is for settling alone: a held server's client's CONFIRM,
  // or what a process that did not take a client's registration sends it.
  if (channel->SettleDeadline() != 0) {
    SettleNow(s, epfd, sys::MonotonicMs());
    if (channel->SettleDeadline() != 0 &&
        (channel->AnchorCarriesStream() || channel->SettleFd() >= 0))
      return;
  }
  if (channel->AnchorCarriesStream()) {
    channel->OnAnchorReady(events);
    return;
  }
  for (;;) {
    const AnchorPeek peek = PeekAnchor(s->anchor_fd);
    switch (peek.kind) {
      case AnchorPeek::Kind::kNone:
      case AnchorPeek::Kind::kPartial:
        return;  // edge-triggered: the rest wakes us
      case AnchorPeek::Kind::kEnd: {
        const bool reset = peek.error == ECONNRESET;
        SLIP_LOG(kDebug, "anchor fd %d: peer gone (%s)", s->anchor_fd,
                 peek.error == 0 ? "EOF"
                 : reset         ? "reset"
                                 : "error");
        sys::epoll_ctl(epfd, EPOLL_CTL_DEL, s->anchor_fd, nullptr);
        s->stream->MarkPeerGone(reset);
        return;
      }
      case AnchorPeek::Kind::kBytes:
        // (A verbs server that settled as plain after its deadline sends its application's
        // bytes here: this end confirmed too late. It resets too, so neither end mistakes
        // the broken connection for an orderly close.)
        SLIP_LOG(kError, "anchor fd %d: unexpected bytes on the control channel (%s); resetting",
                 s->anchor_fd, wire::ParseStatusName(peek.status));
        sys::epoll_ctl(epfd, EPOLL_CTL_DEL, s->anchor_fd, nullptr);
        s->stream->MarkPeerGone(/*reset=*/true);
        return;
      case AnchorPeek::Kind::kMessage:
        break;
    }
    ConsumeAnchor(s->anchor_fd, peek);
    const wire::Message& msg = peek.msg;
    if (msg.type == wire::Type::kDecline) {
      StatsSetTransport(s->stats, TransportKind::kTcp, Reason::kDeclined);
      if (channel->OnPeerDecline()) {
        SLIP_LOG(kWarn,
                 "anchor fd %d: the server declined the connection after its CONFIRM (reason "
                 "%u): it continues on TCP from byte 0",
                 s->anchor_fd, unsigned(msg.decline.reason));
        CarryOnAnchor(s, epfd);
        return;  // what follows is the stream's
      }
      SLIP_LOG(kWarn,
               "anchor fd %d: declined by the peer after its CONFIRM (reason %u), with bytes "
               "already exchanged; reset",
               s->anchor_fd, unsigned(msg.decline.reason));
      ResetAnchor(s, epfd);
      return;
    } else if (msg.type == wire::Type::kFailover) {
      TakeFailover(s, epfd, msg.failover);
      return;  // what follows is the stream's
    } else if (msg.type == wire::Type::kUrgent) {
      // Urgent data (core/stream_urgent.cc): the peer's mark, or its answer to ours.
      AnchorFailover* failover = channel->failover();
      if (!failover) continue;
      if (msg.urgent.ack)
        failover->OnUrgentAck(msg.urgent.offset);
      else if (s->stream->OnPeerUrgent(msg.urgent.offset, msg.urgent.byte))
        failover->AnswerUrgent(msg.urgent.offset);
    } else if (msg.type == wire::Type::kWindow) {
      s->stream->OnPeerWindow(msg.window.bytes);  // (docs/DESIGN.md, "Buffer sizes")
    }
  }
}

// The list of connections to settle holds a reference on each. One walk, under the lock:
// entries that are settled (or no longer accelerated) are unlinked and their references
// go to `unlinked`; those whose deadline passed go to `due`, with a reference of their
// own. Returns the earliest deadline left (0: none). The caller releases both outside the
// lock (a last reference tears the socket down, which takes the lock).
struct Walk {
  static constexpr size_t kMax = 64;
  SlipSocket* due[kMax];
  size_t due_count = 0;
  SlipSocket* unlinked[kMax];
  size_t unlinked_count = 0;
  // More settled entries than `unlinked` holds: walk again at once. (Without it, those
  // past the 64th kept their references until something else woke the thread: a burst of
  // connections closed while they were settling kept their descriptors and rings.)
  bool cut_short = false;

  void ReleaseAll() noexcept {
    for (size_t i = 0; i < unlinked_count; ++i) Release(unlinked[i]);
    unlinked_count = 0;
  }
};

uint64_t CollectDue(ControlState& st, uint64_t now_ms, Walk* walk) noexcept {
  std::lock_guard<std::mutex> lock(st.mu);
  uint64_t earliest = 0;
  SlipSocket** link = &st.settling;
  while (SlipSocket* s = *link) {
    const uint64_t deadline =
        s->kind == SockKind::kAccel && s->stream ? s->stream->control()->SettleDeadline() : 0;
    if (deadline == 0 && walk->unlinked_count == Walk::kMax) walk->cut_short = true;
    if (deadline == 0 && walk->unlinked_count < Walk::kMax) {
      *link = s->settle_next;
      s->settle_next = nullptr;
      s->settle_listed = false;
      --st.settling_count;
      walk->unlinked[walk->unlinked_count++] = s;
      continue;
    }
    if (deadline != 0 && deadline <= now_ms && walk->due_count < Walk::kMax) {
      Acquire(s);
      walk->due[walk->due_count++] = s;
    }
    if (deadline != 0 && (earliest == 0 || deadline < earliest)) earliest = deadline;
    link = &s->settle_next;
  }
  st.next_wake = earliest;
  return earliest;
}

void* ControlMain(void* arg) {
  int epfd = int(reinterpret_cast<intptr_t>(arg));
  ControlState& st = State();
  std::atomic<uint64_t>& batches = st.batches;
  epoll_event events[64];
  // Twins with work left after a service's budget (registrations to answer): served again
  // each round, between the other events, until they are done (the edge that woke us will
  // not come again for what is already queued).
  uint64_t redrain[16];
  size_t redrain_count = 0;
  auto drain = [&redrain, &redrain_count](SlipSocket* s, uint64_t key) {
    if (s->kind != SockKind::kListener) return;
    bool more = false;
    for (auto& twin : s->twins) {
      if (twin && twin->ServiceFd() >= 0) more = twin->Service() || more;
    }
    if (!more) return;
    for (size_t i = 0; i < redrain_count; ++i) {
      if (redrain[i] == key) return;
    }
    if (redrain_count < std::size(redrain)) redrain[redrain_count++] = key;
  };
  for (;;) {
    Walk walk;
    uint64_t now = sys::MonotonicMs();
    const uint64_t earliest = CollectDue(st, now, &walk);
    walk.ReleaseAll();
    for (size_t i = 0; i < walk.due_count; ++i) {
      SettleNow(walk.due[i], epfd, now);
      Release(walk.due[i]);
    }
    int timeout = -1;
    if (earliest) {
      now = sys::MonotonicMs();
      timeout = earliest <= now ? 0 : int(std::min<uint64_t>(earliest - now, 60000));
    }
    if (redrain_count || walk.cut_short) timeout = 0;
    // The real call: the interposed one would prepare every stream for a sleep of ours.
    int n = Libc().epoll_pwait(epfd, events, 64, timeout, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      SLIP_LOG(kError, "control thread: epoll_wait failed (errno %d); exiting", errno);
      return nullptr;
    }
    batches.fetch_add(1, std::memory_order_seq_cst);
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      const Tag tag = Tag(key >> 62);
      if (tag == kWake) {
        uint64_t value;
        sys::read(st.wake_fd, &value, sizeof(value));
        continue;
      }
      SlipSocket* s = AcquireKey(key);
      if (!s) continue;
      if (tag == kTwins) {
        drain(s, key);
      } else if (s->kind == SockKind::kAccel && s->stream) {
        if (tag == kAnchor) {
          HandleAnchor(s, epfd, events[i].events);
        } else {
          SettleNow(s, epfd, sys::MonotonicMs());
        }
      }
      Release(s);
    }
    const size_t pending = redrain_count;
    uint64_t keys[std::size(redrain)];
    std::copy(redrain, redrain + pending, keys);
    redrain_count = 0;
    for (size_t i = 0; i < pending; ++i) {
      if (SlipSocket* s = AcquireKey(keys[i])) {
        drain(s, keys[i]);
        Release(s);
      }
    }
    batches.fetch_add(1, std::memory_order_seq_cst);
  }
}

int StartLocked(ControlState& st) noexcept {
  if (st.epfd >= 0) return st.epfd;
  const int floor = sys::HiddenFdFloor();
  int epfd = sys::MoveAbove(epoll_create1(EPOLL_CLOEXEC), floor);
  if (epfd < 0) return -1;
  int wake = sys::MoveAbove(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), floor);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = uint64_t(kWake) << 62;
  if (wake < 0 || sys::epoll_ctl(epfd, EPOLL_CTL_ADD, wake, &ev) != 0) {
    if (wake >= 0) sys::close(wake);
    sys::close(epfd);
    return -1;
  }
  if (int rc = sys::StartServiceThread(ControlMain, reinterpret_cast<void*>(intptr_t(epfd)),
                                       "slipstream-ctl");
      rc != 0) {
    sys::close(wake);
    sys::close(epfd);
    SLIP_LOG(kError, "cannot start the control thread (error %d)", rc);
    return -1;
  }
  st.epfd = epfd;
  st.wake_fd = wake;
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
  ev.data.u64 = Key(s, kAnchor);
  if (sys::epoll_ctl(epfd, EPOLL_CTL_ADD, s->anchor_fd, &ev) != 0)
    SLIP_LOG(kWarn, "control thread: cannot watch fd %d (errno %d)", s->anchor_fd, errno);
}

void ControlUnwatch(SlipSocket* s) noexcept {
  ControlState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.epfd >= 0 && s->anchor_fd >= 0)
    sys::epoll_ctl(st.epfd, EPOLL_CTL_DEL, s->anchor_fd, nullptr);
}

void ControlSettle(SlipSocket* s) noexcept {
  ControlState& st = State();
  int epfd;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    epfd = StartLocked(st);
    if (epfd < 0) return;  // (ControlWatch ran: it has started)
  }
  ChannelControl* channel = s->stream->control();
  SettleNow(s, epfd, sys::MonotonicMs());
  const uint64_t deadline = channel->SettleDeadline();
  if (deadline == 0) return;
  // Until now nobody else could settle it: its descriptor was not watched and it was not
  // listed (the anchor's events settle only connections without one).
  std::lock_guard<std::mutex> lock(st.mu);
  if (!s->settle_listed) {
    Acquire(s);  // the list's: the socket stays until the thread has seen it settled
    s->settle_next = st.settling;
    st.settling = s;
    s->settle_listed = true;
    ++st.settling_count;
  }
  // Watched before the thread reads it: whoever settles the connection closes it, which
  // takes it out of the set.
  if (const int fd = channel->SettleFd(); fd >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = Key(s, kSettleFd);
    if (sys::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
      SLIP_LOG(kWarn, "control thread: cannot watch fd %d (errno %d); settling at the deadline", fd,
               errno);
  }
  // Its sleep must end by this deadline.
  if (st.next_wake == 0 || deadline < st.next_wake) {
    const uint64_t one = 1;
    sys::write(st.wake_fd, &one, sizeof(one));
  }
}

void ControlWatchTwins(SlipSocket* listener) noexcept {
  const pid_t pid = NotedProcessId();
  ControlState& st = State();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (listener->acceptor_pid == pid || StartLocked(st) < 0) return;
    listener->acceptor_pid = pid;
    for (auto& twin : listener->twins) {
      if (!twin || twin->ServiceFd() < 0) continue;
      epoll_event ev{};
      // Edge-triggered: a twin that cannot make progress (no descriptors) must not keep
      // the thread busy; what is left is served at its next news or accept().
      ev.events = EPOLLIN | EPOLLET;
      ev.data.u64 = Key(listener, kTwins);
      if (sys::epoll_ctl(st.epfd, EPOLL_CTL_ADD, twin->ServiceFd(), &ev) != 0)
        SLIP_LOG(kWarn, "control thread: cannot watch a listener's twin (errno %d)", errno);
    }
  }
  // What arrived before the watch raised no edge.
  for (auto& twin : listener->twins) {
    if (twin && twin->ServiceFd() >= 0) twin->Service();
  }
}

void ControlQuiesce() noexcept {
  std::atomic<uint64_t>& batches = State().batches;
  const uint64_t seen = batches.load(std::memory_order_seq_cst);
  if (seen & 1) {
    while (batches.load(std::memory_order_seq_cst) == seen) sched_yield();
  }
}

bool ControlWaitSettled(uint64_t bound_ms) noexcept {
  ControlState& st = State();
  const uint64_t deadline = sys::MonotonicMs() + bound_ms;
  for (;;) {
    size_t unsettled = 0;
    {
      // (The list drops settled entries only when walked: count what is really pending.)
      std::lock_guard<std::mutex> lock(st.mu);
      for (SlipSocket* s = st.settling; s; s = s->settle_next) {
        if (s->kind == SockKind::kAccel && s->stream && s->stream->control()->SettleDeadline())
          ++unsettled;
      }
    }
    // (Read after the deadlines: one seen cleared was counted in flight before it was.)
    if (unsettled == 0 && st.settling_now.load(std::memory_order_acquire) == 0) return true;
    if (sys::MonotonicMs() >= deadline) return false;
    sys::poll(nullptr, 0, 1);
  }
}

void ControlResetAfterFork() noexcept {
  ControlState& st = State();
  st.batches.store(0, std::memory_order_relaxed);
  st.settling_now.store(0, std::memory_order_relaxed);  // (the parent's threads' calls)
  // Runs in the single-threaded child: the parent's lock state is meaningless here.
  new (&st.mu) std::mutex();
  if (st.epfd >= 0) sys::close(st.epfd);
  if (st.wake_fd >= 0) sys::close(st.wake_fd);
  st.epfd = -1;
  st.wake_fd = -1;
  // Settling the inherited connections is the parent's business (fork waited for it;
  // preload/fork.cc resets what is left): the list lets go of them here.
  SlipSocket* list = st.settling;
  st.settling = nullptr;
  st.settling_count = 0;
  while (SlipSocket* s = list) {
    list = s->settle_next;
    s->settle_next = nullptr;
    s->settle_listed = false;
    Release(s);
  }
}

}  // namespace slip::preload
