// Slipstream configuration: core's SLIP_* environment variables, validated once. Each
// transport reads its own (verbs/options.h) with the same grammar (core/options.h).
//
// A bad value never aborts the host program: ParseConfig() reports one clear
// line and the caller disables Slipstream for the process (plain TCP).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "core/options.h"

namespace slip {

enum class LogLevel : uint8_t { kError = 0, kWarn, kInfo, kDebug, kTrace };

// Transports in preference order. kTcp means "plain TCP allowed as fallback".
enum class TransportKind : uint8_t { kTcp = 0, kShm, kVerbs, kFabric };
const char* TransportName(TransportKind kind) noexcept;

// The transports in preference order: at most one of each kind, in a fixed array, so that
// a default Config is built without the heap (the shim builds one before anything else,
// where an allocation failure could only terminate the host program).
class TransportList {
 public:
  TransportList() = default;
  TransportList(std::initializer_list<TransportKind> kinds) noexcept {
    for (TransportKind k : kinds) push_back(k);
  }
  void push_back(TransportKind kind) noexcept {
    if (size_ < kMax) items_[size_++] = kind;
  }
  size_t size() const noexcept { return size_; }
  TransportKind operator[](size_t i) const noexcept { return items_[i]; }
  const TransportKind* begin() const noexcept { return items_; }
  const TransportKind* end() const noexcept { return items_ + size_; }
  bool operator==(const TransportList& o) const noexcept {
    return size_ == o.size_ && std::equal(begin(), end(), o.begin());
  }

 private:
  static constexpr size_t kMax = 4;  // every kind once
  TransportKind items_[kMax] = {};
  size_t size_ = 0;
};

// An inclusive port range.
struct PortRange {
  uint16_t first = 0;
  uint16_t last = 0;
};

// An IPv4 or IPv6 prefix. IPv4 prefixes also match v4-mapped IPv6 addresses.
struct Cidr {
  int family = AF_INET;  // AF_INET or AF_INET6
  uint8_t addr[16] = {};
  uint8_t prefix_len = 0;
};

struct Config {
  bool enabled = true;  // SLIP_ENABLE=0|1
  TransportList transports = {TransportKind::kShm, TransportKind::kVerbs,
                              TransportKind::kTcp};  // SLIP_TRANSPORTS
  uint32_t ring_size =
      1u << 20;  // SLIP_RING_SIZE, bytes per direction, power of 2, 4K..256M, K/M/G suffixes
  uint32_t spin_us = 50;                 // SLIP_SPIN_US, 0..1000000
  uint32_t handshake_timeout_ms = 2000;  // SLIP_HANDSHAKE_TIMEOUT_MS, 1..600000
  LogLevel log_level = LogLevel::kWarn;  // SLIP_LOG=error|warn|info|debug|trace
  std::string log_file;                  // SLIP_LOG_FILE (default: stderr)
  std::string stats_file;                // SLIP_STATS_FILE (JSON lines appended at exit)
  std::vector<PortRange> include_ports;  // SLIP_INCLUDE_PORTS="80,8000-9000" (empty: all)
  std::vector<PortRange> exclude_ports;  // SLIP_EXCLUDE_PORTS
  std::vector<Cidr> include_cidrs;       // SLIP_INCLUDE_CIDR="127.0.0.0/8,::1/128" (empty: all)
  std::vector<Cidr> exclude_cidrs;       // SLIP_EXCLUDE_CIDR

  // SLIP_RENDEZVOUS_DIR: a directory that listeners and clients in different network
  // namespaces of this host share (pods): listeners publish a rendezvous there for the
  // addresses they are reached at, so that shm serves connections between namespaces.
  // Absolute, at most kMaxRendezvousDirLength characters; empty: none.
  std::string rendezvous_dir;
  static constexpr size_t kMaxRendezvousDirLength = 255;  // (reached through a descriptor)

  // SLIP_FAILOVER=0|1: a connection whose transport fails continues on its TCP connection
  // (0: it resets, as before failover existed; for tests and for the cautious).
  bool failover = true;

  // SLIP_SHORT_CONNS=adaptive|accelerate: whether a client stops accelerating connections
  // to a destination whose connections keep closing before their setup paid off
  // (core/short_conns.h), or accelerates every one however short.
  bool short_conns_adaptive = true;

  bool Allows(TransportKind kind) const noexcept;
};

// Parses all SLIP_* variables. Returns true on success. On a bad value returns false, leaves
// *out untouched and sets *error (when non-null) to one line naming the variable, the value
// and what was expected. Unknown SLIP_* names are reported by UnknownSlipVariables().
bool ParseConfig(EnvLookup lookup, void* ctx, Config* out, std::string* error) noexcept;

// Convenience: parses the process environment.
bool ParseConfigFromEnv(Config* out, std::string* error) noexcept;

// Lists SLIP_* names in `envp` that neither ParseConfig nor `also_known` (the transports'
// own variables) know.
std::vector<std::string> UnknownSlipVariables(char** envp,
                                              std::span<const char* const> also_known = {});

// A socket address reduced to what policy and stats need. v4-mapped IPv6 addresses
// (::ffff:a.b.c.d) come out as AF_INET, so IPv4 rules and output apply to them.
struct IpEndpoint {
  int family = AF_UNSPEC;  // AF_INET (addr[0..3]) or AF_INET6
  uint8_t addr[16] = {};
  uint16_t port = 0;  // host byte order
};
// Returns false (and leaves *out alone) for null or non-IP addresses.
bool DecodeSockaddr(const sockaddr* sa, IpEndpoint* out) noexcept;

// Policy: may a connection between these addresses be accelerated?
// `remote` and `local` are AF_INET or AF_INET6 socket addresses.
bool PolicyAllows(const Config& config, const sockaddr* local, const sockaddr* remote) noexcept;
// Whether PolicyAllows looks at the local address at all (port rules): a connect() asks the
// kernel for it only then.
inline bool PolicyNeedsLocal(const Config& config) noexcept {
  return !config.exclude_ports.empty() || !config.include_ports.empty();
}

// Policy for a listener, before any peer is known: the port rules on its local port.
// (CIDR rules are applied by the connecting side, which knows the remote address.)
bool ListenerPortAllowed(const Config& config, uint16_t port) noexcept;

}  // namespace slip
