// A stream's notes: the 64 bits of remote CQ data that every write into a peer's ring (or
// an empty write) carries, and that the peer's completion queue hands to the connection
// it names.
//
//   bits 63..40  the receiving connection's tag (it chose it: the REQ or REP said it)
//   bits 39..36  the kind: data, credit, end of stream, closed
//   bits 35..0   data: the sender's `produced` after this write; credit: the receiver's
//                `consumed` (both the low 36 bits of a 64-bit cursor)
//
// 36 bits are more than enough: a cursor never moves by more than a ring (at most 1 GiB,
// streamwire::kMaxRingLog2) between two notes, so the receiver extends them from its own
// copy; a note behind it is stale (taken out of order), and one that would move it past a
// ring is the peer's violation.
//
// Cursor words (the default, SLIP_FABRIC_NOTES=word; the only form where the provider
// carries just 4 bytes of CQ data, as ofi_rxm over verbs and efa do): the cursors go into
// two words of the receiver's registered memory, right after its ring (kProducedWord:
// data, with kEndFlag once the stream ended; kConsumedWord: credit, with kEndFlag once
// closed), by a write whose 4 bytes of CQ data are only a doorbell:
//
//   bits 31..8   the receiving connection's tag
//   bits 7..4    the kind (which word moved: data and EOF the first, credit and CLOSED
//                the second)
//   bits 3..0    zero
//
// The endpoint orders writes (FI_ORDER_WAW), so when a doorbell's write completes, its
// word and every byte the word covers are in place; the word may already hold a later
// value (a later write's), which is as true. The receiver reads the word the doorbell
// names (every change of a word rings one). Only a holder of the ring's registration key (a 64-bit
// secret of the connection's two ends) can write them: another host that guesses a tag rings a bell
// that moves nothing. 8-byte notes (SLIP_FABRIC_NOTES=inline) carry the cursor itself,
// and anybody who reaches the endpoint and guesses a tag could move it.
//
// Cursor notes, over a connected endpoint (rings up to 256 MiB): only the peer writes
// through it, so a note needs no tag to find its connection nor a key to be believed, and
// the cursor goes in the 4 bytes of CQ data themselves, on the publish's last write: one
// write per send(), as the verbs transport's notes.
//
//   bits 31..30  the kind, less one
//   bits 29..0   the cursor's low 30 bits
//
// A cursor moves by at most a ring (2^28) between two notes, so the receiver extends the
// 30 bits from its own copy as it does the 36 above (one behind it is stale).
#pragma once

#include <cstdint>

namespace slip::fabric::note {

enum class Kind : uint8_t { kData = 1, kCredit = 2, kEof = 3, kClosed = 4 };

constexpr int kTagShift = 40;
constexpr int kKindShift = 36;
constexpr uint64_t kCursorMask = (uint64_t(1) << kKindShift) - 1;

constexpr uint64_t Encode(uint32_t tag, Kind kind, uint64_t cursor) noexcept {
  return uint64_t(tag) << kTagShift | uint64_t(kind) << kKindShift | (cursor & kCursorMask);
}
constexpr uint32_t TagOf(uint64_t data) noexcept {
  return uint32_t(data >> kTagShift);
}
constexpr Kind KindOf(uint64_t data) noexcept {
  return Kind((data >> kKindShift) & 0xf);
}
constexpr uint32_t kWordBytes = 64;  // after the ring: the words, in one registration
constexpr uint32_t kProducedWord = 0;
constexpr uint32_t kConsumedWord = 8;
constexpr uint64_t kEndFlag = uint64_t(1) << 63;  // in a word: EOF, or CLOSED
constexpr uint32_t WordOffset(Kind kind) noexcept {
  return kind == Kind::kData || kind == Kind::kEof ? kProducedWord : kConsumedWord;
}
constexpr uint64_t EncodeShort(uint32_t tag, Kind kind) noexcept {
  return uint64_t(tag) << 8 | uint64_t(kind) << 4;
}
constexpr uint32_t ShortTagOf(uint64_t data) noexcept {
  return uint32_t(data & 0xffffffffu) >> 8;
}
constexpr Kind ShortKindOf(uint64_t data) noexcept {
  return Kind((data >> 4) & 0xf);
}
// A 4-byte note with nothing outside its fields (a peer's violation otherwise).
constexpr bool ShortWellFormed(uint64_t data) noexcept {
  return (data & ~uint64_t(0xfffffff0u)) == 0;
}

constexpr uint32_t kLinkCursorBits = 30;
constexpr uint32_t kLinkMaxRingLog2 = 28;
constexpr uint32_t kLinkCursorMask = (1u << kLinkCursorBits) - 1;
constexpr uint32_t EncodeLink(Kind kind, uint64_t cursor) noexcept {
  return (uint32_t(kind) - 1) << kLinkCursorBits | (uint32_t(cursor) & kLinkCursorMask);
}
constexpr Kind LinkKindOf(uint32_t data) noexcept {
  return Kind((data >> kLinkCursorBits) + 1);
}
// The whole cursor a cursor note names, from `known` (the receiver's copy): ahead of it by
// less than half the 30-bit space, or behind it (a stale note, which the caller ignores).
constexpr uint64_t LinkCursor(uint32_t data, uint64_t known) noexcept {
  const uint32_t ahead = (data - uint32_t(known)) & kLinkCursorMask;
  return ahead <= (kLinkCursorMask >> 1) ? known + ahead
                                         : known - uint64_t(kLinkCursorMask + 1 - ahead);
}

// How far the note's cursor is ahead of `known` (its low bits). Two pollers may hand a
// connection its notes out of order: a note behind `known` is stale, and says so by being
// more than half the cursor space ahead.
constexpr uint64_t Ahead(uint64_t data, uint64_t known) noexcept {
  return (data - known) & kCursorMask;
}
constexpr bool Stale(uint64_t ahead) noexcept {
  return ahead > (kCursorMask >> 1);
}
// The whole cursor a note says, from the last one `known`: `known` itself where the note
// says nothing newer (stale: a later note said more).
constexpr uint64_t Cursor(uint64_t data, uint64_t known) noexcept {
  const uint64_t ahead = Ahead(data, known);
  return Stale(ahead) ? known : known + ahead;
}

}  // namespace slip::fabric::note
