// shm's internal interface (its public header is shm/transport.h): the same-host
// transport. Rings live in a memfd region shared by the two processes;
// detection goes through a rendezvous that each listening socket of a Slipstream process
// publishes.
//
// Rendezvous: an abstract AF_UNIX SOCK_SEQPACKET listener named from the listening port
// and the TCP listening socket's inode ("slipstream-v3:<port>:<inode>"); abstract names are
// per network namespace. A client asks the kernel which listener its SYN will reach (for
// an SO_REUSEPORT group, which member: core/sock_diag.h), connects to that listener's
// rendezvous and checks that it belongs to the listener's owner (abstract names have no
// owner, so any local user could bind one first). Then it registers its connection
// (4-tuple, nonce, and the region plus both proxy pairs as SCM_RIGHTS) BEFORE it sends its
// SYN, so the server's classification at accept is race-free, and carries its stream on
// the rings from the start. To a listener that said it has no SO_REUSEPORT
// (kListenerSolo, shm/region.h) a client registers without a port, its TCP socket handed
// over in the 4-tuple's place: no bind() before the SYN (docs/DESIGN.md, "Registering
// without a port").
//
// The region's claim word decides, once, whether the rings carry the connection: the
// process that accepts the connection claims it when it takes the registration (and then
// answers ACCEPT, which only wakes the client); the client withdraws when the connection
// turned out to be another process's (a plain member of the group, a sibling sharing the
// listener): its stream then continues on TCP from byte 0. Nothing of ours ever goes in
// band, so a connection that reaches a process without its registration is a plain one
// for that process, whatever it runs. A client to a plain server finds no rendezvous: one
// kernel lookup and one failed connect(2) on an AF_UNIX socket, nothing added to the TCP
// stream. docs/DESIGN.md, "Detection on one host"; docs/SECURITY.md for what each step
// defends against.
//
// Everything the peer writes into the region is hostile input: the ring size and nonce are
// validated once and kept, this end's own cursors are never read back, and Stream checks
// the peer's cursors before it uses them.
//
// Thread safety: Rendezvous methods take the rendezvous' own lock; an Offer is owned by one
// connecting thread; a Registration by whoever took it.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/channel.h"
#include "core/stream.h"
#include "core/trusted_path.h"
#include "core/wire.h"
#include "shm/sibling_queue.h"

namespace slip::shm {

// Whether the rings carry a registered connection, decided once, in the region's header,
// by whichever end moves it from kOpen first (compare and exchange):
//   kTaken      the server, when the process that accepted the connection takes its
//               registration: the rings carry it, and the client can no longer withdraw;
//   kWithdrawn  the client, when its connection went to a process that did not take it
//               (plain TCP arrived, the connection was accepted and not taken in time, the
//               listener said DECLINE or went away): its stream continues on TCP;
//   kAbandoned  the server, when it drops a registration it will not take (expired,
//               evicted, a forger's beside the real one): the client stays plain.
// Any other value (the peer wrote it) counts as kOpen for the server.
enum class Claim : uint32_t { kOpen = 0, kTaken = 1, kWithdrawn = 2, kAbandoned = 3 };

// The client's withdrawal of the claim word `claim`: open -> withdrawn. True when the
// connection is plain for both ends now (withdrawn here, or dropped by the server before);
// false when the server took it first.
inline bool WithdrawClaim(std::atomic<uint32_t>* claim) noexcept {
  uint32_t expected = uint32_t(Claim::kOpen);
  return claim->compare_exchange_strong(expected, uint32_t(Claim::kWithdrawn),
                                        std::memory_order_acq_rel) ||
         expected != uint32_t(Claim::kTaken);
}

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
  // channel settles by the claim word (ChannelControl::Settle), which the answer or other
  // news prompts it to read. -1: settled (a server is, from the start).
  int rendezvous = -1;
  // Client: the connection's 4-tuple, to ask the kernel whether its server end has been
  // accepted (by a process that then did not take it). A client port of 0 (registered by
  // its socket) is read from the anchor when needed.
  wire::Endpoint client, server;
  // Client: the listening socket registered at (0: through the rendezvous directory), to
  // note, once its connection is taken, whether it said kListenerSolo.
  uint64_t listener_inode = 0;
  // Client: the listener is in another network namespace (shm/dir_rendezvous.h): this
  // kernel cannot see the server's end, the listener tells (DECLINE) instead.
  bool across_namespaces = false;
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

// Connects to the rendezvous of the listener that a SYN to `dest` from `source` reaches
// (no source: from nowhere, which for an SO_REUSEPORT group is some member), and verifies
// it: it is the one that listening socket publishes, and it is held by that socket's
// owner. *member (when not null) is that socket's inode, set whenever a listening socket
// was found (with -ECONNREFUSED: it publishes no rendezvous). Returns the socket, or -errno:
// -ECONNREFUSED (no Slipstream listener), -EAGAIN (its queue is full), -EPERM (a rendezvous
// whose owner is not the listener's: not used), -EMFILE (descriptors short), other errors.
int FindRendezvous(const sockaddr* dest, const sockaddr* source = nullptr,
                   uint64_t* member = nullptr) noexcept;

// Connects to the rendezvous that a listener in another network namespace of this host
// published in `dir` (SLIP_RENDEZVOUS_DIR) for `dest`, and verifies it: the directory
// trusted, the name a socket made and held by this process's uid or the directory's
// owner. Returns the socket, or -errno: -ENOENT (no such name), -ECONNREFUSED (a name
// nobody serves), -EAGAIN, -EPERM (an untrusted directory, or a name of anybody else's:
// not used), other errors. shm/dir_rendezvous.h.
int FindDirRendezvous(const char* dir, const sockaddr* dest) noexcept;

// Builds the region, the proxies and the anchor's slot, all above the hidden-descriptor
// floor. Returns 0 or -errno (-EMFILE: descriptors short; -EFBIG: the file size limit).
int PrepareOffer(uint32_t ring_size, Offer* offer) noexcept;

// Sends REGISTER with the region and proxies over the rendezvous socket (non-blocking).
// `tcp` (>= 0: a rendezvous found in the directory) is the connection's own TCP socket,
// sent along as the proof the listener checks once it accepts the connection.
int SendRegister(int rendezvous, const Offer& offer, const wire::Endpoint& client,
                 const wire::Endpoint& server, int tcp = -1) noexcept;

// Client: withdraws (the TCP handshake took too long, or nothing is installed): the
// connection stays plain, as the server will see when it takes the registration. False
// when the server took it first (its accept() was quicker): the rings carry it there, so
// the connection cannot go on as plain TCP.
bool ClaimWithdraw(Offer* offer) noexcept;

// The client's channel once its TCP connection is up; takes the region, client_b and
// server_b out of `offer` (and closes its memfd: the mapping is all that is needed), and
// `rendezvous`: the rings carry the stream at once, and the channel settles when the
// claim is decided (the control thread calls Settle on the listener's answer, on news
// from the anchor, and at its deadlines). `client`/`server`: the 4-tuple. `*proxy_a`/
// `*proxy_b` receive the client's proxy pair. On failure the offer keeps everything and
// `rendezvous` is the caller's.
std::unique_ptr<Channel> MakeClientChannel(Offer* offer, int rendezvous,
                                           const wire::Endpoint& client,
                                           const wire::Endpoint& server, int* proxy_a, int* proxy_b,
                                           bool across_namespaces = false,
                                           uint64_t listener_inode = 0) noexcept;

// Listeners (by inode) whose region headers said kListenerSolo: a client registers its next
// connections there by its socket, without binding a port first. A small table of recent
// ones shared by the process's threads; an inode is not reused while its socket lives, and
// a stale or false entry costs a connection its acceleration, never a byte.
void NoteSoloListener(uint64_t inode) noexcept;
bool IsSoloListener(uint64_t inode) noexcept;

// ----------------------------------------------------------------------------- server

// Validates what REGISTER carries and builds the server's channel over it: the memfd (a
// sealed regular file of exactly the region's size, mapped and then closed), the server's proxy
// pair (two ends of one AF_UNIX stream socketpair, proven by a probe byte), the client's B (an
// AF_UNIX stream socket), the region mapped once and its header checked against `msg`. Takes `fds`
// (memfd, server A, server B, client B): on failure each is closed and *reason says why.
// On success *proxy_a/*proxy_b are the server's proxy pair, owned by the caller, and
// *claim (when not null) the region's claim word, valid as long as the channel. `anchor`:
// ChannelSetup.
// `across_namespaces`: it came through the rendezvous directory (shm/dir_rendezvous.h),
// with the client's TCP socket as a fifth descriptor (the caller's, not in `fds`), and the
// proxy pair is proven by a probe (unix_diag sees only this namespace's sockets).
// `listener_flags` (kListener*, shm/region.h) go into the region's header for the client.
std::unique_ptr<Channel> AcceptRegistration(const wire::Register& msg, int fds[4], int anchor,
                                            int* proxy_a, int* proxy_b,
                                            std::atomic<uint32_t>** claim,
                                            wire::DeclineReason* reason,
                                            bool across_namespaces = false,
                                            uint32_t listener_flags = 0) noexcept;

// The listener's one answer on a rendezvous connection (kUnspecified: ACCEPT).
void AnswerRegistration(int conn, uint64_t nonce, wire::DeclineReason reason) noexcept;

// One registration a listener read and can serve: everything its connection needs is
// built (the server's stream over the mapped region, a descriptor number kept for the
// anchor), so installing it at accept() allocates nothing. Its client is answered when
// the registration is taken (Commit: ACCEPT) or dropped (Abandon: DECLINE).
struct Registration {
  Registration() = default;
  ~Registration();
  Registration(Registration&& o) noexcept;
  Registration& operator=(Registration&& o) noexcept;

  wire::Register msg;
  uint32_t uid = 0;  // who registered (SO_PEERCRED of the rendezvous connection)
  uint64_t received_ms = 0;
  std::unique_ptr<Stream> stream;          // the server's end
  int proxy_a = -1;                        // the stream's A: dup3'd onto the application's number
  int anchor_slot = -1;                    // where the TCP socket will go (owned)
  int answer = -1;                         // the rendezvous connection, until answered (owned)
  std::atomic<uint32_t>* claim = nullptr;  // in the region (mapped by the stream's channel)
  // Registered through the rendezvous directory (another network namespace): the client's
  // TCP socket, its proof (owned; closed once it has been looked at in Take), and when the
  // server's end was first seen accepted without being taken here.
  int client_socket = -1;
  // Registered by its socket (this namespace, no port bound: msg.client.port is 0): the
  // inode of the client's TCP socket, which it handed over (closed once looked at), so
  // that only its holder can have registered it. Take finds it by the connection's client
  // socket, as the kernel names it.
  uint64_t client_inode = 0;
  uint64_t accepted_seen_ms = 0;

  Claim ReadClaim() const noexcept;
  // The accepting process takes the connection onto the rings: claims it and says ACCEPT.
  // False when the client withdrew first (the connection is plain for both).
  bool Commit() noexcept;
  // Drops the registration unless this end took it, and tells its client (DECLINE).
  // Returns kAbandoned (now, or before, or a claim word the client set itself), kWithdrawn,
  // or kTaken: Commit took it, the rings carry the connection, so it must not be handed
  // over as plain TCP.
  Claim Abandon() noexcept;

 private:
  void Release() noexcept;
  bool taken_ = false;  // Commit claimed it (never read from the region)
};

// The listening side.
class Rendezvous {
 public:
  // Publishes the rendezvous for the TCP listening socket `listener_inode` bound to `port`;
  // its streams get `options`. Returns nullptr (and *error = -errno) when it cannot
  // (-EADDRINUSE: another process holds the name; it is logged with that process's pid and
  // uid).
  // `solo`: the listening socket has no SO_REUSEPORT (kListenerSolo, shm/region.h), said to
  // every client in its region's header.
  static std::unique_ptr<Rendezvous> Publish(uint16_t port, uint64_t listener_inode,
                                             StreamOptions options, int* error,
                                             bool solo = false) noexcept;
  ~Rendezvous();

  // Readable when registrations wait to be read (an epoll set over the listening socket and
  // the connections whose message has not arrived): the control thread watches it.
  int fd() const noexcept { return epoll_fd_; }

  // Takes the registration for this connection out of the table (reading and answering
  // what arrived first). False when there is none.
  bool Take(const wire::Endpoint& client, const wire::Endpoint& server, Registration* out) noexcept;
  // Reads what arrived (declining what it cannot serve), up to a budget per call (a burst
  // or a flood must not keep the caller here), and drops registrations whose clients
  // withdrew. True when more is waiting: call again after other work.
  bool Drain() noexcept;

  // The listening socket is held by several processes (fork): registrations are read only
  // by Take, in the process that accepts, one at a time; one read by a process whose
  // connection it is not is passed on unread through the siblings' queue (made by
  // PrepareSharing before the fork), where the process that accepted its connection
  // finds it. Drain() then does nothing.
  // (Its names in the rendezvous directory are withdrawn then: a registration from another
  // namespace is proven and watched by the control thread, which such a listener does not
  // run. Clients in other namespaces stay plain.)
  void Share() noexcept;
  bool shared() const noexcept { return shared_.load(std::memory_order_relaxed); }
  // Before a fork: makes the siblings' queue (shm/sibling_queue.h) unless there is one.
  void PrepareSharing() noexcept;

  // Publishes, in `dir` (SLIP_RENDEZVOUS_DIR, trusted: RendezvousDir), a name for
  // each of the `count` endpoints `reached` at which other network namespaces of this
  // host reach the listener (ReachableEndpoints, shm/dir_rendezvous.h): clients there
  // register through it with their TCP socket as proof. Returns how many names it holds; a name
  // held by a live rendezvous already (another member of an SO_REUSEPORT group) is left to it.
  size_t PublishInDir(const TrustedDir& dir, const wire::Endpoint* reached, size_t count) noexcept;

  // Limits (docs/SECURITY.md, "Resource exhaustion").
  size_t capacity() const noexcept { return capacity_; }
  size_t per_uid_limit() const noexcept { return per_uid_; }

 private:
  struct Waiting {  // a rendezvous connection whose REGISTER has not arrived yet
    int fd;
    uint32_t uid;
    uint64_t since_ms;
    bool via_dir;  // connected through a name in the rendezvous directory
  };
  struct DirName {  // a name published in the rendezvous directory
    int fd = -1;    // its listening socket
    wire::Endpoint server;
    char entry[64] = {};  // its name in the directory (kDirEntryNameMax)
    ino_t inode = 0;      // the entry bound, so that only it is ever removed
  };

  Rendezvous() noexcept = default;
  enum class DrainResult { kDone, kMore, kBlocked };  // kBlocked: no descriptor to read with
  DrainResult DrainLocked(int budget) noexcept;       // budget: connections read at most
  // Connections accepted as plain while registrations were left unread: a registration
  // for one of them that turns up later is refused.
  // (`client_inode`: the connection's client socket, for one registered by its socket; 0
  // when not known.)
  bool IsLate(const wire::Register& msg, uint64_t client_inode) noexcept;
  void NoteLate(const wire::Endpoint& client, const wire::Endpoint& server,
                uint64_t client_inode) noexcept;
  void ExpireLocked(uint64_t now_ms) noexcept;
  void ReadOne(int conn, uint32_t uid, uint64_t now_ms, bool via_dir) noexcept;
  // The inode of a socket a client handed over (0: not a socket).
  static uint64_t SocketInode(int fd) noexcept;
  // The uid of a rendezvous connection's client (UINT32_MAX when unknown).
  static uint32_t PeerUid(int conn) noexcept;
  // Shared by processes: what a rendezvous connection's REGISTER, unread, says of the
  // accepted connection `client` -> `server` (`owner_inode(owner_ctx)`: its client
  // socket's inode, asked only for a registration made by socket; 0 when the kernel
  // cannot say).
  enum class Peeked { kMine, kOther, kNotYet, kUnreadable };
  Peeked PeekFor(int conn, const wire::Endpoint& client, const wire::Endpoint& server,
                 uint64_t (*owner_inode)(void*), void* owner_ctx) noexcept;
  // Shared by processes: reads rendezvous connections, the siblings' first, until this
  // connection's registration is in the table, passing every other one on unread; waits
  // only while a sibling holds one it has not passed yet. False when cut short (limits).
  bool SearchSiblings(const wire::Endpoint& client, const wire::Endpoint& server,
                      uint64_t (*owner_inode)(void*), void* owner_ctx,
                      uint64_t give_up_ms) noexcept;
  // Accepts and reads the rendezvous connections queued on `listen_fd`, within *budget.
  DrainResult AcceptQueued(int listen_fd, bool via_dir, int* budget, uint64_t now_ms) noexcept;
  // Whether a registration from the directory can be for one of our connections.
  wire::DeclineReason CheckAcrossNamespaces(const wire::Register& msg, int client_socket) noexcept;
  // For a registration from the directory: whether its connection went elsewhere.
  bool GoneElsewhere(Registration* r, uint64_t now_ms) noexcept;
  bool IsDirName(int fd) const noexcept;
  void WithdrawDirNames(bool unlink_names) noexcept;
  size_t CountForUid(uint32_t uid) const noexcept;
  bool MakeRoomFor(uint32_t uid) noexcept;
  void RemoveAt(size_t i) noexcept;  // the last live entry takes slot i
  bool Watch(int fd) noexcept;

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  uint64_t listener_inode_ = 0;  // the TCP listening socket's
  uint32_t listener_flags_ = 0;  // kListener*, for the clients
  DirName dir_names_[8];         // [0, dir_count_): kMaxDirNames
  size_t dir_count_ = 0;
  TrustedDir dir_;       // where they are
  pid_t publisher_ = 0;  // the process that bound them (and may unlink them)
  // Ticks in the epoll set while registrations from the directory wait: their clients
  // cannot see where their connections went, so the control thread looks (GoneElsewhere).
  int timer_fd_ = -1;
  bool timer_armed_ = false;
  void ArmTimer(bool on) noexcept;
  StreamOptions options_;
  size_t capacity_ = 0;  // registrations held at most
  size_t per_uid_ = 0;   // of them, from one uid
  std::mutex mu_;
  std::atomic<int> takers_{0};  // accept()s waiting for mu_: the control thread gives way
  std::atomic<bool> shared_{false};
  std::unique_ptr<SiblingQueue> siblings_;  // made before a fork (PrepareSharing)
  uint64_t next_expire_ms_ = 0;
  std::unique_ptr<Registration[]> table_;  // [0, used_) live, fixed capacity: no allocation
  size_t used_ = 0;
  static constexpr size_t kMaxPerTuple = 4;
  static constexpr size_t kMaxWaiting = 32;
  static constexpr size_t kMaxWaitingPerUid = 8;
  Waiting waiting_[kMaxWaiting];
  size_t waiting_count_ = 0;
  struct Late {
    wire::Endpoint client, server;
    uint64_t client_inode = 0;
    uint64_t until_ms = 0;
  };
  Late late_[256];
  size_t late_next_ = 0;
};

}  // namespace slip::shm
