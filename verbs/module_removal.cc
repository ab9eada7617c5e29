// The verbs module and a device that goes away (DEVICE_REMOVAL; docs/DESIGN.md
// "Failover"): its connections continue on TCP, and everything the process holds on it is
// destroyed once nothing uses it.
#include <cerrno>
#include <mutex>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/module_impl.h"

namespace slip::verbs {

using namespace module_internal;

void VerbsModule::NoteRemoved(ibv_context* context) noexcept {
  if (!context) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Removal& r : removals_) {
    if (r.context == context && !r.superseded) return;
  }
  Removal r;
  r.context = context;
  auto it = devices_.find(context);
  if (it != devices_.end()) r.device = it->second;
  try {
    removals_.push_back(r);
  } catch (...) {
    SLIP_LOG(kWarn, "verbs: out of memory: the removed device stays open until exit");
    return;
  }
  if (it != devices_.end()) devices_.erase(it);  // a later connection opens a new one
  reaping_ = true;
  SLIP_LOG(kInfo, "verbs: RDMA device %s removed: releasing what this process holds of it",
           ibv_get_device_name(context->device));
}

void VerbsModule::ReapRemoved() noexcept {
  if (!reaping_) return;
  bool done = true;
  // Only this thread adds removals (under mu_, which DeviceFor reads them under), so it
  // reads them without the lock; ReapRemoval takes mu_ itself.
  for (size_t i = 0; i < removals_.size(); ++i) done = ReapRemoval(&removals_[i]) && done;
  reaping_ = !done;
}

bool VerbsModule::ReapRemoval(Removal* r) noexcept {
  if (r->retired) return true;
  // Listener ids bound to the device (a wildcard listener has none: rdma_cm keeps its own
  // per-device listeners): the TCP listener goes on serving, plain. Requests kept on the
  // device are dropped, their records left: a client that confirms has its stream on TCP
  // from byte 0 (core/stand_in_ring.h).
  std::vector<rdma_cm_id*> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Listener* l : listeners_) {
      for (rdma_cm_id** id : {&l->id, &l->port_id}) {
        if (!*id || (*id)->verbs != r->context) continue;
        try {
          ids.push_back(*id);
          *id = nullptr;
        } catch (...) {
          return false;  // tried again on the next round
        }
      }
    }
  }
  for (rdma_cm_id* id : ids) rdma_destroy_id(id);  // its events were acknowledged
  if (PendingRequests* table = requests_.table(); table && r->device) {
    auto on_device = [](const RemoteRing* conn, const void* device) noexcept {
      return static_cast<const Conn*>(conn)->device() == device;
    };
    size_t dropped = 0;
    while (RemoteRing* conn = table->DropOneIf(on_device, r->device, sys::MonotonicMs())) {
      DeleteRequest(conn);
      ++dropped;
    }
    if (dropped)
      SLIP_LOG(kDebug, "verbs: dropped %zu request(s) kept on the removed device", dropped);
  }
  if (r->device) {
    // Parked queue pairs on it are deleted (their peers see them go); the connections
    // that failed over keep their rings and release the rest.
    std::vector<ParkedConn> gone;
    {
      std::lock_guard<std::mutex> lock(park_mu_);
      MoveOutIf(&parked_, &gone,
                [r](const ParkedConn& p) { return p.ready && p.conn->device() == r->device; });
    }
    for (const ParkedConn& p : gone) delete p.conn;
    ReleaseRemovedConns(r->device);
    // A connection that an application thread is still setting up on the device holds it
    // until that thread lets go (its handshake fails, bounded by its timeout).
    if (r->device->users() != 0) return false;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, r->device->comp_channel()->fd, nullptr);
    delete r->device;  // its idle slots, channel and protection domain
    r->device = nullptr;
  }
  RetireContext(r->context);
  r->retired = true;
  SLIP_LOG(kInfo, "verbs: released the removed RDMA device");
  return true;
}

void VerbsModule::ForkPrepare() noexcept {
  // Lock order: module, connection registry (as the progress thread takes them). (The
  // requests' table is never touched in the child: RequestKeeper::ForkChild.)
  mu_.lock();
  ConnRegistryLock();
  negative_.fork_mutex().ForkPrepare();  // (a leaf lock: taken last)
}

void VerbsModule::ForkParent() noexcept {
  negative_.fork_mutex().ForkParent();
  ConnRegistryUnlock();
  mu_.unlock();
}

void VerbsModule::ForkChild() noexcept {
  forked_.store(true, std::memory_order_release);
  OrphanAllConns();
  requests_.ForkChild();  // the parent's requests, not ours
  negative_.fork_mutex().ForkChild();
  ConnRegistryUnlock();
  mu_.unlock();
}

void VerbsModule::FlushAll(int timeout_ms) noexcept {
  if (!forked_.load()) FlushAllConns(timeout_ms);
}

bool VerbsModule::IsListenerId(rdma_cm_id* id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (Listener* l : listeners_) {
    if (l->id == id || (l->port_id && l->port_id == id)) return true;
  }
  return false;
}

}  // namespace slip::verbs
