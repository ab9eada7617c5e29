#include "core/offer_steps.h"

#include <netinet/in.h>

#include <cstring>
#include <new>

#include "core/local_address.h"
#include "core/proxy.h"
#include "core/sys.h"

namespace slip {

bool BindToSource(int family, int fd, const sockaddr_storage& source,
                  wire::Endpoint* client) noexcept {
  sockaddr_storage bind_to = source;
  socklen_t bind_len = source.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (family == AF_INET6 && source.ss_family == AF_INET) {
    sockaddr_in6 mapped{};
    mapped.sin6_family = AF_INET6;
    mapped.sin6_addr.s6_addr[10] = mapped.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&mapped.sin6_addr.s6_addr[12],
                &reinterpret_cast<const sockaddr_in*>(&source)->sin_addr, 4);
    std::memcpy(&bind_to, &mapped, sizeof(mapped));
    bind_len = sizeof(mapped);
  }
  return sys::bind(fd, reinterpret_cast<sockaddr*>(&bind_to), bind_len) == 0 &&
         LocalEndpoint(fd, client);
}

bool MakeProxies(int* a, int* b) noexcept {
  int pair[2];
  if (proxy::CreatePair(pair) != 0) return false;
  *a = sys::MoveHigh(pair[0], sys::HiddenFdFloor());
  *b = sys::MoveHigh(pair[1], sys::HiddenFdFloor());
  return true;
}

void CloseProxies(int* a, int* b) noexcept {
  if (*a >= 0) sys::close(*a);
  if (*b >= 0) sys::close(*b);
  *a = *b = -1;
}

std::unique_ptr<Stream> MakeStream(std::unique_ptr<Channel> channel, int* a, int* b,
                                   const Config& config) noexcept {
  StreamOptions options;
  options.spin_us = config.spin_us;
  std::unique_ptr<Stream> stream(new (std::nothrow) Stream(std::move(channel), *a, *b, options));
  if (stream) *a = *b = -1;  // the stream's
  return stream;
}

}  // namespace slip
