// Stream: the application's buffer sizes (docs/DESIGN.md, "Buffer sizes").
//
// Over TCP, what a sender can write ahead of its peer's reads is bounded by its send buffer
// and the peer's receive buffer; a program that sets both small (flow control of its own,
// or a test that the peer's close with bytes unread resets the writer) relies on it. The
// ring alone bounds an accelerated stream, so when the application set both (SO_SNDBUF
// here, SO_RCVBUF at the peer, told in its WINDOW), their sum bounds it too. When either is
// the kernel's own (autotuned, up to megabytes), the ring does.
#include <algorithm>

#include "core/proxy.h"
#include "core/stream.h"

namespace slip {

void Stream::SetSendBuffer(uint32_t bytes) noexcept {
  send_buffer_.store(bytes);
  UpdateTxLimit();
}

void Stream::OnPeerWindow(uint32_t bytes) noexcept {
  peer_window_.store(bytes);
  UpdateTxLimit();
}

void Stream::UpdateTxLimit() noexcept {
  // The application's thread (setsockopt) and the control thread (WINDOW) may update at
  // once: each stores its input first, then computes and stores the bound until the inputs
  // it used are still the current ones, so the last bound stored is the current inputs'.
  const uint64_t ring = channel_->ring_size();
  bool grew = false;
  for (;;) {
    const uint64_t send = send_buffer_.load();
    const uint64_t window = peer_window_.load();
    const uint64_t limit = send != 0 && window != 0 ? std::min(ring, send + window) : ring;
    grew = tx_limit_.exchange(limit) < limit || grew;
    if (send_buffer_.load() == send && peer_window_.load() == window) break;
  }
  // A writer asleep on the old bound looks again (A writable: it re-checks the space).
  if (grew) proxy::Unfill(proxy_b_);
}

}  // namespace slip
