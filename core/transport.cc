#include "core/transport.h"

#include "core/sys.h"

namespace slip {

Carrier::~Carrier() {
  if (anchor_slot >= 0) sys::close(anchor_slot);
}

Carrier::Carrier(Carrier&& o) noexcept
    : stream(std::move(o.stream)), anchor_slot(o.anchor_slot), confirmed(o.confirmed) {
  o.anchor_slot = -1;
}

Carrier& Carrier::operator=(Carrier&& o) noexcept {
  if (this != &o) {
    if (anchor_slot >= 0) sys::close(anchor_slot);
    stream = std::move(o.stream);
    anchor_slot = o.anchor_slot;
    confirmed = o.confirmed;
    o.anchor_slot = -1;
  }
  return *this;
}

void TransportRegistry::Add(Transport* t) noexcept {
  if (known_count_ == kMax) return;
  library_checks_[known_count_] = t->IsLibraryCaller();
  known_[known_count_++] = t;
}

void TransportRegistry::Choose(const TransportList& order) noexcept {
  chosen_count_ = 0;
  for (TransportKind kind : order) {
    for (size_t i = 0; i < known_count_; ++i) {
      if (known_[i]->kind() == kind && chosen_count_ < kMax) chosen_[chosen_count_++] = known_[i];
    }
  }
}

Transport* TransportRegistry::LibraryOf(const void* code) const noexcept {
  for (size_t i = 0; i < known_count_; ++i) {
    if (library_checks_[i] != nullptr && library_checks_[i](code)) return known_[i];
  }
  return nullptr;
}

size_t ChooseOffer(const TransportRegistry& transports, const ServerOfferPtr* offers) noexcept {
  const size_t n = transports.size();
  size_t chosen = n;
  for (size_t i = 0; i < n; ++i) {
    if (!offers[i]) continue;
    if (transports[i]->OffersVouchedByKernel()) return i;
    if (chosen == n) chosen = i;
  }
  return chosen;
}

namespace {

// 0: the transport was not allowed; 1: it cannot reach another host; 2: it tried.
int Relevance(Reason r) noexcept {
  if (r == Reason::kPolicy) return 0;
  if (r == Reason::kNotSameHost) return 1;
  return 2;
}

}  // namespace

Reason CloserReason(Reason first, Reason later) noexcept {
  return Relevance(later) > Relevance(first) ? later : first;
}

}  // namespace slip
