// verbs' message comms: listening, accepting and connecting, one step per call (verbs/msg.h).
#include <arpa/inet.h>
#include <fcntl.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "core/log.h"
#include "core/msg_pending.h"
#include "core/sys.h"
#include "verbs/msg_internal.h"
#include "verbs/qp.h"

namespace slip::verbs::msgimpl {

namespace {

using msgwire::ConnectData;
using msgwire::Handle;
using msgwire::kSecretHalf;

constexpr int kListenBacklog = 64;
constexpr int kMaxPendingAccepts = 8;
constexpr int kResolveTimeoutMs = 2000;

// --- the listening side ---

class VerbsListener final : public msg::Listener {
 public:
  ~VerbsListener() override {
    if (id_) rdma_destroy_id(id_);
    if (channel_) rdma_destroy_event_channel(channel_);
  }

  Status Start(const Device& device, uint8_t* handle) noexcept {
    channel_ = rdma_create_event_channel();
    if (!channel_) return Status::kSystem;
    const int flags = fcntl(channel_->fd, F_GETFL);
    if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) return Status::kSystem;
    if (rdma_create_id(channel_, &id_, this, RDMA_PS_TCP) != 0) return Status::kSystem;
    sockaddr_storage at = device.address;  // port 0: the kernel picks one
    if (rdma_bind_addr(id_, reinterpret_cast<sockaddr*>(&at)) != 0 ||
        rdma_listen(id_, kListenBacklog) != 0) {
      SLIP_LOG(kWarn, "verbs: cannot listen for NCCL on %s: %s", device.info.name, strerror(errno));
      return Status::kSystem;
    }
    Handle h;
    h.address = device.address;
    const uint16_t port = rdma_get_src_port(id_);  // network order
    if (h.address.ss_family == AF_INET)
      reinterpret_cast<sockaddr_in*>(&h.address)->sin_port = port;
    else
      reinterpret_cast<sockaddr_in6*>(&h.address)->sin6_port = port;
    msg::PublishAddressHandle("verbs", msgwire::kMagic.handle, msgwire::kVersion, &h, secret_,
                              device.info.name, handle);
    return Status::kOk;
  }

  Status Accept(std::unique_ptr<msg::RecvComm>* out) noexcept override {
    rdma_cm_event* event = nullptr;
    while (rdma_get_cm_event(channel_, &event) == 0) {
      if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST)
        OnRequest(event);  // acknowledges it
      else
        rdma_ack_cm_event(event);
    }
    const uint64_t now = sys::MonotonicMs();
    for (Pending& p : pending_) {
      if (!p.ep) continue;
      const Status st = Advance(&p, now);
      if (st == Status::kAgain) continue;
      std::unique_ptr<Endpoint> ep = std::move(p.ep);
      if (st != Status::kOk) continue;  // dropped (logged); the listener goes on
      *out = MakeRecvComm(std::move(ep), p.fifo);
      return *out ? Status::kOk : Status::kSystem;
    }
    return Status::kAgain;
  }

 private:
  struct Pending {
    std::unique_ptr<Endpoint> ep;
    msgwire::RemoteArea fifo;
    uint64_t deadline_ms = 0;
  };

  // A sender's REQ: answered at once (our queue pair ready, REP with the secret's second
  // half) when it proves it read our handle; refused otherwise.
  void OnRequest(rdma_cm_event* event) noexcept {
    rdma_cm_id* id = event->id;
    ConnectData req;
    const bool ours =
        msgwire::ParseConnectData(msgwire::kMagic.request,
                                  static_cast<const uint8_t*>(event->param.conn.private_data),
                                  event->param.conn.private_data_len, &req) &&
        msg::SameSecret(req.proof, secret_, kSecretHalf);
    rdma_ack_cm_event(event);
    Pending* slot = nullptr;
    for (Pending& p : pending_)
      if (!p.ep) slot = &p;
    if (!ours || !slot) {
      SLIP_LOG(kWarn, "verbs: NCCL listener refused a connection request: %s",
               ours ? "too many pending" : "it does not carry this listener's secret");
      rdma_reject(id, nullptr, 0);
      rdma_destroy_id(id);
      return;
    }
    auto ep = std::unique_ptr<Endpoint>(new (std::nothrow) Endpoint(true));
    if (!ep) {
      rdma_reject(id, nullptr, 0);
      rdma_destroy_id(id);
      return;
    }
    int rc = ep->OpenChannel();
    // Its events (ESTABLISHED, a disconnect) go to the comm's own channel from now on.
    if (rc == 0 && rdma_migrate_id(id, ep->channel()) != 0) rc = -(errno ? errno : EINVAL);
    if (rc < 0) {
      rdma_reject(id, nullptr, 0);
      rdma_destroy_id(id);
      return;
    }
    ep->Adopt(id);
    // As many queue pairs as the sender asked for (1 to kMaxQueuePairs: the parser's bound).
    if (rc = ep->Build(1 + req.extra); rc == 0) rc = ep->Ready(req.extra_qpn);
    if (rc == 0) {
      ConnectData rep;
      std::memcpy(rep.proof, secret_ + kSecretHalf, kSecretHalf);
      rep.area = ep->control_area(0);  // the size slots
      rep.extra = req.extra;
      for (int i = 0; i < req.extra; ++i) rep.extra_qpn[i] = ep->qp(i + 1)->qp_num;
      uint8_t data[msgwire::kConnectDataBytes];
      const size_t len = msgwire::EncodeConnectData(msgwire::kMagic.reply, rep, data, sizeof(data));
      rdma_conn_param param = ConnParam(data, len, ep->qp()->qp_num);
      if (rdma_accept(id, &param) != 0) rc = -(errno ? errno : EINVAL);
    }
    if (rc < 0) {
      SLIP_LOG(kWarn, "verbs: NCCL listener cannot answer a connection request: %s", strerror(-rc));
      rdma_reject(id, nullptr, 0);
      return;  // ep destroys the id
    }
    slot->ep = std::move(ep);
    slot->fifo = req.area;
    slot->deadline_ms = sys::MonotonicMs() + msg::KeptSetup<MessageSetup>().connect_timeout_ms;
  }

  Status Advance(Pending* p, uint64_t now) noexcept {
    rdma_cm_event* event = nullptr;
    while (rdma_get_cm_event(p->ep->channel(), &event) == 0) {
      const rdma_cm_event_type type = event->event;
      rdma_ack_cm_event(event);
      if (type == RDMA_CM_EVENT_ESTABLISHED) {
        p->ep->SetConnected();
        return Status::kOk;
      }
      if (type == RDMA_CM_EVENT_REJECTED || type == RDMA_CM_EVENT_DISCONNECTED ||
          type == RDMA_CM_EVENT_CONNECT_ERROR || type == RDMA_CM_EVENT_UNREACHABLE ||
          type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
        SLIP_LOG(kInfo, "verbs: an NCCL connection did not complete: %s", rdma_event_str(type));
        return Status::kRemote;
      }
    }
    if (now > p->deadline_ms) {
      SLIP_LOG(kInfo, "verbs: an NCCL connection did not complete in %u ms",
               unsigned(msg::KeptSetup<MessageSetup>().connect_timeout_ms));
      return Status::kRemote;
    }
    return Status::kAgain;
  }

  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  uint8_t secret_[msgwire::kSecretBytes] = {};
  Pending pending_[kMaxPendingAccepts];
};

// --- the connecting side ---

// A connect between its first call and its comm: NCCL calls connect() again with the same
// handle, so the steps in between are found by the handle's secret.
struct Connecting {
  std::unique_ptr<Endpoint> ep;
  Handle handle;
  uint64_t deadline_ms = 0;
};

Status Fail(const Connecting& c, Status st, const char* what) noexcept {
  return msg::ConnectFailed("verbs", c.handle, st, what);
}

Status Begin(Connecting* c) noexcept {
  c->ep.reset(new (std::nothrow) Endpoint(false));
  if (!c->ep || c->ep->OpenChannel() < 0) return Fail(*c, Status::kSystem, strerror(errno));
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(c->ep->channel(), &id, nullptr, RDMA_PS_TCP) != 0)
    return Fail(*c, Status::kSystem, strerror(errno));
  c->ep->Adopt(id);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&c->handle.address),
                        kResolveTimeoutMs) != 0)
    return Fail(*c, Status::kSystem, strerror(errno));
  c->deadline_ms = sys::MonotonicMs() + msg::KeptSetup<MessageSetup>().connect_timeout_ms;
  return Status::kAgain;
}

Status SendRequest(Connecting* c) noexcept {
  Endpoint* ep = c->ep.get();
  if (int rc = ep->Build(msg::KeptSetup<MessageSetup>().queue_pairs); rc < 0)
    return Fail(*c, Status::kSystem, strerror(-rc));
  ConnectData req;
  std::memcpy(req.proof, c->handle.secret, kSecretHalf);
  req.area = ep->control_area(0);  // the CTS FIFO
  req.extra = uint8_t(ep->queue_pairs() - 1);
  for (int i = 0; i < req.extra; ++i) req.extra_qpn[i] = ep->qp(i + 1)->qp_num;
  uint8_t data[msgwire::kConnectDataBytes];
  const size_t len = msgwire::EncodeConnectData(msgwire::kMagic.request, req, data, sizeof(data));
  rdma_conn_param param = ConnParam(data, len, ep->qp()->qp_num);
  if (rdma_connect(ep->id(), &param) != 0) return Fail(*c, Status::kSystem, strerror(errno));
  return Status::kAgain;
}

Status Step(Connecting* c, std::unique_ptr<msg::SendComm>* out) noexcept {
  Endpoint* ep = c->ep.get();
  rdma_cm_event* event = nullptr;
  while (rdma_get_cm_event(ep->channel(), &event) == 0) {
    const rdma_cm_event_type type = event->event;
    if (type == RDMA_CM_EVENT_CONNECT_RESPONSE) {
      ConnectData rep;
      const bool theirs =
          msgwire::ParseConnectData(msgwire::kMagic.reply,
                                    static_cast<const uint8_t*>(event->param.conn.private_data),
                                    event->param.conn.private_data_len, &rep) &&
          msg::SameSecret(rep.proof, c->handle.secret + kSecretHalf, kSecretHalf);
      rdma_ack_cm_event(event);
      if (!theirs)
        return Fail(*c, Status::kRemote, "the answer does not carry the handle's secret");
      if (rep.extra != ep->queue_pairs() - 1)
        return Fail(*c, Status::kRemote, "the answer has another number of queue pairs");
      if (int rc = ep->Ready(rep.extra_qpn); rc < 0)
        return Fail(*c, Status::kSystem, strerror(-rc));
      if (rdma_establish(ep->id()) != 0) return Fail(*c, Status::kSystem, strerror(errno));
      ep->SetConnected();
      char text[96];
      SLIP_LOG(kDebug, "verbs: NCCL comm to %s: %d queue pair(s) from %u",
               msg::AddressText(c->handle.address, text, sizeof(text)), ep->queue_pairs(),
               ep->qp()->qp_num);
      *out = MakeSendComm(std::move(c->ep), rep.area);
      return *out ? Status::kOk : Status::kSystem;
    }
    rdma_ack_cm_event(event);
    Status st = Status::kAgain;
    switch (type) {
      case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (rdma_resolve_route(ep->id(), kResolveTimeoutMs) != 0)
          st = Fail(*c, Status::kSystem, strerror(errno));
        break;
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
        st = SendRequest(c);
        break;
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        st = Fail(*c, Status::kSystem, rdma_event_str(type));
        break;
      default:
        break;
    }
    if (st != Status::kAgain) return st;
  }
  if (sys::MonotonicMs() > c->deadline_ms) return Fail(*c, Status::kSystem, "timed out");
  return Status::kAgain;
}

class VerbsTransport final : public msg::DeviceTransport<const Device> {
 public:
  explicit VerbsTransport(const Device& device) noexcept : DeviceTransport("verbs", device) {}

  Status Listen(uint8_t* handle, std::unique_ptr<msg::Listener>* out) noexcept override {
    return StartListener<VerbsListener>(
        out, [&](VerbsListener* listener) { return listener->Start(device_, handle); });
  }

  Status Connect(const uint8_t* handle, std::unique_ptr<msg::SendComm>* out) noexcept override {
    Handle h;
    if (!msgwire::ParseHandle(handle, msg::kHandleBytes, &h)) {
      SLIP_LOG(kWarn, "verbs: NCCL connect: the handle is not a verbs listener's");
      return Status::kBadArgument;
    }
    return msg::PendingConnects<Connecting>::Process().Advance(
        h, [](Connecting* c) { return Begin(c); }, [out](Connecting* c) { return Step(c, out); });
  }
};

}  // namespace

std::unique_ptr<msg::Transport> MakeTransport(const Device& device) noexcept {
  return std::unique_ptr<msg::Transport>(new (std::nothrow) VerbsTransport(device));
}

}  // namespace slip::verbs::msgimpl
