#include "fabric/stream_link.h"

#include <netinet/in.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>

namespace slip::fabric {

namespace {

constexpr size_t kEqEntries = 256;

bool OpenEq(fid_fabric* fabric, EqPtr* out, int* wait_fd, std::string* why) noexcept {
  fi_eq_attr attr{};
  attr.size = kEqEntries;
  attr.wait_obj = FI_WAIT_FD;
  fid_eq* eq = nullptr;
  int rc = fi_eq_open(fabric, &attr, &eq, nullptr);
  if (rc != 0) {
    // (A provider without wait objects: polled.)
    attr.wait_obj = FI_WAIT_NONE;
    rc = fi_eq_open(fabric, &attr, &eq, nullptr);
  }
  if (rc != 0) {
    *why = FabricError("fi_eq_open", rc);
    return false;
  }
  out->reset(eq);
  *wait_fd = -1;
  if (attr.wait_obj == FI_WAIT_FD && fi_control(&eq->fid, FI_GETWAIT, wait_fd) != 0) *wait_fd = -1;
  return true;
}

uint32_t TagOf(const fid* f) noexcept {
  return f ? uint32_t(uintptr_t(f->context)) : 0;
}

}  // namespace

bool ReadLinkEvent(fid_eq* eq, LinkEvent* out) noexcept {
  // A CM entry with its connection data behind it.
  alignas(fi_eq_cm_entry) uint8_t raw[sizeof(fi_eq_cm_entry) + sizeof(LinkEvent::param)] = {};
  uint32_t kind = 0;
  const ssize_t n = fi_eq_read(eq, &kind, raw, sizeof(raw), 0);
  const auto* entry = reinterpret_cast<const fi_eq_cm_entry*>(raw);
  if (n == -FI_EAVAIL) {
    fi_eq_err_entry err{};
    if (fi_eq_readerr(eq, &err, 0) <= 0) return false;
    out->kind = 0;
    out->error = err.err ? err.err : EIO;
    out->tag = TagOf(err.fid);
    return true;
  }
  if (n < ssize_t(sizeof(fi_eq_cm_entry))) return false;
  out->kind = kind;
  out->error = 0;
  out->tag = TagOf(entry->fid);
  out->info.reset(kind == FI_CONNREQ ? entry->info : nullptr);
  out->param_len = size_t(n) - sizeof(fi_eq_cm_entry);
  if (out->param_len > sizeof(out->param)) out->param_len = sizeof(out->param);
  std::memcpy(out->param, raw + sizeof(fi_eq_cm_entry), out->param_len);
  return true;
}

bool LinkListener::Open(const Domain& domain, std::string* why) noexcept {
  if (!OpenEq(domain.fabric(), &eq_, &wait_fd_, why)) return false;
  fid_pep* pep = nullptr;
  int rc = fi_passive_ep(domain.fabric(), const_cast<fi_info*>(&domain.info()), &pep, nullptr);
  if (rc != 0) {
    *why = FabricError("fi_passive_ep", rc);
    return false;
  }
  pep_.reset(pep);
  if ((rc = fi_pep_bind(pep, &eq_->fid, 0)) != 0 || (rc = fi_listen(pep)) != 0) {
    *why = FabricError("fi_listen", rc);
    pep_.reset();
    return false;
  }
  address_len_ = sizeof(address_);
  if ((rc = fi_getname(&pep->fid, address_, &address_len_)) != 0 || address_len_ > 64) {
    *why = FabricError("fi_getname", rc);
    pep_.reset();
    return false;
  }
  return true;
}

void LinkListener::Reject(const fi_info& request) noexcept {
  if (pep_) fi_reject(pep_.get(), request.handle, nullptr, 0);
}

bool Link::Open(const Domain& domain, const fi_info* request, const sockaddr* server, fid_cq* tx_cq,
                fid_cq* rx_cq, fid_eq* eq, uint32_t tag, std::string* why) noexcept {
  InfoPtr client;
  if (!request) {
    if (!OpenEq(domain.fabric(), &eq_, &eq_fd_, why)) return false;
    // The domain's answer with the server as its destination (fi_freeinfo frees it).
    const size_t len = server->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    client.reset(fi_dupinfo(&domain.info()));
    void* dest = client ? malloc(len) : nullptr;
    if (!dest) {
      *why = "out of memory";
      return false;
    }
    std::memcpy(dest, server, len);
    free(client->dest_addr);
    client->dest_addr = dest;
    client->dest_addrlen = len;
  }
  fid_ep* ep = nullptr;
  int rc = fi_endpoint(domain.domain(), const_cast<fi_info*>(request ? request : client.get()), &ep,
                       reinterpret_cast<void*>(uintptr_t(tag)));
  if (rc != 0) {
    *why = FabricError("fi_endpoint", rc);
    return false;
  }
  ep_.reset(ep);
  const bool one_cq = tx_cq == rx_cq;
  if ((rc = fi_ep_bind(ep, &(request ? eq : eq_.get())->fid, 0)) != 0 ||
      (rc = fi_ep_bind(ep, &rx_cq->fid, one_cq ? FI_TRANSMIT | FI_RECV : FI_RECV)) != 0 ||
      (!one_cq && (rc = fi_ep_bind(ep, &tx_cq->fid, FI_TRANSMIT)) != 0)) {
    *why = FabricError("fi_ep_bind", rc);
    return false;
  }
  if ((rc = fi_enable(ep)) != 0) {
    *why = FabricError("fi_enable", rc);
    return false;
  }
  return true;
}

bool Link::Connect(const sockaddr* server, const uint8_t* param, size_t param_len,
                   std::string* why) noexcept {
  const int rc = fi_connect(ep_.get(), server, param, param_len);
  if (rc != 0) *why = FabricError("fi_connect", rc);
  return rc == 0;
}

bool Link::Accept(std::string* why) noexcept {
  const int rc = fi_accept(ep_.get(), nullptr, 0);
  if (rc != 0) *why = FabricError("fi_accept", rc);
  return rc == 0;
}

Link::Step Link::PollConnect(std::string* why) noexcept {
  LinkEvent event;
  while (eq_ && ReadLinkEvent(eq_.get(), &event)) {
    if (event.kind == FI_CONNECTED) return Step::kUp;
    *why = event.kind == 0 ? FabricError("fi_connect", -event.error) : "the peer shut it down";
    return Step::kFailed;
  }
  return Step::kWaiting;
}

}  // namespace slip::fabric
