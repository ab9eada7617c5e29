// verbs: the RDMA transport, RC queue pairs over libibverbs + librdmacm.
//
// Built as its own shared object, libslipstream-verbs.so, that the shim loads with dlopen()
// the first time a connection could use it: a host without rdma-core's libraries, or a
// process that never leaves its host, never loads it. The boundary is this header: one
// Module, found with the C symbol `slip_verbs_module`.
//
// Detection (docs/DESIGN.md, "Detection across hosts"): a Slipstream listener also listens
// on the rdma_cm port space RDMA_PS_TCP with the same port number, and keeps its kernel TCP
// listener for everyone else. A client resolves the destination over RDMA, binds its TCP
// socket to the source address the RDMA route uses, and sends an rdma_cm REQ whose private
// data carries magic, version, the TCP 4-tuple and a nonce (verbs/private_data.h). The
// listener's progress thread accepts the REQ (its REP names the server's ring) and keeps it
// pending under the 4-tuple. Only then does the client send its SYN, so accept() finds the
// pending request race-free, exactly as with shm's rendezvous; the in-band CONFIRM with the
// nonce proves that the TCP peer is the rdma_cm peer.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>

#include "core/channel.h"
#include "core/config.h"
#include "core/own_fds.h"
#include "core/stats.h"
#include "core/wire.h"
#include "verbs/options.h"

namespace slip::verbs {

struct Listener;    // an rdma_cm listener paired with one TCP listener
struct ClientConn;  // a client connection between REQ and the installed channel

class Module {
 public:
  virtual ~Module() = default;

  // --- listening side ---
  // Listens on rdma_cm at `local` (the TCP listener's bound address). Returns nullptr with
  // *why set when it cannot (no device on that address, port taken, ...).
  // `group_member`: the inode of a TCP listening socket with SO_REUSEPORT (0 for others).
  // The group's sockets in this process share one rdma_cm listener, and a request is served
  // only when the kernel will hand its SYN to one of them; the first process of the group
  // holds the port and redirects the others' requests to the rdma_cm ports they listen on
  // (docs/DESIGN.md "Servers that share a port", over verbs).
  virtual Listener* Listen(const sockaddr* local, uint64_t group_member, Reason* why) noexcept = 0;
  // One call per Listen that returned the listener (a group's is shared), with the same
  // `group_member`.
  virtual void Unlisten(Listener* listener, uint64_t group_member) noexcept = 0;
  // Is an rdma_cm request pending for this TCP connection? (Made by its client, or forged.)
  virtual bool HasPending(Listener* listener, const wire::Endpoint& client,
                          const wire::Endpoint& server) noexcept = 0;
  // The connection goes another way (shm): its pending requests are forged or stale, so
  // they are rejected now rather than left to expire.
  virtual void DropPending(Listener* listener, const wire::Endpoint& client,
                           const wire::Endpoint& server) noexcept = 0;
  // Takes a request pending for the accepted TCP connection's tuple (one whose client sent
  // its HELLO first) and returns its channel *held* (Conn::Hold): the application may have
  // the connection at once, and the client's first bytes on TCP settle it
  // (ChannelControl::Settle). The tuple's other requests are rejected: a connection makes one
  // request, so all but one are forged, and a CONFIRM for another resets the connection.
  // `proxy_b` is the server's proxy end, which the channel duplicates for its wake-ups.
  // Returns nullptr with *why set (kConnectSlow: every client of the tuple gave up) and
  // *committed when a request's client had sent its HELLO (its CONFIRM may be on its way:
  // the connection must not be handed over as plain TCP then).
  virtual std::unique_ptr<Channel> AcceptPending(Listener* listener, const wire::Endpoint& client,
                                                 const wire::Endpoint& server, int proxy_b,
                                                 Reason* why, bool* committed) noexcept = 0;

  // --- connecting side ---
  // Resolves `dest` over RDMA (bounded by the handshake timeout; answers from the negative
  // cache at once). On success *source is the local address to bind the TCP socket to.
  virtual ClientConn* Resolve(const sockaddr* dest, sockaddr_storage* source,
                              Reason* why) noexcept = 0;
  // Sends the REQ for the now known 4-tuple and waits for the listener's answer.
  virtual bool Handshake(ClientConn* conn, const wire::Endpoint& client,
                         const wire::Endpoint& server, uint64_t nonce, uint32_t ring_size,
                         Reason* why) noexcept = 0;
  // The same two steps without blocking (a non-blocking connect(), docs/DESIGN.md
  // "Non-blocking connect"): StartResolve begins address and route resolution and returns
  // at once (nullptr with *why set when the negative cache or a local check answers);
  // StartHandshake sends the REQ once the TCP socket is bound. Between them the caller
  // waits for EventFd(conn) to turn readable, or for Deadline(conn) (monotonic ms), and
  // then calls Advance, which takes what arrived without blocking and says where the
  // connection stands. Many connections may be in flight at once, each on its own
  // descriptor, so their rdma_cm exchanges overlap. After kFailed the caller calls Abort.
  enum class Step : uint8_t {
    kWaiting,   // nothing decided yet: wait for EventFd or the deadline
    kResolved,  // *source is the local address to bind to; StartHandshake next
    kAccepted,  // the listener answered: the queue pair is ready, the SYN may go
    kFailed,    // *why says why (the negative cache remembers it where it should)
  };
  virtual ClientConn* StartResolve(const sockaddr* dest, Reason* why) noexcept = 0;
  virtual bool StartHandshake(ClientConn* conn, const wire::Endpoint& client,
                              const wire::Endpoint& server, uint64_t nonce, uint32_t ring_size,
                              Reason* why) noexcept = 0;
  virtual Step Advance(ClientConn* conn, sockaddr_storage* source, Reason* why) noexcept = 0;
  virtual int EventFd(ClientConn* conn) noexcept = 0;
  virtual uint64_t Deadline(ClientConn* conn) noexcept = 0;

  // The listener shares its port (SO_REUSEPORT): the CONFIRM must wait until the process
  // that accepted the connection says TAKEN on the queue pair, since a SYN may reach a
  // process that knows nothing of the request. Finish then returns the channel *held* (no
  // bytes, no space) and its Settle sends the CONFIRM (ChannelControl::Settle).
  virtual bool AwaitsTaken(ClientConn* conn) noexcept = 0;
  // The TCP connection is up and CONFIRM sent (or, AwaitsTaken, to be sent once settled):
  // the client's channel. Consumes `conn`.
  virtual std::unique_ptr<Channel> Finish(ClientConn* conn, int proxy_b) noexcept = 0;
  // Gives up (the TCP connect failed or was slow): the listener drops its pending request.
  // Consumes `conn`.
  virtual void Abort(ClientConn* conn) noexcept = 0;

  // fork(): the parent's devices, queue pairs and progress thread are not the child's. In
  // the child, inherited verbs channels fail (ECONNRESET) rather than touch them, and no
  // new verbs connection is made. Prepare takes the module's locks; Parent/Child drop them.
  virtual void ForkPrepare() noexcept = 0;
  virtual void ForkParent() noexcept = 0;
  virtual void ForkChild() noexcept = 0;

  // At exit: waits (bounded) until every connection's posted writes are acknowledged, so a
  // program that sends and exits without close() loses nothing, as on TCP.
  virtual void FlushAll(int timeout_ms) noexcept = 0;
};

}  // namespace slip::verbs

extern "C" {
// Returns the process's module, or nullptr (with a one-line reason in `error`) when no RDMA
// device is usable. `config` (core's) and `options` (the transport's, verbs/options.h) must
// outlive the module; descriptors the module keeps go at or above `hidden_fd_floor`, and
// are marked in `own_fds` (the face's table, core/own_fds.h; nullptr: none).
slip::verbs::Module* slip_verbs_module(const slip::Config* config,
                                       const slip::verbs::Options* options, int hidden_fd_floor,
                                       slip::OwnFdTable* own_fds, char* error, size_t error_len);
}
