// A client of a plain server (a listening socket that publishes no rendezvous) asks the
// kernel once, then goes plain at once for a second (shm's negative cache, in
// ShmTransport::Offer); one that found nothing listening asks again at its next connect,
// so that a client retrying until its server is up finds the rendezvous the moment there
// is one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>

#include "core/config.h"
#include "core/stats.h"
#include "core/transport.h"
#include "shm/shm.h"
#include "shm/transport.h"
#include "tests/unit/rendezvous_helpers.h"

namespace slip::shm {
namespace {

using namespace rendezvous_helpers;  // NOLINT(google-build-using-namespace)

// What shm's transport offers for a connection to 127.0.0.1:port (null: plain, *why).
std::unique_ptr<ClientOffer> OfferTo(uint16_t port, Reason* why) {
  static const Config config;
  ConnectRequest req;
  req.family = AF_INET;
  req.dest_storage = Addr("127.0.0.1", port);
  req.dest_len = sizeof(sockaddr_in);
  req.server = Ep("127.0.0.1", port);
  req.config = &config;
  *why = Reason::kNone;
  return TheTransport()->Offer(req, why);
}

// A listening TCP socket on a free port: *port, the socket.
int ListenSomewhere(uint16_t* port) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    *port = RandomPort();
    const int fd = TcpSocket(Addr("127.0.0.1", *port), false, /*listen_too=*/true);
    if (fd >= 0) return fd;
  }
  return -1;
}

TEST(PlainListenerCacheTest, APlainListenerIsAskedOnceThenRememberedForASecond) {
  uint16_t port = 0;
  int listener = ListenSomewhere(&port);
  ASSERT_GE(listener, 0);
  Reason why;
  EXPECT_FALSE(OfferTo(port, &why));
  EXPECT_EQ(why, Reason::kPeerNotSlipstream);
  // The server starts publishing (as if it restarted under Slipstream): the client still
  // remembers it as plain...
  int error = 0;
  auto rendezvous = Rendezvous::Publish(port, InodeOf(listener), StreamOptions{}, &error);
  ASSERT_TRUE(rendezvous) << error;
  EXPECT_FALSE(OfferTo(port, &why));
  EXPECT_EQ(why, Reason::kPeerNotSlipstream);
  // ... for a second, no longer.
  usleep(1100 * 1000);
  auto offer = OfferTo(port, &why);
  EXPECT_TRUE(offer) << ReasonName(why);
  offer.reset();
  rendezvous.reset();
  close(listener);
}

TEST(PlainListenerCacheTest, NothingListeningIsNotRemembered) {
  uint16_t port = 0;
  int listener = ListenSomewhere(&port);
  ASSERT_GE(listener, 0);
  close(listener);  // the port, free again: nothing listens there
  Reason why;
  EXPECT_FALSE(OfferTo(port, &why));
  EXPECT_EQ(why, Reason::kPeerNotSlipstream);
  listener = TcpSocket(Addr("127.0.0.1", port), false, /*listen_too=*/true);
  ASSERT_GE(listener, 0) << "port " << port << " taken meanwhile";
  int error = 0;
  auto rendezvous = Rendezvous::Publish(port, InodeOf(listener), StreamOptions{}, &error);
  ASSERT_TRUE(rendezvous) << error;
  // The server is up: found at once.
  auto offer = OfferTo(port, &why);
  EXPECT_TRUE(offer) << ReasonName(why);
  offer.reset();
  rendezvous.reset();
  close(listener);
}

}  // namespace
}  // namespace slip::shm
