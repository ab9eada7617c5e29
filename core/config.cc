#include "core/config.h"

#include <arpa/inet.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <utility>

namespace slip {
namespace {

using Why = std::string;  // optional detail naming the offending list item
using options::ForEachItem;
using options::IEquals;
using options::ParseBool;
using options::ParseRange;
using options::ParseSize;
using options::Trim;

constexpr const char* kTransportNames[] = {"tcp", "shm", "verbs", "fabric"};
constexpr const char* kLevelNames[] = {"error", "warn", "info", "debug", "trace"};

bool ParseTransports(std::string_view v, Config* c, Why* why) {
  TransportList list;
  bool ok = ForEachItem(v, why, [&](std::string_view item, Why* item_why) {
    for (size_t k = 0; k < std::size(kTransportNames); ++k) {
      if (!IEquals(item, kTransportNames[k])) continue;
      auto kind = static_cast<TransportKind>(k);
      for (TransportKind seen : list) {
        if (seen == kind) {
          *item_why = "duplicate \"" + std::string(item) + "\"";
          return false;
        }
      }
      list.push_back(kind);
      return true;
    }
    *item_why = "unknown transport \"" + std::string(item) + "\"";
    return false;
  });
  if (ok) c->transports = list;
  return ok;
}

bool ParseRingSize(std::string_view v, Config* c, Why*) {
  uint64_t size;
  if (!ParseSize(v, &size) || size < (4u << 10) || size > (256u << 20)) return false;
  if ((size & (size - 1)) != 0) return false;
  c->ring_size = static_cast<uint32_t>(size);
  return true;
}

bool ParseLogLevel(std::string_view v, Config* c, Why*) {
  for (size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (IEquals(v, kLevelNames[i])) {
      c->log_level = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

bool ParsePorts(std::string_view v, std::vector<PortRange>* out, Why* why) {
  std::vector<PortRange> list;
  bool ok = ForEachItem(v, why, [&](std::string_view item, Why*) {
    size_t dash = item.find('-');
    uint32_t first, last;
    if (!ParseRange(Trim(item.substr(0, dash)), 1, 65535, &first)) return false;
    last = first;
    if (dash != std::string_view::npos &&
        !ParseRange(Trim(item.substr(dash + 1)), first, 65535, &last)) {
      return false;
    }
    list.push_back({static_cast<uint16_t>(first), static_cast<uint16_t>(last)});
    return true;
  });
  if (ok) *out = std::move(list);
  return ok;
}

// ::ffff:a.b.c.d; checked on bytes because Cidr::addr is not an aligned in6_addr.
bool IsV4Mapped(const uint8_t* a) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(a, kPrefix, sizeof(kPrefix)) == 0;
}

// "10.0.0.0/8", "::1/128", "10.1.2.3" (full length). A v4-mapped IPv6 prefix of /96 or
// longer becomes the equivalent IPv4 prefix, since mapped addresses match as IPv4.
bool ParseCidr(std::string_view item, Cidr* out) {
  size_t slash = item.find('/');
  std::string_view host = item.substr(0, slash);
  char buf[INET6_ADDRSTRLEN];
  if (host.empty() || host.size() >= sizeof(buf)) return false;
  memcpy(buf, host.data(), host.size());
  buf[host.size()] = '\0';
  Cidr c;
  if (inet_pton(AF_INET, buf, c.addr) == 1) {
    c.family = AF_INET;
  } else if (inet_pton(AF_INET6, buf, c.addr) == 1) {
    c.family = AF_INET6;
  } else {
    return false;
  }
  uint32_t max_len = c.family == AF_INET ? 32 : 128, len = max_len;
  if (slash != std::string_view::npos && !ParseRange(item.substr(slash + 1), 0, max_len, &len)) {
    return false;
  }
  c.prefix_len = static_cast<uint8_t>(len);
  if (c.family == AF_INET6 && IsV4Mapped(c.addr) && len >= 96) {
    c.family = AF_INET;
    memmove(c.addr, c.addr + 12, 4);
    memset(c.addr + 4, 0, 12);
    c.prefix_len = static_cast<uint8_t>(len - 96);
  }
  *out = c;
  return true;
}

bool ParseCidrs(std::string_view v, std::vector<Cidr>* out, Why* why) {
  std::vector<Cidr> list;
  bool ok = ForEachItem(v, why, [&](std::string_view item, Why*) {
    Cidr c;
    if (!ParseCidr(item, &c)) return false;
    list.push_back(c);
    return true;
  });
  if (ok) *out = std::move(list);
  return ok;
}

// An empty list means "no restriction", the same as unset.
bool EmptyList(std::string_view v) {
  return Trim(v).empty();
}

constexpr const char* kPortsExpected =
    "expected ports or ranges within 1-65535, comma-separated (e.g. 80,8000-9000)";
constexpr const char* kCidrExpected =
    "expected IPv4/IPv6 addresses with optional /prefix, comma-separated "
    "(e.g. 127.0.0.0/8,::1/128)";

using Option = options::Option<Config>;

// The single list of known variables: drives parsing and UnknownSlipVariables().
constexpr Option kOptions[] = {
    {"SLIP_ENABLE", "expected 0, 1, true, false, yes or no",
     [](std::string_view v, Config* c, Why*) { return ParseBool(v, &c->enabled); }},
    {"SLIP_TRANSPORTS",
     "expected a comma list of distinct transports from shm, tcp, verbs, fabric "
     "(e.g. shm,tcp)",
     ParseTransports},
    {"SLIP_RING_SIZE", "expected a power-of-two size between 4K and 256M (e.g. 1M)", ParseRingSize},
    {"SLIP_SPIN_US", "expected a decimal integer between 0 and 1000000",
     [](std::string_view v, Config* c, Why*) { return ParseRange(v, 0, 1000000, &c->spin_us); }},
    {"SLIP_HANDSHAKE_TIMEOUT_MS", "expected a decimal integer between 1 and 600000",
     [](std::string_view v, Config* c, Why*) {
       return ParseRange(v, 1, 600000, &c->handshake_timeout_ms);
     }},
    {"SLIP_LOG", "expected error, warn, info, debug or trace", ParseLogLevel},
    {"SLIP_LOG_FILE", "expected a file path",
     [](std::string_view v, Config* c, Why*) {
       c->log_file = v;
       return true;
     }},
    {"SLIP_STATS_FILE", "expected a file path",
     [](std::string_view v, Config* c, Why*) {
       c->stats_file = v;
       return true;
     }},
    {"SLIP_INCLUDE_PORTS", kPortsExpected,
     [](std::string_view v, Config* c, Why* why) {
       return EmptyList(v) || ParsePorts(v, &c->include_ports, why);
     }},
    {"SLIP_EXCLUDE_PORTS", kPortsExpected,
     [](std::string_view v, Config* c, Why* why) {
       return EmptyList(v) || ParsePorts(v, &c->exclude_ports, why);
     }},
    {"SLIP_INCLUDE_CIDR", kCidrExpected,
     [](std::string_view v, Config* c, Why* why) {
       return EmptyList(v) || ParseCidrs(v, &c->include_cidrs, why);
     }},
    {"SLIP_EXCLUDE_CIDR", kCidrExpected,
     [](std::string_view v, Config* c, Why* why) {
       return EmptyList(v) || ParseCidrs(v, &c->exclude_cidrs, why);
     }},
    {"SLIP_RENDEZVOUS_DIR", "expected an absolute directory path of at most 255 characters",
     [](std::string_view v, Config* c, Why*) {
       v = Trim(v);
       if (!v.empty() && (v.front() != '/' || v.size() > Config::kMaxRendezvousDirLength ||
                          v.find('\0') != std::string_view::npos))
         return false;
       while (v.size() > 1 && v.back() == '/') v.remove_suffix(1);
       c->rendezvous_dir = v;
       return true;
     }},
    {"SLIP_FAILOVER", "expected 0, 1, true, false, yes or no",
     [](std::string_view v, Config* c, Why*) { return ParseBool(v, &c->failover); }},
    {"SLIP_SHORT_CONNS", "expected adaptive or accelerate",
     [](std::string_view v, Config* c, Why*) {
       v = Trim(v);
       if (v != "adaptive" && v != "accelerate") return false;
       c->short_conns_adaptive = v == "adaptive";
       return true;
     }},
};

bool PortIn(const std::vector<PortRange>& ranges, uint16_t port) {
  for (const PortRange& r : ranges) {
    if (port >= r.first && port <= r.last) return true;
  }
  return false;
}

bool PrefixMatch(const uint8_t* a, const uint8_t* p, unsigned bits) {
  unsigned full = bits / 8, rem = bits % 8;
  if (memcmp(a, p, full) != 0) return false;
  if (rem == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rem));
  return (a[full] & mask) == (p[full] & mask);
}

bool CidrIn(const std::vector<Cidr>& cidrs, const IpEndpoint& ep) {
  for (const Cidr& c : cidrs) {
    if (c.family == ep.family && PrefixMatch(ep.addr, c.addr, c.prefix_len)) return true;
  }
  return false;
}

}  // namespace

const char* TransportName(TransportKind kind) noexcept {
  auto i = static_cast<size_t>(kind);
  return i < std::size(kTransportNames) ? kTransportNames[i] : "?";
}

bool Config::Allows(TransportKind kind) const noexcept {
  for (TransportKind t : transports) {
    if (t == kind) return true;
  }
  return false;
}

bool ParseConfig(EnvLookup lookup, void* ctx, Config* out, std::string* error) noexcept {
  if (lookup == nullptr) return false;
  try {
    Config config;
    if (!options::ParseTable<Config>(kOptions, lookup, ctx, &config, error)) return false;
    if (out == nullptr) return false;
    *out = std::move(config);
    return true;
  } catch (const std::bad_alloc&) {
    if (error != nullptr) error->clear();  // nothing better to say without memory
    return false;
  }
}

bool ParseConfigFromEnv(Config* out, std::string* error) noexcept {
  return ParseConfig(ProcessEnv, nullptr, out, error);
}

std::vector<std::string> UnknownSlipVariables(char** envp,
                                              std::span<const char* const> also_known) {
  std::vector<std::string> unknown;
  try {
    for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
      std::string_view entry(*e);
      std::string_view name = entry.substr(0, entry.find('='));
      if (name.substr(0, 5) != "SLIP_") continue;
      // Reserved for the project's own test tooling (tests/vm, tests/integration).
      if (name.substr(0, 8) == "SLIP_VM_" || name.substr(0, 10) == "SLIP_TEST_") continue;
      // The NCCL face's own (ncclnet-plugin/net.cc): a job may set them for its plugin.
      if (name.substr(0, 10) == "SLIP_NCCL_") continue;
      bool known = false;
      for (const Option& opt : kOptions) known |= name == opt.name;
      for (const char* other : also_known) known |= name == other;
      if (!known) unknown.emplace_back(name);
    }
  } catch (const std::bad_alloc&) {
    // A warning list is best effort: return what fitted.
  }
  return unknown;
}

bool DecodeSockaddr(const sockaddr* sa, IpEndpoint* out) noexcept {
  if (sa == nullptr) return false;
  IpEndpoint ep;
  if (sa->sa_family == AF_INET) {
    sockaddr_in in;
    memcpy(&in, sa, sizeof(in));
    ep.family = AF_INET;
    memcpy(ep.addr, &in.sin_addr, 4);
    ep.port = ntohs(in.sin_port);
  } else if (sa->sa_family == AF_INET6) {
    sockaddr_in6 in6;
    memcpy(&in6, sa, sizeof(in6));
    bool mapped = IsV4Mapped(in6.sin6_addr.s6_addr);
    ep.family = mapped ? AF_INET : AF_INET6;
    memcpy(ep.addr, in6.sin6_addr.s6_addr + (mapped ? 12 : 0), mapped ? 4 : 16);
    ep.port = ntohs(in6.sin6_port);
  } else {
    return false;
  }
  *out = ep;
  return true;
}

bool PolicyAllows(const Config& config, const sockaddr* local, const sockaddr* remote) noexcept {
  IpEndpoint r, l;
  if (!DecodeSockaddr(remote, &r)) return false;  // not IP: nothing we accelerate
  DecodeSockaddr(local, &l);                      // unknown local: port 0 matches no range
  if (PortIn(config.exclude_ports, r.port) || PortIn(config.exclude_ports, l.port)) return false;
  if (CidrIn(config.exclude_cidrs, r)) return false;
  if (!config.include_ports.empty() && !PortIn(config.include_ports, r.port) &&
      !PortIn(config.include_ports, l.port)) {
    return false;
  }
  return config.include_cidrs.empty() || CidrIn(config.include_cidrs, r);
}

bool ListenerPortAllowed(const Config& config, uint16_t port) noexcept {
  if (PortIn(config.exclude_ports, port)) return false;
  return config.include_ports.empty() || PortIn(config.include_ports, port);
}

}  // namespace slip
