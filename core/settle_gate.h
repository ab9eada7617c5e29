// SettleGate: what keeps a late CONFIRM from the application, for every transport whose
// server connections settle (docs/DESIGN.md "Settling a connection").
//
// A server connection that goes on as plain TCP before it saw any byte of its client (its
// request's transport failed, or the client said nothing by the deadline) may yet receive
// the CONFIRM of a real client that was late: delivered as data it would corrupt the
// stream. So the gate is raised then, and the anchor's first bytes are looked at before any
// is delivered: a CONFIRM resets the connection (once, with SO_LINGER {1, 0} on the anchor,
// so that the late client sees a reset and not an orderly end); anything else opens the
// gate for good.
//
// Thread safety: Pass may run on any thread; Raise and Trip come from settling, under the
// channel's failover lock.
#pragma once

#include <atomic>

namespace slip {

class SettleGate {
 public:
  void Raise() noexcept { up_.store(true, std::memory_order_release); }
  // Settling found a CONFIRM that resets the connection itself.
  void Trip() noexcept { tripped_.store(true, std::memory_order_relaxed); }
  void Lower() noexcept {
    up_.store(false, std::memory_order_relaxed);
    tripped_.store(false, std::memory_order_relaxed);
  }
  // Whether the anchor's next bytes may go to the application. *reset is set (once) when a
  // CONFIRM arrived: the caller fails the connection with ECONNRESET. `transport` names it
  // in the log line.
  bool Pass(int anchor, const char* transport, bool* reset) const noexcept;

 private:
  mutable std::atomic<bool> up_{false};
  mutable std::atomic<bool> tripped_{false};
};

}  // namespace slip
