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
#include "core/request_module.h"
#include "core/stats.h"
#include "core/wire.h"
#include "verbs/options.h"

namespace slip::verbs {

struct Listener;    // an rdma_cm listener paired with one TCP listener
struct ClientConn;  // a client connection between REQ and the installed channel

class Module : public RequestModule<Listener, ClientConn> {
 public:
  // --- listening side (the pending requests: core/request_module.h) ---
  // Listens on rdma_cm at `local` (the TCP listener's bound address). Returns nullptr with
  // *why set when it cannot (no device on that address, port taken, ...).
  // `group_member`: the inode of a TCP listening socket with SO_REUSEPORT (0 for others).
  // The group's sockets in this process share one rdma_cm listener, and a request is served
  // only when the kernel will hand its SYN to one of them; the first process of the group
  // holds the port and redirects the others' requests to the rdma_cm ports they listen on
  // (docs/DESIGN.md "Servers that share a port", over verbs). A request counts as made
  // once its client sent its HELLO (AcceptPending's `committed`).
  virtual Listener* Listen(const sockaddr* local, uint64_t group_member, Reason* why) noexcept = 0;
  // One call per Listen that returned the listener (a group's is shared), with the same
  // `group_member`.
  virtual void Unlisten(Listener* listener, uint64_t group_member) noexcept = 0;

  // --- connecting side ---
  // Start begins address and route resolution (Advance says kResolved with the source);
  // a parked queue pair for the same listener resolves at once and its request is a CLAIM
  // (docs/DESIGN.md "Reusing queue pairs"). A listener whose port is shared makes the
  // client await its TAKEN (AwaitsTaken).

 protected:
  using RequestModule::RequestModule;
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
