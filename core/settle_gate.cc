#include "core/settle_gate.h"

#include <sys/socket.h>

#include "core/anchor_path.h"
#include "core/log.h"
#include "core/sys.h"

namespace slip {

bool SettleGate::Pass(int anchor, const char* transport, bool* reset) const noexcept {
  *reset = false;
  if (!up_.load(std::memory_order_acquire)) return true;
  if (tripped_.load(std::memory_order_acquire)) return false;  // (being reset)
  const AnchorPeek peek = PeekAnchor(anchor);
  // Nothing yet, or our magic so far: nothing to deliver until the rest says what it is.
  if (peek.kind == AnchorPeek::Kind::kNone || peek.kind == AnchorPeek::Kind::kPartial) return false;
  if (peek.Is(wire::Type::kConfirm)) {
    if (!tripped_.exchange(true)) {
      SLIP_LOG(kWarn,
               "%s: a CONFIRM arrived after the connection went on as plain TCP (its client "
               "was too late); resetting the connection rather than passing it on as data",
               transport);
      // The application gets ECONNRESET now, and its close resets the TCP connection (no
      // FIN first: the client must not take it for an orderly end).
      linger lg{1, 0};
      sys::setsockopt(anchor, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
      *reset = true;
    }
    return false;
  }
  up_.store(false, std::memory_order_release);  // the application's bytes (or EOF)
  return true;
}

}  // namespace slip
