// The libfabric objects every use of the fabric transport is built from, each with its
// owner: the provider's answer (fi_info), a domain (fabric + domain: one per NIC, or per
// interface, or shm), and a reliable-datagram endpoint with its own address vector and
// completion queue. Both faces build on these (the NCCL face's comms: fabric/msg.h).
//
// What the transport asks of a provider (Want) decides which providers can serve at all;
// the answer says what the chosen one does beyond it (directed receives), and the objects
// are closed in the reverse order they were opened, on every path.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace slip::fabric {

// libfabric's API version this build is written against (Debian 12's 1.17).
constexpr uint32_t kApiVersion = FI_VERSION(1, 17);

template <typename T>
struct FidCloser {
  void operator()(T* p) const noexcept {
    if (p) fi_close(&p->fid);
  }
};
struct InfoFreer {
  void operator()(fi_info* p) const noexcept { fi_freeinfo(p); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoFreer>;
using FabricPtr = std::unique_ptr<fid_fabric, FidCloser<fid_fabric>>;
using DomainPtr = std::unique_ptr<fid_domain, FidCloser<fid_domain>>;
using AvPtr = std::unique_ptr<fid_av, FidCloser<fid_av>>;
using CqPtr = std::unique_ptr<fid_cq, FidCloser<fid_cq>>;
using EndpointPtr = std::unique_ptr<fid_ep, FidCloser<fid_ep>>;
using MrPtr = std::unique_ptr<fid_mr, FidCloser<fid_mr>>;

// "fi_tsend: Connection refused (-111)": libfabric's text for a negative return.
std::string FabricError(const char* call, int rc);

// What a domain is for, which decides what is asked of its provider.
enum class Use : uint8_t {
  // The NCCL face's comms: tagged messages (FI_TAGGED, FI_ORDER_SAS).
  kTaggedMessages,
  // The shim's streams: one-sided writes into the peer's ring with remote CQ data (FI_RMA,
  // writes landing in order: FI_ORDER_WAW), at least 4 bytes of CQ data; between
  // reliable datagram endpoints (FI_EP_RDM)...
  kStreamRings,
  // ... or between connected ones (FI_EP_MSG, one per stream), whose remote CQ data may
  // need receive buffers posted (FI_RX_CQ_DATA: verbs).
  kStreamConnections,
  // The shim's streams where a provider has no RMA: sends into receives the peer posted
  // (FI_MSG), in order (FI_ORDER_SAS), each with 4 bytes of remote CQ data, between
  // connected endpoints; a send that finds no receive posted waits at the sender rather
  // than fail (FI_RM_ENABLED).
  kStreamSends,
};

// The providers' domains that can serve `use`, in order, between RDM endpoints (MSG for
// kStreamConnections and kStreamSends; thread safe, memory registration modes we handle).
// `provider` empty: every provider's, best first. Empty with *why when none.
std::vector<InfoPtr> FindDomains(const std::string& provider, Use use, std::string* why);

// Whether the provider moves data without being called (its writes land, its peer's
// complete) while nobody polls its queues: automatic progress, or verbs, whose queue pairs
// move data in the device whatever progress model it agreed to (FindDomains asks for
// manual progress, so that tcp runs no thread of its own; to verbs that only says when
// completions are reaped).
bool MovesDataItself(const fi_info& info) noexcept;

// A completion queue of `entries` entries in `format`, with a descriptor to wait on where
// `waitable` and the provider has one (*wait_fd, else -1). False with *why, and with
// *out_of_fds (when given) where the process had no descriptor left for it (the shim keeps
// libfabric's above the hidden-descriptor floor: preload/hidden_fds.h).
bool OpenCq(fid_domain* domain, size_t entries, fi_cq_format format, bool waitable, CqPtr* out,
            int* wait_fd, std::string* why, bool* out_of_fds = nullptr);

// One domain, opened: shared by the endpoints and registrations made in it.
class Domain {
 public:
  // Takes `info` (one entry: its `next` is cut). nullptr with *why when it cannot.
  static std::unique_ptr<Domain> Open(InfoPtr info, std::string* why);
  Domain(const Domain&) = delete;
  Domain& operator=(const Domain&) = delete;

  const fi_info& info() const noexcept { return *info_; }
  fid_domain* domain() const noexcept { return domain_.get(); }
  fid_fabric* fabric() const noexcept { return fabric_.get(); }
  // "tcp;ofi_rxm", "shm", ...
  const char* provider() const noexcept { return info_->fabric_attr->prov_name; }
  const char* name() const noexcept { return info_->domain_attr->name; }
  // Receives may name the one address they take messages from.
  bool directed_recv() const noexcept { return (info_->caps & FI_DIRECTED_RECV) != 0; }
  // A send completes once delivered at its target (else once the buffer may be reused).
  bool delivery_complete() const noexcept {
    return (info_->tx_attr->op_flags & FI_DELIVERY_COMPLETE) != 0;
  }
  // Sends and receives must name a registration of their buffer (FI_MR_LOCAL).
  bool needs_local_mr() const noexcept { return (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0; }
  // Where this domain's TCP side channel listens: the interface's IP address for providers
  // addressed by IP (tcp, verbs), the loopback for shm, else the host's first address
  // outside loopback (port 0).
  const sockaddr_storage& ip_address() const noexcept { return ip_address_; }

 private:
  Domain() = default;
  InfoPtr info_;
  FabricPtr fabric_;
  DomainPtr domain_;
  sockaddr_storage ip_address_{};
};

// A reliable-datagram endpoint with an address vector and completion queue of its own.
// Its completions are tagged entries, polled (the NCCL face's comms), or data entries with
// a wait object that a progress thread may sleep on where the provider has one (streams).
class Endpoint {
 public:
  Endpoint() = default;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // False with *why when the provider refuses any of it.
  bool Open(const Domain& domain, size_t cq_entries, std::string* why) {
    return Open(domain, cq_entries, FI_CQ_FORMAT_TAGGED, /*waitable=*/false, why);
  }
  bool Open(const Domain& domain, size_t cq_entries, fi_cq_format format, bool waitable,
            std::string* why);
  // The completion queue has a descriptor to wait on (after fi_trywait says so).
  bool waitable() const noexcept { return waitable_; }
  int wait_fd() const noexcept { return wait_fd_; }
  // The endpoint's address (fi_getname): false when it is longer than `*len`.
  bool Name(uint8_t* out, size_t* len) const noexcept;
  // A peer's address into the address vector. False when the provider rejects it.
  bool Insert(const uint8_t* address, size_t len, fi_addr_t* out) noexcept;
  // Takes an entry out of the address vector. False when the provider refuses.
  bool Remove(fi_addr_t addr) noexcept;

  // At exit, where the endpoint stays open (other threads may still use it): removes the
  // name new peers would find it by (shm's file in /dev/shm, which only closing removes).
  void Unpublish() noexcept;

  // Closes the endpoint, then what it is bound to (nothing lands in posted buffers after).
  void Close() noexcept {
    ep_.reset();
    shm_name_.clear();
    av_.reset();
    cq_.reset();
  }

  // A fork child's copy: forgotten without closing (the objects are the parent's).
  void Forget() noexcept {
    (void)ep_.release();
    (void)av_.release();
    (void)cq_.release();
  }

  fid_ep* ep() const noexcept { return ep_.get(); }
  fid_cq* cq() const noexcept { return cq_.get(); }

 private:
  // Closed in the reverse order: the endpoint before what it is bound to.
  CqPtr cq_;
  AvPtr av_;
  EndpointPtr ep_;
  bool waitable_ = false;
  int wait_fd_ = -1;      // the provider's
  std::string shm_name_;  // the region's name we gave a shm endpoint
};

}  // namespace slip::fabric
