// The server side of the connection engine: what accept() does with a connection its
// kernel listener handed over, the same for every transport (core/transport.h).
//
//   Take     every twin of the listener is asked what its client offered for this
//            4-tuple (nothing: plain, untouched)
//   Choose   one offer carries the connection (ChooseOffer: the one the kernel vouched
//            for, else the first in the user's order); the others are forged or stale:
//            abandoned, and dropped from their twins
//   Open     the chosen offer's stream, held until the client's first bytes settle it
//   (install: the face's)   a failure there, or at Open, abandons the offer: plain TCP,
//            unless the client had committed to its CONFIRM, which must not reach the
//            application as data: then the connection is dropped
//
// Nothing here allocates or waits: the offers live in room on the accepting thread's
// stack (inside this object), and settling happens later (ChannelControl::Settle).
#pragma once

#include <cstdint>

#include "core/transport.h"

namespace slip {

class ServerSetup {
 public:
  enum class Stage : uint8_t {
    kNothing,  // no twin was offered the connection: plain
    kOpened,   // carrier() holds the held stream: the face installs it, or calls Fail
    kPlain,    // plain TCP is safe, for reason()
    kDrop,     // the client committed but nothing can carry it: refuse the connection
  };

  ServerSetup() noexcept = default;
  ServerSetup(const ServerSetup&) = delete;
  ServerSetup& operator=(const ServerSetup&) = delete;

  // Take, choose and open, for the connection `client` -> `server` accepted on a
  // listener whose twins are `twins` (twins[i] is transports[i]'s, or null).
  Stage Run(const TransportRegistry& transports, ListenerTwin* const* twins,
            const wire::Endpoint& client, const wire::Endpoint& server) noexcept;
  // The face could not install the opened stream (why): plain or drop.
  Stage Fail(Reason why) noexcept;

  Stage stage() const noexcept { return stage_; }
  Reason reason() const noexcept { return reason_; }
  TransportKind transport() const noexcept { return kind_; }
  Carrier* carrier() noexcept { return &carrier_; }

  // For a connection the face cannot even track (no memory): everything offered for it is
  // abandoned and dropped. False when a client had committed (refuse the connection).
  static bool AbandonAll(const TransportRegistry& transports, ListenerTwin* const* twins,
                         const wire::Endpoint& client, const wire::Endpoint& server) noexcept;

 private:
  ServerOfferRoom rooms_[TransportRegistry::kMax];
  ServerOfferPtr offers_[TransportRegistry::kMax];
  ServerOffer* chosen_ = nullptr;
  Carrier carrier_;  // (after offers_: destroyed first, while the offer's memory is mapped)
  Stage stage_ = Stage::kNothing;
  Reason reason_ = Reason::kNone;
  TransportKind kind_ = TransportKind::kTcp;
};

}  // namespace slip
