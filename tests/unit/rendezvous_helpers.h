// Helpers shared by the rendezvous tests (rendezvous_fixture.h, dir_rendezvous_test.cc):
// addresses, TCP sockets, and what a listener answered on a rendezvous connection.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "core/wire.h"

namespace slip::shm::rendezvous_helpers {

// ---------------------------------------------------------------------------- addresses

inline sockaddr_storage Addr(const char* text, uint16_t port) {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  if (inet_pton(AF_INET, text, &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    return ss;
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
  EXPECT_EQ(inet_pton(AF_INET6, text, &in6->sin6_addr), 1) << text;
  in6->sin6_family = AF_INET6;
  in6->sin6_port = htons(port);
  return ss;
}

inline const sockaddr* Sa(const sockaddr_storage& ss) {
  return reinterpret_cast<const sockaddr*>(&ss);
}
inline socklen_t Len(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

inline wire::Endpoint Ep(const sockaddr_storage& ss) {
  wire::Endpoint ep;
  EXPECT_TRUE(wire::EndpointFromSockaddr(Sa(ss), &ep));
  return ep;
}
inline wire::Endpoint Ep(const char* text, uint16_t port) {
  return Ep(Addr(text, port));
}

inline uint16_t RandomPort() {
  static std::mt19937 rng(std::random_device{}());
  return uint16_t(std::uniform_int_distribution<int>(20000, 60999)(rng));
}

inline void CloseIf(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// ---------------------------------------------------------------------------- listeners

// A TCP socket bound to `addr` (listening unless `listen_too` is false: then it only keeps
// the port from anybody else). Returns it, or -errno.
inline int TcpSocket(const sockaddr_storage& addr, bool v6only, bool listen_too,
                     bool reuseport = false) {
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1, v6 = v6only ? 1 : 0;
  if (addr.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6, sizeof(v6));
  if (reuseport) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  if (bind(fd, Sa(addr), Len(addr)) != 0 || (listen_too && listen(fd, 128) != 0)) {
    int err = -errno;
    close(fd);
    return err;
  }
  return fd;
}

// The inode of socket `fd` (what names its rendezvous).
inline uint64_t InodeOf(int fd) {
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  return uint64_t(st.st_ino);
}

inline uint16_t PortOf(int fd) {
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len), 0);
  wire::Endpoint ep;
  EXPECT_TRUE(wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &ep));
  return ep.port;
}

// Makes connected TCP socket `fd` one whose last close() would wait 30 s: its peer's window
// filled with bytes nobody reads, and SO_LINGER set to 30 s.
inline ::testing::AssertionResult MakeLingering(int fd) {
  if (fcntl(fd, F_SETFL, O_NONBLOCK) != 0) return ::testing::AssertionFailure() << "F_SETFL";
  static char junk[65536];
  while (send(fd, junk, sizeof(junk), MSG_NOSIGNAL) > 0) {
  }
  const linger lg{1, 30};
  if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) != 0)
    return ::testing::AssertionFailure() << "SO_LINGER";
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------- answers

// What the listener said on a rendezvous connection.
struct Answer {
  int find_rc = 0;       // FindRendezvous' result, when the helper called it
  bool message = false;  // a message came
  bool parsed = false;   // ... and it is one whole, valid message
  wire::Type type = wire::Type::kConfirm;
  uint64_t nonce = 0;
  wire::DeclineReason reason = wire::DeclineReason::kUnspecified;
  bool eof_after = false;  // the connection was closed after it (or without one)
};

inline std::string Describe(const Answer& a) {
  if (a.find_rc < 0) return std::string("FindRendezvous: ") + std::strerror(-a.find_rc);
  if (!a.message) return a.eof_after ? "no answer (EOF)" : "no answer";
  if (!a.parsed) return "an unparsable answer";
  if (a.type == wire::Type::kAccept) return "ACCEPT";
  if (a.type == wire::Type::kDecline) return "DECLINE " + std::to_string(int(a.reason));
  return "message type " + std::to_string(int(a.type));
}

inline Answer ReadAnswer(int sock, int timeout_ms = 2000) {
  Answer a;
  pollfd pfd{sock, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) != 1) return a;
  uint8_t buf[wire::kMaxMessageSize + 16];
  ssize_t n = recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
  if (n == 0) {
    a.eof_after = true;
    return a;
  }
  if (n < 0) return a;
  a.message = true;
  wire::Message msg;
  size_t used = 0;
  if (wire::ParseMessage(buf, size_t(n), &msg, &used) == wire::ParseStatus::kOk &&
      used == size_t(n)) {
    a.parsed = true;
    a.type = msg.type;
    if (msg.type == wire::Type::kAccept) a.nonce = msg.accept.nonce;
    if (msg.type == wire::Type::kDecline) {
      a.nonce = msg.decline.nonce;
      a.reason = msg.decline.reason;
    }
  }
  pfd = pollfd{sock, POLLIN, 0};
  a.eof_after = poll(&pfd, 1, 1000) == 1 && recv(sock, buf, sizeof(buf), MSG_DONTWAIT) == 0;
  return a;
}

// How long a registration the listener keeps is watched for an answer that must not come
// (it comes when the connection is taken, or the registration dropped).
inline constexpr int kQuietMs = 100;

// The listener kept the registration: no answer yet, the rendezvous connection open.
inline ::testing::AssertionResult IsKept(const Answer& a) {
  if (a.find_rc < 0 || a.message || a.eof_after)
    return ::testing::AssertionFailure() << "expected no answer yet, got " << Describe(a);
  return ::testing::AssertionSuccess();
}

// (`nonce` by reference: read after the argument that fills it in was evaluated.)
inline ::testing::AssertionResult IsAccept(const Answer& a, const uint64_t& nonce) {
  if (!a.parsed || a.type != wire::Type::kAccept)
    return ::testing::AssertionFailure() << "expected ACCEPT, got " << Describe(a);
  if (a.nonce != nonce) return ::testing::AssertionFailure() << "ACCEPT for another nonce";
  if (!a.eof_after) return ::testing::AssertionFailure() << "more than one message, or no EOF";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult IsDecline(const Answer& a, const uint64_t& nonce,
                                            wire::DeclineReason why) {
  if (!a.parsed || a.type != wire::Type::kDecline || a.reason != why)
    return ::testing::AssertionFailure()
           << "expected DECLINE " << int(why) << ", got " << Describe(a);
  if (a.nonce != nonce) return ::testing::AssertionFailure() << "DECLINE for another nonce";
  if (!a.eof_after) return ::testing::AssertionFailure() << "more than one message, or no EOF";
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------- other uids

// A process of another uid holding a rendezvous name (abstract names have no owner): it
// accepts what connects and tells what it received.
class Squatter {
 public:
  struct Report {
    int accepted = -1;
    ssize_t bytes = 0;
    int fds = 0;
  };

  // Binds `name` as `uid`; false when the name is taken.
  bool Start(const sockaddr_un& name, socklen_t len, uid_t uid) {
    int ready[2], go[2];
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      close(go[1]);
      char ok = 0;
      int s = -1;
      if (setgid(uid) == 0 && setuid(uid) == 0) {
        s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        ok = s >= 0 && bind(s, reinterpret_cast<const sockaddr*>(&name), len) == 0 &&
             listen(s, 16) == 0;
      }
      if (write(ready[1], &ok, 1) != 1 || !ok) _exit(0);
      char c;
      if (read(go[0], &c, 1) != 1) _exit(0);
      Report report;
      report.accepted = 0;
      for (;;) {
        int conn = accept4(s, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (conn < 0) break;
        ++report.accepted;
        pollfd pfd{conn, POLLIN, 0};
        poll(&pfd, 1, 300);
        uint8_t buf[512];
        iovec iov{buf, sizeof(buf)};
        alignas(cmsghdr) char control[CMSG_SPACE(16 * sizeof(int))];
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control;
        mh.msg_controllen = sizeof(control);
        ssize_t n = recvmsg(conn, &mh, MSG_DONTWAIT);
        if (n > 0) report.bytes += n;
        if (n >= 0 && mh.msg_controllen > 0) ++report.fds;
        close(conn);
      }
      (void)!write(ready[1], &report, sizeof(report));
      _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    ready_ = ready[0];
    go_ = go[1];
    char ok = 0;
    pollfd pfd{ready_, POLLIN, 0};
    if (poll(&pfd, 1, 10000) != 1 || read(ready_, &ok, 1) != 1 || !ok) {
      Stop();
      return false;
    }
    return true;
  }
  // Looks at what came, then lets go of the name.
  Report Finish() {
    Report report;
    char go = 'g';
    pollfd pfd{ready_, POLLIN, 0};
    if (write(go_, &go, 1) != 1 || poll(&pfd, 1, 10000) != 1 ||
        read(ready_, &report, sizeof(report)) != ssize_t(sizeof(report)))
      ADD_FAILURE() << "the squatter did not report";
    Stop();
    return report;
  }
  ~Squatter() { Stop(); }

 private:
  void Stop() {
    CloseIf(&go_);
    CloseIf(&ready_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid_ = -1;
  int ready_ = -1, go_ = -1;
};

}  // namespace slip::shm::rendezvous_helpers
