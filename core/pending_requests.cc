#include "core/pending_requests.h"

#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "core/local_address.h"
#include "core/sock_diag.h"

namespace slip {

namespace {

// An endpoint's bytes for hashing, field by field (the struct has padding).
size_t PutEndpoint(const wire::Endpoint& e, uint8_t* out) noexcept {
  out[0] = e.family;
  std::memcpy(out + 1, &e.port, 2);
  std::memcpy(out + 3, e.addr, 16);
  return 19;
}

template <typename T>
std::unique_ptr<T[]> Table(size_t n) noexcept {
  return std::unique_ptr<T[]>(new (std::nothrow) T[n]);
}

}  // namespace

bool PendingRequests::Init(size_t budget_bytes, size_t max_kept) noexcept {
  uint64_t key[2];
  if (getrandom(key, sizeof(key), 0) != ssize_t(sizeof(key))) return false;
  hash_.SetKey(key[0], key[1]);
  budget_ = budget_bytes;
  max_kept_ = max_kept < kMaxRequests ? max_kept : kMaxRequests;
  requests_ = Table<Request>(kMaxRequests);
  request_heads_ = Table<uint32_t>(kMaxRequests);
  holders_ = Table<Holder>(kMaxRequests);
  holder_heads_ = Table<uint32_t>(kMaxRequests);
  dropped_ = Table<Dropped>(kMaxDropped);
  dropped_heads_ = Table<uint32_t>(kMaxDropped);
  refusals_ = Table<Refusal>(kRefusals);
  refusal_heads_ = Table<uint32_t>(kRefusals);
  if (!requests_ || !request_heads_ || !holders_ || !holder_heads_ || !dropped_ ||
      !dropped_heads_ || !refusals_ || !refusal_heads_)
    return false;
  for (size_t i = 0; i < kMaxRequests; ++i) {
    request_heads_[i] = holder_heads_[i] = kNil;
    requests_[i].chain = i + 1 < kMaxRequests ? uint32_t(i + 1) : kNil;
  }
  free_request_ = 0;
  for (size_t i = 0; i < kMaxDropped; ++i) dropped_heads_[i] = kNil;
  for (size_t i = 0; i < kRefusals; ++i) refusal_heads_[i] = kNil;
  return true;
}

size_t PendingRequests::charged() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return charged_;
}

uint64_t PendingRequests::HashOf(const Tuple& t) const noexcept {
  uint8_t bytes[38];
  const size_t n = PutEndpoint(t.client, bytes);
  return hash_(bytes, n + PutEndpoint(t.server, bytes + n));
}

uint64_t PendingRequests::HashOf(const Principal& p) const noexcept {
  uint8_t bytes[24];
  bytes[0] = uint8_t(p.kind);
  std::memcpy(bytes + 1, &p.uid, 4);
  return hash_(bytes, 5 + PutEndpoint(p.address, bytes + 5));
}

void PendingRequests::PushBack(List* l, uint32_t i, uint32_t Request::*prev,
                               uint32_t Request::*next) noexcept {
  requests_[i].*prev = l->tail;
  requests_[i].*next = kNil;
  if (l->tail != kNil)
    requests_[l->tail].*next = i;
  else
    l->head = i;
  l->tail = i;
}

void PendingRequests::Unlink(List* l, uint32_t i, uint32_t Request::*prev,
                             uint32_t Request::*next) noexcept {
  Request& r = requests_[i];
  if (r.*prev != kNil)
    requests_[r.*prev].*next = r.*next;
  else
    l->head = r.*next;
  if (r.*next != kNil)
    requests_[r.*next].*prev = r.*prev;
  else
    l->tail = r.*prev;
  r.*prev = r.*next = kNil;
}

uint32_t PendingRequests::FindLocked(const Tuple& t, uint64_t hash) const noexcept {
  for (uint32_t i = request_heads_[hash & (kMaxRequests - 1)]; i != kNil; i = requests_[i].chain)
    if (requests_[i].hash == hash && requests_[i].tuple == t) return i;
  return kNil;
}

PendingRequests::Found PendingRequests::Find(const Tuple& t, uint64_t nonce, Answer* out) noexcept {
  const uint64_t hash = HashOf(t);
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t i = FindLocked(t, hash);
  if (i == kNil) return Found::kNone;
  const Request& r = requests_[i];
  if (r.nonce != nonce) return Found::kOther;
  *out = r.answer;
  return Found::kSame;
}

uint32_t PendingRequests::HolderLocked(const Principal& who, bool add) noexcept {
  const uint64_t hash = HashOf(who);
  uint32_t& head = holder_heads_[hash & (kMaxRequests - 1)];
  for (uint32_t h = head; h != kNil; h = holders_[h].chain)
    if (holders_[h].hash == hash && holders_[h].who == who) return h;
  if (!add) return kNil;
  // (A holder has a request, so one is free while a request is: found in a scan that a
  // new sender pays once.)
  for (uint32_t h = 0; h < kMaxRequests; ++h) {
    if (holders_[h].count != 0) continue;
    holders_[h] = Holder{};
    holders_[h].who = who;
    holders_[h].hash = hash;
    holders_[h].chain = head;
    head = h;
    return h;
  }
  return kNil;
}

uint32_t PendingRequests::VictimLocked() const noexcept {
  uint32_t best = kNil;
  for (uint32_t h = 0; h < kMaxRequests; ++h) {
    const Holder& x = holders_[h];
    if (x.count == 0 || x.unproven.head == kNil) continue;
    if (best == kNil || x.count > holders_[best].count ||
        (x.count == holders_[best].count && requests_[x.unproven.head].created_ms <
                                                requests_[holders_[best].unproven.head].created_ms))
      best = h;
  }
  return best == kNil ? kNil : holders_[best].unproven.head;
}

PendingRequests::Admitted PendingRequests::Reserve(RequestOwner* l, const Principal& who,
                                                   size_t charge, uint64_t now_ms,
                                                   Room* room) noexcept {
  *room = Room{};
  std::lock_guard<std::mutex> lock(mu_);
  ExpireDroppedLocked(now_ms);
  if (l->kept >= kMaxPerListener) return Admitted::kListenerFull;
  const uint32_t known = HolderLocked(who, /*add=*/false);
  if (known != kNil && holders_[known].count >= kMaxPerPrincipal) return Admitted::kPrincipalFull;
  // A record for every unproven request, should each be dropped (this one's too): when
  // there is none to spare, nothing is kept until records expire.
  if (dropped_free() <= unproven_) return Admitted::kFull;
  // A slot and the budget: the holder with the most makes room, its oldest first; unless
  // that is the newcomer's own (its older request for a newer one is churn for nothing,
  // and may be one about to be accepted): then the newcomer is refused.
  auto fits = [&] { return requests_used_ < max_kept_ && charged_ + charge <= budget_; };
  while (!fits() && room->evicted_count < kMaxEvicted) {
    const uint32_t victim = VictimLocked();
    if (victim == kNil || (known != kNil && requests_[victim].principal == known)) break;
    room->evicted[room->evicted_count++] = DropLocked(victim, now_ms);
  }
  if (!fits()) return Admitted::kFull;
  room->principal = HolderLocked(who, /*add=*/true);
  if (room->principal == kNil) return Admitted::kFull;  // (cannot be: a request is free)
  ++holders_[room->principal].count;
  charged_ += charge;
  ++requests_used_;
  ++unproven_;
  ++l->kept;
  room->owner = l;
  room->charge = charge;
  room->reserved = true;
  return Admitted::kYes;
}

void PendingRequests::Release(Room* room) noexcept {
  if (!room->reserved) return;
  std::lock_guard<std::mutex> lock(mu_);
  Holder& h = holders_[room->principal];
  if (--h.count == 0) {
    uint32_t* link = &holder_heads_[h.hash & (kMaxRequests - 1)];
    while (*link != room->principal) link = &holders_[*link].chain;
    *link = h.chain;
  }
  charged_ -= room->charge;
  --requests_used_;
  --unproven_;
  --room->owner->kept;
  room->reserved = false;
}

void PendingRequests::Keep(Room* room, const Tuple& t, uint64_t nonce, RemoteRing* conn,
                           const Answer& answer, uint64_t now_ms) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t i = free_request_;  // (reserved: one is free)
  Request& r = requests_[i];
  free_request_ = r.chain;
  const uint32_t generation = r.generation;
  r = Request{};
  r.tuple = t;
  r.hash = HashOf(t);
  r.nonce = nonce;
  r.conn = conn;
  r.owner = room->owner;
  r.answer = answer;
  r.created_ms = now_ms;
  r.charge = room->charge;
  r.principal = room->principal;
  r.generation = generation;
  while ((uint32_t(1) << r.ring_log2) < answer.ring_size) ++r.ring_log2;
  r.state = State::kUnchecked;
  uint32_t& head = request_heads_[r.hash & (kMaxRequests - 1)];
  r.chain = head;
  head = i;
  PushBack(&unchecked_, i, &Request::prev, &Request::next);
  PushBack(&holders_[r.principal].unproven, i, &Request::mprev, &Request::mnext);
  room->reserved = false;
}

RemoteRing* PendingRequests::RemoveLocked(uint32_t i) noexcept {
  Request& r = requests_[i];
  uint32_t* link = &request_heads_[r.hash & (kMaxRequests - 1)];
  while (*link != i) link = &requests_[*link].chain;
  *link = r.chain;
  Holder& h = holders_[r.principal];
  if (r.state == State::kProven) {
    Unlink(&proven_, i, &Request::prev, &Request::next);
  } else {
    Unlink(&unchecked_, i, &Request::prev, &Request::next);
    Unlink(&h.unproven, i, &Request::mprev, &Request::mnext);
    --unproven_;
  }
  if (--h.count == 0) {
    uint32_t* hl = &holder_heads_[h.hash & (kMaxRequests - 1)];
    while (*hl != r.principal) hl = &holders_[*hl].chain;
    *hl = h.chain;
  }
  charged_ -= r.charge;
  --r.owner->kept;
  --requests_used_;
  RemoteRing* conn = r.conn;
  r.conn = nullptr;
  r.state = State::kFree;
  ++r.generation;
  r.chain = free_request_;
  free_request_ = i;
  return conn;
}

RemoteRing* PendingRequests::DropLocked(uint32_t i, uint64_t now_ms) noexcept {
  ExpireDroppedLocked(now_ms);
  const Request& r = requests_[i];
  if (dropped_used_ < kMaxDropped) {  // (reserved for every unproven request: Reserve)
    const size_t d = (dropped_head_ + dropped_used_++) % kMaxDropped;
    Dropped& x = dropped_[d];
    x.hash = r.hash;
    x.nonce = r.nonce;
    x.until_ms = r.created_ms + kPendingMs;
    x.ring_log2 = r.ring_log2;
    x.live = true;
    uint32_t& head = dropped_heads_[r.hash & (kMaxDropped - 1)];
    x.chain = head;
    head = uint32_t(d);
  }
  return RemoveLocked(i);
}

void PendingRequests::UnchainDroppedLocked(uint32_t d) noexcept {
  Dropped& x = dropped_[d];
  uint32_t* link = &dropped_heads_[x.hash & (kMaxDropped - 1)];
  while (*link != kNil && *link != d) link = &dropped_[*link].chain;
  if (*link == d) *link = x.chain;
  x.live = false;
}

void PendingRequests::ExpireDroppedLocked(uint64_t now_ms) noexcept {
  while (dropped_used_ > 0) {
    Dropped& x = dropped_[dropped_head_];
    if (x.live && x.until_ms > now_ms) return;
    if (x.live) UnchainDroppedLocked(uint32_t(dropped_head_));
    dropped_head_ = (dropped_head_ + 1) % kMaxDropped;
    --dropped_used_;
  }
}

uint32_t PendingRequests::FindDroppedLocked(uint64_t hash, uint64_t now_ms) const noexcept {
  for (uint32_t d = dropped_heads_[hash & (kMaxDropped - 1)]; d != kNil; d = dropped_[d].chain)
    if (dropped_[d].live && dropped_[d].hash == hash && now_ms < dropped_[d].until_ms) return d;
  return kNil;
}

size_t PendingRequests::TakeDue(uint64_t now_ms, Check* out, size_t max) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (uint32_t i = unchecked_.head; i != kNil && n < max; i = requests_[i].next) {
    Request& r = requests_[i];
    if (r.created_ms + kGraceMs > now_ms) break;
    if (r.state != State::kUnchecked) continue;
    r.state = State::kChecking;
    out[n++] = Check{i, r.generation, r.tuple, false};
  }
  return n;
}

void PendingRequests::Settle(const Check* checks, size_t n, uint64_t now_ms, RemoteRing** out,
                             size_t max, size_t* count) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  *count = 0;
  for (size_t k = 0; k < n; ++k) {
    const uint32_t i = checks[k].slot;
    Request& r = requests_[i];
    if (r.generation != checks[k].generation || r.state != State::kChecking) continue;
    if (!checks[k].connected) {
      if (*count < max) {
        out[(*count)++] = DropLocked(i, now_ms);
      } else {
        r.state = State::kUnchecked;  // (no room to hand it back: the next round)
      }
      continue;
    }
    Unlink(&unchecked_, i, &Request::prev, &Request::next);
    Unlink(&holders_[r.principal].unproven, i, &Request::mprev, &Request::mnext);
    --unproven_;
    r.state = State::kProven;
    PushBack(&proven_, i, &Request::prev, &Request::next);
  }
  while (*count < max && proven_.head != kNil &&
         requests_[proven_.head].created_ms + kPendingMs <= now_ms)
    out[(*count)++] = RemoveLocked(proven_.head);
  // (Unchecked ones past their time are ones the checks have not reached yet: next round.)
  ExpireDroppedLocked(now_ms);
}

uint64_t PendingRequests::next_due_ms() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t due = 0;
  auto sooner = [&due](uint64_t t) {
    if (due == 0 || t < due) due = t;
  };
  if (unchecked_.head != kNil) sooner(requests_[unchecked_.head].created_ms + kGraceMs);
  if (proven_.head != kNil) sooner(requests_[proven_.head].created_ms + kPendingMs);
  return due;
}

bool PendingRequests::Has(const Tuple& t, uint64_t now_ms) noexcept {
  const uint64_t hash = HashOf(t);
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(t, hash) != kNil || FindDroppedLocked(hash, now_ms) != kNil;
}

bool PendingRequests::Take(const Tuple& t, uint64_t now_ms, Taken* out) noexcept {
  const uint64_t hash = HashOf(t);
  *out = Taken{};
  std::lock_guard<std::mutex> lock(mu_);
  if (const uint32_t i = FindLocked(t, hash); i != kNil) {
    out->nonce = requests_[i].nonce;
    out->ring_log2 = requests_[i].ring_log2;
    out->conn = RemoveLocked(i);
    return true;
  }
  const uint32_t d = FindDroppedLocked(hash, now_ms);
  if (d == kNil) return false;
  out->dropped = true;
  out->nonce = dropped_[d].nonce;
  out->ring_log2 = dropped_[d].ring_log2;
  UnchainDroppedLocked(d);  // (its slot in the ring goes when the ring's head passes it)
  return true;
}

RemoteRing* PendingRequests::Forget(const Tuple& t, uint64_t now_ms) noexcept {
  const uint64_t hash = HashOf(t);
  std::lock_guard<std::mutex> lock(mu_);
  if (const uint32_t d = FindDroppedLocked(hash, now_ms); d != kNil) UnchainDroppedLocked(d);
  const uint32_t i = FindLocked(t, hash);
  return i == kNil ? nullptr : RemoveLocked(i);
}

RemoteRing* PendingRequests::ForgetOneOf(const RequestOwner* owner) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (!requests_ || (owner && owner->kept == 0) || requests_used_ == 0) return nullptr;
  for (uint32_t i = 0; i < kMaxRequests; ++i)
    if (requests_[i].state != State::kFree && (!owner || requests_[i].owner == owner))
      return RemoveLocked(i);
  return nullptr;
}

RemoteRing* PendingRequests::Withdraw(const Tuple& t, const RemoteRing* conn, Reason why,
                                      uint64_t now_ms) noexcept {
  {
    const uint64_t hash = HashOf(t);
    std::lock_guard<std::mutex> lock(mu_);
    const uint32_t i = FindLocked(t, hash);
    if (i == kNil || requests_[i].conn != conn) return nullptr;
    RemoveLocked(i);
  }
  RecordRefusal(t, why, now_ms);
  return const_cast<RemoteRing*>(conn);
}

RemoteRing* PendingRequests::DropOneIf(Match match, const void* ctx, uint64_t now_ms) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (!requests_ || requests_used_ == 0) return nullptr;
  for (uint32_t i = 0; i < kMaxRequests; ++i)
    if (requests_[i].state != State::kFree && match(requests_[i].conn, ctx))
      return DropLocked(i, now_ms);
  return nullptr;
}

void PendingRequests::RecordRefusal(const Tuple& t, Reason why, uint64_t now_ms) noexcept {
  const uint64_t hash = HashOf(t);
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t slot = uint32_t(refusal_next_++ % kRefusals);
  Refusal& r = refusals_[slot];
  if (r.why != Reason::kNone) {
    uint32_t* link = &refusal_heads_[r.hash & (kRefusals - 1)];
    while (*link != kNil && *link != slot) link = &refusals_[*link].chain;
    if (*link == slot) *link = r.chain;
  }
  r.hash = hash;
  r.why = why == Reason::kNone ? Reason::kResources : why;
  r.until_ms = now_ms + kPendingMs;
  uint32_t& head = refusal_heads_[hash & (kRefusals - 1)];
  r.chain = head;
  head = slot;
}

Reason PendingRequests::Refused(const Tuple& t, uint64_t now_ms) noexcept {
  const uint64_t hash = HashOf(t);
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = refusal_heads_[hash & (kRefusals - 1)]; i != kNil; i = refusals_[i].chain)
    if (refusals_[i].hash == hash && now_ms < refusals_[i].until_ms) return refusals_[i].why;
  return Reason::kNone;
}

Principal Principal::OfSource(const wire::Endpoint& source) noexcept {
  Principal who;
  if (IsLoopback(source)) {
    who.kind = Kind::kLoopback;
    return who;
  }
  who.kind = Kind::kAddress;
  who.address = source;
  who.address.port = 0;
  return who;
}

size_t PendingRequests::DefaultBudget(size_t charge) noexcept {
  return std::max(size_t(192) << 20, kMinRequests * charge);
}

size_t PendingRequests::CheckDue(uint64_t now_ms, Deleter release) noexcept {
  constexpr size_t kChecks = 64;   // requests asked about per round
  constexpr int kCheckRounds = 8;  // rounds per call: the rest waits for the next
  Check checks[kChecks];
  RemoteRing* done[kChecks + 16];
  size_t gone = 0;
  for (int round = 0; round < kCheckRounds; ++round) {
    const size_t n = TakeDue(now_ms, checks, kChecks);
    for (size_t i = 0; i < n; ++i) {
      sockaddr_storage server{}, client{};
      SocketInfo info;
      checks[i].connected = wire::SockaddrFromEndpoint(checks[i].tuple.server, &server) &&
                            wire::SockaddrFromEndpoint(checks[i].tuple.client, &client) &&
                            FindConnection(reinterpret_cast<sockaddr*>(&server),
                                           reinterpret_cast<sockaddr*>(&client), &info) == 0;
    }
    size_t count = 0;
    Settle(checks, n, now_ms, done, sizeof(done) / sizeof(done[0]), &count);
    for (size_t i = 0; i < count; ++i) release(done[i]);
    gone += count;
    if (n < kChecks && count < sizeof(done) / sizeof(done[0])) break;
  }
  return gone;
}

}  // namespace slip
