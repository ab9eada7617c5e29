// The client side of the connection engine: one resumable state machine that takes a TCP
// connect() from "which transport?" to a stream or to plain TCP, used alike by a blocking
// connect, a non-blocking one (whose waits a service thread does) and by any face.
//
//   kProbe ──> kOffer ──> kTcpHandshake ──> kCarried
//     │          │  (SYN)      │
//     └──────────┴─────────────┴──────────> kPlain (why; did the SYN leave? is TCP up?)
//                                     └──> kReset (the CONFIRM left, the stream failed)
//
// kProbe asks the registry's transports in order (Transport::Offer) and keeps the first
// that can reach the peer; kOffer drives its out-of-band exchange (ClientOffer::Advance);
// the SYN leaves only once the listener holds the offer, so that its accept() classifies
// the connection without a race; kTcpHandshake waits for the connection, bounded by the
// offer's budget; then ClientOffer::Establish. Step() never blocks: it goes as far as it
// can and says what to wait for (Wait()). The face owns the socket's descriptor number,
// the installation and the stats; the machine owns the offer and the SYN.
//
// Thread safety: one thread at a time drives a ClientSetup.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>

#include "core/stats.h"
#include "core/transport.h"

namespace slip {

class ClientSetup {
 public:
  enum class Stage : uint8_t { kProbe, kOffer, kTcpHandshake, kCarried, kPlain, kReset };
  // The real connect(2) (a face that interposes connect passes the next one in line).
  using ConnectFn = int (*)(int fd, const sockaddr* addr, socklen_t len);

  ClientSetup(const ConnectRequest& req, ConnectFn connect) noexcept;
  ~ClientSetup();
  ClientSetup(ClientSetup&&) noexcept = default;
  ClientSetup& operator=(ClientSetup&&) noexcept = default;

  // kProbe: the first transport of `transports` that can reach the peer makes the offer.
  // False (kPlain, nothing changed, no SYN) when none can; reason() says why, in the
  // terms of the transport that came closest.
  bool Probe(const TransportRegistry& transports) noexcept;
  // Abandons before the first Step (the face found it cannot go on): kPlain for `why`.
  void GiveUp(Reason why) noexcept;

  // Advances without blocking. `tcp`: the connection's TCP socket under its current number.
  Stage Step(int tcp) noexcept;

  // While kOffer or kTcpHandshake: what to wait for before the next Step.
  struct Wait {
    int fd = -1;       // -1: only the deadline
    short events = 0;  // POLLIN or POLLOUT
    uint64_t deadline_ms = 0;
  };
  Wait NextWait(int tcp) const noexcept;
  // Blocks in poll() between steps until the machine is done (a blocking connect).
  Stage Run(int tcp) noexcept;

  const ConnectRequest& request() const noexcept { return req_; }
  Stage stage() const noexcept { return stage_; }
  Reason reason() const noexcept { return reason_; }
  TransportKind transport() const noexcept { return kind_; }
  ClientOffer* offer() const noexcept { return offer_.get(); }
  // kPlain: whether the SYN left (the connection is the application's as it stands), and
  // whether the TCP connection is known to be up.
  bool syn_sent() const noexcept { return syn_sent_; }
  bool connected() const noexcept { return connected_; }
  // The SYN's connect(2): its return value and errno (an immediate failure stays the
  // application's to see).
  int syn_rc() const noexcept { return syn_rc_; }
  int syn_errno() const noexcept { return syn_errno_; }
  // kCarried: the stream, the face's to install.
  Carrier* carrier() noexcept { return &carrier_; }

 private:
  void Plain(Reason why) noexcept;
  void SendSyn(int tcp) noexcept;
  void Establish(int tcp) noexcept;

  ConnectRequest req_;
  ConnectFn connect_;
  Stage stage_ = Stage::kProbe;
  Reason reason_ = Reason::kNone;
  TransportKind kind_ = TransportKind::kTcp;
  std::unique_ptr<ClientOffer> offer_;
  Carrier carrier_;
  bool syn_sent_ = false;
  bool connected_ = false;
  int syn_rc_ = 0;
  int syn_errno_ = 0;
  uint64_t tcp_deadline_ms_ = 0;
};

}  // namespace slip
