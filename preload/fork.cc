#include "preload/fork.h"

#include <pthread.h>

#include <cstring>
#include <vector>

#include "core/log.h"
#include "core/stats.h"
#include "preload/accel_list.h"
#include "preload/closer.h"
#include "preload/connector.h"
#include "preload/control.h"
#include "preload/exec.h"
#include "preload/fd_table.h"
#include "preload/handshake.h"
#include "preload/runtime.h"
#include "preload/transports.h"

namespace slip::preload {

namespace {

// What a stats slot said, copied out before the child's stats table is replaced.
struct InheritedSlot {
  SlipSocket* socket;
  uint8_t transport, reason, role;
  char local[sizeof(ConnSlot::local)];
  char remote[sizeof(ConnSlot::remote)];
  char provider[sizeof(ConnSlot::provider)];
};

// Connections are settled within the handshake timeout, or twice it for a server whose
// client committed to its CONFIRM (docs/DESIGN.md, "Settling a connection").
uint64_t SettleBoundMs() noexcept {
  return 2 * uint64_t(GetRuntime().config.handshake_timeout_ms) + 1000;
}

void MarkForked(SlipSocket* s, void* ctx) {
  if (s->kind == SockKind::kListener) s->forked.store(true, std::memory_order_relaxed);
  // Kept alive (it may be closing meanwhile) for ShareConnections.
  if (s->kind != SockKind::kAccel && s->kind != SockKind::kListener) return;
  if (!TryAcquire(s, s->generation.load())) return;
  try {
    static_cast<std::vector<SlipSocket*>*>(ctx)->push_back(s);
  } catch (...) {
    Release(s);  // (not the last reference: the table holds one)
  }
}

// Both processes may send or receive on these from now on: their cursors and side locks
// move where both see them (core/shared_sides.h); both may accept on these listeners, and
// what their twins share is made before the fork (shm: the queue through which siblings
// hand each other registrations). Outside the pool's lock, which the release of a last
// reference takes.
void ShareConnections(const std::vector<SlipSocket*>& sockets) {
  for (SlipSocket* s : sockets) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->kind == SockKind::kListener) {
        for (auto& twin : s->twins)
          if (twin) twin->BeforeFork();
      } else if (s->stream) {
        s->stream->ShareAcrossFork();
        s->stream->control()->HoldAcrossFork();
      }
    }
    Release(s);
  }
}

void Prepare() {
  // Listeners and connections are held by both processes from now on (in the parent too,
  // from here: a failed fork only costs it reading registrations in accept(), and its
  // connections a shared lock per call).
  {
    std::vector<SlipSocket*> connections;
    ForEachLiveSocket(MarkForked, &connections);
    ShareConnections(connections);
  }
  // First, holding nothing: connects in progress settle (the connector's thread, which
  // the child will not have, needs the locks below to finish them), and so do
  // connections installed before they settled (the control thread settles them).
  ConnectorForkPrepare();
  ControlWaitSettled(SettleBoundMs());
  // Lock order: pool, then accelerated list (the order Teardown uses), then transports.
  TableForkPrepare();
  AccelListForkPrepare();
  for (Transport* t : Transports()) t->ForkPrepare();
  CloserForkPrepare();
  ShortConns().fork_mutex().ForkPrepare();
}

void Parent() {
  ShortConns().fork_mutex().ForkParent();
  CloserForkParent();
  for (Transport* t : Transports()) t->ForkParent();
  AccelListForkParent();
  TableForkParent();
}

void CollectSlot(SlipSocket* s, void* ctx) {
  if (!s->stats) return;
  auto* out = static_cast<std::vector<InheritedSlot>*>(ctx);
  InheritedSlot slot{s, s->stats->transport, s->stats->reason, s->stats->role, {}, {}, {}};
  std::memcpy(slot.local, s->stats->local, sizeof(slot.local));
  std::memcpy(slot.remote, s->stats->remote, sizeof(slot.remote));
  std::memcpy(slot.provider, s->stats->provider, sizeof(slot.provider));
  slot.local[sizeof(slot.local) - 1] = slot.remote[sizeof(slot.remote) - 1] = '\0';
  slot.provider[sizeof(slot.provider) - 1] = '\0';
  try {
    out->push_back(slot);
  } catch (...) {
  }
}

// A connection the parent had not settled when it forked (past the bound): the parent
// settles it; the child's copy fails (ECONNRESET), as a verbs connection's does.
void ResetUnsettled(SlipSocket* s, void*) {
  if (s->kind != SockKind::kAccel || !s->stream) return;
  if (s->stream->control()->SettleDeadline() == 0) return;
  SLIP_LOG(kWarn, "a connection was still settling at fork; the child's copy fails");
  s->stream->MarkPeerGone(true);
}

void RewatchAnchor(SlipSocket* s, void*) {
  if (s->kind != SockKind::kAccel || s->anchor_fd < 0) return;
  ControlWatch(s);
  if (s->stream) s->stream->control()->HoldAcrossFork();  // one more holder
}

void Child() {
  ExecNoteProcess();
  // What only the parent may use (verbs: its queue pairs) is not ours: inherited
  // connections on it fail (ECONNRESET).
  ShortConns().fork_mutex().ForkChild();
  CloserForkChild();
  for (Transport* t : Transports()) t->ForkChild();
  AccelListForkChild();
  TableForkChild();
  ControlResetAfterFork();
  std::vector<InheritedSlot> inherited;
  ForEachLiveSocket(CollectSlot, &inherited);
  StatsReinitAfterFork();
  for (const InheritedSlot& slot : inherited) {
    slot.socket->stats =
        StatsOpenText(static_cast<TransportKind>(slot.transport), static_cast<Reason>(slot.reason),
                      slot.role, slot.local, slot.remote, slot.provider);
  }
  ForEachLiveSocket(ResetUnsettled, nullptr);
  // A peer dying must wake the child's sleepers too: the child needs its own watcher.
  ForEachLiveSocket(RewatchAnchor, nullptr);
}

}  // namespace

void InstallForkHandlers() noexcept {
  ExecNoteProcess();
  pthread_atfork(Prepare, Parent, Child);
}

}  // namespace slip::preload
