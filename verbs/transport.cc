// verbs as core's Transport (core/module_transport.h): the client's offer is the rdma_cm
// exchange (resolve, then a REQ or a parked queue pair's CLAIM, answered before the SYN),
// the listener's twin its rdma_cm listener. What each step does and why is in verbs.h and
// docs/DESIGN.md ("Detection across hosts (verbs)").
#include "verbs/transport.h"

#include <sys/stat.h>

#include <new>

#include "core/local_address.h"
#include "core/module_transport.h"
#include "core/no_destructor.h"
#include "verbs/options.h"
#include "verbs/verbs.h"

namespace slip::verbs {

namespace {

class VerbsTwin final : public RingTwin<Module> {
 public:
  VerbsTwin(Module* m, Listener* l, uint64_t group_member, const Config* config) noexcept
      : RingTwin(m, l, config), group_member_(group_member) {}
  ~VerbsTwin() override { m_->Unlisten(l_, group_member_); }

 private:
  const uint64_t group_member_;  // the TCP listener's inode in its SO_REUSEPORT group, or 0
};

class VerbsTransport final : public ModuleTransport<Module, Options> {
 public:
  VerbsTransport() noexcept : ModuleTransport(kModule, kOptionTable) {}

  std::unique_ptr<ClientOffer> Offer(const ConnectRequest& req, Reason* why) noexcept override {
    *why = Reason::kNoRdmaPath;
    if (IsLoopback(req.server)) return nullptr;  // rdma_cm has no loopback device
    return ModuleTransport::Offer(req, why);
  }

  std::unique_ptr<ListenerTwin> Listen(const ListenRequest& req, Reason* why) noexcept override {
    // SO_REUSEPORT: the group's sockets in one process share the port's rdma_cm listener,
    // which serves only the SYNs the kernel will hand them (docs/DESIGN.md "Servers that
    // share a port"); they are told apart by inode, as the kernel's lookup names them.
    uint64_t group_member = 0;
    if (req.reuseport) {
      struct stat st {};
      *why = Reason::kReusePort;
      if (fstat(req.fd, &st) != 0 || st.st_ino == 0) return nullptr;
      group_member = uint64_t(st.st_ino);
    }
    Module* m = Get(req.config);
    *why = Reason::kNoRdmaDevice;
    if (!m) return nullptr;
    Listener* l = m->Listen(req.local, group_member, why);
    if (!l) return nullptr;
    std::unique_ptr<ListenerTwin> twin(new (std::nothrow)
                                           VerbsTwin(m, l, group_member, req.config));
    if (!twin) {
      m->Unlisten(l, group_member);
      *why = Reason::kResources;
    }
    return twin;
  }
};

}  // namespace

Transport* TheTransport() noexcept {
  static NoDestructor<VerbsTransport> transport;  // connections may be made during exit
  return transport.get();
}

}  // namespace slip::verbs
