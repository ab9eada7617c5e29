// Unit tests for core/sock_diag.h's lookups that a fabric listener makes: which local
// user's socket sent a datagram, and whether a TCP connection exists at this host.
#include "core/sock_diag.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace slip {
namespace {

sockaddr_in Loopback(uint8_t last, uint16_t port = 0) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(0x7f000000u | last);
  return a;
}

sockaddr_in NameOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  return a;
}

const sockaddr* Sa(const sockaddr_in& a) {
  return reinterpret_cast<const sockaddr*>(&a);
}

// The sender's socket is found from the receiver's side, whichever loopback address it
// sends from, and names its owner; once it is closed, nothing is.
TEST(SockDiag, FindsTheSocketThatSentADatagram) {
  const int receiver = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(receiver, 0);
  sockaddr_in at = Loopback(1);
  ASSERT_EQ(bind(receiver, Sa(at), sizeof(at)), 0);
  at = NameOf(receiver);
  const int sender = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(sender, 0);
  sockaddr_in from = Loopback(42);
  ASSERT_EQ(bind(sender, Sa(from), sizeof(from)), 0);
  ASSERT_EQ(connect(sender, Sa(at), sizeof(at)), 0);
  from = NameOf(sender);
  struct stat st {};
  ASSERT_EQ(fstat(sender, &st), 0);
  SocketInfo info;
  ASSERT_EQ(FindUdpSender(Sa(at), Sa(from), &info), 0);
  EXPECT_EQ(info.uid, geteuid());
  EXPECT_EQ(info.inode, st.st_ino);
  close(sender);
  EXPECT_EQ(FindUdpSender(Sa(at), Sa(from), &info), -ENOENT);
  close(receiver);
}

// A connection to a listener shows from the server's side while it waits in the backlog
// (and so while it is in the handshake); a 4-tuple nobody connected does not.
TEST(SockDiag, FindsAServersConnectionBeforeItsAccept) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in at = Loopback(1);
  ASSERT_EQ(bind(listener, Sa(at), sizeof(at)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  at = NameOf(listener);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  ASSERT_EQ(connect(client, Sa(at), sizeof(at)), 0);
  const sockaddr_in from = NameOf(client);
  SocketInfo info;
  EXPECT_EQ(FindConnection(Sa(at), Sa(from), &info), 0);
  sockaddr_in nobody = from;
  nobody.sin_port = htons(ntohs(from.sin_port) == 65535 ? 1 : ntohs(from.sin_port) + 1);
  EXPECT_EQ(FindConnection(Sa(at), Sa(nobody), &info), -ENOENT);
  close(client);
  close(listener);
}

}  // namespace
}  // namespace slip
