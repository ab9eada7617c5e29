// Per-connection counters, live in shared memory for slip-stat, and the exit record.
//
// Each process under Slipstream owns one file /dev/shm/slipstream-stats.<pid> (or, when
// another user took that name first, slipstream-stats.<pid>.<random hex>) holding a
// StatsHeader and a fixed array of ConnSlot. Slots are claimed under a process-local mutex
// (control path); counters are updated lock-free with relaxed atomics (data path).
// Readers in other processes (slip-stat) see a consistent-enough snapshot: counters are
// monotonic, and `state` is published last with release ordering.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/config.h"

namespace slip {

// Why a connection is plain TCP. Values are stable: slip-stat and JSON print the names.
enum class Reason : uint8_t {
  kNone = 0,             // accelerated
  kPeerNotSlipstream,    // no rendezvous for the destination / peer did not register
  kNotSameHost,          // peer on another host and no cross-host transport available
  kPolicy,               // excluded by SLIP_*_PORTS / SLIP_*_CIDR / SLIP_TRANSPORTS
  kDisabled,             // Slipstream disabled for the process (bad config, SLIP_ENABLE=0)
  kDeclined,             // peer declined the proposal
  kHandshakeTimeout,     // peer registered but never confirmed in time
  kResources,            // memfd/mmap/socketpair/fd limit failure
  kConnectSlow,          // TCP handshake did not complete promptly; registration cancelled
  kRendezvousBusy,       // rendezvous queue full
  kNonceMismatch,        // confirm carried the wrong nonce (forged registration)
  kFailover,             // was accelerated, moved back to TCP mid-stream
  kUnsupported,          // socket state we do not accelerate (e.g. bound to a device)
  kReusePort,            // verbs: the SO_REUSEPORT member the SYN reaches is not served
  kNoRdmaDevice,         // verbs allowed, but no usable RDMA device (or rdma-core missing)
  kNoRdmaPath,           // the peer cannot be reached over RDMA (address/route/timeout)
  kMemlock,              // RLIMIT_MEMLOCK too low to register the rings
  kExec,                 // handed back to TCP because the process exec'd with it
  kUntrustedRendezvous,  // the rendezvous for the port is not held by the listener's owner
  kFdLimit,              // descriptors short: the setup would have used the application's
  kAcceptedElsewhere,    // another process took the connection (shared listener, group member)
  kShortLived,           // its destination's connections lately closed before setup paid off
  kKernelFeature,        // the program set an option only the kernel's TCP serves (zerocopy, TLS)
  kCount
};
const char* ReasonName(Reason r) noexcept;  // "peer_not_slipstream", ...

enum class SlotState : uint32_t { kFree = 0, kOpen = 1, kClosed = 2 };

// Where the files are: kStatsDir/kStatsPrefix<pid>[.<16 hex digits>].
constexpr const char* kStatsDir = "/dev/shm";
constexpr const char* kStatsPrefix = "slipstream-stats.";

constexpr uint32_t kStatsMagic = 0x53544154;  // "STAT"
constexpr uint32_t kStatsVersion = 9;  // 3: kNoRdmaDevice..kMemlock; 4: kExec; 5: ..kFdLimit;
                                       // 6: kAcceptedElsewhere; 7: kShortLived; 8: provider;
                                       // 9: kKernelFeature
constexpr uint32_t kStatsSlots = 8192;

struct alignas(64) ConnSlot {
  std::atomic<uint32_t> state;  // SlotState
  uint8_t transport;            // TransportKind
  uint8_t reason;               // Reason
  uint8_t role;                 // 0 client (connect), 1 server (accept)
  uint8_t pad0;
  char local[48];  // "127.0.0.1:5201" or "[::1]:5201"
  char remote[48];
  char provider[24];  // the transport's provider where it has one ("tcp;ofi_rxm"), else ""
  std::atomic<uint64_t> bytes_sent;
  std::atomic<uint64_t> bytes_received;
  std::atomic<uint64_t> msgs_sent;
  std::atomic<uint64_t> msgs_received;
  uint64_t opened_ns;  // CLOCK_REALTIME
  std::atomic<uint64_t> closed_ns;
};

// alignas(64): the ConnSlot array starts at offset sizeof(StatsHeader).
struct alignas(64) StatsHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t pid;
  uint32_t slot_count;
  char exe[256];
  std::atomic<uint32_t> high_water;  // slots ever used (scan bound)
  std::atomic<uint64_t> dropped;     // connections not recorded (table full)
  std::atomic<uint64_t> reason_counts[static_cast<int>(Reason::kCount)];
};

// Enables stats for the process; the file is created by the first StatsOpen, so processes
// that never open a connection (shells, fork-then-exec children) leave no file behind.
// Safe to call more than once. After fork the child calls StatsReinitAfterFork: it drops
// the parent's table and gets its own file with its own first connection. A failure to
// create the file, or a file size limit (RLIMIT_FSIZE) below the table's size, disables
// stats (one log line). Neither re-init nor StatsShutdown munmaps a table: they
// replace it with private zero pages, so ConnSlot pointers still held (other threads,
// inherited across fork) stay safe to update and simply count nowhere.
void StatsInit() noexcept;
void StatsReinitAfterFork() noexcept;

// Claims a slot; returns nullptr when stats are disabled or full (counted as dropped).
// `provider`: what carries the transport where it says (fabric: the libfabric provider),
// or null.
ConnSlot* StatsOpen(TransportKind transport, Reason reason, int role, const sockaddr* local,
                    const sockaddr* remote, const char* provider = nullptr) noexcept;
// The same, with the addresses already formatted (a forked child re-registers the
// connections it inherited this way).
ConnSlot* StatsOpenText(TransportKind transport, Reason reason, int role, const char* local,
                        const char* remote, const char* provider = nullptr) noexcept;
// Changes transport/reason (e.g. failover, decline after an optimistic start).
void StatsSetTransport(ConnSlot* slot, TransportKind transport, Reason reason) noexcept;
void StatsClose(ConnSlot* slot) noexcept;

inline void StatsAddSent(ConnSlot* slot, uint64_t bytes) noexcept {
  if (slot) {
    slot->bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
    slot->msgs_sent.fetch_add(1, std::memory_order_relaxed);
  }
}
inline void StatsAddReceived(ConnSlot* slot, uint64_t bytes) noexcept {
  if (slot) {
    slot->bytes_received.fetch_add(bytes, std::memory_order_relaxed);
    slot->msgs_received.fetch_add(1, std::memory_order_relaxed);
  }
}

// Appends one JSON line for this process to `path` (O_APPEND, one write):
// {"pid":N,"exe":"...","dropped":N,"connections":[{"local":"..","remote":"..",
//  "transport":"shm","reason":"..","bytes_sent":N,"bytes_received":N}, ...]}
// Lists every open or closed slot; "reason" is "" for accelerated connections. A record
// that RLIMIT_FSIZE would cut is not written (one log line): never SIGXFSZ. Does not
// remove the /dev/shm file (StatsShutdown does).
void StatsWriteExitRecord(const char* path) noexcept;
void StatsShutdown() noexcept;  // unlinks /dev/shm file, drops the table (see StatsInit)

// Formats an address as "1.2.3.4:80" or "[::1]:80" (v4-mapped shown as IPv4).
void FormatSockaddr(const sockaddr* sa, char* out, size_t out_len) noexcept;

// Appends s[0, n) to *out as a JSON string literal; any bytes give valid JSON (control
// characters escaped, invalid UTF-8 as U+FFFD). The exit record and slip-stat --json use it.
void AppendJsonString(std::string* out, const char* s, size_t n);

}  // namespace slip
