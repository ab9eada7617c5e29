// Where the data links of a test come from: the client opens them, the server accepts them.
// Sockets connect to and accept from a TCP port (net.h); a native transport builds them
// over the control channel of a process pair (shm_native.h).
#pragma once

#include <functional>
#include <memory>

#include "tools/slip-perf/link.h"

namespace slipperf {

class Connector {
 public:
  virtual ~Connector() = default;
  // Opens one data link. Safe to call from several threads at once (crr).
  virtual std::unique_ptr<Link> Open() = 0;
};

class Acceptor {
 public:
  virtual ~Acceptor() = default;
  // Waits for the next data link. `give_up` is asked now and then while nothing arrives;
  // once it says true, returns nullptr. Safe to call from several threads at once (crr).
  virtual std::unique_ptr<Link> Accept(const std::function<bool()>& give_up) = 0;
};

}  // namespace slipperf
