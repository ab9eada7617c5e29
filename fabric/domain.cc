#include "fabric/domain.h"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/module_loader.h"

namespace slip::fabric {

namespace {

bool IsLoopback(const sockaddr* a) noexcept {
  if (a->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  return false;
}

// The domain's source address when the provider is addressed by IP, else null.
const sockaddr* IpSource(const fi_info& info) noexcept {
  if (!info.src_addr) return nullptr;
  if (info.addr_format == FI_SOCKADDR_IN && info.src_addrlen >= sizeof(sockaddr_in))
    return static_cast<const sockaddr*>(info.src_addr);
  if (info.addr_format == FI_SOCKADDR_IN6 && info.src_addrlen >= sizeof(sockaddr_in6))
    return static_cast<const sockaddr*>(info.src_addr);
  return nullptr;
}

InfoPtr Query(const std::string& provider, Use use, bool directed, bool delivery, std::string* why,
              bool manual_progress = false) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) {
    *why = "out of memory";
    return nullptr;
  }
  // Messages: every operation carries a fi_context2 of ours. Streams: an operation's
  // context is only the number of its connection (a provider that needs room there cannot
  // serve them).
  hints->mode = use == Use::kTaggedMessages ? FI_CONTEXT | FI_CONTEXT2 : 0;
  const bool connected = use == Use::kStreamConnections || use == Use::kStreamSends;
  hints->ep_attr->type = connected ? FI_EP_MSG : FI_EP_RDM;
  if (connected) {
    // Writes with remote CQ data that consume a posted receive: we post them.
    hints->mode |= FI_RX_CQ_DATA;
    hints->rx_attr->mode = FI_RX_CQ_DATA;
  }
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
  // Any thread may call in at any time (the application's writers and readers, the progress
  // thread): the provider serialises what it must, where it must, and we take no lock.
  hints->domain_attr->threading = FI_THREAD_SAFE;
  if (use == Use::kTaggedMessages) {
    hints->caps = FI_TAGGED | (directed ? FI_DIRECTED_RECV : 0);
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
  } else if (use == Use::kStreamSends) {
    // A message's bytes go where its order says (the receiver copies them after the ones
    // before): sends complete at the receiver in the order they were posted.
    hints->caps = FI_MSG | FI_SEND | FI_RECV;
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    hints->domain_attr->cq_data_size = 4;
    hints->domain_attr->resource_mgmt = FI_RM_ENABLED;
  } else {
    // A note's completion says its bytes and every earlier write's have landed.
    hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
    hints->tx_attr->msg_order = FI_ORDER_WAW;
    hints->rx_attr->msg_order = FI_ORDER_WAW;
    hints->domain_attr->cq_data_size = 4;  // (8 where it can: fabric/stream_note.h)
  }
  if (delivery) hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  if (manual_progress) hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* found = nullptr;
  const int rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &found);
  if (rc != 0) {
    *why = FabricError("fi_getinfo", rc);
    return nullptr;
  }
  return InfoPtr(found);
}

// "slip-<pid>-<n>-<random>", malloc'd (fi_freeinfo frees an info's src_addr), with its
// length and the NUL; null when out of memory. Short enough for every shm version's name
// field (32 bytes in the oldest).
void* ShmName(size_t* len) noexcept {
  static std::atomic<unsigned> count{0};
  uint32_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce)) nonce = uint32_t(random());
  char name[32];
  const int n = snprintf(name, sizeof(name), "slip-%d-%u-%08x", int(getpid()),
                         count.fetch_add(1) & 0xffff, nonce);
  *len = size_t(n) + 1;
  return strdup(name);
}

}  // namespace

std::string FabricError(const char* call, int rc) {
  char line[160];
  snprintf(line, sizeof(line), "%s: %s (%d)", call, fi_strerror(rc < 0 ? -rc : rc), rc);
  return line;
}

std::vector<InfoPtr> FindDomains(const std::string& provider, Use use, std::string* why) {
  std::vector<InfoPtr> out;
  // Directed receives where a provider has them (a stranger's message then matches no
  // receive of ours), and sends that complete once delivered (a sender that closes its comm
  // after its last completion loses nothing, as over verbs' RC); without where none has.
  // shm's completions mean delivery already (the bytes are in the receiver's region, or
  // read from ours by the receiver), and 1.17's shm never completes a send above its inject
  // size under FI_DELIVERY_COMPLETE (seen here): it is not asked of shm.
  InfoPtr list;
  // Streams need neither: their notes name their connection, and ring space is freed by
  // the peer's credit, not by a completion.
  const int first = use == Use::kTaggedMessages ? 3 : 0;
  // Connected endpoints: progressed by whoever polls (the waiting reader or writer, the
  // progress thread), where the provider lets us, as ofi_rxm asks of its core provider:
  // with automatic progress tcp runs a thread of its own per domain besides ours. (Over
  // tcp it did not make connected endpoints as fast as ofi_rxm's datagrams: a 64 B round
  // trip stayed 3x theirs on this host, docs/PERFORMANCE.md.)
  if (use == Use::kStreamConnections || use == Use::kStreamSends)
    list = Query(provider, use, false, false, why, /*manual_progress=*/true);
  for (int want = first; want >= 0 && !list; --want) {
    const bool directed = (want & 2) != 0, delivery = (want & 1) != 0;
    list = Query(provider, use, directed, delivery, why);
    if (list && delivery && strcmp(list->fabric_attr->prov_name, "shm") == 0)
      list = Query(provider, use, directed, /*delivery=*/false, why);
  }
  if (!list) {
    if (!provider.empty()) *why = "provider " + provider + ": " + *why;
    return out;
  }
  // Streams' notes need at least 4 bytes of remote CQ data (fabric/stream_note.h): a
  // provider may answer with less than the hints asked, and a note cut short names no
  // connection, so such entries serve no stream.
  auto serves = [use](const fi_info* i) {
    return use == Use::kTaggedMessages || i->domain_attr->cq_data_size >= 4;
  };
  const fi_info* best = list.get();
  while (best && !serves(best)) best = best->next;
  if (!best) {
    char line[160];
    snprintf(line, sizeof(line), "provider %s carries %zu bytes of CQ data; streams need 4",
             list->fabric_attr->prov_name, list->domain_attr->cq_data_size);
    *why = line;
    return out;
  }
  // The best match's provider, one entry per domain (a domain is listed once per address
  // family), loopback interfaces only when there is nothing else.
  const std::string chosen = best->fabric_attr->prov_name;
  bool other_than_loopback = false;
  for (const fi_info* i = list.get(); i; i = i->next) {
    const sockaddr* ip = IpSource(*i);
    if (chosen == i->fabric_attr->prov_name && serves(i) && !(ip && IsLoopback(ip)))
      other_than_loopback = true;
  }
  for (const fi_info* i = list.get(); i; i = i->next) {
    if (chosen != i->fabric_attr->prov_name || !serves(i)) continue;
    const sockaddr* ip = IpSource(*i);
    if (other_than_loopback && ip && IsLoopback(ip)) continue;
    bool seen = false;
    for (const InfoPtr& d : out)
      seen = seen || strcmp(d->domain_attr->name, i->domain_attr->name) == 0;
    if (seen) continue;
    InfoPtr one(fi_dupinfo(i));
    if (!one) {
      *why = "out of memory";
      return {};
    }
    if (one->next) {
      fi_freeinfo(one->next);
      one->next = nullptr;
    }
    out.push_back(std::move(one));
  }
  return out;
}

std::unique_ptr<Domain> Domain::Open(InfoPtr info, std::string* why) {
  std::unique_ptr<Domain> d(new (std::nothrow) Domain);
  if (!d) {
    *why = "out of memory";
    return nullptr;
  }
  d->info_ = std::move(info);
  fid_fabric* fabric = nullptr;
  int rc = fi_fabric(d->info_->fabric_attr, &fabric, nullptr);
  if (rc != 0) {
    *why = FabricError("fi_fabric", rc);
    return nullptr;
  }
  d->fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  rc = fi_domain(fabric, d->info_.get(), &domain, nullptr);
  if (rc != 0) {
    *why = FabricError("fi_domain", rc);
    return nullptr;
  }
  d->domain_.reset(domain);
  // The side channel's address.
  if (const sockaddr* ip = IpSource(*d->info_)) {
    std::memcpy(&d->ip_address_, ip,
                ip->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  } else if (strcmp(d->provider(), "shm") == 0) {
    auto* in = reinterpret_cast<sockaddr_in*>(&d->ip_address_);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else {
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) == 0) {
      for (const ifaddrs* a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || IsLoopback(a->ifa_addr)) continue;
        std::memcpy(&d->ip_address_, a->ifa_addr, sizeof(sockaddr_in));
        break;
      }
      freeifaddrs(list);
    }
    if (d->ip_address_.ss_family == 0) {
      *why = "no IP address for the domain's connection listener";
      return nullptr;
    }
  }
  reinterpret_cast<sockaddr_in*>(&d->ip_address_)->sin_port = 0;  // (same place in sockaddr_in6)
  return d;
}

bool MovesDataItself(const fi_info& info) noexcept {
  if (info.domain_attr && info.domain_attr->data_progress == FI_PROGRESS_AUTO) return true;
  return info.fabric_attr && info.fabric_attr->prov_name &&
         std::strcmp(info.fabric_attr->prov_name, "verbs") == 0;
}

bool OpenCq(fid_domain* domain, size_t entries, fi_cq_format format, bool waitable, CqPtr* out,
            int* wait_fd, std::string* why, bool* out_of_fds) {
  fi_cq_attr cq_attr{};
  cq_attr.format = format;
  cq_attr.wait_obj = waitable ? FI_WAIT_FD : FI_WAIT_NONE;
  cq_attr.size = entries;
  fid_cq* cq = nullptr;
  int rc = fi_cq_open(domain, &cq_attr, &cq, nullptr);
  const bool no_fds = rc == -FI_EMFILE || rc == -ENFILE;
  if (out_of_fds) *out_of_fds = no_fds;
  if (rc != 0 && waitable && !no_fds) {
    // A provider without wait objects: polled (the progress thread naps instead). Not one
    // that ran out of descriptors: a queue polled for that would cost the progress thread
    // its sleep for a connection that is better plain.
    cq_attr.wait_obj = FI_WAIT_NONE;
    waitable = false;
    rc = fi_cq_open(domain, &cq_attr, &cq, nullptr);
  }
  if (rc != 0) {
    *why = FabricError("fi_cq_open", rc);
    return false;
  }
  out->reset(cq);
  *wait_fd = -1;
  if (waitable && fi_control(&cq->fid, FI_GETWAIT, wait_fd) != 0) *wait_fd = -1;
  return true;
}

bool Endpoint::Open(const Domain& domain, size_t cq_entries, fi_cq_format format, bool waitable,
                    std::string* why) {
  // A provider may install signal handlers as its first endpoint opens (shm's, which
  // unlink its regions and re-raise): the application's signals stay its own.
  KeepSignalDispositions keep("fabric");
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = 4;
  fid_av* av = nullptr;
  int rc = fi_av_open(domain.domain(), &av_attr, &av, nullptr);
  if (rc != 0) {
    *why = FabricError("fi_av_open", rc);
    return false;
  }
  av_.reset(av);
  if (!OpenCq(domain.domain(), cq_entries, format, waitable, &cq_, &wait_fd_, why)) return false;
  waitable_ = wait_fd_ >= 0;
  fid_cq* cq = cq_.get();
  // shm names the file of its endpoint's region after the pid ("<pid>:0:0" in /dev/shm)
  // unless told otherwise, and fails to enable an endpoint whose file exists: one a
  // process killed with that pid left, or one another local user made first. A name of our
  // own that nobody can guess avoids both (and lets the owner unlink it at exit).
  InfoPtr named;
  if (std::strcmp(domain.provider(), "shm") == 0) {
    named.reset(fi_dupinfo(&domain.info()));
    if (!named || !(named->src_addr = ShmName(&named->src_addrlen))) {
      *why = "out of memory";
      return false;
    }
  }
  fid_ep* ep = nullptr;
  rc = fi_endpoint(domain.domain(), const_cast<fi_info*>(named ? named.get() : &domain.info()), &ep,
                   nullptr);
  if (rc != 0) {
    *why = FabricError("fi_endpoint", rc);
    return false;
  }
  ep_.reset(ep);
  if (named) shm_name_.assign(static_cast<const char*>(named->src_addr));
  if ((rc = fi_ep_bind(ep, &av->fid, 0)) != 0 ||
      (rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0) {
    *why = FabricError("fi_ep_bind", rc);
    return false;
  }
  if ((rc = fi_enable(ep)) != 0) {
    *why = FabricError("fi_enable", rc);
    return false;
  }
  return true;
}

void Endpoint::Unpublish() noexcept {
  if (!shm_name_.empty()) shm_unlink(shm_name_.c_str());
}

bool Endpoint::Name(uint8_t* out, size_t* len) const noexcept {
  return ep_ && fi_getname(&ep_->fid, out, len) == 0;
}

bool Endpoint::Insert(const uint8_t* address, size_t len, fi_addr_t* out) noexcept {
  (void)len;  // the provider knows its addresses' length; the wire bounded it
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  if (!av_ || fi_av_insert(av_.get(), address, 1, &addr, 0, nullptr) != 1 ||
      addr == FI_ADDR_NOTAVAIL)
    return false;
  *out = addr;
  return true;
}

bool Endpoint::Remove(fi_addr_t addr) noexcept {
  return av_ && fi_av_remove(av_.get(), &addr, 1, 0) == 0;
}

}  // namespace slip::fabric
