#include "tools/slip-perf/shm_native.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>
#include <system_error>

#include "core/stream.h"
#include "shm/transport.h"
#include "tools/slip-perf/codec.h"
#include "tools/slip-perf/fd_passing.h"
#include "tools/slip-perf/net.h"
#include "tools/slip-perf/protocol.h"

namespace slipperf {
namespace {

// How often the watch looks whether it should stop.
constexpr int kWatchPollMs = 100;

// What goes with the descriptors: magic u32 | ring_size u32 | nonce u64 | region_size u64.
// The descriptors: the region's memfd, the server's proxy pair, the client's proxy B: the
// same four that the shim's REGISTER carries.
constexpr size_t kOfferBytes = 24;
constexpr int kOfferFds = 4;

[[noreturn]] void ThrowCode(int negative_errno, const char* what) {
  throw std::system_error(-negative_errno, std::generic_category(), what);
}

class StreamLink final : public Link {
 public:
  StreamLink(std::unique_ptr<slip::Channel> channel, int proxy_a, int proxy_b, uint32_t spin_us,
             PeerWatch* watch)
      : stream_(std::move(channel), proxy_a, proxy_b, slip::StreamOptions{.spin_us = spin_us}),
        watch_(watch) {
    watch_->Add(this);
  }
  ~StreamLink() override {
    watch_->Remove(this);
    stream_.Close();
  }

  size_t SendSome(const void* data, size_t len) override {
    iovec iov{const_cast<void*>(data), len};
    for (;;) {
      CheckStop();
      const ssize_t n = stream_.Send(&iov, 1, MSG_NOSIGNAL, /*nonblocking=*/false);
      if (n > 0) return static_cast<size_t>(n);
      if (n < 0 && n != -EINTR) ThrowCode(static_cast<int>(n), "shm send");
    }
  }

  size_t RecvSome(void* data, size_t len) override {
    iovec iov{data, len};
    for (;;) {
      CheckStop();
      const ssize_t n = stream_.Recv(&iov, 1, 0, /*nonblocking=*/false);
      if (n >= 0) return static_cast<size_t>(n);
      if (n != -EINTR) ThrowCode(static_cast<int>(n), "shm recv");
    }
  }

  void ShutdownWrite() override {
    if (const int rc = stream_.ShutdownWrite(); rc < 0) ThrowCode(rc, "shm shutdown");
  }

  void Abort() noexcept override {
    stream_.MarkPeerGone();
    stream_.ShutdownRead();
  }

 private:
  slip::Stream stream_;
  PeerWatch* watch_;
};

}  // namespace

PeerWatch::PeerWatch(int control_fd) : fd_(control_fd), thread_([this] { Run(); }) {}

PeerWatch::~PeerWatch() {
  done_ = true;
  thread_.join();
}

void PeerWatch::Add(Link* link) {
  std::lock_guard<std::mutex> lock(mu_);
  links_.insert(link);
  if (peer_gone_) link->Abort();
}

void PeerWatch::Remove(Link* link) {
  std::lock_guard<std::mutex> lock(mu_);
  links_.erase(link);
}

void PeerWatch::Run() {
  while (!done_) {
    // No events asked for: poll reports only POLLHUP and POLLERR, never the session's own
    // messages, which the session reads.
    pollfd p{fd_, 0, 0};
    if (poll(&p, 1, kWatchPollMs) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) {
      std::lock_guard<std::mutex> lock(mu_);
      peer_gone_ = true;
      for (Link* link : links_) link->Abort();
      return;
    }
  }
}

std::unique_ptr<Link> ShmConnector::Open() {
  slip::shm::NativeRegion region;
  int proxy_a = -1;
  int proxy_b = -1;
  int error = 0;
  std::unique_ptr<slip::Channel> channel =
      slip::shm::OpenNative(ring_size_, &region, &proxy_a, &proxy_b, &error);
  if (!channel) ThrowCode(error, "shm: preparing a region");
  const auto message = Writer<kOfferBytes>()
                           .Put(kMagic)
                           .Put(region.ring_size)
                           .Put(region.nonce)
                           .Put(region.region_size)
                           .bytes();
  SendWithFds(fd_, message.data(), message.size(), region.fds, kOfferFds);
  for (int fd : region.fds) close(fd);  // (the server has its own now)
  return std::make_unique<StreamLink>(std::move(channel), proxy_a, proxy_b, spin_us_, watch_);
}

std::unique_ptr<Link> ShmAcceptor::Accept(const std::function<bool()>&) {
  std::array<uint8_t, kOfferBytes> message;
  slip::shm::NativeRegion region;
  const int count = RecvWithFds(fd_, message.data(), message.size(), region.fds);
  if (count < 0) throw std::runtime_error("the client closed instead of sending a region");
  Reader in(message);
  if (in.Get<uint32_t>() != kMagic || count != kOfferFds) {
    for (int fd : region.fds) {
      if (fd >= 0) close(fd);
    }
    throw std::runtime_error("protocol error: expected a region and its descriptors");
  }
  region.ring_size = in.Get<uint32_t>();
  region.nonce = in.Get<uint64_t>();
  region.region_size = in.Get<uint64_t>();
  int proxy_a = -1;
  int proxy_b = -1;
  int reason = 0;
  // The region and proxies are checked as a listener checks a registration.
  std::unique_ptr<slip::Channel> channel =
      slip::shm::AcceptNative(region, &proxy_a, &proxy_b, &reason);
  if (!channel) {
    throw std::runtime_error("shm: the region is unusable (reason " + std::to_string(reason) + ")");
  }
  return std::make_unique<StreamLink>(std::move(channel), proxy_a, proxy_b, spin_us_, watch_);
}

}  // namespace slipperf
