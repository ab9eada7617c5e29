#include "core/local_address.h"

#include <ifaddrs.h>

#include <cstring>
#include <ctime>
#include <mutex>
#include <vector>

#include "core/no_destructor.h"
#include "core/sys.h"

namespace slip {

namespace {

struct InterfaceCache {
  std::mutex mu;
  std::vector<wire::Endpoint> addresses;
  time_t fetched = 0;
};

bool IsInterfaceAddress(const wire::Endpoint& ep) noexcept {
  // getifaddrs is a netlink round trip; cache it for a few seconds.
  static NoDestructor<InterfaceCache> cache;
  std::lock_guard<std::mutex> lock(cache->mu);
  const time_t now = time(nullptr);
  if (now - cache->fetched > 5) {
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) == 0) {
      try {
        cache->addresses.clear();
        for (ifaddrs* it = list; it; it = it->ifa_next) {
          wire::Endpoint e;
          if (it->ifa_addr && wire::EndpointFromSockaddr(it->ifa_addr, &e))
            cache->addresses.push_back(e);
        }
      } catch (...) {
      }
      freeifaddrs(list);
      cache->fetched = now;
    }
  }
  for (const wire::Endpoint& e : cache->addresses) {
    if (e.family == ep.family && std::memcmp(e.addr, ep.addr, 16) == 0) return true;
  }
  return false;
}

}  // namespace

bool LocalEndpoint(int fd, wire::Endpoint* ep) noexcept {
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  return sys::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
         wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), ep);
}

bool PeerEndpoint(int fd, wire::Endpoint* ep) noexcept {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  return sys::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 &&
         wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&peer), ep);
}

bool IsLoopback(const wire::Endpoint& ep) noexcept {
  if (ep.family == 4) return ep.addr[0] == 127;
  static const uint8_t kLoop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  // (127/8 mapped into IPv6 too: an endpoint read off the wire need not be folded.)
  return std::memcmp(ep.addr, kLoop6, 16) == 0 ||
         (std::memcmp(ep.addr, kMapped, 12) == 0 && ep.addr[12] == 127);
}

bool IsLocalDestination(const sockaddr* addr) noexcept {
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(addr, &ep)) return false;
  return IsLoopback(ep) || IsInterfaceAddress(ep);
}

}  // namespace slip
