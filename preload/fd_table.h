// The fd table: which application descriptors are Slipstream's business.
//
// A flat array indexed by descriptor number, read without locks on every intercepted call.
// Entries point to SlipSockets, which live in a type-stable pool (never returned to the
// allocator), so a racing reader may safely try to take a reference on an entry that is
// being closed: Acquire() fails once the count reached zero or the generation changed.
//
// Thread safety: Lookup/Acquire/Release from any thread; Install/Remove serialise per fd
// through the atomic exchange, which is how the kernel's own fd table behaves for dup2.
#pragma once

#include <sys/epoll.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/stats.h"
#include "core/stream.h"
#include "core/transport.h"
#include "core/wire.h"

namespace slip::preload {

enum class SockKind : uint8_t {
  kTcp,         // an AF_INET/AF_INET6 stream socket, not connected yet
  kListener,    // listening; its transports' twins stand beside it
  kPlain,       // a connected TCP socket that stays plain (counted, passed through)
  kAccel,       // accelerated: the application holds the proxy, the TCP socket is hidden
  kConnecting,  // a non-blocking connect whose offer is in progress (preload/connector.h):
                // the application holds a filled proxy, the TCP socket is hidden at anchor_fd
};

struct SlipSocket {
  std::atomic<int> refs{0};
  std::atomic<uint32_t> generation{0};
  uint32_t index = 0;

  // Atomic: the control thread reads it for the events it handles while another thread
  // installs or hands back the connection (the epoll registration orders them in the kernel,
  // which the language does not see).
  std::atomic<SockKind> kind{SockKind::kTcp};
  int family = 0;
  std::atomic<bool> nonblocking{false};
  std::mutex mu;  // control-path transitions (listen, connect, accept)
  // kConnecting (set and cleared under `mu`; read without it to decide whether a call must
  // take `mu` to serialise with the connector's swap of the descriptor number).
  std::atomic<bool> connecting{false};
  // The connector's own plain connect() failed at once (a local refusal, no route): the
  // kernel reported the error to it, not to the socket, so SO_ERROR and the next connect()
  // report it here, once, as they would have.
  std::atomic<int> connect_error{0};
  // SO_RCVBUF and SO_SNDBUF as the application set them (read back: the kernel doubles
  // them), 0 while they are the kernel's own. Kept for the stream (Stream::SetSendBuffer,
  // AnchorFailover::AnnounceWindow); an accepted socket has its listener's, as in the kernel.
  std::atomic<uint32_t> rcvbuf{0};
  std::atomic<uint32_t> sndbuf{0};
  // SO_ZEROCOPY was set on it (or on its listener, as the kernel copies it): the
  // connection goes back to TCP at its first MSG_ZEROCOPY send (preload/hand_back.h).
  std::atomic<bool> kernel_only{false};

  ConnSlot* stats = nullptr;
  // kListener: each chosen transport's twin (twins[i] is Transports()[i]'s, or null), and
  // why a connection that no twin was offered stays plain.
  std::unique_ptr<ListenerTwin> twins[TransportRegistry::kMax];
  Reason no_offer = Reason::kPeerNotSlipstream;
  // kPlain after a non-blocking connect: the stats slot is opened only once the connection
  // proves established (a refused connect is no connection).
  std::atomic<bool> stats_pending{false};
  Reason pending_reason = Reason::kNone;
  pid_t acceptor_pid = 0;  // kListener: the process whose control thread serves its twins
  // kListener: a process forked while it listened; its twins are told at the next accept()
  // (ListenerTwin::SharedByProcesses), where they are used.
  std::atomic<bool> forked{false};
  std::unique_ptr<Stream> stream;  // kAccel
  int anchor_fd = -1;              // kAccel, kConnecting: the hidden TCP socket
  // A client connection that may be accelerated: where it connected, so that its end tells
  // the short-connection policy (core/short_conns.h) how it went.
  bool judged = false;
  wire::Endpoint judged_dest{};

  // The application's epoll registrations of this socket (under `mu`). While kTcp: when
  // connect() swaps the descriptor to the proxy they must move with it, or epoll would
  // keep watching the now hidden TCP socket. While kAccel: the shim holds its own
  // reference to the proxy's file, so closing the application's last descriptor would not
  // end the registrations as the kernel ends a closed socket's; close() removes them.
  struct EpollReg {
    int epfd;
    int fd;
    epoll_event event;
  };
  std::vector<EpollReg> epoll_regs;
  std::atomic<int> table_fds{0};  // application descriptors that refer to this socket

  // The control thread's list of connections still to settle (preload/control.h), under
  // its lock; the list holds a reference on each entry.
  SlipSocket* settle_next = nullptr;
  bool settle_listed = false;

  // Clears everything back to a fresh kTcp socket (called when the last reference goes).
  void Reset() noexcept;
};

// Whether one of the application's epoll registrations of `s` is edge-triggered (under
// `s->mu`): its stream then wants a token at every arrival (Stream::SetEdgeTriggered).
bool WatchedEdgeTriggered(const SlipSocket* s) noexcept;

// close(fd) is about to run: if `fd` is the application's last descriptor of an
// accelerated socket, its epoll registrations go now, as the kernel's would.
void ForgetEpollOnClose(int fd) noexcept;
// The same with `s->mu` held by the caller (`s` is the socket at `fd`).
void ForgetEpollLocked(SlipSocket* s, int fd) noexcept;

// A listener's twins: whether it has any; closing them.
bool HasTwins(const SlipSocket* s) noexcept;
void CloseTwins(SlipSocket* s) noexcept;

// Allocates a socket with one reference (the caller's).
SlipSocket* NewSocket(SockKind kind, int family) noexcept;

// Takes a reference if `s` is still live with generation `gen`.
bool TryAcquire(SlipSocket* s, uint32_t gen) noexcept;
void Acquire(SlipSocket* s) noexcept;
// Drops a reference; the last one tears the socket down.
void Release(SlipSocket* s) noexcept;
SlipSocket* SocketAt(uint32_t index) noexcept;

// Returns the socket for `fd` with a reference taken, or nullptr (not ours, or closing).
SlipSocket* Lookup(int fd) noexcept;
// Points `fd` at `s` (taking a reference for the table); drops what was there.
void Install(int fd, SlipSocket* s) noexcept;
// Forgets `fd`; drops the table's reference.
void Remove(int fd) noexcept;
// True if the table entry of `fd` is `s` (the connector, under `s->mu`, checks that the
// application has not closed or replaced the number before swapping what it refers to).
bool TableHolds(int fd, const SlipSocket* s) noexcept;
// True if any descriptor may be tracked (cheap pre-check for plain programs).
bool TableInUse() noexcept;

// Calls `fn` for every tracked descriptor, with the socket it refers to (a reference is
// held during the call). Not under any lock: for rare whole-process work (exec).
void ForEachTrackedFd(void (*fn)(int fd, SlipSocket* s, void* ctx), void* ctx) noexcept;
// Calls `fn` for every socket that is alive (some reference held), under the pool lock.
void ForEachLiveSocket(void (*fn)(SlipSocket* s, void* ctx), void* ctx) noexcept;
// fork(): the pool lock is taken around fork so that the child never inherits it held.
void TableForkPrepare() noexcept;
void TableForkParent() noexcept;
void TableForkChild() noexcept;

// RAII reference holder for one intercepted call. Costs one load for a program that has
// no tracked socket at all.
class SocketRef {
 public:
  explicit SocketRef(int fd) noexcept : s_(TableInUse() ? Lookup(fd) : nullptr) {}
  ~SocketRef() {
    if (s_) Release(s_);
  }
  SocketRef(const SocketRef&) = delete;
  SocketRef& operator=(const SocketRef&) = delete;
  SlipSocket* get() const noexcept { return s_; }
  SlipSocket* operator->() const noexcept { return s_; }
  explicit operator bool() const noexcept { return s_ != nullptr; }
  bool accelerated() const noexcept { return s_ && s_->kind == SockKind::kAccel; }
  bool counted() const noexcept { return s_ && s_->stats; }

 private:
  SlipSocket* s_;
};

}  // namespace slip::preload
