// The module of a transport whose streams cross hosts on the peer's ring (verbs, fabric),
// as its face-side part sees it: the steps of a client's request, answered before its SYN
// leaves, and the requests a listener keeps pending under their TCP 4-tuple until accept()
// takes one. A transport's own module interface derives from this and adds what its
// listeners alone need (verbs' SO_REUSEPORT groups, fabric's UDP twins); its face-side part
// makes the engine's offers from it (core/offer_steps.h), so that the steps and their
// order are written once.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>

#include "core/channel.h"
#include "core/stats.h"
#include "core/wire.h"

namespace slip {

template <typename Listener, typename Client>
class RingModule {
 public:
  using ListenerType = Listener;
  using ClientType = Client;
  virtual ~RingModule() = default;

  // --- listening side ---
  // Is a request pending for this TCP connection? (Made by its client, or forged.)
  virtual bool HasPending(Listener* listener, const wire::Endpoint& client,
                          const wire::Endpoint& server) noexcept = 0;
  // The connection goes another way (shm): its pending requests are forged or stale, so
  // they are refused now rather than left to expire.
  virtual void DropPending(Listener* listener, const wire::Endpoint& client,
                           const wire::Endpoint& server) noexcept = 0;
  // Takes the request pending for the accepted TCP connection's tuple and returns its
  // channel *held* (RemoteRing::Hold): the application has the connection at once, and the
  // client's first bytes on TCP settle it (ChannelControl::Settle). The tuple's other
  // requests are refused: a connection makes one request, so all but one are forged.
  // `proxy_b` is the server's proxy end, which the channel duplicates for its wake-ups.
  // nullptr with *why, and *committed when a request's client had our answer (its
  // CONFIRM may be on its way: the connection must not be handed over as plain TCP).
  virtual std::unique_ptr<Channel> AcceptPending(Listener* listener, const wire::Endpoint& client,
                                                 const wire::Endpoint& server, int proxy_b,
                                                 Reason* why, bool* committed) noexcept = 0;
  // Why a request for `client` -> `server` was refused lately (its client was told, and
  // is plain); kNone if none was: so that accept()'s stats say why.
  virtual Reason Refused(Listener* listener, const wire::Endpoint& client,
                         const wire::Endpoint& server) noexcept {
    (void)listener;
    (void)client;
    (void)server;
    return Reason::kNone;
  }

  // --- connecting side ---
  // A client for `dest` (nullptr with *why when the negative cache or a local check
  // answers, before anything is sent). *source is the local address its TCP socket binds
  // to when the module knows it already; else (ss_family 0) Advance says kResolved once
  // it does.
  virtual Client* Start(const sockaddr* dest, sockaddr_storage* source, Reason* why) noexcept = 0;
  // Sends the request for the now known 4-tuple (the TCP socket is bound): the listener's
  // answer comes before the SYN may go.
  virtual bool Request(Client* client, const wire::Endpoint& from, const wire::Endpoint& to,
                       uint64_t nonce, uint32_t ring_size, Reason* why) noexcept = 0;
  enum class Step : uint8_t {
    kWaiting,   // nothing decided yet: wait for EventFd or Deadline
    kResolved,  // *source is the local address to bind to; Request next
    kAccepted,  // the listener answered: the SYN may go
    kFailed,    // *why (the negative cache remembers it where it should); Abort next
  };
  // Takes what arrived, without blocking, and says where the client stands. Many clients
  // may be in flight at once, each on its own descriptor.
  virtual Step Advance(Client* client, sockaddr_storage* source, Reason* why) noexcept = 0;
  virtual int EventFd(Client* client) noexcept = 0;
  virtual uint64_t Deadline(Client* client) noexcept = 0;  // monotonic ms
  // The listener's process may not be the one whose accept() takes the SYN (a port shared
  // by processes): the CONFIRM waits until that process says it took the connection.
  // Finish then returns the channel held, and its Settle sends the CONFIRM.
  virtual bool AwaitsTaken(Client*) noexcept { return false; }
  // The TCP connection is up and the CONFIRM sent (or, AwaitsTaken, to be sent once
  // settled): the client's channel. Consumes `client`.
  virtual std::unique_ptr<Channel> Finish(Client* client, int proxy_b) noexcept = 0;
  // Gives up (the TCP connect failed or was slow): the listener drops its pending request.
  // Consumes `client`.
  virtual void Abort(Client* client) noexcept = 0;

  // --- the process ---
  // fork(): in the child every inherited connection fails (the device's objects are the
  // parent's), and no new one is made. Prepare takes the module's locks; Parent and Child
  // drop them.
  virtual void ForkPrepare() noexcept = 0;
  virtual void ForkParent() noexcept = 0;
  virtual void ForkChild() noexcept = 0;
  // At exit: waits (bounded) until every connection's writes completed, so that a program
  // that sends and exits without close() loses nothing, as on TCP.
  virtual void FlushAll(int timeout_ms) noexcept = 0;
};

}  // namespace slip
