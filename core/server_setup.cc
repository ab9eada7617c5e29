#include "core/server_setup.h"

namespace slip {

ServerSetup::Stage ServerSetup::Run(const TransportRegistry& transports, ListenerTwin* const* twins,
                                    const wire::Endpoint& client,
                                    const wire::Endpoint& server) noexcept {
  const size_t n = transports.size();
  for (size_t i = 0; i < n; ++i) {
    if (twins[i]) offers_[i] = twins[i]->Take(client, server, &rooms_[i]);
  }
  const size_t chosen = ChooseOffer(transports, offers_);
  if (chosen == n) return stage_ = Stage::kNothing;
  for (size_t i = 0; i < n; ++i) {
    if (i == chosen || !offers_[i]) continue;
    offers_[i]->Abandon();
    offers_[i].reset();
    twins[i]->Drop(client, server);
  }
  chosen_ = offers_[chosen].get();
  kind_ = transports[chosen]->kind();
  Reason why = Reason::kResources;
  if (chosen_->Open(&carrier_, &why)) return stage_ = Stage::kOpened;
  return Fail(why);
}

ServerSetup::Stage ServerSetup::Fail(Reason why) noexcept {
  reason_ = why;
  // The stream, if any, is still alive here: the offer may read its memory.
  stage_ = chosen_ && !chosen_->Abandon() ? Stage::kDrop : Stage::kPlain;
  return stage_;
}

bool ServerSetup::AbandonAll(const TransportRegistry& transports, ListenerTwin* const* twins,
                             const wire::Endpoint& client, const wire::Endpoint& server) noexcept {
  bool safe = true;
  for (size_t i = 0; i < transports.size(); ++i) {
    if (!twins[i]) continue;
    ServerOfferRoom room;
    if (ServerOfferPtr offer = twins[i]->Take(client, server, &room))
      safe = offer->Abandon() && safe;
    twins[i]->Drop(client, server);
  }
  return safe;
}

}  // namespace slip
