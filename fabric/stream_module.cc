// The stream module: its entry point, the connections' common set-up, fork and exit.
#include <cstdio>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "fabric/stream_internal.h"

namespace slip::fabric {

StreamConn* StreamModuleImpl::NewConn(uint32_t ring_size, Reason* why) noexcept {
  *why = Reason::kResources;
  if (!MakesNew() || !fabric_->StartProgress()) return nullptr;
  return StreamConn::Create(fabric_.get(), ring_size, why);
}

bool StreamModuleImpl::Connect(StreamConn* conn, const streamwire::Message& m) noexcept {
  PeerRing peer;
  peer.key = m.ring_key;
  peer.base = m.ring_addr;
  peer.note_tag = m.note_tag;
  if (fabric_->connected()) {
    conn->SetPeer(peer, nullptr);  // (its own endpoint, once connected)
    return true;
  }
  peer.addr = fabric_->AddPeer(m.address, m.address_len);
  if (peer.addr == FI_ADDR_NOTAVAIL) {
    SLIP_LOG(kInfo, "fabric: the provider rejects the peer's endpoint address");
    return false;
  }
  conn->SetPeer(peer, fabric_->ep());
  return true;
}

void StreamModuleImpl::ForkPrepare() noexcept {}
void StreamModuleImpl::ForkParent() noexcept {}

void StreamModuleImpl::ForkChild() noexcept {
  // The endpoint, its thread and every registration are the parent's: the child's copies
  // of its connections fail (ECONNRESET), and it makes no new ones.
  forked_.store(true);
  requests_.ForkChild();
  fabric_->ForEachConn([](StreamConn* c) { c->Orphan(); });
  fabric_->Abandon();
}

void StreamModuleImpl::BeforeExec() noexcept {
  // The next image is another program, and nothing of ours runs at its exit to unlink
  // shm's region file (each exec left one in /dev/shm): it goes now. Every connection that
  // exec keeps was handed back to TCP, and a new one could not be reached by a new peer:
  // where exec fails, this image makes no new ones (plain TCP).
  // A fork child's endpoint is its parent's: the file is the parent's to remove (a child
  // that execs, as subprocesses do, must not take the parent's new peers from it).
  if (forked_.load() || exec_retired_.exchange(true)) return;
  fabric_->Unpublish();
}

void StreamModuleImpl::FlushAll(int timeout_ms) noexcept {
  if (forked_.load()) return;
  fabric_->ForEachConn([timeout_ms](StreamConn* c) { c->Flush(timeout_ms); });
  // (At exit: the endpoint stays open for threads still running, but is no longer found.)
  fabric_->Unpublish();
}

}  // namespace slip::fabric

extern "C" __attribute__((visibility("default"))) slip::fabric::StreamModule*
slip_fabric_stream_module(const slip::Config* config, const slip::fabric::Options* options,
                          int hidden_fd_floor, slip::OwnFdTable* own_fds, char* error,
                          size_t error_len) {
  using slip::fabric::StreamFabric;
  // The module's log lines go where the face's do, and its copy of core's descriptors
  // (the kernel's socket table, core/sock_diag.h) where the face's own go.
  slip::LogInit(config->log_level, config->log_file.c_str());
  slip::sys::SetHiddenFdFloor(hidden_fd_floor);
  slip::UseOwnFds(own_fds);
  std::string why;
  std::unique_ptr<StreamFabric> fabric;
  try {
    fabric = StreamFabric::Open(*options, hidden_fd_floor, &why);
  } catch (...) {
    why = "out of memory";
  }
  if (!fabric) {
    snprintf(error, error_len, "%s", why.c_str());
    return nullptr;
  }
  auto* m = new (std::nothrow)
      slip::fabric::StreamModuleImpl(config, options, hidden_fd_floor, std::move(fabric));
  if (!m) snprintf(error, error_len, "out of memory");
  return m;
}
