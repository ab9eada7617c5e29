// Connected endpoints (FI_EP_MSG) for the shim's streams, one per stream, as verbs' queue
// pairs are (SLIP_FABRIC_ENDPOINT=msg, the default where the provider has them): the
// process's connection listener, and one stream's endpoint, connected by fi_connect or
// accepted from the listener's connection request.
//
// A connected endpoint needs no tag in the remote CQ data to be told from other peers'
// (only its peer can write through it) and no address vector; a provider carries it
// without the reliable-datagram layer (ofi_rxm) in between, which over verbs costs 8x in
// latency (docs/PERFORMANCE.md).
//
// Ownership: each object closes what it opened, in the reverse order (the endpoint before
// the event queue it is bound to); a fork child forgets them without closing.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fabric/domain.h"

namespace slip::fabric {

using EqPtr = std::unique_ptr<fid_eq, FidCloser<fid_eq>>;
using PassiveEpPtr = std::unique_ptr<fid_pep, FidCloser<fid_pep>>;

// A connection-manager event: its kind (FI_CONNREQ, FI_CONNECTED, FI_SHUTDOWN; or 0 with
// `error` for an error entry), the endpoint it is about (its context: a stream's tag, 0
// for the listener), a connection request's info (owned by the reader) and the peer's
// connection data.
struct LinkEvent {
  uint32_t kind = 0;
  int error = 0;
  uint32_t tag = 0;
  InfoPtr info;
  uint8_t param[64] = {};
  size_t param_len = 0;
};

// Reads one event from `eq`: false when none waits.
bool ReadLinkEvent(fid_eq* eq, LinkEvent* out) noexcept;

// The process's connection listener: a passive endpoint on the domain's address (a port
// the system chooses), whose requests and whose accepted endpoints' events come to one
// event queue, watched by the progress thread.
class LinkListener {
 public:
  LinkListener() = default;
  LinkListener(const LinkListener&) = delete;
  LinkListener& operator=(const LinkListener&) = delete;

  bool Open(const Domain& domain, std::string* why) noexcept;
  bool open() const noexcept { return pep_ != nullptr; }
  // What a client passes to fi_connect (a sockaddr; its address may be the any address,
  // which the client replaces with the TCP destination's).
  const uint8_t* address() const noexcept { return address_; }
  size_t address_len() const noexcept { return address_len_; }
  fid_eq* eq() const noexcept { return eq_.get(); }
  int wait_fd() const noexcept { return wait_fd_; }
  // A request nobody takes.
  void Reject(const fi_info& request) noexcept;
  void Close() noexcept {
    pep_.reset();
    eq_.reset();
    wait_fd_ = -1;
    address_len_ = 0;
  }
  void Forget() noexcept {
    (void)pep_.release();
    (void)eq_.release();
  }

 private:
  EqPtr eq_;
  PassiveEpPtr pep_;  // (after eq_: closed first)
  int wait_fd_ = -1;
  uint8_t address_[64] = {};
  size_t address_len_ = 0;
};

// One stream's endpoint.
class Link {
 public:
  Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // The endpoint, for a client of `server` (`request` null; an event queue of its own) or
  // for a connection request (bound to the listener's `eq`), bound to `tx_cq` for its
  // writes and `rx_cq` for its receives (the same queue or two), enabled; `tag` is its
  // context in events. Receives may be posted then, before Connect or Accept.
  bool Open(const Domain& domain, const fi_info* request, const sockaddr* server, fid_cq* tx_cq,
            fid_cq* rx_cq, fid_eq* eq, uint32_t tag, std::string* why) noexcept;
  bool Connect(const sockaddr* server, const uint8_t* param, size_t param_len,
               std::string* why) noexcept;
  // (A client's endpoint is made for its server: verbs resolves the route at fi_endpoint.)
  bool Accept(std::string* why) noexcept;

  enum class Step : uint8_t { kWaiting, kUp, kFailed };
  // A client's connect: what its event queue says.
  Step PollConnect(std::string* why) noexcept;
  // A client's event queue's descriptor (-1: poll it).
  int event_fd() const noexcept { return eq_fd_; }

  fid_ep* ep() const noexcept { return ep_.get(); }
  // The endpoint first (its operations end), then its own event queue.
  void Close() noexcept {
    ep_.reset();
    eq_.reset();
  }
  void Forget() noexcept {
    (void)ep_.release();
    (void)eq_.release();
  }

 private:
  EqPtr eq_;  // a client's own
  EndpointPtr ep_;
  int eq_fd_ = -1;
};

}  // namespace slip::fabric
