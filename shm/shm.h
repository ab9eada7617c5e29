// shm: the same-host transport. Rings live in a memfd region shared by the two processes;
// detection goes through a rendezvous that each listening Slipstream process publishes.
//
// Rendezvous: an abstract AF_UNIX SOCK_SEQPACKET listener named from the listening port
// and address ("slipstream-v2:<port>:<scope>"); abstract names are per network namespace.
// A client that finds it first checks that it belongs to the owner of the TCP listener
// its SYN will reach (the kernel's view, core/sock_diag.h: abstract names have no owner,
// so any local user could bind one first). Then it registers its connection (4-tuple,
// nonce, and the region plus both proxy pairs as SCM_RIGHTS) BEFORE it sends its SYN, so
// the server's classification at accept is race-free. The listener answers ACCEPT once it
// holds everything the connection will need (descriptors, the mapped region, the stream),
// or DECLINE; only after ACCEPT does the client claim the region and send CONFIRM in band.
// A client to a plain server finds no rendezvous: one failed connect(2) on an AF_UNIX
// socket, no round trip, nothing added to the TCP stream. docs/DESIGN.md, "Detection on
// one host"; docs/SECURITY.md for what each step defends against.
//
// Everything the peer writes into the region is hostile input: the ring size and nonce are
// validated once and kept, this end's own cursors are never read back, and Stream checks
// the peer's cursors before it uses them.
//
// Thread safety: Rendezvous methods take the rendezvous' own lock; an Offer is owned by one
// connecting thread; a Registration by whoever took it.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/channel.h"
#include "core/stream.h"
#include "core/wire.h"

namespace slip {
class Transport;
}

namespace slip::shm {

// shm as core's Transport (core/transport.h), for the face's registry.
Transport* TheTransport() noexcept;

// Whether a registered connection's CONFIRM comes, decided once, in the region's header,
// by whichever end moves it from kOpen first (compare and exchange):
//   kConfirmed  the client, after the listener's ACCEPT, just before it sends CONFIRM: the
//               server must wait for it;
//   kWithdrawn  the client, when its TCP handshake or the listener's answer was too slow:
//               it stays plain;
//   kAbandoned  the server, when it stops waiting (SLIP_HANDSHAKE_TIMEOUT_MS): the client,
//               finding it so, stays plain and sends nothing of ours.
// Any other value (the peer wrote it) counts as kOpen for the server.
enum class Claim : uint32_t { kOpen = 0, kConfirmed = 1, kWithdrawn = 2, kAbandoned = 3 };

// What MakeChannel needs: a mapped, validated region and the descriptors around it.
struct ChannelSetup {
  void* region = nullptr;  // mapped, region_size bytes (the channel takes the mapping)
  size_t region_size = 0;
  uint32_t ring_size = 0;  // validated: never read from the region again
  uint64_t nonce = 0;      // validated likewise
  bool is_client = false;
  int peer_b = -1;  // taken: B of the peer's proxy
  int own_b = -1;   // B of this end's proxy, owned by the Stream
  int anchor = -1;  // the number the connection's TCP socket will have (not owned)
  // Client: the rendezvous socket (taken) on which the listener's answer will come; the
  // channel then settles when it does (ChannelControl::Settle). -1: settled.
  int rendezvous = -1;
  // Server: hold the stream until the client's CONFIRM arrives on the anchor.
  bool held = false;
  int handshake_timeout_ms = 2000;  // how long either waits to settle
};
// Builds the channel; on failure (no memory) the caller keeps everything.
std::unique_ptr<Channel> MakeChannel(const ChannelSetup& setup) noexcept;

// ----------------------------------------------------------------------------- client

// A client's half-built connection: the region and the proxies, before the server says yes.
struct Offer {
  Offer() = default;
  ~Offer();
  Offer(const Offer&) = delete;
  Offer& operator=(const Offer&) = delete;

  uint64_t nonce = 0;
  uint32_t ring_size = 0;
  size_t region_size = 0;
  void* region = nullptr;
  int memfd = -1;
  int client_a = -1, client_b = -1;  // the client's proxy pair
  int server_a = -1, server_b = -1;  // the server's proxy pair (sent to the server)
  int anchor_slot = -1;              // a descriptor number kept for the hidden TCP socket
};
// (Once connected a client end keeps four descriptors, all above the floor: A, B, the
// server's B, and the TCP socket; the server's end the same four.)

// Connects to the rendezvous of the listener that a connection to `dest` reaches, and
// verifies it: the rendezvous is the one the kernel's listener would publish, and it is
// held by that listener's owner. Returns the socket, or -errno: -ECONNREFUSED/-ENOENT (no
// Slipstream listener), -EAGAIN (its queue is full), -EPERM (a rendezvous whose owner is
// not the listener's: not used), -EMFILE (descriptors short), other errors.
int FindRendezvous(const sockaddr* dest) noexcept;

// Builds the region, the proxies and the anchor's slot, all above the hidden-descriptor
// floor. Returns 0 or -errno (-EMFILE: descriptors short; -EFBIG: the file size limit).
int PrepareOffer(uint32_t ring_size, Offer* offer) noexcept;

// Sends REGISTER with the region and proxies over the rendezvous socket (non-blocking).
int SendRegister(int rendezvous, const Offer& offer, const wire::Endpoint& client,
                 const wire::Endpoint& server) noexcept;

// Client: withdraws (the TCP handshake took too long, or nothing is installed): the
// connection stays plain, as the server will see.
void ClaimWithdraw(Offer* offer) noexcept;

// The client's channel once its TCP connection is up; takes the region, client_b and
// server_b out of `offer` (and closes its memfd: the mapping is all that is needed), and
// `rendezvous`: the channel settles the connection when the listener answers (the control thread
// calls Settle; a client whose answer is already there settles on the first call).
// `*proxy_a`/`*proxy_b` receive the client's proxy pair. On failure the offer keeps everything and
// `rendezvous` is the caller's.
std::unique_ptr<Channel> MakeClientChannel(Offer* offer, int rendezvous, int handshake_timeout_ms,
                                           int* proxy_a, int* proxy_b) noexcept;

// ----------------------------------------------------------------------------- server

// Validates what REGISTER carries and builds the server's channel over it: the memfd (a
// sealed regular file of exactly the region's size, mapped and then closed), the server's proxy
// pair (two ends of one AF_UNIX stream socketpair, proven by a probe byte), the client's B (an
// AF_UNIX stream socket), the region mapped once and its header checked against `msg`. Takes `fds`
// (memfd, server A, server B, client B): on failure each is closed and *reason says why.
// On success *proxy_a/*proxy_b are the server's proxy pair, owned by the caller, and
// *claim (when not null) the region's claim word, valid as long as the channel. `anchor`,
// `held` and the timeout: ChannelSetup.
std::unique_ptr<Channel> AcceptRegistration(const wire::Register& msg, int fds[4], int anchor,
                                            bool held, int handshake_timeout_ms, int* proxy_a,
                                            int* proxy_b, std::atomic<uint32_t>** claim,
                                            wire::DeclineReason* reason) noexcept;

// One registration a listener took and answered ACCEPT: everything its connection needs is
// built (the server's held stream over the mapped region, a descriptor number kept for the
// anchor), so installing it at accept() allocates nothing.
struct Registration {
  Registration() = default;
  ~Registration();
  Registration(Registration&& o) noexcept;
  Registration& operator=(Registration&& o) noexcept;

  wire::Register msg;
  uint32_t uid = 0;  // who registered (SO_PEERCRED of the rendezvous connection)
  uint64_t received_ms = 0;
  std::unique_ptr<Stream> stream;          // the server's end, held until CONFIRM
  int proxy_a = -1;                        // the stream's A: dup3'd onto the application's number
  int anchor_slot = -1;                    // where the TCP socket will go (owned)
  std::atomic<uint32_t>* claim = nullptr;  // in the region (mapped by the stream's channel)

  Claim ReadClaim() const noexcept;
  // Stops waiting for the CONFIRM unless the client already committed to it. Returns
  // kAbandoned (now, or before), kWithdrawn, or kConfirmed: the CONFIRM is on its way, so
  // the connection must not be handed over as plain TCP.
  Claim Abandon() noexcept;

 private:
  void Release() noexcept;
};

// The listening side.
class Rendezvous {
 public:
  // Publishes the rendezvous for a listening socket bound to `local`; its streams get
  // `options`. Returns nullptr (and *error = -errno) when it cannot (-EADDRINUSE: another
  // process holds the name; it is logged with that process's pid and uid).
  static std::unique_ptr<Rendezvous> Publish(const sockaddr* local, bool v6only,
                                             StreamOptions options, int handshake_timeout_ms,
                                             int* error) noexcept;
  ~Rendezvous();

  // Readable when registrations wait to be read (an epoll set over the listening socket and
  // the connections whose message has not arrived): the control thread watches it.
  int fd() const noexcept { return epoll_fd_; }

  // Takes the registration for this connection out of the table (reading and answering
  // what arrived first). False when there is none.
  bool Take(const wire::Endpoint& client, const wire::Endpoint& server, Registration* out) noexcept;
  // Reads and answers what arrived, up to a budget per call (a burst or a flood must not
  // keep the caller here). True when more is waiting: call again after other work.
  bool Drain() noexcept;

  // Limits (docs/SECURITY.md, "Resource exhaustion").
  size_t capacity() const noexcept { return capacity_; }
  size_t per_uid_limit() const noexcept { return per_uid_; }

 private:
  struct Waiting {  // a rendezvous connection whose REGISTER has not arrived yet
    int fd;
    uint32_t uid;
    uint64_t since_ms;
  };

  Rendezvous() noexcept = default;
  enum class DrainResult { kDone, kMore, kBlocked };  // kBlocked: no descriptor to read with
  DrainResult DrainLocked() noexcept;
  // Connections accepted as plain while registrations were left unread: a registration
  // for one of them that turns up later is refused.
  bool IsLate(const wire::Endpoint& client, const wire::Endpoint& server) noexcept;
  void NoteLate(const wire::Endpoint& client, const wire::Endpoint& server) noexcept;
  void ExpireLocked(uint64_t now_ms) noexcept;
  void ReadOne(int conn, uint32_t uid, uint64_t now_ms) noexcept;
  void Answer(int conn, uint64_t nonce, wire::DeclineReason reason) noexcept;
  size_t CountForUid(uint32_t uid) const noexcept;
  bool MakeRoomFor(uint32_t uid) noexcept;
  void RemoveAt(size_t i) noexcept;  // the last live entry takes slot i
  bool Watch(int fd) noexcept;

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  StreamOptions options_;
  int timeout_ms_ = 2000;
  size_t capacity_ = 0;  // registrations held at most
  size_t per_uid_ = 0;   // of them, from one uid
  std::mutex mu_;
  std::unique_ptr<Registration[]> table_;  // [0, used_) live, fixed capacity: no allocation
  size_t used_ = 0;
  static constexpr size_t kMaxPerTuple = 4;
  static constexpr size_t kMaxWaiting = 32;
  static constexpr size_t kMaxWaitingPerUid = 8;
  Waiting waiting_[kMaxWaiting];
  size_t waiting_count_ = 0;
  struct Late {
    wire::Endpoint client, server;
    uint64_t until_ms = 0;
  };
  Late late_[256];
  size_t late_next_ = 0;
};

}  // namespace slip::shm
