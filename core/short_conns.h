// Connections too short to pay for their own setup (SLIP_SHORT_CONNS=adaptive, the default).
//
// Setting up an accelerated connection costs several times what a TCP connection costs
// (shm: a region, two proxy pairs, a rendezvous exchange; verbs: a queue pair and the
// rdma_cm exchange), and the rings win it back only over the messages that follow. A
// client that opens a connection per request (HTTP/1.0, `pgbench -C`, health checks) pays
// the setup every time and wins nothing: on shm it ran at 0.3-0.4x of kernel TCP's
// connection rate. So each client process remembers, per destination, how its
// accelerated connections ended: after kRun in a row that closed young and small (under
// kShortLifeMs and kShortBytes both ways together), its next connections there stay plain
// TCP (reason `short_lived`), the first one of every kProbeEvery still accelerated to look
// again. One that lives longer or moves more ends it, and so does a pause of kIdleMs
// between connections (a new phase of the program). Nothing changes for a connection
// already open, and a plain connection is plain from its first byte, as for any plain peer.
//
// Thread safety: every call from any thread (one lock, taken at connect and at close).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/fork_safe_mutex.h"
#include "core/wire.h"

namespace slip {

class ShortConnPolicy {
 public:
  static constexpr uint32_t kRun = 16;
  static constexpr uint64_t kShortLifeMs = 20;
  static constexpr uint64_t kShortBytes = 64 * 1024;
  static constexpr uint32_t kProbeEvery = 128;
  static constexpr uint64_t kIdleMs = 1000;

  // At connect: whether this connection to `dest` stays plain.
  bool Bypass(const wire::Endpoint& dest, uint64_t now_ms) noexcept;
  // At close of a client connection that was accelerated: how long it lived and how many
  // bytes it moved both ways.
  void NoteClosed(const wire::Endpoint& dest, uint64_t now_ms, uint64_t life_ms,
                  uint64_t bytes) noexcept;

  // For the fork handlers (core/fork_safe_mutex.h).
  ForkSafeMutex& fork_mutex() noexcept { return mu_; }

 private:
  struct Entry {
    wire::Endpoint dest;
    uint64_t last_ms = 0;    // its last connect or close (0: a free entry)
    uint32_t short_run = 0;  // accelerated connections that closed short, in a row
    uint32_t connects = 0;   // connections since it went plain (for the probes)
    bool plain = false;      // its connections stay plain (all but the probes)
  };
  static constexpr size_t kEntries = 64;  // destinations remembered; the least recent goes

  Entry* FindLocked(const wire::Endpoint& dest) noexcept;

  ForkSafeMutex mu_;
  Entry entries_[kEntries];
};

}  // namespace slip
