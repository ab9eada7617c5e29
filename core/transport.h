// The transport interface: what a transport offers to one TCP connection, and the registry
// that lists a process's transports in the order the user chose (SLIP_TRANSPORTS).
//
// A connection is carried by at most one transport, chosen before its SYN leaves (the
// client) or before accept() returns it (the server), in the same four steps for every
// transport (docs/DESIGN.md, "The connection engine"):
//
//   client  Transport::Offer     can this transport reach the peer? (no change to the
//                                socket; a plain peer must cost next to nothing)
//           ClientOffer::Advance the out-of-band exchange that tells the listener, before
//                                the SYN, that this 4-tuple is ours (shm: REGISTER on the
//                                rendezvous; verbs: the rdma_cm REQ/REP). Resumable: it
//                                never blocks, and says what to wait for.
//           (the SYN, the TCP handshake: core/client_setup.h)
//           ClientOffer::Establish  the in-band step and the stream, once TCP is up
//   server  ListenerTwin::Take   did this accepted connection's client offer it here?
//           ServerOffer::Open    the stream, held until the client's CONFIRM settles it
//
// Every failure at every step ends in plain TCP with a Reason, except where the client
// already committed in band (its CONFIRM is in the stream): then the connection is reset,
// never handed over with our bytes in it.
//
// A transport directory provides one Transport object, declared in its public header
// (<name>/transport.h); the build lists it (BuiltTransports) and the face registers what
// the build lists. Core includes no transport, and no transport includes another.
//
// Thread safety: a Transport's methods may be called from any thread. A ClientOffer is
// driven by one thread at a time; a ListenerTwin's methods may run concurrently.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/config.h"
#include "core/options.h"
#include "core/stats.h"
#include "core/stream.h"
#include "core/wire.h"

namespace slip {

// A stream built over a transport's channel, and where its anchor goes.
struct Carrier {
  std::unique_ptr<Stream> stream;  // owns the channel and both proxy ends
  int anchor_slot = -1;            // a descriptor number kept for the anchor (owned), or -1
  // The in-band CONFIRM already left: if the stream cannot be installed now, the
  // connection must be reset (plain TCP would carry our bytes to the application).
  bool confirmed = false;

  Carrier() = default;
  ~Carrier();
  Carrier(Carrier&&) noexcept;
  Carrier& operator=(Carrier&&) noexcept;
};

// What a client connection looks like to a transport that is asked to carry it (a value:
// offers keep their own copy).
struct ConnectRequest {
  int fd = -1;  // the application's number for the TCP socket, not connected yet
  int family = 0;
  sockaddr_storage dest_storage{};
  socklen_t dest_len = 0;
  wire::Endpoint server;  // dest, as the wire writes it
  const Config* config = nullptr;

  const sockaddr* dest() const noexcept { return reinterpret_cast<const sockaddr*>(&dest_storage); }
};

// One transport's attempt at one client connection, from its Offer to its Establish.
// Dropping it unestablished withdraws whatever it told the listener (the listener then
// treats the SYN as plain).
class ClientOffer {
 public:
  virtual ~ClientOffer() = default;
  ClientOffer(const ClientOffer&) = delete;
  ClientOffer& operator=(const ClientOffer&) = delete;

  enum class Step : uint8_t {
    kWaiting,  // wait for WaitFd() to turn readable, or for DeadlineMs(), then call again
    kReady,    // the listener holds the offer: the SYN may go
    kFailed,   // plain, for *why
  };
  // Moves the out-of-band exchange on without blocking. `tcp` is the connection's TCP
  // socket under the number it has now (the face may have hidden it), which the offer may
  // bind (the 4-tuple must be known before the SYN).
  virtual Step Advance(int tcp, Reason* why) noexcept = 0;
  // Readable when Advance has news; -1 when it has none to wait for.
  virtual int WaitFd() const noexcept = 0;
  // CLOCK_MONOTONIC milliseconds by which Advance must be called again.
  virtual uint64_t DeadlineMs() const noexcept = 0;
  // How long the SYN may take before the connection goes plain (the listener holds the
  // offer that long).
  virtual int TcpHandshakeBudgetMs() const noexcept = 0;
  // The TCP handshake outlived that budget: the offer is withdrawn and the connection goes
  // on plain. False when the listener took it meanwhile (shm: its accept() claimed the
  // region between our last look and now), so that its end may carry it on the transport:
  // the setup then resets the connection instead.
  virtual bool WithdrawSlow() noexcept { return true; }

  // The stream's proxy pair, made on the first call and the offer's until Establish (a
  // face may show end A to the application while the exchange runs). False: none could be
  // made.
  virtual bool Proxies(int* proxy_a, int* proxy_b) noexcept = 0;

  enum class Outcome : uint8_t {
    kCarried,  // *out holds the stream
    kPlain,    // the connection continues on TCP, untouched, for *why
    kReset,    // the CONFIRM left but the stream cannot be built: reset the connection
  };
  // The TCP connection on `tcp` is up: the in-band step (or its arrangement: a channel
  // that settles later) and the stream. Called at most once.
  virtual Outcome Establish(int tcp, Carrier* out, Reason* why) noexcept = 0;

 protected:
  ClientOffer() = default;
};

// What a client offered for one accepted connection, taken from the listener's twin
// (dropping it unopened abandons it). It lives in room the accepting thread provides
// (ServerOfferRoom): taking an offer allocates nothing, since an allocation failing inside accept()
// must not cost a client that committed to its CONFIRM its connection.
class ServerOffer {
 public:
  virtual ~ServerOffer() = default;
  ServerOffer(const ServerOffer&) = delete;
  ServerOffer& operator=(const ServerOffer&) = delete;

  // Builds the server's stream, held (no bytes, no space) until the client's first bytes
  // settle it (ChannelControl::Settle). False with *why when it cannot.
  virtual bool Open(Carrier* out, Reason* why) noexcept = 0;
  // The connection will not be carried (Open failed, or the stream could not be
  // installed): stops the offer. True when plain TCP is still safe; false when the client
  // had committed to its CONFIRM, which must not reach the application as data.
  virtual bool Abandon() noexcept = 0;

 protected:
  ServerOffer() = default;
};

struct alignas(16) ServerOfferRoom {
  unsigned char bytes[512];
};
struct ServerOfferDeleter {
  void operator()(ServerOffer* offer) const noexcept { offer->~ServerOffer(); }
};
using ServerOfferPtr = std::unique_ptr<ServerOffer, ServerOfferDeleter>;

// A transport's side of one TCP listener.
class ListenerTwin {
 public:
  virtual ~ListenerTwin() = default;
  ListenerTwin(const ListenerTwin&) = delete;
  ListenerTwin& operator=(const ListenerTwin&) = delete;

  // Takes what a client offered here for the accepted connection `client` -> `server`,
  // built in `room`; null when nothing was.
  virtual ServerOfferPtr Take(const wire::Endpoint& client, const wire::Endpoint& server,
                              ServerOfferRoom* room) noexcept = 0;
  // Another transport carries this connection: what was offered here for it is forged or
  // stale, and goes now rather than at its expiry.
  virtual void Drop(const wire::Endpoint& client, const wire::Endpoint& server) noexcept = 0;
  // Why this twin refused what a client offered for `client` -> `server` lately (the
  // client was told, and goes plain); kNone when it refused nothing for it. So that the
  // server's stats say the reason, not that the peer is not Slipstream.
  virtual Reason Refused(const wire::Endpoint& client, const wire::Endpoint& server) noexcept {
    (void)client;
    (void)server;
    return Reason::kNone;
  }
  // A descriptor readable when the twin has work that must not wait for accept() (shm:
  // registrations to answer), watched by the face's service thread; -1 when none.
  virtual int ServiceFd() const noexcept { return -1; }
  // Does that work, within a budget. True when more is waiting.
  virtual bool Service() noexcept { return false; }
  // The listening socket is held by several processes (fork), any of which may accept a
  // connection: what a client offered must go to the process that accepts its connection,
  // so it is read in accept() only, not ahead of it by a service thread. Any thread.
  virtual void SharedByProcesses() noexcept {}
  // The process is about to fork while holding the listening socket: what the processes
  // that will share it need in common is made now, so that all of them inherit it.
  virtual void BeforeFork() noexcept {}

 protected:
  ListenerTwin() = default;
};

// What a listener looks like to a transport asked to stand beside it.
struct ListenRequest {
  int fd = -1;
  const sockaddr* local = nullptr;  // the TCP listener's bound address
  bool v6only = false;
  // SO_REUSEPORT: other listening sockets (other processes') may share the port, and the
  // kernel hands each SYN to one of them. A transport serves such a listener only if its
  // clients can find the member their SYN reaches and nothing of ours reaches the others.
  bool reuseport = false;
  const Config* config = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual TransportKind kind() const noexcept = 0;

  // --- options (read once, at start-up, with core's grammar: core/options.h) ---
  virtual bool ReadOptions(EnvLookup lookup, void* ctx, std::string* error) noexcept {
    (void)lookup;
    (void)ctx;
    (void)error;
    return true;
  }
  // The SLIP_* variables the transport reads (for the list of unknown ones).
  virtual std::span<const char* const> OptionNames() const noexcept { return {}; }

  // --- client ---
  // Can this transport reach the peer of `req`? nullptr with *why when not. Changes
  // nothing on the socket.
  virtual std::unique_ptr<ClientOffer> Offer(const ConnectRequest& req, Reason* why) noexcept = 0;

  // --- server ---
  // Stands beside the TCP listener (before the kernel listens, so that a client that
  // finds the TCP port finds the twin too). nullptr with *why when it cannot.
  virtual std::unique_ptr<ListenerTwin> Listen(const ListenRequest& req, Reason* why) noexcept = 0;
  // When two transports hold an offer for one accepted connection, the one whose offers
  // the kernel vouches for (the client's owner was checked) carries it; the other's is
  // forged.
  virtual bool OffersVouchedByKernel() const noexcept { return false; }

  // --- process events ---
  // fork(): Prepare takes the transport's locks; Parent/Child drop them. In the child the
  // transport forgets what only the parent may use.
  virtual void ForkPrepare() noexcept {}
  virtual void ForkParent() noexcept {}
  virtual void ForkChild() noexcept {}
  // At exit: waits (bounded) until what was sent is delivered, as TCP would.
  virtual void Flush(int timeout_ms) noexcept { (void)timeout_ms; }
  // exec(): the image is about to be replaced, its connections handed back to TCP. What
  // only this image's exit would clean up goes now (a file in /dev/shm); where exec fails,
  // the image goes on, and the transport may make no new connections.
  virtual void BeforeExec() noexcept {}

  // --- the libraries the transport loads (libfabric and its providers) ---
  // Whether `code` (the return address of an interposed call) lies in code this transport
  // loaded: the face leaves the descriptors such code makes, and its waits, alone (a
  // provider's own sockets and its progress thread are not the application's). Asked on
  // every interposed socket call: cheap, and false while the transport has loaded nothing.
  // A plain function, taken once when the transport is registered: the face calls it from
  // inside interposed calls (pipe, socket), where even a virtual call's sanitizer check
  // (UBSan's vptr, which probes memory with pipe()) would call them again. Null: the
  // transport loads no library.
  using LibraryCheck = bool (*)(const void* code) noexcept;
  virtual LibraryCheck IsLibraryCaller() const noexcept { return nullptr; }
  // A library of this transport accepted `conn` on `listening` (the face hid it already).
  virtual void LibraryAccepted(int listening, int conn) noexcept {
    (void)listening;
    (void)conn;
  }
};

// The process's transports: every one the face knows, and the order the user chose.
class TransportRegistry {
 public:
  static constexpr size_t kMax = 5;

  // Lists a transport (the face does this once per transport it was built with).
  void Add(Transport* t) noexcept;
  // The transports of `order` (SLIP_TRANSPORTS) that are listed, in that order.
  void Choose(const TransportList& order) noexcept;

  size_t size() const noexcept { return chosen_count_; }
  Transport* operator[](size_t i) const noexcept { return chosen_[i]; }
  Transport* const* begin() const noexcept { return chosen_; }
  Transport* const* end() const noexcept { return chosen_ + chosen_count_; }
  // Every listed transport, chosen or not (options, names).
  size_t known_size() const noexcept { return known_count_; }
  Transport* known(size_t i) const noexcept { return known_[i]; }
  // The listed transport whose libraries hold `code` (Transport::IsLibraryCaller), or null.
  // Makes no virtual call (see IsLibraryCaller).
  Transport* LibraryOf(const void* code) const noexcept;

 private:
  Transport* known_[kMax] = {};
  Transport::LibraryCheck library_checks_[kMax] = {};  // known_[i]'s, taken at Add
  size_t known_count_ = 0;
  Transport* chosen_[kMax] = {};
  size_t chosen_count_ = 0;
};

// Of the offers that the twins of one listener hold for one accepted connection (offers[i]
// is transports[i]'s, or null), the index of the one that carries it: one whose origin the
// kernel vouched for, else the first in the user's order. Any other is forged or stale.
// transports.size() when there is none.
size_t ChooseOffer(const TransportRegistry& transports, const ServerOfferPtr* offers) noexcept;

// Every transport this build has, in the build's order: the list is generated from the
// top-level CMakeLists.txt (SLIP_TRANSPORTS) into the face that links it, from each
// transport's public header (<name>/transport.h, TheTransport()).
std::span<Transport* const> BuiltTransports() noexcept;

// Of two reasons for staying plain, from two transports tried in turn, the one in the
// terms of the transport that came closest (a transport that was not allowed, or that
// cannot reach another host, says least).
Reason CloserReason(Reason first, Reason later) noexcept;

}  // namespace slip
