// fabric's listeners and connects: the exchange of endpoint addresses on the comm's TCP
// connection (fabric/msg.h, fabric/msg_wire.h), one step per call.
//
//   sender                                   listener (Accept)
//   connect() to the handle's address  ───>  accept4(), kept pending (at most 16; a
//                                            newcomer takes the place of the oldest that
//                                            has not sent its REQ)
//   REQ: first half, sender's address  ───>  checks the half; the receiving comm's endpoint,
//                                            the sender's address in it
//                                      <───  REP: second half, tag key, receiver's address
//   checks the half; the receiver's address
//   in its address vector
//   hello (tag key, on the fabric)     ───>  arrives: the receiving comm is up
//   completes: the sending comm is up
//
// A REQ that is not the listener's (a stranger's, or late for a closed listener's secret)
// closes its connection and is logged; it never ends the listener.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/msg_pending.h"
#include "core/sys.h"
#include "fabric/msg_internal.h"

namespace slip::fabric::msgimpl {

namespace {

using msgwire::Hello;
using msgwire::kHelloBytes;

constexpr int kListenBacklog = 64;
constexpr size_t kMaxPendingAccepts = 16;
// How long a connection may take to send its REQ. A sender writes it as soon as its
// connect completes: the rest of the connect timeout is for the answered ones (their hello
// on the fabric). Anybody who reaches the address can connect and say nothing, so this is
// what a silent connection holds a slot for, unless a newcomer takes it sooner.
constexpr uint64_t kReqWaitMs = 3000;

socklen_t AddressLength(const sockaddr_storage& a) noexcept {
  return a.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

int StreamSocket(int family) noexcept {
  const int fd = sys::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;  // the two messages go at once
  sys::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Reads what is there of a kHelloBytes message into in[*got...]. True once complete;
// false with *gone when the connection ended or failed first.
bool ReadHello(int fd, uint8_t* in, size_t* got, bool* gone) noexcept {
  while (*got < kHelloBytes) {
    const ssize_t r = ::recv(fd, in + *got, kHelloBytes - *got, MSG_DONTWAIT);
    if (r > 0) {
      *got += size_t(r);
      continue;
    }
    *gone = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    return false;
  }
  return true;
}

// The message whole into a connection that has just been made (its send buffer is empty).
bool WriteHello(int fd, uint32_t magic, const Hello& h) noexcept {
  uint8_t out[kHelloBytes];
  if (!msgwire::EncodeHello(magic, h, out)) return false;
  return ::send(fd, out, sizeof(out), MSG_DONTWAIT | MSG_NOSIGNAL) == ssize_t(sizeof(out));
}

// Our endpoint's address into a Hello.
bool OwnAddress(const Endpoint& ep, Hello* h) noexcept {
  size_t len = sizeof(h->address);
  if (!ep.Name(h->address, &len) || len == 0 || len > sizeof(h->address)) return false;
  h->address_len = uint8_t(len);
  return true;
}

uint32_t RandomTagKey() noexcept {
  uint32_t key = 0;
  while (key == 0) key = uint32_t(sys::RandomNonce()) & msgwire::kMaxTagKey;
  return key;
}

class FabricListener final : public msg::Listener {
 public:
  explicit FabricListener(const Device& device) noexcept : device_(device) {}
  ~FabricListener() override {
    for (Pending& p : pending_)
      if (p.fd >= 0) sys::close(p.fd);
    if (fd_ >= 0) sys::close(fd_);
  }

  Status Start(uint8_t* handle) noexcept {
    msgwire::Handle h;
    h.address = device_.domain->ip_address();
    fd_ = StreamSocket(h.address.ss_family);
    socklen_t len = AddressLength(h.address);
    if (fd_ < 0 || sys::bind(fd_, reinterpret_cast<sockaddr*>(&h.address), len) != 0 ||
        ::listen(fd_, kListenBacklog) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&h.address), &len) != 0) {
      char text[96];
      SLIP_LOG(kWarn, "fabric: cannot listen at %s: %s",
               msg::AddressText(device_.domain->ip_address(), text, sizeof(text)), strerror(errno));
      return Status::kSystem;
    }
    msg::PublishAddressHandle("fabric", msgwire::kMagic.handle, msgwire::kVersion, &h, secret_,
                              device_.info.name, handle);
    return Status::kOk;
  }

  Status Accept(std::unique_ptr<msg::RecvComm>* out) noexcept override {
    TakeNewConnections();
    const uint64_t now = sys::MonotonicMs();
    for (Pending& p : pending_) {
      if (p.link) {  // answered: waiting for the sender's hello on the fabric
        const int hello = p.link->HelloDone();
        if (hello > 0) {
          *out = MakeRecvComm(std::move(p.link));
          return *out ? Status::kOk : Status::kSystem;
        }
        if (hello < 0 || p.link->TcpEnded() || now > p.deadline_ms) {
          SLIP_LOG(kWarn, "fabric: NCCL listener dropped a connection: %s",
                   hello < 0 ? "its hello on the fabric failed"
                             : "it refused the answer or said nothing more in time");
          p.link.reset();
        }
        continue;
      }
      if (p.fd < 0) continue;
      bool gone = false;
      if (!ReadHello(p.fd, p.in, &p.got, &gone)) {
        if (gone || now > p.deadline_ms) Drop(&p, gone ? "it closed" : "it said nothing in time");
        continue;
      }
      Hello req;
      if (!msgwire::ParseHello(msgwire::kMagic.request, p.in, kHelloBytes, &req) ||
          !msg::SameSecret(req.proof, secret_, msg::kSecretHalf)) {
        Drop(&p, "it does not carry this listener's secret");
        continue;
      }
      const int tcp = p.fd;
      p.fd = -1;
      p.deadline_ms = now + msg::KeptSetup<MessageSetup>().connect_timeout_ms;
      p.link = Open(tcp, req);  // (then its hello, above, on a later call)
    }
    return Status::kAgain;
  }

 private:
  // A sender's connection: its REQ being read (fd), or answered (link).
  struct Pending {
    int fd = -1;
    uint8_t in[kHelloBytes] = {};
    size_t got = 0;
    uint64_t accepted_ms = 0;
    uint64_t deadline_ms = 0;
    std::unique_ptr<Link> link;
  };

  void TakeNewConnections() noexcept {
    for (;;) {
      const int fd = sys::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      // A free slot, else the one of the oldest connection that has not sent its REQ: a
      // sender sends it at once, so whoever fills the slots with silent connections makes
      // room for each newcomer (it was refused, and NCCL's setup failed with it).
      Pending* slot = nullptr;
      Pending* silent = nullptr;
      for (Pending& p : pending_) {
        if (p.fd < 0 && !p.link)
          slot = &p;
        else if (p.fd >= 0 && (!silent || p.accepted_ms < silent->accepted_ms))
          silent = &p;
      }
      if (!slot && silent) {
        Drop(silent, "it sent no REQ while newer connections came");
        slot = silent;
      }
      if (!slot) {
        SLIP_LOG(kWarn, "fabric: NCCL listener refused a connection: too many pending");
        sys::close(fd);
        continue;
      }
      const uint64_t now = sys::MonotonicMs();
      *slot = Pending{};
      slot->fd = fd;
      slot->accepted_ms = now;
      slot->deadline_ms =
          now + std::min<uint64_t>(kReqWaitMs, msg::KeptSetup<MessageSetup>().connect_timeout_ms);
    }
  }

  void Drop(Pending* p, const char* why) noexcept {
    SLIP_LOG(kWarn, "fabric: NCCL listener refused a connection: %s", why);
    sys::close(p->fd);
    p->fd = -1;
  }

  // The receiving link for a sender that proved the secret: its endpoint, the sender in
  // its address vector, the REP, and the receive of its hello. Null when any fails (the
  // sender's connection closes with it).
  std::unique_ptr<Link> Open(int tcp, const Hello& req) noexcept {
    std::unique_ptr<Link> link(new (std::nothrow) Link(device_, tcp, /*receiver=*/true));
    if (!link) {
      sys::close(tcp);
      return nullptr;
    }
    std::string why;
    Hello rep;
    std::memcpy(rep.proof, secret_ + msg::kSecretHalf, msg::kSecretHalf);
    rep.tag_key = RandomTagKey();
    if (!link->endpoint().Open(*device_.domain, kCqEntries, &why) ||
        !link->Connect(req, rep.tag_key, &why) || !link->PostHello(/*send=*/false, &why)) {
      SLIP_LOG(kWarn, "fabric: NCCL listener refused a connection: %s", why.c_str());
      return nullptr;
    }
    if (!OwnAddress(link->endpoint(), &rep) || !WriteHello(tcp, msgwire::kMagic.reply, rep)) {
      SLIP_LOG(kWarn, "fabric: NCCL listener cannot answer a sender");
      return nullptr;
    }
    return link;
  }

  const Device& device_;
  int fd_ = -1;
  uint8_t secret_[msg::kSecretBytes] = {};
  Pending pending_[kMaxPendingAccepts];
};

// A sender between Connect calls.
struct Connecting {
  msgwire::Handle handle;
  uint64_t deadline_ms = 0;
  std::unique_ptr<Link> comm;  // owns the TCP connection
  int tcp = -1;                // (the comm's)
  bool requested = false;      // the REQ left
  bool answered = false;       // the REP checked: the hello is under way
  uint8_t in[kHelloBytes] = {};
  size_t got = 0;
};

Status Fail(const Connecting& c, Status st, const char* what) noexcept {
  return msg::ConnectFailed("fabric", c.handle, st, what);
}

Status Begin(const Device& device, Connecting* c) noexcept {
  c->deadline_ms = sys::MonotonicMs() + msg::KeptSetup<MessageSetup>().connect_timeout_ms;
  c->tcp = StreamSocket(c->handle.address.ss_family);
  if (c->tcp < 0) return Fail(*c, Status::kSystem, strerror(errno));
  c->comm.reset(new (std::nothrow) Link(device, c->tcp, /*receiver=*/false));
  if (!c->comm) {
    sys::close(c->tcp);
    return Status::kSystem;
  }
  std::string why;
  if (!c->comm->endpoint().Open(*device.domain, kCqEntries, &why))
    return Fail(*c, Status::kSystem, why.c_str());
  if (sys::connect(c->tcp, reinterpret_cast<const sockaddr*>(&c->handle.address),
                   AddressLength(c->handle.address)) != 0 &&
      errno != EINPROGRESS)
    return Fail(*c, Status::kSystem, strerror(errno));
  return Status::kAgain;
}

// Answered: the hello on the fabric, until it completed.
Status AwaitHello(Connecting* c, std::unique_ptr<msg::SendComm>* out) noexcept {
  const int hello = c->comm->HelloDone();
  if (hello < 0) return Fail(*c, Status::kRemote, "the hello on the fabric failed");
  if (hello == 0) {
    if (c->comm->TcpEnded())
      return Fail(*c, Status::kRemote, "the listener dropped the connection");
    return sys::MonotonicMs() > c->deadline_ms ? Fail(*c, Status::kSystem, "timed out")
                                               : Status::kAgain;
  }
  *out = MakeSendComm(std::move(c->comm));
  return *out ? Status::kOk : Status::kSystem;
}

Status Step(Connecting* c, std::unique_ptr<msg::SendComm>* out) noexcept {
  if (c->answered) return AwaitHello(c, out);
  if (!c->requested) {
    pollfd p{c->tcp, POLLOUT, 0};
    if (sys::poll(&p, 1, 0) == 0) {
      return sys::MonotonicMs() > c->deadline_ms ? Fail(*c, Status::kSystem, "timed out")
                                                 : Status::kAgain;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->tcp, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
      return Fail(*c, Status::kSystem, strerror(err ? err : errno));
    Hello req;
    std::memcpy(req.proof, c->handle.secret, msg::kSecretHalf);
    if (!OwnAddress(c->comm->endpoint(), &req) || !WriteHello(c->tcp, msgwire::kMagic.request, req))
      return Fail(*c, Status::kSystem, "cannot send the request");
    c->requested = true;
  }
  bool gone = false;
  if (!ReadHello(c->tcp, c->in, &c->got, &gone)) {
    if (gone) return Fail(*c, Status::kRemote, "the listener closed the connection (refused)");
    return sys::MonotonicMs() > c->deadline_ms ? Fail(*c, Status::kSystem, "timed out")
                                               : Status::kAgain;
  }
  Hello rep;
  if (!msgwire::ParseHello(msgwire::kMagic.reply, c->in, kHelloBytes, &rep) ||
      !msg::SameSecret(rep.proof, c->handle.secret + msg::kSecretHalf, msg::kSecretHalf))
    return Fail(*c, Status::kRemote, "the answer does not carry the handle's secret");
  std::string why;
  if (!c->comm->Connect(rep, rep.tag_key, &why) || !c->comm->PostHello(/*send=*/true, &why))
    return Fail(*c, Status::kRemote, why.c_str());
  c->answered = true;
  return AwaitHello(c, out);
}

class FabricTransport final : public msg::DeviceTransport<const Device&> {
 public:
  explicit FabricTransport(const Device& device) noexcept : DeviceTransport("fabric", device) {}

  Status Listen(uint8_t* handle, std::unique_ptr<msg::Listener>* out) noexcept override {
    return StartListener<FabricListener>(
        out, [handle](FabricListener* listener) { return listener->Start(handle); }, device_);
  }

  Status Connect(const uint8_t* handle, std::unique_ptr<msg::SendComm>* out) noexcept override {
    msgwire::Handle h;
    if (!msgwire::ParseHandle(handle, msg::kHandleBytes, &h)) {
      SLIP_LOG(kWarn, "fabric: NCCL connect: the handle is not a fabric listener's");
      return Status::kBadArgument;
    }
    return msg::PendingConnects<Connecting>::Process().Advance(
        h, [this](Connecting* c) { return Begin(device_, c); },
        [out](Connecting* c) { return Step(c, out); });
  }
};

}  // namespace

std::unique_ptr<msg::Transport> MakeTransport(const Device& device) noexcept {
  return std::unique_ptr<msg::Transport>(new (std::nothrow) FabricTransport(device));
}

}  // namespace slip::fabric::msgimpl
