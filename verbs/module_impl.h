// The verbs module's internals, shared by its files: the records of a listener, of a
// client's handshake, of parked queue pairs and of removed devices, and the VerbsModule
// class (verbs.h's Module). A listener's requests are kept in core's table
// (core/request_module.h). Internal to the verbs library.
//
// Files by concern: module.cc (start-up, devices, fork, the library's entry point),
// module_progress.cc (the progress thread: rdma_cm events, completions, requests arriving
// and expiring), module_listen.cc (listeners and accepting requests), module_group.cc
// (SO_REUSEPORT groups: which member a request is for, the members' directory),
// module_connect.cc (the client's handshake), module_reuse.cc (parked queue pairs),
// module_removal.cc (a device that goes away).
//
// Locks: mu_ (devices_, listeners_) before the requests' table's; park_mu_ is a leaf.
#pragma once

#include <rdma/rdma_cma.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/negative_cache.h"
#include "core/pending_requests.h"
#include "core/sys.h"
#include "core/wire.h"
#include "verbs/conn.h"
#include "verbs/device.h"
#include "verbs/options.h"
#include "verbs/private_data.h"
#include "verbs/qp.h"
#include "verbs/verbs.h"

namespace slip::verbs {

namespace module_internal {
inline constexpr int kListenBacklog = 1024;
// Parked queue pairs (docs/DESIGN.md "Reusing queue pairs"): one whose peer has not closed
// yet waits this long for it; a client's idle one this long for a connection to claim it;
// a listener's (which the client drops first) longer.
inline constexpr uint64_t kLingerMs = 30000;
inline constexpr uint64_t kClientIdleMs = 10000;
inline constexpr uint64_t kListenerIdleMs = 60000;

inline bool SetNonblocking(int fd) noexcept {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// The wire endpoint of an rdma_cm address (v4-mapped folds to IPv4, as in core/wire).
inline bool EndpointOf(const sockaddr* sa, wire::Endpoint* ep) noexcept {
  return sa && wire::EndpointFromSockaddr(sa, ep);
}

inline bool SameAddress(const wire::Endpoint& a, const wire::Endpoint& b) noexcept {
  return a.family == b.family && std::memcmp(a.addr, b.addr, 16) == 0;
}

// Moves the elements for which `take` holds from *from to the end of *out, keeping the
// others in their order (the parked list is oldest first). One that cannot be moved (out
// of memory) stays where it is, for a later round.
template <typename T, typename Take>
void MoveOutIf(std::vector<T>* from, std::vector<T>* out, Take take) noexcept {
  size_t kept = 0;
  for (size_t i = 0; i < from->size(); ++i) {
    bool moved = false;
    if (take((*from)[i])) {
      try {
        out->push_back((*from)[i]);
        moved = true;
      } catch (...) {
      }
    }
    if (!moved) (*from)[kept++] = (*from)[i];
  }
  from->erase(from->begin() + long(kept), from->end());
}

// Binds a new rdma_cm id of listener `l` (its context) at l's address with `port` (0:
// any) and listens. Returns 0 with *id, or the errno (nothing left).
int BindListener(rdma_event_channel* channel, Listener* l, uint16_t port, rdma_cm_id** id) noexcept;

// Epoll keys of the progress thread: a Device* (aligned), a Conn's own channel (bit 0,
// conn.h), a group member's directory socket (bit 1, its descriptor above).
inline uint64_t DirectoryKey(int fd) noexcept {
  return (uint64_t(uint32_t(fd)) << 2) | 2;
}
inline bool IsDirectoryKey(uint64_t key) noexcept {
  return (key & 3) == 2;
}
inline int DirectoryFd(uint64_t key) noexcept {
  return int(uint32_t(key >> 2));
}

}  // namespace module_internal

// A TCP listening socket of this process in an SO_REUSEPORT group.
struct GroupMember {
  uint64_t inode = 0;
  // Where the holder of the group's port learns this process's rdma_cm port (a listening
  // AF_UNIX socket, abstract name; verbs/module_group.cc), or -1 in the holder itself.
  int directory_fd = -1;
};

struct Listener {
  rdma_cm_id* id = nullptr;
  uint16_t port = 0;  // the TCP port (a request's tuple names it)
  // Where the rdma_cm listener is bound: `port`, or for a group member whose process does
  // not hold the port, a port of its own that the holder redirects requests to.
  uint16_t rdma_port = 0;
  // Such a member's second listener, at `port`, once the holder went and this process took
  // the port over (TakeOverPorts); requests reach the same Listener through either id.
  rdma_cm_id* port_id = nullptr;
  sockaddr_storage local{};  // the TCP listener's address, as given
  wire::Endpoint addr{};     // as bound (claims must name it, unless it is the wildcard)
  bool wildcard = false;
  // SO_REUSEPORT (docs/DESIGN.md "Servers that share a port"): the TCP listening sockets
  // of this process in the group, which share this one rdma_cm listener; a request is
  // served only for a SYN that one of them will get. Under the module's mu_.
  bool group = false;
  std::vector<GroupMember> members;
  RequestOwner requests;  // its share of the module's table (core/pending_requests.h)
};

struct ClientConn {
  // Where the client stands: resolving the address, then the route; resolved (the caller
  // binds its TCP socket); the REQ sent; the REP taken (the id now reports to the module's
  // channel). A parked queue pair taken for the connection: kReused (resolved, not yet
  // said), kResolved, the CLAIM sent (kClaim), the ANSWER taken (kAccepted).
  enum class Stage : uint8_t { kAddr, kRoute, kResolved, kRequest, kAccepted, kReused, kClaim };
  rdma_event_channel* channel = nullptr;  // private until Finish/Abort
  rdma_cm_id* id = nullptr;
  Conn* conn = nullptr;
  wire::Endpoint dest;
  uint64_t nonce = 0;
  uint8_t ring_log2 = 0;
  Stage stage = Stage::kAddr;
  uint64_t deadline_ms = 0;
  bool reused = false;  // conn is a parked queue pair (no rdma_cm exchange of its own)
  // The request, kept for a second one: a group's holder may redirect it (once) to the
  // rdma_cm port of the member process that the SYN will reach.
  sockaddr_storage dest_addr{};
  wire::Endpoint client, server;
  bool redirected = false;
};

struct ParkedConn {
  Conn* conn = nullptr;
  uint64_t since_ms = 0;
  // Release lists a queue pair before its PARKED goes out and marks it ready after: until
  // then its closing thread still uses it, and nothing else may take or delete it.
  bool ready = true;
};

// A device that rdma_cm said was removed (DEVICE_REMOVAL), from the event to the end of the
// process: the context is never handed out again (librdmacm may still name it in an id
// resolved before the removal).
struct Removal {
  ibv_context* context = nullptr;
  Device* device = nullptr;  // ours on it, until nothing uses it any more
  bool retired = false;      // RetireContext done
  bool superseded = false;   // under mu_: the address now holds a new context (DeviceFor)
};

class VerbsModule final : public Module, public ConnOwner {
 public:
  VerbsModule(const Config* config, const Options* options) noexcept
      : Module(QpChannel::kNames, DeleteRequest, sys::HiddenFdFloor(),
               config->handshake_timeout_ms),
        config_(config),
        options_(options) {}
  int Init(char* error, size_t error_len) noexcept;

  Listener* Listen(const sockaddr* local, uint64_t group_member, Reason* why) noexcept override;
  void Unlisten(Listener* listener, uint64_t group_member) noexcept override;
  ClientConn* Start(const sockaddr* dest, sockaddr_storage* source, Reason* why) noexcept override;
  bool Request(ClientConn* conn, const wire::Endpoint& client, const wire::Endpoint& server,
               uint64_t nonce, uint32_t ring_size, Reason* why) noexcept override;
  Step Advance(ClientConn* conn, sockaddr_storage* source, Reason* why) noexcept override;
  int EventFd(ClientConn* conn) noexcept override {
    return conn->channel ? conn->channel->fd : conn->conn->EventFd();
  }
  uint64_t Deadline(ClientConn* conn) noexcept override { return conn->deadline_ms; }
  bool AwaitsTaken(ClientConn* conn) noexcept override {
    return conn->conn && conn->conn->awaits_taken();
  }
  std::unique_ptr<Channel> Finish(ClientConn* conn, int proxy_b) noexcept override;
  void Abort(ClientConn* conn) noexcept override;
  void ForkPrepare() noexcept override;
  void ForkParent() noexcept override;
  void ForkChild() noexcept override;
  void FlushAll(int timeout_ms) noexcept override;
  void Release(Conn* conn) noexcept override;

 private:
  // accept() took a kept request (core/request_module.h): committed once its client's
  // HELLO came; a group's client is told TAKEN.
  void Accepted(Listener* l, const wire::Endpoint& client, const KeptRequest& kept,
                bool* committed) noexcept override;
  static void DeleteRequest(RemoteRing* conn) noexcept { delete static_cast<Conn*>(conn); }
  // The table, made at the first listener (clients never pay for it); null in a fork child.
  PendingRequests* Requests() noexcept;
  // Room in the table for a request for `t` with rings of `ring_size` at `l` (its REP or
  // ANSWER goes once it is kept): false when its sender or the listener has no more
  // (refused, and recorded for accept()'s reason). The caller deletes the requests it
  // evicted (room->evicted), outside mu_.
  bool ReserveRequest(Listener* l, const Tuple& t, uint32_t ring_size,
                      PendingRequests::Room* room) noexcept;
  void Run() noexcept;
  void HandleCmEvent(rdma_cm_event* event) noexcept;
  void OnConnectRequest(rdma_cm_event* event) noexcept;
  // Groups (verbs/module_group.cc). Of a group listener: does the SYN of `req`'s 4-tuple
  // reach one of its members (kOurs), or a member of another Slipstream process of the
  // uid that owns the group, listening on rdma_cm at *port (kRedirect), or neither?
  enum class MemberAnswer : uint8_t { kOurs, kRedirect, kElsewhere };
  MemberAnswer MemberFor(Listener* listener, const Req& req, uint16_t* port) noexcept;
  // A member whose process does not hold the port: its rdma_cm listener on a port of its
  // own, and its name in the directory. Returns the listener or nullptr.
  Listener* ListenAside(const wire::Endpoint& ep, uint64_t inode, Reason* why) noexcept;
  // Publishes `inode`'s rdma_cm port under its name (mu_ held). False if it cannot.
  bool PublishMember(Listener* listener, GroupMember* member) noexcept;
  void UnpublishMember(GroupMember* member) noexcept;  // (mu_ held)
  // Progress thread: a directory socket has a holder asking.
  void ServeDirectory(int fd) noexcept;
  // Progress thread, now and then: a group whose holder went (its process exited) gets a
  // new one, the first member process to bind the port again.
  void TakeOverPorts() noexcept;
  void HandleCompletions(Device* device) noexcept;
  void CheckRequests(uint64_t now_ms) noexcept;
  void TrimIdleSlots(uint64_t now_ms) noexcept;
  Device* DeviceFor(ibv_context* context, int* error) noexcept;
  bool DeviceAllowed(ibv_context* context) const noexcept;
  bool SendNotify(Device* device) const noexcept;
  static void Reject(rdma_cm_id* id) noexcept;
  Reason MemlockReason(int error, uint32_t ring_size) noexcept;
  bool IsListenerId(rdma_cm_id* id) noexcept;
  void ReleaseClient(ClientConn* c) noexcept;
  Step TakeEvent(ClientConn* c, rdma_cm_event* event, sockaddr_storage* source,
                 Reason* why) noexcept;
  Step Fail(ClientConn* c, Reason why, Reason* out) noexcept;
  // The REQ (and the queue pair it offers) for c's tuple, nonce and ring size.
  bool SendReq(ClientConn* c, Reason* why) noexcept;
  // The group's holder named another rdma_cm port of the destination: ask there.
  Step Redirect(ClientConn* c, uint16_t rdma_port, Reason* why) noexcept;
  Step Resolved(ClientConn* c, sockaddr_storage* source, Reason* why) noexcept;
  // Reuse: a parked client queue pair to `dest` whose listener parked too, or nullptr.
  Conn* TakeParked(const wire::Endpoint& dest) noexcept;
  void PutParked(Conn* conn) noexcept;
  size_t ParkedCount() noexcept;
  ClientConn* Reuse(const wire::Endpoint& dest) noexcept;
  bool SendClaim(ClientConn* c, const wire::Endpoint& client, const wire::Endpoint& server,
                 uint32_t ring_size, Reason* why) noexcept;
  // Progress thread: CLAIMs that arrived on the listener's parked queue pairs, and the
  // parked queue pairs that died or waited too long.
  void ServeClaims() noexcept;
  void ServeClaim(Conn* conn, const LinkMsg& claim) noexcept;
  void SweepParked() noexcept;
  // Deletes the oldest parked queue pair (its ring slot goes back to the device's pool):
  // a new connection that could not get resources tries once more. False if none.
  bool EvictParked() noexcept;
  Listener* ListenerFor(const wire::Endpoint& server) noexcept;
  // Device removal (docs/DESIGN.md "Failover"): the event's context is noted (and no longer
  // handed out); after the events were acknowledged, ReapRemoved destroys what the process
  // holds on it: listener ids bound to it, requests pending on it, parked queue pairs, the
  // RDMA objects of its connections (which live on over TCP), and then the device.
  void NoteRemoved(ibv_context* context) noexcept;
  void ReapRemoved() noexcept;
  bool ReapRemoval(Removal* removal) noexcept;  // true once nothing is left to do

  const Config* config_;
  const Options* options_;  // the verbs transport's own (verbs/options.h)
  rdma_event_channel* cm_channel_ = nullptr;
  int epoll_fd_ = -1;
  std::thread thread_;
  std::mutex mu_;  // devices_, listeners_
  std::map<ibv_context*, Device*> devices_;
  std::vector<Listener*> listeners_;
  NegativeCache negative_;
  std::atomic<bool> forked_{false};
  std::atomic<bool> memlock_reported_{false};
  std::mutex park_mu_;  // parked_ (a leaf: nothing else is taken under it)
  std::vector<ParkedConn> parked_;
  std::vector<Removal> removals_;      // written by the progress thread under mu_
  bool reaping_ = false;               // progress thread: a removal is not finished yet
  uint64_t last_housekeeping_ms_ = 0;  // progress thread: TrimIdleSlots, CheckAllConns
  // Progress thread (MemberFor): what other processes' members answered lately, so that a
  // storm to a group asks each member's directory once a second, not once per request, and
  // a member whose process does not answer (stopped, say) costs the wait once a second.
  struct MemberPort {
    uint64_t inode = 0;
    uint16_t port = 0;  // 0: it did not answer
    uint64_t until_ms = 0;
  };
  std::array<MemberPort, 16> member_ports_{};
};

}  // namespace slip::verbs
