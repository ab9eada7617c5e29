// The control side of an accelerated connection: what the face's control thread, exec,
// fork and an abortive close do with it besides moving bytes (core/channel.h is the data
// path). Settling a connection installed before its ends agreed, failing over to the TCP
// anchor mid-stream, handing the stream back to TCP at exec, and sharing it across fork.
// A transport's channel usually implements both interfaces and returns itself from
// Channel::control(); one that needs none of this keeps the defaults here.
//
// Thread safety: called from the control thread (failover, settling, the anchor's
// readiness), from the thread that execs or forks, and from close(); never on the data
// path, and never concurrently with the channel's destruction.
#pragma once

#include <cstdint>

#include "core/stats.h"
#include "core/wire.h"

namespace slip {

class AnchorFailover;

class ChannelControl {
 public:
  ChannelControl() = default;
  virtual ~ChannelControl() = default;
  ChannelControl(const ChannelControl&) = delete;
  ChannelControl& operator=(const ChannelControl&) = delete;

  // The application closes abortively (SO_LINGER {1, 0}): the channel, when destroyed,
  // must not tell the peer an orderly end; the peer sees the reset.
  virtual void Abort() noexcept {}

  // The face could not install a stream it was handed (connect): may the connection go on
  // as plain TCP, as it stands? True when the peer cannot be carrying it on the transport
  // (the channel then leaves the connection alone when destroyed); false when it may be
  // (an shm server claims the region when it accepts, before the client installed
  // anything): the connection must then be reset.
  virtual bool WithdrawUninstalled() noexcept { return true; }

  // --- failover (docs/DESIGN.md, "Failover") ---
  // A transport that can fail mid-stream continues on the connection's TCP anchor: both
  // ends send FAILOVER (bytes received) there, then carry the stream on TCP from those
  // offsets. Channels that never fail that way keep these defaults.
  // The anchor (non-blocking), once the stream is installed; the channel does not own it.
  virtual void SetAnchor(int fd) noexcept { (void)fd; }
  // The channel's continue-on-anchor (core/failover.h), for what the stream itself says on
  // the anchor (urgent data); null for a channel without one.
  virtual AnchorFailover* failover() noexcept { return nullptr; }
  // Control thread: the peer's FAILOVER arrived (how much of our stream it received, how
  // much of its own it had sent). Answers with our own FAILOVER if we had not sent one.
  // Returns false when the stream cannot continue (the caller then treats the peer as gone
  // with a reset).
  virtual bool OnPeerFailover(const wire::Failover& peer) noexcept {
    (void)peer;
    return false;
  }
  // Control thread, client: the server declined the connection after our CONFIRM (its
  // accepting process had nothing registered for it: the registration went to another
  // process sharing the listener, or expired). It consumed the CONFIRM and takes the
  // connection as plain TCP, so the stream starts again on the anchor from byte 0 both
  // ways: nothing of ours was read, nothing was written to us. False when that cannot be
  // shown (bytes arrived over the transport, or credit came back): the caller resets.
  virtual bool OnPeerDecline() noexcept { return false; }
  // True once the anchor carries the stream's bytes (no more messages): its readiness
  // (EPOLLIN/EPOLLOUT/...) then goes to OnAnchorReady, from the control thread.
  virtual bool AnchorCarriesStream() const noexcept { return false; }
  virtual void OnAnchorReady(uint32_t events) noexcept { (void)events; }
  // The anchor ended (the peer closed its TCP connection, or died) while the transport
  // still carries the stream: the stream is about to take the peer for gone. A transport
  // whose last notes travel apart from the anchor (fabric: the FIN may overtake them)
  // takes in, within a bounded wait, what the peer said before it closed, so that an
  // orderly close is not mistaken for a crash with our bytes unread.
  virtual void BeforePeerGone() noexcept {}

  // --- hand-back (exec) ---
  // The process is about to exec with this connection's descriptor: the new image knows
  // nothing of rings, so the stream goes back to the anchor for good. `consumed` is what
  // the application read. Sends FAILOVER (cause kHandBack, received = `consumed`), takes
  // the peer's answer and writes onto the anchor what the peer did not receive, all within
  // `timeout_ms`. True when the anchor now carries the stream exactly: in from byte
  // `consumed`, out after the last byte published (EOF following it if the sending side
  // was closed). False leaves the connection unusable. The caller stopped the control
  // thread's watch on the anchor first.
  virtual bool HandBack(uint64_t consumed, int timeout_ms) noexcept {
    (void)consumed;
    (void)timeout_ms;
    return false;
  }
  // True while another process also holds this end of the connection (fork): a hand-back
  // would take the stream from under it.
  virtual bool SharedWithOtherProcess() const noexcept { return true; }
  // This process holds this end across a fork: called in the parent just before it and in
  // the child just after, so that each can tell whether the other still holds it.
  virtual void HoldAcrossFork() noexcept {}

  // --- settling (docs/DESIGN.md, "Settling a connection") ---
  // A connection may be installed before its two ends agreed that it uses the transport:
  // a client whose listener has not answered its registration yet, a server whose client's
  // CONFIRM has not arrived when the application accepts. Neither may wait for the other
  // inside connect() or accept(). Until settled, the channel keeps the stream safe on its
  // own terms (a server's shows no bytes and no space), and the control thread calls Settle
  // whenever the anchor or SettleFd() has news, and at SettleDeadline().
  enum class Settlement : uint8_t {
    kSettled,  // the transport carries the stream
    kPending,  // not yet: call again on news or at the deadline
    kPlain,    // the stream continues on the TCP anchor from here (as after a failover;
               // its readiness goes to OnAnchorReady), for the reason in *why
    kReset,    // neither is safe: the connection must be reset
  };
  // CLOCK_MONOTONIC milliseconds by which the connection must be settled; 0 once settled.
  virtual uint64_t SettleDeadline() const noexcept { return 0; }
  // A descriptor besides the anchor whose readiness to read may settle it, or -1.
  virtual int SettleFd() const noexcept { return -1; }
  // Tries to settle without blocking. At or past the deadline it decides.
  virtual Settlement Settle(uint64_t now_ms, Reason* why) noexcept {
    (void)now_ms;
    (void)why;
    return Settlement::kSettled;
  }
};

}  // namespace slip
