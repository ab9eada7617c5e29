// What the tests of the shm rendezvous share (rendezvous_find_test.cc,
// rendezvous_registration_test.cc, rendezvous_claim_test.cc, rendezvous_accept_test.cc):
// servers that publish a rendezvous, real TCP connections for the 4-tuples a test takes,
// raw messages, a forked child of another uid, and the registration fixture.
//
// Abstract socket names are shared by everything in the network namespace, so every test
// publishes on a port of its own, chosen at random and retried while the port or the name
// is taken. FindRendezvous only uses a rendezvous for a port a real TCP socket listens
// on, so the tests listen there as the rendezvous claims. Take only takes the registration
// of the owner of the connection's client socket, as the kernel sees it, so every 4-tuple a
// test means to take is a real loopback connection's (TcpClient). The tests run as root;
// "another uid" is a forked child that setuid()s to nobody.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/channel.h"
#include "core/sock_diag.h"
#include "core/stream.h"
#include "core/sys.h"
#include "core/wire.h"
#include "shm/region.h"
#include "shm/rendezvous_name.h"
#include "shm/shm.h"
#include "tests/unit/rendezvous_helpers.h"

namespace slip::shm::rendezvous_fixture {

using namespace rendezvous_helpers;  // NOLINT(google-build-using-namespace)

inline constexpr uint32_t kRing = 4096;
inline constexpr uid_t kNobody = 65534;
inline constexpr int kTimeoutMs = 60000;  // settling deadlines the tests never reach by waiting

// ---------------------------------------------------------------------------- addresses

inline bool HasIpv6Loopback() {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const sockaddr_storage any = Addr("::1", 0);
  const bool ok = bind(fd, Sa(any), Len(any)) == 0;
  close(fd);
  return ok;
}

#define SKIP_UNLESS_ROOT() \
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a child that setuid()s to another uid)"
#define SKIP_UNLESS_IPV6() \
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback"

inline void SleepMs(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// ---------------------------------------------------------------------------- descriptors

inline int CountOpenFds() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory's own descriptor
}

inline bool IsOpen(int fd) {
  return fd >= 0 && fcntl(fd, F_GETFD) != -1;
}

inline bool IsSocket(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

// Sets the hidden-descriptor floor for a scope.
class FloorGuard {
 public:
  explicit FloorGuard(int floor) : saved_(sys::HiddenFdFloor()) { sys::SetHiddenFdFloor(floor); }
  ~FloorGuard() { sys::SetHiddenFdFloor(saved_); }

 private:
  int saved_;
};

inline int SoftFdLimit() {
  rlimit rl{};
  EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  return int(rl.rlim_cur);
}

// Opens the process' netlink socket (core/sock_diag) before a test counts descriptors.
inline void WarmUpNetlink() {
  uint64_t peer = 0;
  UnixPeer(1, &peer);
}

// ---------------------------------------------------------------------------- listeners

// Publishes the rendezvous of TCP socket `tcp` (bound).
inline std::unique_ptr<Rendezvous> Publish(int tcp, int* error) {
  *error = 0;
  return Rendezvous::Publish(PortOf(tcp), InodeOf(tcp), StreamOptions{}, error);
}

// Publishes with a table of `capacity` entries: the capacity comes from the descriptor space
// above the floor when the rendezvous is published (a sixth of it, after 32 kept for the
// process's other hidden descriptors).
inline std::unique_ptr<Rendezvous> PublishWithCapacity(int tcp, size_t capacity, int* error) {
  constexpr int kReserve = 32;  // shm/rendezvous.cc, CapacityFor
  FloorGuard floor(SoftFdLimit() - int(6 * capacity) - kReserve);
  return Publish(tcp, error);
}

// A TCP listener (or only its port, kept by a socket that does not listen) and the
// rendezvous published for it.
struct Server {
  uint16_t port = 0;
  int tcp = -1;
  std::unique_ptr<Rendezvous> rv;
  ~Server() {
    rv.reset();
    CloseIf(&tcp);
  }
  sockaddr_storage To(const char* addr) const { return Addr(addr, port); }
  wire::Endpoint Endpoint(const char* addr) const { return Ep(addr, port); }
};

// `tcp_addr`: where the TCP listener binds (nullptr: nothing listens; the port is kept by a
// bound socket on `rv_addr`). `rv_addr`: null for no rendezvous; else the socket's own is
// published. `capacity`: 0 for the default.
inline std::unique_ptr<Server> StartServer(const char* tcp_addr, const char* rv_addr,
                                           bool v6only = false, size_t capacity = 0) {
  auto server = std::make_unique<Server>();
  for (int attempt = 0; attempt < 100; ++attempt) {
    server->port = RandomPort();
    server->tcp = TcpSocket(Addr(tcp_addr ? tcp_addr : rv_addr, server->port), v6only,
                            /*listen_too=*/tcp_addr != nullptr);
    if (server->tcp < 0) continue;
    if (!rv_addr) return server;
    int error = 0;
    server->rv = capacity ? PublishWithCapacity(server->tcp, capacity, &error)
                          : Publish(server->tcp, &error);
    if (server->rv) return server;
    EXPECT_EQ(error, -EADDRINUSE);
    CloseIf(&server->tcp);
  }
  ADD_FAILURE() << "no free port";
  return nullptr;
}

// ---------------------------------------------------------------------------- connections

// Connects a TCP socket to `dest` (the kernel picks the client's port). Returns the
// connected socket and its local end in *local, or -errno. (No gtest here: a UidChild's
// child uses it too.)
inline int ConnectTcp(const sockaddr_storage& dest, sockaddr_storage* local) {
  int fd = socket(dest.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  socklen_t len = sizeof(*local);
  if (connect(fd, Sa(dest), Len(dest)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(local), &len) != 0) {
    const int err = -errno;
    close(fd);
    return err;
  }
  return fd;
}

// A TCP socket bound to 127.0.0.1 (the kernel picks the port) and not connected: its
// local end in *local. Returns it, or -errno.
inline int BindLoopback(sockaddr_storage* local) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  *local = Addr("127.0.0.1", 0);
  socklen_t len = sizeof(*local);
  if (bind(fd, Sa(*local), Len(*local)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(local), &len) != 0) {
    const int err = -errno;
    close(fd);
    return err;
  }
  return fd;
}

// A real TCP connection to `dest`, for a 4-tuple a test registers and takes: Take asks the
// kernel who owns the client socket whose local end is the 4-tuple's client and whose peer
// is its server, and takes only a registration of that uid. The client socket (this
// process's: root's, when the tests run as root) stays connected as long as the object;
// the server's end waits in the listener's backlog unless a test accepts it.
class TcpClient {
 public:
  TcpClient() = default;
  explicit TcpClient(const sockaddr_storage& dest) {
    sockaddr_storage local{};
    const int fd = ConnectTcp(dest, &local);
    if (fd < 0) {
      ADD_FAILURE() << "TCP connect: " << std::strerror(-fd);
      return;
    }
    fd_ = fd;
    ep_ = Ep(local);
  }
  TcpClient(TcpClient&& o) noexcept : fd_(std::exchange(o.fd_, -1)), ep_(o.ep_) {}
  TcpClient& operator=(TcpClient&& o) noexcept {
    if (this != &o) {
      CloseIf(&fd_);
      fd_ = std::exchange(o.fd_, -1);
      ep_ = o.ep_;
    }
    return *this;
  }
  ~TcpClient() { CloseIf(&fd_); }

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // The 4-tuple's client end (the socket's local address).
  const wire::Endpoint& ep() const { return ep_; }

 private:
  int fd_ = -1;
  wire::Endpoint ep_;
};

// ---------------------------------------------------------------------------- messages

// A datagram on a connected rendezvous socket, with `nfds` descriptors attached.
inline ssize_t SendRaw(int sock, const void* data, size_t len, const int* fds, int nfds) {
  iovec iov{const_cast<void*>(data), len};
  std::vector<char> control(CMSG_SPACE(size_t(nfds) * sizeof(int)), 0);
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds > 0) {
    mh.msg_control = control.data();
    mh.msg_controllen = control.size();
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(size_t(nfds) * sizeof(int));
    std::memcpy(CMSG_DATA(cm), fds, size_t(nfds) * sizeof(int));
  }
  return sendmsg(sock, &mh, MSG_NOSIGNAL);
}

inline std::vector<uint8_t> Encode(const wire::Message& msg) {
  std::vector<uint8_t> buf(wire::kMaxMessageSize);
  buf.resize(wire::EncodeMessage(msg, buf.data(), buf.size()));
  EXPECT_FALSE(buf.empty());
  return buf;
}

inline wire::Register RegisterFor(const Offer& offer, const wire::Endpoint& client,
                                  const wire::Endpoint& server) {
  wire::Register reg;
  reg.client = client;
  reg.server = server;
  reg.nonce = offer.nonce;
  reg.ring_size = offer.ring_size;
  reg.fd_count = 4;
  reg.region_size = offer.region_size;
  return reg;
}

// Registers `offer` (prepared here) for (client, server) at the rendezvous a connection to
// `dest` finds, lets `rv` read it, and returns the answer (none, when it keeps it).
inline Answer RegisterVia(Rendezvous* rv, const sockaddr_storage& dest,
                          const wire::Endpoint& client, const wire::Endpoint& server,
                          Offer* offer) {
  Answer a;
  int sock = FindRendezvous(Sa(dest));
  if (sock < 0) {
    a.find_rc = sock;
    return a;
  }
  int rc = PrepareOffer(kRing, offer);
  if (rc == 0) rc = SendRegister(sock, *offer, client, server);
  EXPECT_EQ(rc, 0) << std::strerror(-rc);
  rv->Drain();
  a = ReadAnswer(sock, kQuietMs);
  close(sock);
  return a;
}

inline std::atomic<uint32_t>& ClaimOf(const Offer& offer) {
  return static_cast<RegionControl*>(offer.region)->header.claim;
}
inline Claim ClaimValue(const Offer& offer) {
  return Claim(ClaimOf(offer).load());
}

// ---------------------------------------------------------------------------- other uids

// A forked child running as another uid: a client of the rendezvous (registering, reading
// its claims) and the owner of TCP connections, on the parent's command.
class UidChild {
 public:
  explicit UidChild(uid_t uid) {
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(to[1]);
      close(from[0]);
      in_ = to[0];
      out_ = from[1];
      _exit(setgid(uid) == 0 && setuid(uid) == 0 ? Serve() : 3);
    }
    close(to[0]);
    close(from[1]);
    out_ = to[1];
    in_ = from[0];
  }
  ~UidChild() {
    if (pid_ > 0) {
      Command quit;
      quit.op = 'Q';
      Write(out_, quit);
      close(out_);
      close(in_);
      int status = 0;
      waitpid(pid_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    }
  }
  bool ok() const { return pid_ > 0; }

  // Registers a fresh offer of the child's for (client, server) at the rendezvous for
  // `dest`; `rv` reads it in between. The child keeps the offer: its index is the number
  // of registrations before it.
  Answer Register(Rendezvous* rv, const sockaddr_storage& dest, const wire::Endpoint& client,
                  const wire::Endpoint& server, uint64_t* nonce) {
    Command cmd;
    cmd.op = 'R';
    cmd.dest = dest;
    cmd.client = client;
    cmd.server = server;
    Reply sent = Ask(cmd);
    if (sent.rc < 0) {
      Answer a;
      a.find_rc = sent.rc;
      return a;
    }
    *nonce = sent.nonce;
    rv->Drain();
    Reply answered;
    EXPECT_TRUE(Read(in_, &answered)) << "child gone";
    return answered.answer;
  }
  Claim ReadClaim(int index) {
    Command cmd;
    cmd.op = 'C';
    cmd.index = index;
    return Claim(Ask(cmd).value);
  }
  // A TCP connection from the child to `dest`, owned by the child's uid (TcpClient's, in
  // the child; it stays connected as long as the child); returns its local end.
  wire::Endpoint Connect(const sockaddr_storage& dest) {
    Command cmd;
    cmd.op = 'T';
    cmd.dest = dest;
    Reply r = Ask(cmd);
    EXPECT_EQ(r.rc, 0) << std::strerror(-r.rc);
    return r.rc == 0 ? Ep(r.local) : wire::Endpoint();
  }

 private:
  struct Command {
    char op = 0;
    int index = 0;
    sockaddr_storage dest{};
    wire::Endpoint client, server;
  };
  struct Reply {
    int rc = 0;
    uint32_t value = 0;
    uint64_t nonce = 0;
    Answer answer;
    sockaddr_storage local{};  // 'T': the connection's local end
  };

  template <typename T>
  static bool Write(int fd, const T& v) {
    return write(fd, &v, sizeof(v)) == ssize_t(sizeof(v));
  }
  template <typename T>
  static bool Read(int fd, T* v) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 10000) != 1) return false;
    return read(fd, v, sizeof(*v)) == ssize_t(sizeof(*v));
  }
  Reply Ask(const Command& cmd) {
    Reply r;
    r.rc = -EPIPE;
    if (!Write(out_, cmd) || !Read(in_, &r)) ADD_FAILURE() << "child gone";
    return r;
  }

  // The child's loop; returns its exit status.
  int Serve() {
    std::vector<std::unique_ptr<Offer>> offers;
    std::vector<int> tcp;
    Command cmd;
    while (Read(in_, &cmd)) {
      Reply r;
      switch (cmd.op) {
        case 'Q':
          return 0;
        case 'R': {
          int sock = FindRendezvous(Sa(cmd.dest));
          if (sock < 0) {
            r.rc = sock;
            Write(out_, r);
            break;
          }
          auto offer = std::make_unique<Offer>();
          r.rc = PrepareOffer(kRing, offer.get());
          if (r.rc == 0) r.rc = SendRegister(sock, *offer, cmd.client, cmd.server);
          r.nonce = offer->nonce;
          if (r.rc == 0) offers.push_back(std::move(offer));
          Write(out_, r);  // sent: the parent drains now
          if (r.rc != 0) {
            close(sock);
            break;
          }
          Reply answered;
          answered.answer = ReadAnswer(sock, 300);
          close(sock);
          Write(out_, answered);
          break;
        }
        case 'C':
          r.value = size_t(cmd.index) < offers.size() ? ClaimOf(*offers[cmd.index]).load() : 99;
          Write(out_, r);
          break;
        case 'T': {
          const int fd = ConnectTcp(cmd.dest, &r.local);
          if (fd < 0) {
            r.rc = fd;
          } else {
            tcp.push_back(fd);
          }
          Write(out_, r);
          break;
        }
        default:
          return 4;
      }
    }
    return 0;
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
};

// ---------------------------------------------------------------------------- registering

// Streams `size` random bytes each way through two Streams (non-blocking, interleaved).
inline ::testing::AssertionResult ExchangeThrough(Stream* a, Stream* b, size_t size) {
  std::mt19937 rng(size);
  std::vector<uint8_t> ab(size), ba(size), got_ab, got_ba;
  for (auto& c : ab) c = uint8_t(rng());
  for (auto& c : ba) c = uint8_t(rng());
  size_t sent_ab = 0, sent_ba = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint8_t buf[3000];
  while (got_ab.size() < size || got_ba.size() < size) {
    if (std::chrono::steady_clock::now() > deadline)
      return ::testing::AssertionFailure() << "stuck at " << got_ab.size() << "/" << got_ba.size();
    auto send = [&](Stream* s, const std::vector<uint8_t>& data, size_t* sent) {
      if (*sent == data.size()) return;
      iovec iov{const_cast<uint8_t*>(data.data()) + *sent,
                std::min<size_t>(data.size() - *sent, 1 + rng() % 5000)};
      ssize_t n = s->Send(&iov, 1, MSG_NOSIGNAL, true);
      if (n > 0) *sent += size_t(n);
    };
    auto recv = [&](Stream* s, std::vector<uint8_t>* got) {
      iovec iov{buf, 1 + rng() % sizeof(buf)};
      ssize_t n = s->Recv(&iov, 1, 0, true);
      if (n > 0) got->insert(got->end(), buf, buf + n);
    };
    send(a, ab, &sent_ab);
    send(b, ba, &sent_ba);
    recv(b, &got_ab);
    recv(a, &got_ba);
  }
  if (got_ab != ab) return ::testing::AssertionFailure() << "a to b differs";
  if (got_ba != ba) return ::testing::AssertionFailure() << "b to a differs";
  return ::testing::AssertionSuccess();
}

class RendezvousRegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer("127.0.0.1", "127.0.0.1");
    ASSERT_TRUE(server_);
    rv_ = server_->rv.get();
    dest_ = server_->To("127.0.0.1");
    server_ep_ = server_->Endpoint("127.0.0.1");
    client_ep_ = NewClient();
  }

  // A rendezvous connection.
  int Connect() {
    int sock = FindRendezvous(Sa(dest_));
    EXPECT_GE(sock, 0) << std::strerror(-sock);
    return sock;
  }

  // The client end of another real TCP connection to the listener (this process's, kept
  // until the test ends).
  wire::Endpoint NewClient() {
    clients_.emplace_back(dest_);
    EXPECT_TRUE(clients_.back().ok());
    return clients_.back().ep();
  }

  // Prepares *offer and registers it for the fixture's connection on a new rendezvous
  // connection, *sock (the caller's to read and close).
  void SendOffer(Offer* offer, int* sock) {
    ASSERT_EQ(PrepareOffer(kRing, offer), 0);
    *sock = Connect();
    ASSERT_GE(*sock, 0);
    ASSERT_EQ(SendRegister(*sock, *offer, client_ep_, server_ep_), 0);
  }

  // Registers `offer` for the fixture's connection on a rendezvous connection of its own,
  // and expects it kept (no answer yet).
  void ExpectKept(const Offer& offer) {
    int sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
    rv_->Drain();
    EXPECT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));
    close(sock);
  }

  Answer Register(Offer* offer) { return Register(offer, client_ep_); }
  Answer Register(Offer* offer, const wire::Endpoint& client) {
    return RegisterVia(rv_, dest_, client, server_ep_, offer);
  }

  std::unique_ptr<Server> server_;
  Rendezvous* rv_ = nullptr;
  sockaddr_storage dest_{};
  wire::Endpoint server_ep_;
  wire::Endpoint client_ep_;  // the fixture's own connection (NewClient)
  std::vector<TcpClient> clients_;
};

}  // namespace slip::shm::rendezvous_fixture
