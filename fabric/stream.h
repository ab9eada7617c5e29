// The shim's byte streams over libfabric: the boundary between the face's side of the
// transport (fabric/transport.cc, core's Transport) and libslipstream-fabric.so, which the
// face loads with dlopen() the first time a connection or listener could use it.
//
// Detection (docs/DESIGN.md "Detection across hosts (fabric)"): a listener's twin binds a
// UDP socket to the TCP listener's address and port. A client sends a REQ datagram
// (fabric/stream_wire.h) naming the TCP 4-tuple it is about to connect, its nonce, its RDM
// endpoint's address and its receive ring; the twin answers with its own (REP) and keeps
// the request pending under the 4-tuple. Only then does the SYN leave; accept() finds the
// request race-free and installs the connection held, and the client's in-band CONFIRM
// (the nonce) settles it. A plain peer answers the REQ with ICMP port unreachable, which the
// negative cache remembers.
//
// Data (fabric/stream_conn.h): each end writes into the other's registered ring with
// fi_write/fi_writedata; the last write of a publish carries the new cursor in its remote
// CQ data, as credits and the ends of the stream do.
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
#include "fabric/options.h"

namespace slip::fabric {

struct StreamListener;  // a UDP twin of one TCP listener
struct StreamClient;    // a client connection from its REQ to its channel

class StreamModule : public RequestModule<StreamListener, StreamClient> {
 public:
  // The provider and domain every connection of this process uses ("tcp;ofi_rxm", "shm").
  virtual const char* provider() const noexcept = 0;

  // --- listening side (the pending requests: core/request_module.h) ---
  // Binds the UDP twin of the TCP listener bound to `local`. nullptr with *why when it
  // cannot (the UDP port is another program's, ...). Its REQs are answered by the
  // module's progress thread alone, as they come; a request counts as made once answered
  // (AcceptPending's `committed`).
  virtual StreamListener* Listen(const sockaddr* local, bool v6only, Reason* why) noexcept = 0;
  virtual void Unlisten(StreamListener* listener) noexcept = 0;
  // The listening socket is shared by processes (fork): REQs are refused from now on, since
  // the process that answers one may not be the one whose accept() takes its SYN.
  virtual void Share(StreamListener* listener) noexcept = 0;

  // --- connecting side ---
  // Start's UDP socket, connected, names the source address at once; Request sends the
  // REQ, and Advance says kAccepted on its REP.

  // --- the process ---
  // exec(): the image is about to be replaced (its connections handed back to TCP). What
  // only this image's exit would clean up goes now; no new connections after.
  virtual void BeforeExec() noexcept = 0;
  // The face saw libfabric accept `fd` on `listening` (fd already above the floor): the
  // connection listener's sockets are bounded and given a deadline (fabric/link_sockets.h).
  virtual void ProviderAccepted(int listening, int fd) noexcept = 0;

 protected:
  using RequestModule::RequestModule;
};

}  // namespace slip::fabric

extern "C" {
// The process's stream module, or nullptr with a one-line reason in `error` (no provider
// can serve). `config` and `options` must outlive it; descriptors it keeps go at or above
// `hidden_fd_floor`, and are marked in `own_fds` (the face's table, core/own_fds.h).
slip::fabric::StreamModule* slip_fabric_stream_module(const slip::Config* config,
                                                      const slip::fabric::Options* options,
                                                      int hidden_fd_floor,
                                                      slip::OwnFdTable* own_fds, char* error,
                                                      size_t error_len);
}
