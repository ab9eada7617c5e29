// A listening socket shared by forked workers: each registration goes to the process that
// accepted its connection (docs/DESIGN.md, "Servers that share a port").
//
// Registrations are queued before their SYNs, and the siblings read them only in accept(),
// so a worker that accepts alone reads its own. Two that accept at the same instant may
// each read the other's: then each passes what it read on, unread, through the queue all
// of them inherited (shm/sibling_queue.h), and reads the other's from there. The message
// is only peeked at (its descriptors stay in the kernel's queue) until the process whose
// connection it is reads it.
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/sys.h"
#include "shm/fd_passing.h"
#include "shm/shm.h"

namespace slip::shm {

namespace {

// Rendezvous connections looked at per accept(), at most: a burst of foreign ones (a
// flood, or a listener far behind its clients) must not keep accept() here.
constexpr int kMaxSiblingReads = 256;
// A rendezvous connection whose REGISTER has not arrived is passed on this long, and one
// nobody claims as long as a registration lives (its client then sees it closed, plain).
constexpr uint64_t kNotYetTtlMs = 1000;
constexpr uint64_t kPassedTtlMs = 30000;

}  // namespace

void Rendezvous::PrepareSharing() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (!siblings_) siblings_ = SiblingQueue::Create();
}

Rendezvous::Peeked Rendezvous::PeekFor(int conn, const wire::Endpoint& client,
                                       const wire::Endpoint& server, uint64_t (*owner_inode)(void*),
                                       void* owner_ctx) noexcept {
  uint8_t buf[wire::kMaxMessageSize];
  // (No room for descriptors: a peek without it installs none.)
  const ssize_t n = sys::recv(conn, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EINTR ? Peeked::kNotYet : Peeked::kUnreadable;
  wire::Message msg;
  size_t used = 0;
  if (n == 0 || wire::ParseMessage(buf, size_t(n), &msg, &used) != wire::ParseStatus::kOk ||
      used != size_t(n) || msg.type != wire::Type::kRegister)
    return Peeked::kUnreadable;  // (ReadOne drops it, as from the listener's own queue)
  if (!(msg.reg.server == server)) return Peeked::kOther;
  if (msg.reg.client.port != 0) return msg.reg.client == client ? Peeked::kMine : Peeked::kOther;
  // Registered by its socket (the fifth descriptor): a peek with room installs copies of
  // the descriptors, whose message still holds each (so a plain close of a copy is never
  // the last one).
  const uint64_t inode = owner_inode(owner_ctx);
  if (inode == 0) return Peeked::kOther;  // (the kernel cannot say whose it is: not ours)
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))];
  msghdr mh = sys::MessageOver(&iov, control, sizeof(control));
  if (sys::recvmsg(conn, &mh, MSG_PEEK | MSG_DONTWAIT | MSG_CMSG_CLOEXEC) != n)
    return Peeked::kUnreadable;
  // (Each copy closed at once: the message still holds the original, so no close here is
  // the last one.)
  int fds[8];
  const int nfds = TakeFds(&mh, fds, 8);  // (the control buffer holds no more than 8)
  const uint64_t handed = nfds > 4 ? SocketInode(fds[4]) : 0;
  for (int i = 0; i < nfds; ++i) sys::close(fds[i]);
  return handed == inode ? Peeked::kMine : Peeked::kOther;
}

bool Rendezvous::SearchSiblings(const wire::Endpoint& client, const wire::Endpoint& server,
                                uint64_t (*owner_inode)(void*), void* owner_ctx,
                                uint64_t give_up_ms) noexcept {
  // The siblings' queue is first in, first out: once the connections this search passed
  // on come back one after another, all of them and nothing else, it holds nothing new.
  uint64_t first_pass = 0;  // this search's first pass on (0: none yet)
  int passed_here = 0;      // connections this search passed on (each is in the queue)
  int own_run = 0;          // of them, met again one after another
  bool only_ours = false;
  for (int reads = 0; reads < kMaxSiblingReads;) {
    const uint64_t now = sys::MonotonicMs();
    siblings_->BeginHold(now);
    // The listener's queue first: registrations come in the order of their SYNs, so the
    // one for a connection just accepted is at its head unless a sibling took it; then
    // what siblings passed on.
    SiblingQueue::Passed passed{now, 0, 0};
    int conn = sys::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn >= 0) {
      conn = sys::MoveAbove(conn, sys::HiddenFdFloor());
      if (conn < 0) {  // (closed: its client sees EOF and stays plain)
        siblings_->EndHold();
        continue;
      }
    } else if (!only_ours) {
      conn = siblings_->Receive(&passed);
      if (conn >= 0 && siblings_->PassedHereSince(passed, first_pass)) {
        siblings_->Pass(conn, passed.first_read_ms);  // (looked at already: back it goes)
        siblings_->EndHold();
        only_ours = ++own_run >= passed_here;
        continue;
      }
      own_run = 0;
    }
    if (conn < 0) {
      siblings_->EndHold();
      // Nothing new anywhere: ours is in flight only if a sibling holds one now, and then
      // it comes through the siblings' queue, behind what this search passed on.
      if (now >= give_up_ms || !siblings_->SiblingHolds(now)) return true;
      only_ours = false;
      own_run = 0;
      sched_yield();
      continue;
    }
    ++reads;
    const Peeked peeked = PeekFor(conn, client, server, owner_inode, owner_ctx);
    if (peeked == Peeked::kMine || peeked == Peeked::kUnreadable) {
      ReadOne(conn, PeerUid(conn), now, /*via_dir=*/false);
      siblings_->EndHold();
      if (peeked == Peeked::kMine) return true;
      continue;
    }
    // A client that gave up (its connection went plain) closed its end: nobody will
    // claim its registration, which goes (its descriptors with the connection).
    pollfd pfd{conn, POLLIN, 0};
    const bool client_gone = sys::poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLHUP | POLLERR));
    const uint64_t ttl = peeked == Peeked::kNotYet ? kNotYetTtlMs : kPassedTtlMs;
    if (client_gone || now - passed.first_read_ms > ttl) {
      sys::close(conn);  // (its client sees the rendezvous closed: plain)
    } else if (const uint64_t seq = siblings_->Pass(conn, passed.first_read_ms); seq != 0) {
      if (first_pass == 0) first_pass = seq;
      ++passed_here;
    }
    siblings_->EndHold();
    if (now >= give_up_ms) return false;
  }
  return false;
}

}  // namespace slip::shm
