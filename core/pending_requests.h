// The requests a process's listeners answered and keep for accept(), before anything proves
// that the TCP connection they announce exists: what a transport whose requests are
// answered before the SYN (core/ring_module.h) keeps them in (fabric/stream_listen.cc).
//
// Anybody who can reach a listener can make us keep one, so what they hold is bounded the
// way shm bounds its registrations (docs/SECURITY.md, "Resource exhaustion"):
//
// - Memory: the requests' rings (and, where the transport says so, the rings of those
//   dropped that must still retire: fabric's) fit a byte budget per process; at most
//   kMaxPerListener requests per listener and a ceiling in all (kMaxRequests, less where
//   each holds descriptors: a share of those above the hidden floor).
// - Sharing: each request belongs to a principal, the local user whose socket sent it
//   where the kernel names it (inet_diag), else its source address; loopback senders it
//   cannot name share one. A principal holds at most kMaxPerPrincipal. When the budget or
//   a table is full, the principal holding the most gives up its oldest unproven request,
//   as shm's uid holding the most gives up its oldest registration.
// - Time: kGraceMs after its answer, a request whose TCP connection the kernel does not
//   show (SYN_RECV, queued or accepted: core/sock_diag.h FindConnection) is dropped; one
//   it shows is kept until accept() takes it, or kPendingMs.
//
// A dropped request's client had our REP and may still confirm: its TCP connection may
// come late. So what is dropped leaves a record of its 4-tuple and nonce (a few bytes, not
// its rings) for kPendingMs, and accept() finds that record: the connection is then held
// without a path of the transport's (core/stand_in_ring.h), and the client's CONFIRM moves
// it onto TCP (a failover from byte 0), never into the application's bytes. Room for
// those records is reserved before a request is kept: when there is none, the request is
// refused.
//
// And refusals are remembered by 4-tuple (kRefusals, the oldest overwritten), so that
// accept() can say why a client of ours is plain (stats only).
//
// Thread safety: every method takes the table's mutex. The table never touches a
// connection: it keeps each request's as an owned pointer and hands it back to be deleted
// (outside the mutex), so that it depends on no transport (unit-tested alone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/keyed_hash.h"
#include "core/stats.h"
#include "core/wire.h"

namespace slip {

class RemoteRing;

// What the table counts per listener (a listener's share: kMaxPerListener).
struct RequestOwner {
  size_t kept = 0;  // under the table's mutex
};

// A TCP connection as a REQ names it.
struct Tuple {
  wire::Endpoint client, server;
  bool operator==(const Tuple& o) const noexcept {
    return client == o.client && server == o.server;
  }
};

// Who sent a request, for sharing out what the listeners keep.
struct Principal {
  enum class Kind : uint8_t { kNone, kUid, kAddress, kLoopback };
  Kind kind = Kind::kNone;
  uint32_t uid = 0;          // kUid
  wire::Endpoint address{};  // kAddress (port 0)
  bool operator==(const Principal& o) const noexcept {
    return kind == o.kind && uid == o.uid && address == o.address;
  }
  // Who sent from `source` when the kernel names no user for it: its address, or for a
  // loopback address the one principal every local sender shares (any local user may
  // send from any loopback address).
  static Principal OfSource(const wire::Endpoint& source) noexcept;
};

class PendingRequests {
 public:
  static constexpr size_t kMaxRequests = 4096;
  static constexpr size_t kMaxPerListener = 1024;
  static constexpr size_t kMaxPerPrincipal = 64;
  static constexpr uint64_t kPendingMs = 30000;  // as long as a backlog may hold a connection
  static constexpr uint64_t kGraceMs = 1000;
  static constexpr size_t kMaxDropped = 32768;
  static constexpr size_t kRefusals = 4096;
  // What one request is charged besides its rings (its queues, the provider's state).
  static constexpr size_t kOverheadBytes = 32 << 10;

  PendingRequests() noexcept = default;
  ~PendingRequests() = default;  // (its owner takes every connection out first: ForgetAny)
  PendingRequests(const PendingRequests&) = delete;
  PendingRequests& operator=(const PendingRequests&) = delete;

  // The budget of a process whose transport has none of its own: 192 MiB, or kMinRequests
  // requests' worth where one is `charge` bytes and that is more.
  static constexpr size_t kMinRequests = 8;
  static size_t DefaultBudget(size_t charge) noexcept;
  // The tables (fixed from now on), for at most `max_kept` requests (<= kMaxRequests) in
  // `budget_bytes`. False: no memory.
  bool Init(size_t budget_bytes, size_t max_kept = kMaxRequests) noexcept;
  size_t budget() const noexcept { return budget_; }
  // Bytes the kept requests are charged now.
  size_t charged() const noexcept;

  // What the REP to a request says of our connection: filled for one kept already.
  struct Answer {
    uint32_t ring_size = 0;
    uint64_t ring_key = 0;
    uint64_t ring_addr = 0;
    uint32_t note_tag = 0;
  };
  enum class Found : uint8_t { kNone, kSame, kOther };
  // A request kept for `t`: the same one (`nonce`: *out is its REP's) or another.
  Found Find(const Tuple& t, uint64_t nonce, Answer* out) noexcept;

  // Room for one more request of `charge` bytes, from `who`, at `l`.
  static constexpr size_t kMaxEvicted = 8;
  struct Room {
    RemoteRing* evicted[kMaxEvicted] = {};  // the caller deletes them (outside the lock)
    size_t evicted_count = 0;
    RequestOwner* owner = nullptr;
    uint32_t principal = 0;
    size_t charge = 0;
    bool reserved = false;
  };
  enum class Admitted : uint8_t { kYes, kListenerFull, kPrincipalFull, kFull };
  Admitted Reserve(RequestOwner* owner, const Principal& who, size_t charge, uint64_t now_ms,
                   Room* room) noexcept;
  // The reserved room is taken by `conn` (owned from now on) for `t`, whose REP says
  // `answer`, or given back.
  void Keep(Room* room, const Tuple& t, uint64_t nonce, RemoteRing* conn, const Answer& answer,
            uint64_t now_ms) noexcept;
  void Release(Room* room) noexcept;

  // Requests whose grace is over and that the kernel must be asked about, at most `max`.
  struct Check {
    uint32_t slot = 0;
    uint32_t generation = 0;
    Tuple tuple;
    bool connected = false;  // the caller's answer
  };
  size_t TakeDue(uint64_t now_ms, Check* out, size_t max) noexcept;
  // The answers: connected ones are kept, the others dropped (their records stay). Also
  // expires what is due. Connections to delete go into out[0..*count) (at most `max`).
  void Settle(const Check* checks, size_t n, uint64_t now_ms, RemoteRing** out, size_t max,
              size_t* count) noexcept;
  // When TakeDue has something to do next (0: nothing kept).
  uint64_t next_due_ms() const noexcept;
  // TakeDue and Settle in rounds, the kernel asked in between (core/sock_diag.h
  // FindConnection: the connection in its handshake, queued or accepted): what a progress
  // thread calls once next_due_ms() is reached. Each connection to delete goes to
  // `release`, outside the table's mutex. Returns how many went.
  using Deleter = void (*)(RemoteRing* conn) noexcept;
  size_t CheckDue(uint64_t now_ms, Deleter release) noexcept;

  // accept()'s side. Whether a request, or a dropped request's record, waits for `t`.
  bool Has(const Tuple& t, uint64_t now_ms) noexcept;
  struct Taken {
    RemoteRing* conn = nullptr;  // the request's (owned by the caller now); null: dropped
    uint64_t nonce = 0;
    uint8_t ring_log2 = 0;  // a dropped request's
    bool dropped = false;
  };
  // Takes what waits for `t`. False: nothing does.
  bool Take(const Tuple& t, uint64_t now_ms, Taken* out) noexcept;
  // Forgets `t`'s request (another transport carries the connection): its connection, or
  // null.
  RemoteRing* Forget(const Tuple& t, uint64_t now_ms) noexcept;
  // One request of `owner`'s (the listener goes), or of anybody's (null: the table goes):
  // its connection, or null when none is left.
  RemoteRing* ForgetOneOf(const RequestOwner* owner) noexcept;
  // `t`'s request if its connection is `conn`, whose client gave up (it is plain): no
  // record is left, but the refusal `why`, for accept()'s reason. Its connection, or null.
  RemoteRing* Withdraw(const Tuple& t, const RemoteRing* conn, Reason why,
                       uint64_t now_ms) noexcept;
  // Drops one request whose connection `match` names (its path is gone: a record is left,
  // as for any dropped request): its connection, or null when none is left. `match` runs
  // under the table's mutex, and may read only what a connection never changes.
  using Match = bool (*)(const RemoteRing* conn, const void* ctx) noexcept;
  RemoteRing* DropOneIf(Match match, const void* ctx, uint64_t now_ms) noexcept;

  // Refusals, by 4-tuple, for kPendingMs.
  void RecordRefusal(const Tuple& t, Reason why, uint64_t now_ms) noexcept;
  Reason Refused(const Tuple& t, uint64_t now_ms) noexcept;

 private:
  static constexpr uint32_t kNil = ~uint32_t(0);
  enum class State : uint8_t { kFree, kUnchecked, kChecking, kProven };
  struct List {
    uint32_t head = kNil, tail = kNil;
  };
  struct Request {
    Tuple tuple;
    uint64_t hash = 0;
    uint64_t nonce = 0;
    RemoteRing* conn = nullptr;
    RequestOwner* owner = nullptr;
    Answer answer;
    uint64_t created_ms = 0;
    size_t charge = 0;
    uint32_t principal = kNil;
    uint32_t generation = 0;
    uint32_t chain = kNil;                // the hash chain
    uint32_t prev = kNil, next = kNil;    // unchecked_ (kUnchecked, kChecking) or proven_
    uint32_t mprev = kNil, mnext = kNil;  // its principal's unproven ones
    uint8_t ring_log2 = 0;
    State state = State::kFree;
  };
  struct Holder {
    Principal who;
    uint64_t hash = 0;
    uint32_t chain = kNil;
    uint32_t count = 0;  // 0: free
    List unproven;       // oldest first
  };
  struct Dropped {
    uint64_t hash = 0;  // the 4-tuple's (64 bits: a false match costs a plain client a hold)
    uint64_t nonce = 0;
    uint64_t until_ms = 0;
    uint32_t chain = kNil;
    uint8_t ring_log2 = 0;
    bool live = false;
  };
  struct Refusal {
    uint64_t hash = 0;
    uint64_t until_ms = 0;
    uint32_t chain = kNil;
    Reason why = Reason::kNone;
  };

  uint64_t HashOf(const Tuple& t) const noexcept;
  uint64_t HashOf(const Principal& p) const noexcept;
  uint32_t FindLocked(const Tuple& t, uint64_t hash) const noexcept;
  uint32_t HolderLocked(const Principal& who, bool add) noexcept;
  // Takes request `i` out of every table (its holder's count too); returns its connection.
  RemoteRing* RemoveLocked(uint32_t i) noexcept;
  // The same, leaving a record of it for its client's late connection.
  RemoteRing* DropLocked(uint32_t i, uint64_t now_ms) noexcept;
  // The oldest unproven request of the holder with the most, or kNil.
  uint32_t VictimLocked() const noexcept;
  void ExpireDroppedLocked(uint64_t now_ms) noexcept;
  uint32_t FindDroppedLocked(uint64_t hash, uint64_t now_ms) const noexcept;
  void UnchainDroppedLocked(uint32_t i) noexcept;
  size_t dropped_free() const noexcept { return kMaxDropped - dropped_used_; }

  // Intrusive lists over requests_ (by the member pointers of their links).
  void PushBack(List* l, uint32_t i, uint32_t Request::*prev, uint32_t Request::*next) noexcept;
  void Unlink(List* l, uint32_t i, uint32_t Request::*prev, uint32_t Request::*next) noexcept;

  mutable std::mutex mu_;
  KeyedHash hash_;
  size_t budget_ = 0;
  size_t max_kept_ = kMaxRequests;
  size_t charged_ = 0;  // under mu_
  std::unique_ptr<Request[]> requests_;
  std::unique_ptr<uint32_t[]> request_heads_;  // kMaxRequests chains
  uint32_t free_request_ = kNil;               // free requests, chained by `chain`
  size_t requests_used_ = 0;
  size_t unproven_ = 0;
  List unchecked_;  // oldest first
  List proven_;     // oldest first
  std::unique_ptr<Holder[]> holders_;
  std::unique_ptr<uint32_t[]> holder_heads_;
  std::unique_ptr<Dropped[]> dropped_;  // a ring: [dropped_head_, + dropped_used_)
  std::unique_ptr<uint32_t[]> dropped_heads_;
  size_t dropped_head_ = 0;
  size_t dropped_used_ = 0;
  std::unique_ptr<Refusal[]> refusals_;  // a ring, the oldest overwritten
  std::unique_ptr<uint32_t[]> refusal_heads_;
  size_t refusal_next_ = 0;
};

}  // namespace slip
