// Steps that the offers of transports which cross hosts share (verbs, fabric): a client's
// TCP socket bound to the source its transport's route uses, the proxy pair of a stream
// being made, the stream over a transport's channel, and the server's offer of a request
// that a module keeps pending under its 4-tuple.
#pragma once

#include <sys/socket.h>

#include <memory>

#include "core/channel.h"
#include "core/config.h"
#include "core/module_loader.h"
#include "core/stream.h"
#include "core/transport.h"
#include "core/wire.h"

namespace slip {

// Binds the TCP socket `fd` (of `family`) to `source` (port 0); *client is then its
// endpoint. An IPv6 socket reaching an IPv4 peer binds to the v4-mapped source.
bool BindToSource(int family, int fd, const sockaddr_storage& source,
                  wire::Endpoint* client) noexcept;
// A proxy pair above the hidden-descriptor floor; CloseProxies closes what is left (-1s).
bool MakeProxies(int* a, int* b) noexcept;
void CloseProxies(int* a, int* b) noexcept;
// The stream over `channel` and the proxy pair (which it owns from then on: *a and *b
// become -1). nullptr when none could be made (the pair stays the caller's).
std::unique_ptr<Stream> MakeStream(std::unique_ptr<Channel> channel, int* a, int* b,
                                   const Config& config) noexcept;

// A transport whose work is done by a module its face loads on first use (verbs, fabric):
// fork and exit go to the module if it is loaded, and never load it.
template <typename Module>
class ModuleTransport : public Transport {
 public:
  void ForkPrepare() noexcept override {
    if (Module* m = Loaded()) m->ForkPrepare();
  }
  void ForkParent() noexcept override {
    if (Module* m = Loaded()) m->ForkParent();
  }
  void ForkChild() noexcept override {
    if (Module* m = Loaded()) m->ForkChild();
  }
  void Flush(int timeout_ms) noexcept override {
    if (Module* m = Loaded()) m->FlushAll(timeout_ms);
  }
  Module* Loaded() const noexcept { return module_.Loaded(); }

 protected:
  LoadedOnce<Module> module_;
};

// What a client offered for one accepted connection, where a transport's module keeps
// requests pending under their 4-tuple (verbs' rdma_cm listener, fabric's UDP twin):
// Module::AcceptPending(listener, client, server, proxy_b, why, committed) gives the
// request's channel *held* until its client's CONFIRM settles it, so accept() never waits
// and nothing of ours is written to the connection.
template <typename Module, typename Listener>
class PendingServerOffer final : public ServerOffer {
 public:
  PendingServerOffer(Module* m, Listener* l, const wire::Endpoint& client,
                     const wire::Endpoint& server, const Config* config) noexcept
      : m_(m), l_(l), client_(client), server_(server), config_(config) {}
  bool Open(Carrier* out, Reason* why) noexcept override {
    int a = -1, b = -1;
    *why = Reason::kResources;
    if (!MakeProxies(&a, &b)) return false;
    auto channel = m_->AcceptPending(l_, client_, server_, b, why, &committed_);
    if (channel) out->stream = MakeStream(std::move(channel), &a, &b, *config_);
    CloseProxies(&a, &b);
    return out->stream != nullptr;
  }
  // A client that had the module's answer may be confirming now: plain would hand its
  // CONFIRM to the application as data.
  bool Abandon() noexcept override { return !committed_; }

  // The offer for `client` -> `server` if the module holds a request for it, built in
  // `room`; null when it holds none.
  static ServerOfferPtr TakeFrom(Module* m, Listener* l, const wire::Endpoint& client,
                                 const wire::Endpoint& server, const Config* config,
                                 ServerOfferRoom* room) noexcept {
    static_assert(sizeof(PendingServerOffer) <= sizeof(ServerOfferRoom) &&
                  alignof(PendingServerOffer) <= alignof(ServerOfferRoom));
    if (!m->HasPending(l, client, server)) return nullptr;
    return ServerOfferPtr(new (room->bytes) PendingServerOffer(m, l, client, server, config));
  }

 private:
  Module* m_;
  Listener* l_;
  wire::Endpoint client_, server_;
  const Config* config_;
  bool committed_ = false;
};

}  // namespace slip
