// Both ends of one shm connection, built as the shim builds them, for tests of the stream
// engine in one process (no mocks: the real shm channel and readiness proxies).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>

#include "core/stream.h"
#include "core/wire.h"
#include "shm/region.h"
#include "shm/shm.h"

namespace slip {

struct StreamPair {
  std::unique_ptr<Stream> client;
  std::unique_ptr<Stream> server;
  int client_fd = -1;  // proxy A of each end: the application's descriptor
  int server_fd = -1;
};

// Builds both ends of one connection like production: the client prepares the offer; the
// server gets what REGISTER would carry over SCM_RIGHTS (duplicates of the memfd, the
// server's proxy pair and the client's B, taken before MakeClientChannel consumes the
// offer's descriptors) and accepts it against the client's CONFIRM.
// `wrap_server`, when given, wraps the server's real channel (to watch what it is told).
using ChannelWrap = std::function<std::unique_ptr<Channel>(std::unique_ptr<Channel>)>;

inline ::testing::AssertionResult MakeStreamPair(uint32_t ring_size, StreamOptions options,
                                                 StreamPair* out,
                                                 const ChannelWrap& wrap_server = {}) {
  shm::Offer offer;
  if (int rc = shm::PrepareOffer(ring_size, &offer); rc != 0)
    return ::testing::AssertionFailure() << "PrepareOffer: " << std::strerror(-rc);
  int fds[4];
  const int carried[4] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b};
  for (int i = 0; i < 4; ++i) {
    fds[i] = fcntl(carried[i], F_DUPFD_CLOEXEC, 0);
    if (fds[i] < 0) return ::testing::AssertionFailure() << "dup: " << std::strerror(errno);
  }
  wire::Register reg;
  reg.nonce = offer.nonce;
  reg.ring_size = ring_size;
  reg.region_size = shm::RegionSize(ring_size);
  reg.fd_count = 4;

  int client_a = -1, client_b = -1;
  std::unique_ptr<Channel> client =
      shm::MakeClientChannel(&offer, /*rendezvous=*/-1, {}, {}, &client_a, &client_b);
  if (!client) return ::testing::AssertionFailure() << "MakeClientChannel failed";
  out->client = std::make_unique<Stream>(std::move(client), client_a, client_b, options);
  out->client_fd = client_a;

  int server_a = -1, server_b = -1;
  wire::DeclineReason reason = wire::DeclineReason::kUnspecified;
  std::unique_ptr<Channel> server =
      shm::AcceptRegistration(reg, fds, /*anchor=*/-1, &server_a, &server_b, nullptr, &reason);
  if (!server) return ::testing::AssertionFailure() << "AcceptRegistration: reason " << int(reason);
  if (wrap_server) server = wrap_server(std::move(server));
  out->server = std::make_unique<Stream>(std::move(server), server_a, server_b, options);
  out->server_fd = server_a;
  return ::testing::AssertionSuccess();
}

}  // namespace slip
