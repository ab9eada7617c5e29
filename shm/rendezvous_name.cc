// Rendezvous names: which abstract socket serves which listener (shm/rendezvous_name.h).
#include "shm/rendezvous_name.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "core/wire.h"

namespace slip::shm {

namespace {

// "v2": the listener answers each registration (ACCEPT or DECLINE) and the client confirms
// only after ACCEPT. A v1 peer (which never answers, or never waits) finds no name of ours.
void MakeName(uint16_t port, const char* scope, sockaddr_un* out, socklen_t* len) noexcept {
  std::memset(out, 0, sizeof(*out));
  out->sun_family = AF_UNIX;
  // Abstract name: leading NUL, no terminator.
  int n = std::snprintf(out->sun_path + 1, sizeof(out->sun_path) - 1, "slipstream-v2:%u:%s",
                        unsigned(port), scope);
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
}

}  // namespace

bool RendezvousNameFor(const sockaddr* local, bool v6only, sockaddr_un* out,
                       socklen_t* len) noexcept {
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(local, &ep)) return false;
  char scope[INET6_ADDRSTRLEN + 4];
  static const uint8_t kZero[16] = {};
  bool any = std::memcmp(ep.addr, kZero, ep.family == 4 ? 4 : 16) == 0;
  if (any && local->sa_family == AF_INET) {
    std::strcpy(scope, "*4");
  } else if (any) {
    std::strcpy(scope, v6only ? "*6" : "*");
  } else {
    inet_ntop(ep.family == 4 ? AF_INET : AF_INET6, ep.addr, scope, sizeof(scope));
  }
  MakeName(ep.port, scope, out, len);
  return true;
}

int RendezvousNamesFor(const sockaddr* dest, sockaddr_un out[3], socklen_t lens[3]) noexcept {
  wire::Endpoint ep;
  if (!wire::EndpointFromSockaddr(dest, &ep)) return 0;
  char exact[INET6_ADDRSTRLEN];
  inet_ntop(ep.family == 4 ? AF_INET : AF_INET6, ep.addr, exact, sizeof(exact));
  MakeName(ep.port, exact, &out[0], &lens[0]);
  MakeName(ep.port, ep.family == 4 ? "*4" : "*6", &out[1], &lens[1]);
  MakeName(ep.port, "*", &out[2], &lens[2]);
  return 3;
}

}  // namespace slip::shm
