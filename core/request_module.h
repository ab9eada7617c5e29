// The listening side of a RingModule whose listeners keep their requests in core's table
// (core/pending_requests.h): verbs' rdma_cm listeners and fabric's UDP twins. What
// accept() does with the table is written here once:
//
//   HasPending, DropPending   the table's Has and Forget
//   AcceptPending             a kept request: its connection held for its nonce, with the
//                             proxy, then the transport's Accepted (what it alone checks
//                             and says); a dropped request's record: a StandInRing (its
//                             client may still confirm); nothing: kConnectSlow
//   Refused                   the table's refusals, then the transport's (RefusedLately)
//
// The transport answers requests into table() (Find, Reserve, Keep), drops them when due
// (CheckDue, from its progress thread) and lets a listener's go with it (ForgetOwner).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/channel.h"
#include "core/pending_requests.h"
#include "core/remote_ring.h"
#include "core/ring_module.h"
#include "core/stats.h"
#include "core/wire.h"

namespace slip {

// A kept request that accept() took: its connection is held (RemoteRing::Hold) and has its
// proxy, and is the caller's.
struct KeptRequest {
  RemoteRing* conn = nullptr;
  uint64_t nonce = 0;
};

// The table, made at the first listener, and what accept() does with it.
class RequestKeeper {
 public:
  // `names` name a dropped request's stand-in; `release` deletes a request's connection
  // (the transport's type); proxies go at or above `fd_floor`; a held connection waits
  // `handshake_ms` for its client's first bytes.
  RequestKeeper(const RemoteRing::Names& names, PendingRequests::Deleter release, int fd_floor,
                uint32_t handshake_ms) noexcept
      : names_(names), release_(release), fd_floor_(fd_floor), handshake_ms_(handshake_ms) {}
  ~RequestKeeper();  // deletes what is still kept (unless in a fork child): see ForgetOwner
  RequestKeeper(const RequestKeeper&) = delete;
  RequestKeeper& operator=(const RequestKeeper&) = delete;

  // Makes the table (once) for at most `max_kept` requests in `budget_bytes`. False: no
  // memory.
  bool Make(size_t budget_bytes, size_t max_kept) noexcept;
  // The table once made; null before, and in a fork child.
  PendingRequests* table() noexcept {
    return made_.load(std::memory_order_acquire) && !forked_.load(std::memory_order_acquire)
               ? &table_
               : nullptr;
  }
  void Delete(RemoteRing* conn) const noexcept {
    if (conn) release_(conn);
  }

  bool Has(const Tuple& t) noexcept;
  void Drop(const Tuple& t) noexcept;
  Reason Refused(const Tuple& t) noexcept;
  // What waits for `t`, made a channel: a dropped request's stand-in (returned), or a kept
  // request's connection (*kept; nullptr returned). Nothing with *why when neither.
  std::unique_ptr<Channel> Take(const Tuple& t, int proxy_b, KeptRequest* kept, Reason* why,
                                bool* committed) noexcept;
  // The progress thread's: drops or expires what is due (PendingRequests::CheckDue).
  // Returns how many went.
  size_t CheckDue(uint64_t now_ms) noexcept;
  // The listener `owner` goes: its requests too (null: every request, which a module's
  // destructor does first, while what its connections use is still there).
  void ForgetOwner(const RequestOwner* owner) noexcept;
  // fork(), in the child: the requests are the parent's, and so may be the table's mutex
  // (held at the fork): neither is touched again.
  void ForkChild() noexcept { forked_.store(true, std::memory_order_release); }

 private:
  const RemoteRing::Names& names_;
  const PendingRequests::Deleter release_;
  const int fd_floor_;
  const uint32_t handshake_ms_;
  std::mutex make_mu_;
  std::atomic<bool> made_{false};
  std::atomic<bool> forked_{false};
  PendingRequests table_;
};

template <typename Listener, typename Client>
class RequestModule : public RingModule<Listener, Client> {
 public:
  bool HasPending(Listener* l, const wire::Endpoint& client,
                  const wire::Endpoint& server) noexcept final {
    (void)l;
    return requests_.Has(Tuple{client, server});
  }
  void DropPending(Listener* l, const wire::Endpoint& client,
                   const wire::Endpoint& server) noexcept final {
    (void)l;
    requests_.Drop(Tuple{client, server});
  }
  std::unique_ptr<Channel> AcceptPending(Listener* l, const wire::Endpoint& client,
                                         const wire::Endpoint& server, int proxy_b, Reason* why,
                                         bool* committed) noexcept final {
    KeptRequest kept;
    auto channel = requests_.Take(Tuple{client, server}, proxy_b, &kept, why, committed);
    if (!kept.conn) return channel;
    Accepted(l, client, kept, committed);
    return std::unique_ptr<Channel>(kept.conn);
  }
  Reason Refused(Listener* l, const wire::Endpoint& client,
                 const wire::Endpoint& server) noexcept final {
    const Reason why = requests_.Refused(Tuple{client, server});
    return why != Reason::kNone ? why : RefusedLately(l, client);
  }

 protected:
  RequestModule(const RemoteRing::Names& names, PendingRequests::Deleter release, int fd_floor,
                uint32_t handshake_ms) noexcept
      : requests_(names, release, fd_floor, handshake_ms) {}

  // A kept request of `client`'s was taken for its connection (held, with its proxy): the
  // transport's part. *committed: true unless the transport knows its client had not
  // confirmed yet (plain is then safe should the stream not be installed).
  virtual void Accepted(Listener* l, const wire::Endpoint& client, const KeptRequest& kept,
                        bool* committed) noexcept = 0;
  // Refusals the table does not record (a transport's own rates).
  virtual Reason RefusedLately(Listener* l, const wire::Endpoint& client) noexcept {
    (void)l;
    (void)client;
    return Reason::kNone;
  }

  RequestKeeper requests_;
};

}  // namespace slip
