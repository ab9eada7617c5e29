#include "tools/slip-perf/link.h"

#include <cstdint>
#include <stdexcept>

namespace slipperf {

void SendAll(Link& link, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    const size_t n = link.SendSome(p, len);
    p += n;
    len -= n;
  }
}

bool RecvAll(Link& link, void* data, size_t len) {
  auto* p = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < len) {
    const size_t n = link.RecvSome(p + got, len - got);
    if (n == 0) {
      if (got == 0) return false;
      throw std::runtime_error("peer closed the connection in the middle of a message");
    }
    got += n;
  }
  return true;
}

void ExpectEof(Link& link) {
  uint8_t byte;
  if (link.RecvSome(&byte, 1) != 0) throw std::runtime_error("unexpected data before close");
}

}  // namespace slipperf
