// The shm transport driven natively: the library's own region, rings, readiness proxies and
// slip::Stream, between two processes, with no socket on the data path and no preload.
// A link is built the way the shim builds one: the client prepares the region and proxies
// (shm::PrepareOffer) and passes them to the server over the control socket with
// SCM_RIGHTS (the shim uses its rendezvous), and each side wraps its channel in a Stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>

#include "tools/slip-perf/endpoints.h"

namespace slipperf {

// Watches the control socket between the two processes: once the other one is gone, every
// link still open is aborted. Without it a blocked Recv would wait for ever, since this
// process itself holds a duplicate of the descriptor that would report the peer's end.
class PeerWatch {
 public:
  explicit PeerWatch(int control_fd);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  void Add(Link* link);
  void Remove(Link* link);

 private:
  void Run();

  const int fd_;
  std::mutex mu_;
  std::set<Link*> links_;
  bool peer_gone_ = false;
  std::atomic<bool> done_{false};
  std::thread thread_;  // last: starts once the members above exist
};

// The client side: each Open builds a region and sends it over `control_fd`.
class ShmConnector final : public Connector {
 public:
  ShmConnector(int control_fd, uint32_t ring_size, uint32_t spin_us, PeerWatch* watch)
      : fd_(control_fd), ring_size_(ring_size), spin_us_(spin_us), watch_(watch) {}
  std::unique_ptr<Link> Open() override;

 private:
  int fd_;
  uint32_t ring_size_;
  uint32_t spin_us_;
  PeerWatch* watch_;
};

// The server side: each Accept receives a region from `control_fd` and maps it. It reads
// the control socket, so it runs on the thread that reads the session's messages.
class ShmAcceptor final : public Acceptor {
 public:
  ShmAcceptor(int control_fd, uint32_t spin_us, PeerWatch* watch)
      : fd_(control_fd), spin_us_(spin_us), watch_(watch) {}
  std::unique_ptr<Link> Accept(const std::function<bool()>& give_up) override;

 private:
  int fd_;
  uint32_t spin_us_;
  PeerWatch* watch_;
};

}  // namespace slipperf
