#include "core/client_setup.h"

#include <poll.h>

#include <cerrno>

#include "core/sys.h"

namespace slip {

ClientSetup::ClientSetup(const ConnectRequest& req, ConnectFn connect) noexcept
    : req_(req), connect_(connect) {}

ClientSetup::~ClientSetup() = default;

bool ClientSetup::Probe(const TransportRegistry& transports) noexcept {
  Reason why = Reason::kPolicy;  // no transport at all: the user allowed none
  bool first = true;
  for (Transport* t : transports) {
    Reason r = Reason::kNone;
    std::unique_ptr<ClientOffer> offer = t->Offer(req_, &r);
    if (offer) {
      offer_ = std::move(offer);
      kind_ = t->kind();
      stage_ = Stage::kOffer;
      return true;
    }
    why = first ? r : CloserReason(why, r);
    first = false;
  }
  Plain(why);
  return false;
}

void ClientSetup::GiveUp(Reason why) noexcept {
  Plain(why);  // (dropping the offer withdraws it)
}

void ClientSetup::Plain(Reason why) noexcept {
  stage_ = Stage::kPlain;
  reason_ = why;
  offer_.reset();
}

void ClientSetup::SendSyn(int tcp) noexcept {
  syn_sent_ = true;
  syn_rc_ = connect_(tcp, req_.dest(), req_.dest_len);
  syn_errno_ = syn_rc_ == 0 ? 0 : errno;
  if (syn_rc_ == 0) {
    connected_ = true;
    Establish(tcp);
    return;
  }
  if (syn_errno_ == EINPROGRESS || syn_errno_ == EINTR) {
    stage_ = Stage::kTcpHandshake;
    tcp_deadline_ms_ = sys::MonotonicMs() + uint64_t(offer_->TcpHandshakeBudgetMs());
    return;
  }
  // Refused or unroutable at once: the application sees connect's own answer.
  Plain(Reason::kConnectSlow);
}

void ClientSetup::Establish(int tcp) noexcept {
  Reason why = Reason::kResources;
  switch (offer_->Establish(tcp, &carrier_, &why)) {
    case ClientOffer::Outcome::kCarried:
      stage_ = Stage::kCarried;
      offer_.reset();
      return;
    case ClientOffer::Outcome::kPlain:
      Plain(why);
      return;
    case ClientOffer::Outcome::kReset:
      stage_ = Stage::kReset;
      reason_ = why;
      offer_.reset();
      return;
  }
}

ClientSetup::Stage ClientSetup::Step(int tcp) noexcept {
  if (stage_ == Stage::kOffer) {
    Reason why = Reason::kNone;
    switch (offer_->Advance(tcp, &why)) {
      case ClientOffer::Step::kWaiting:
        return stage_;
      case ClientOffer::Step::kFailed:
        Plain(why);
        return stage_;
      case ClientOffer::Step::kReady:
        SendSyn(tcp);  // only now: the listener holds the offer before accept() sees the SYN
        return stage_;
    }
  }
  if (stage_ == Stage::kTcpHandshake) {
    pollfd p{tcp, POLLOUT, 0};
    sys::poll(&p, 1, 0);
    if (p.revents & (POLLERR | POLLHUP)) {
      // Refused or reset: the error stays pending on the socket (SO_ERROR is not read
      // here), for the application to find.
      Plain(Reason::kConnectSlow);
    } else if (p.revents & POLLOUT) {
      sockaddr_storage peer;
      socklen_t plen = sizeof(peer);
      if (sys::getpeername(tcp, reinterpret_cast<sockaddr*>(&peer), &plen) == 0) {
        connected_ = true;
        Establish(tcp);
      } else {
        Plain(Reason::kConnectSlow);
      }
    } else if (sys::MonotonicMs() >= tcp_deadline_ms_) {
      // Slower than the offer's budget: the listener stops holding it and treats the
      // connection as plain; so does this end (unless the listener took it just now).
      if (offer_->WithdrawSlow()) {
        Plain(Reason::kConnectSlow);
      } else {
        stage_ = Stage::kReset;
        reason_ = Reason::kConnectSlow;
        offer_.reset();
      }
    }
  }
  return stage_;
}

ClientSetup::Wait ClientSetup::NextWait(int tcp) const noexcept {
  Wait w;
  if (stage_ == Stage::kOffer) {
    w.fd = offer_->WaitFd();
    w.events = POLLIN;
    w.deadline_ms = offer_->DeadlineMs();
  } else if (stage_ == Stage::kTcpHandshake) {
    w.fd = tcp;
    w.events = POLLOUT;
    w.deadline_ms = tcp_deadline_ms_;
  }
  return w;
}

ClientSetup::Stage ClientSetup::Run(int tcp) noexcept {
  for (;;) {
    const Stage stage = Step(tcp);
    if (stage != Stage::kOffer && stage != Stage::kTcpHandshake) return stage;
    const Wait w = NextWait(tcp);
    const uint64_t now = sys::MonotonicMs();
    const int timeout = w.deadline_ms > now ? int(w.deadline_ms - now) : 0;
    pollfd p{w.fd, w.events, 0};
    int rc;
    do {
      rc = sys::poll(&p, w.fd >= 0 ? 1 : 0, timeout);
    } while (rc < 0 && errno == EINTR);
  }
}

}  // namespace slip
