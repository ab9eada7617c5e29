// 127.0.0.<last> port <port>, as the listeners' tables see a peer (unit tests).
#pragma once

#include <cstdint>

#include "core/wire.h"

namespace slip::test {

inline wire::Endpoint LoopbackAt(uint8_t last, uint16_t port) {
  wire::Endpoint e;
  e.family = 4;
  e.port = port;
  e.addr[0] = 127;
  e.addr[3] = last;
  return e;
}

}  // namespace slip::test
