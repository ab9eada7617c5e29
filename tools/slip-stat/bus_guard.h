// Reading a mapped file that its owner shrinks under us: a touch beyond the new end raises
// SIGBUS, which must cost slip-stat one file, not its life.
#pragma once

namespace slipstat {

// Runs fn(ctx) and returns true; returns false instead if fn touched a page beyond the end
// of a mapped file. fn must leave nothing half-done that matters when cut short (no
// allocation, no locks): it is abandoned mid-way by a jump out of the signal handler.
// A SIGBUS outside such a call keeps its previous disposition.
bool RunGuarded(void (*fn)(void*), void* ctx) noexcept;

}  // namespace slipstat
