// Tests for the shm rendezvous (shm/shm.h): publishing and finding the abstract socket of
// a listener, verified against the kernel's TCP listener and its owner; REGISTER and the
// listener's one answer (ACCEPT or DECLINE); the bounds on what registrations can hold
// (per uid, per 4-tuple, the table's capacity, eviction); Take, with a forged registration
// for the same 4-tuple next to the real one; robustness against malformed messages (no
// crash, no leaked descriptor); AcceptRegistration's checks of everything the peer hands
// over; and Registration's claim.
//
// Abstract socket names are shared by everything in the network namespace, so every test
// publishes on a port of its own, chosen at random and retried while the port or the name
// is taken. FindRendezvous only uses a rendezvous for a port a real TCP socket listens
// on, so the tests listen there as the rendezvous claims. Take only takes the registration
// of the owner of the connection's client socket, as the kernel sees it, so every 4-tuple a
// test means to take is a real loopback connection's (TcpClient). The tests run as root;
// "another uid" is a forked child that setuid()s to nobody.
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

namespace slip::shm {
namespace {

using namespace rendezvous_helpers;  // NOLINT(google-build-using-namespace)

constexpr uint32_t kRing = 4096;
constexpr uid_t kNobody = 65534;
constexpr int kTimeoutMs = 60000;  // settling deadlines the tests never reach by waiting

// ---------------------------------------------------------------------------- addresses

bool HasIpv6Loopback() {
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

// ---------------------------------------------------------------------------- descriptors

int CountOpenFds() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory's own descriptor
}

bool IsOpen(int fd) {
  return fd >= 0 && fcntl(fd, F_GETFD) != -1;
}

bool IsSocket(int fd) {
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

int SoftFdLimit() {
  rlimit rl{};
  EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  return int(rl.rlim_cur);
}

// Opens the process' netlink socket (core/sock_diag) before a test counts descriptors.
void WarmUpNetlink() {
  uint64_t peer = 0;
  UnixPeer(1, &peer);
}

// ---------------------------------------------------------------------------- listeners

// Publishes the rendezvous of TCP socket `tcp` (bound).
std::unique_ptr<Rendezvous> Publish(int tcp, int* error) {
  *error = 0;
  return Rendezvous::Publish(PortOf(tcp), InodeOf(tcp), StreamOptions{}, error);
}

// Publishes with a table of `capacity` entries: the capacity comes from the descriptor space
// above the floor when the rendezvous is published (a sixth of it, after 32 kept for the
// process's other hidden descriptors).
std::unique_ptr<Rendezvous> PublishWithCapacity(int tcp, size_t capacity, int* error) {
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
std::unique_ptr<Server> StartServer(const char* tcp_addr, const char* rv_addr, bool v6only = false,
                                    size_t capacity = 0) {
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
int ConnectTcp(const sockaddr_storage& dest, sockaddr_storage* local) {
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
int BindLoopback(sockaddr_storage* local) {
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
ssize_t SendRaw(int sock, const void* data, size_t len, const int* fds, int nfds) {
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

std::vector<uint8_t> Encode(const wire::Message& msg) {
  std::vector<uint8_t> buf(wire::kMaxMessageSize);
  buf.resize(wire::EncodeMessage(msg, buf.data(), buf.size()));
  EXPECT_FALSE(buf.empty());
  return buf;
}

wire::Register RegisterFor(const Offer& offer, const wire::Endpoint& client,
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
Answer RegisterVia(Rendezvous* rv, const sockaddr_storage& dest, const wire::Endpoint& client,
                   const wire::Endpoint& server, Offer* offer) {
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

std::atomic<uint32_t>& ClaimOf(const Offer& offer) {
  return static_cast<RegionControl*>(offer.region)->header.claim;
}
Claim ClaimValue(const Offer& offer) {
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

// ---------------------------------------------------------------------------- finding

TEST(RendezvousFindTest, ExactNameOfTheListenerIsFoundAndServes) {
  auto server = StartServer("127.0.0.1", "127.0.0.1");
  ASSERT_TRUE(server);
  ASSERT_GE(server->rv->fd(), 0);
  int sock = FindRendezvous(Sa(server->To("127.0.0.1")));
  ASSERT_GE(sock, 0) << std::strerror(-sock);
  EXPECT_TRUE(IsSocket(sock));
  EXPECT_TRUE(fcntl(sock, F_GETFD) & FD_CLOEXEC);
  // The control thread's descriptor says there is something to read.
  pollfd pfd{server->rv->fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  close(sock);
  server->rv->Drain();

  Offer offer;
  TcpClient tcp(server->To("127.0.0.1"));
  ASSERT_TRUE(tcp.ok());
  const wire::Endpoint client = tcp.ep();
  EXPECT_TRUE(IsKept(RegisterVia(server->rv.get(), server->To("127.0.0.1"), client,
                                 server->Endpoint("127.0.0.1"), &offer)));
  Registration reg;
  EXPECT_TRUE(server->rv->Take(client, server->Endpoint("127.0.0.1"), &reg));
  pfd = pollfd{server->rv->fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 0), 0) << "readable with nothing left to read";

  // Another port, another address: nothing there.
  const uint16_t other_port = uint16_t(server->port == 60999 ? server->port - 1 : server->port + 1);
  EXPECT_EQ(FindRendezvous(Sa(Addr("127.0.0.1", other_port))), -ECONNREFUSED);
  EXPECT_EQ(FindRendezvous(Sa(server->To("127.0.0.2"))), -ECONNREFUSED);
}

std::string NameText(const sockaddr_un& name, socklen_t len) {
  EXPECT_EQ(name.sun_path[0], '\0');  // abstract
  return std::string(name.sun_path + 1, len - offsetof(sockaddr_un, sun_path) - 1);
}

TEST(RendezvousFindTest, NamesAreVersionThreeAndOnePerListeningSocket) {
  sockaddr_un name;
  socklen_t len;
  RendezvousName(5201, 123456789, &name, &len);
  EXPECT_EQ(NameText(name, len), "slipstream-v3:5201:123456789");
  RendezvousName(80, 18446744073709551615ull, &name, &len);
  EXPECT_EQ(NameText(name, len), "slipstream-v3:80:18446744073709551615");

  // Publish binds exactly that name for its socket, and a client finds it, naming the
  // socket; IPv6 and dual-stack listeners alike.
  for (const char* addr : {"127.0.0.1", "::1", "::"}) {
    SCOPED_TRACE(addr);
    if (addr[0] == ':' && !HasIpv6Loopback()) continue;
    auto server = StartServer(addr, addr, /*v6only=*/std::string(addr) == "::1");
    ASSERT_TRUE(server);
    RendezvousName(server->port, InodeOf(server->tcp), &name, &len);
    int raw = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    ASSERT_GE(raw, 0);
    EXPECT_EQ(connect(raw, reinterpret_cast<sockaddr*>(&name), len), 0) << std::strerror(errno);
    close(raw);
    server->rv->Drain();
    uint64_t member = 0;
    const char* to = std::string(addr) == "::" ? "127.0.0.1" : addr;
    int sock = FindRendezvous(Sa(server->To(to)), nullptr, &member);
    EXPECT_GE(sock, 0) << std::strerror(-sock);
    EXPECT_EQ(member, InodeOf(server->tcp));
    if (sock >= 0) close(sock);
  }
}

TEST(RendezvousFindTest, NothingPublishedMeansRefusedAndNoLeak) {
  WarmUpNetlink();
  const int before = CountOpenFds();
  for (int i = 0; i < 20; ++i) {
    int sock = FindRendezvous(Sa(Addr("127.0.0.1", RandomPort())));
    if (sock >= 0) close(sock);  // someone else's listener on that port: fine
  }
  EXPECT_EQ(CountOpenFds(), before);
  sockaddr_un unix_addr{};
  unix_addr.sun_family = AF_UNIX;
  EXPECT_EQ(FindRendezvous(reinterpret_cast<const sockaddr*>(&unix_addr)), -EAFNOSUPPORT);
}

TEST(RendezvousFindTest, RendezvousWithoutATcpListenerIsRefused) {
  WarmUpNetlink();
  for (const char* addr : {"127.0.0.1", "0.0.0.0"}) {
    SCOPED_TRACE(addr);
    auto server = StartServer(/*tcp_addr=*/nullptr, addr);
    ASSERT_TRUE(server);
    const int before = CountOpenFds();
    EXPECT_EQ(FindRendezvous(Sa(server->To("127.0.0.1"))), -ECONNREFUSED);
    EXPECT_EQ(CountOpenFds(), before);
    // Once the socket listens, its rendezvous is found.
    ASSERT_EQ(listen(server->tcp, 16), 0);
    int sock = FindRendezvous(Sa(server->To("127.0.0.1")));
    EXPECT_GE(sock, 0) << std::strerror(-sock);
    if (sock >= 0) close(sock);
  }
}

TEST(RendezvousFindTest, SecondPublishForTheSameSocketFails) {
  auto server = StartServer("127.0.0.1", "127.0.0.1");
  ASSERT_TRUE(server);
  int error = 0;
  EXPECT_EQ(Publish(server->tcp, &error), nullptr);
  EXPECT_EQ(error, -EADDRINUSE);
  // Another socket on another port is another name.
  auto other = StartServer("127.0.0.1", nullptr);
  ASSERT_TRUE(other);
  auto second = Publish(other->tcp, &error);
  EXPECT_TRUE(second) << std::strerror(-error);
  // Once the first is gone, its name can be published again.
  server->rv.reset();
  auto again = Publish(server->tcp, &error);
  EXPECT_TRUE(again) << std::strerror(-error);
}

// A registration through what FindRendezvous finds for `dest` (from the connection's own
// source), for a real connection to `dest`, ends up in `rv`'s table (and in no other).
::testing::AssertionResult Reaches(const sockaddr_storage& dest, Rendezvous* rv,
                                   Rendezvous* not_rv = nullptr) {
  TcpClient tcp(dest);
  if (!tcp.ok()) return ::testing::AssertionFailure() << "no TCP connection";
  const wire::Endpoint client = tcp.ep();
  const wire::Endpoint server = Ep(dest);
  Offer offer;
  Answer a = RegisterVia(rv, dest, client, server, &offer);
  if (not_rv) not_rv->Drain();
  if (!IsKept(a)) return ::testing::AssertionFailure() << "registration: " << Describe(a);
  Registration reg;
  if (not_rv && not_rv->Take(client, server, &reg))
    return ::testing::AssertionFailure() << "reached the other rendezvous";
  if (!rv->Take(client, server, &reg)) return ::testing::AssertionFailure() << "not in the table";
  if (reg.msg.nonce != offer.nonce) return ::testing::AssertionFailure() << "another nonce";
  return ::testing::AssertionSuccess();
}

TEST(RendezvousFindTest, WildcardListenerIsFoundFromEveryLocalAddress) {
  auto server = StartServer("0.0.0.0", "0.0.0.0");
  ASSERT_TRUE(server);
  EXPECT_TRUE(Reaches(server->To("127.0.0.1"), server->rv.get()));
  EXPECT_TRUE(Reaches(server->To("127.0.0.2"), server->rv.get()));
  // A client that speaks IPv6 with a v4-mapped address reaches the IPv4 wildcard too.
  EXPECT_TRUE(Reaches(server->To("::ffff:127.0.0.1"), server->rv.get()));
}

TEST(RendezvousFindTest, ExactListenerIsPreferredOverTheWildcard) {
  // Two TCP listeners on the port (SO_REUSEPORT lets them share it): the kernel picks the
  // exact one for 127.0.0.1 and the wildcard for any other local address.
  std::unique_ptr<Server> wildcard;
  std::unique_ptr<Rendezvous> exact_rv;
  int exact_tcp = -1;
  for (int attempt = 0; attempt < 50 && !exact_rv; ++attempt) {
    wildcard = std::make_unique<Server>();
    wildcard->port = RandomPort();
    wildcard->tcp = TcpSocket(wildcard->To("0.0.0.0"), false, false, /*reuseport=*/true);
    exact_tcp = TcpSocket(wildcard->To("127.0.0.1"), false, false, /*reuseport=*/true);
    int error = 0;
    if (wildcard->tcp >= 0 && exact_tcp >= 0 && listen(wildcard->tcp, 16) == 0 &&
        listen(exact_tcp, 16) == 0) {
      wildcard->rv = Publish(wildcard->tcp, &error);
      if (wildcard->rv) exact_rv = Publish(exact_tcp, &error);
    }
    if (!exact_rv) CloseIf(&exact_tcp);
  }
  ASSERT_TRUE(exact_rv);
  EXPECT_TRUE(Reaches(wildcard->To("127.0.0.1"), exact_rv.get(), wildcard->rv.get()));
  EXPECT_TRUE(Reaches(wildcard->To("127.0.0.2"), wildcard->rv.get(), exact_rv.get()));
  exact_rv.reset();
  close(exact_tcp);
}

TEST(RendezvousFindTest, OnlyTheListenersOwnRendezvousCounts) {
  // Two sockets share the port (SO_REUSEPORT); only one listens. The other's rendezvous is
  // not the listener's, so a client finds none until the listener publishes its own.
  std::unique_ptr<Server> server;
  int idle = -1;
  for (int attempt = 0; attempt < 50 && idle < 0; ++attempt) {
    server = std::make_unique<Server>();
    server->port = RandomPort();
    server->tcp = TcpSocket(server->To("127.0.0.1"), false, false, /*reuseport=*/true);
    idle = TcpSocket(server->To("127.0.0.1"), false, false, /*reuseport=*/true);
    if (server->tcp < 0 || idle < 0 || listen(server->tcp, 16) != 0) {
      CloseIf(&server->tcp);
      CloseIf(&idle);
    }
  }
  ASSERT_GE(idle, 0);
  int error = 0;
  auto idle_rv = Publish(idle, &error);
  ASSERT_TRUE(idle_rv) << std::strerror(-error);
  EXPECT_EQ(FindRendezvous(Sa(server->To("127.0.0.1"))), -ECONNREFUSED);
  server->rv = Publish(server->tcp, &error);
  ASSERT_TRUE(server->rv) << std::strerror(-error);
  EXPECT_TRUE(Reaches(server->To("127.0.0.1"), server->rv.get(), idle_rv.get()));
  idle_rv.reset();
  close(idle);
}

TEST(RendezvousFindTest, DualStackWildcardServesIpv4ButV6OnlyDoesNot) {
  SKIP_UNLESS_IPV6();
  {
    auto dual = StartServer("::", "::", /*v6only=*/false);
    ASSERT_TRUE(dual);
    EXPECT_TRUE(Reaches(dual->To("127.0.0.1"), dual->rv.get()));
    EXPECT_TRUE(Reaches(dual->To("::1"), dual->rv.get()));
  }
  {
    auto v6only = StartServer("::", "::", /*v6only=*/true);
    ASSERT_TRUE(v6only);
    EXPECT_EQ(FindRendezvous(Sa(v6only->To("127.0.0.1"))), -ECONNREFUSED);
    EXPECT_TRUE(Reaches(v6only->To("::1"), v6only->rv.get()));
  }
}

// SO_REUSEPORT: every member publishes its own rendezvous, and asked from the client's
// bound source, the kernel names the member that the SYN from there reaches (the same hash
// of the 4-tuple), so the registration goes to the process that will accept.
TEST(RendezvousFindTest, EachSynReachesTheReuseportMemberFoundFromItsSource) {
  constexpr int kMembers = 3;
  constexpr int kClients = 40;
  std::vector<int> members;
  uint16_t port = 0;
  for (int attempt = 0; attempt < 50 && int(members.size()) < kMembers; ++attempt) {
    for (int fd : members) close(fd);
    members.clear();
    port = RandomPort();
    for (int i = 0; i < kMembers; ++i) {
      const int fd = TcpSocket(Addr("127.0.0.1", port), false, true, /*reuseport=*/true);
      if (fd < 0) break;
      members.push_back(fd);
    }
  }
  ASSERT_EQ(int(members.size()), kMembers);
  std::vector<std::unique_ptr<Rendezvous>> rvs;
  for (int fd : members) {
    ASSERT_EQ(fcntl(fd, F_SETFL, O_NONBLOCK), 0);  // (accept4's flag is for the new socket)
    int error = 0;
    rvs.push_back(Publish(fd, &error));
    ASSERT_TRUE(rvs.back()) << std::strerror(-error);
  }
  const sockaddr_storage dest = Addr("127.0.0.1", port);
  std::vector<int> hits(kMembers, 0);
  for (int c = 0; c < kClients; ++c) {
    sockaddr_storage local{};
    const int tcp = BindLoopback(&local);
    ASSERT_GE(tcp, 0);
    uint64_t member = 0;
    const int sock = FindRendezvous(Sa(dest), Sa(local), &member);
    ASSERT_GE(sock, 0) << std::strerror(-sock);
    close(sock);
    ASSERT_EQ(connect(tcp, Sa(dest), Len(dest)), 0);
    int taker = -1, conn = -1;
    for (int i = 0; i < kMembers && taker < 0; ++i) {
      conn = accept4(members[i], nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (conn >= 0) taker = i;
    }
    ASSERT_GE(taker, 0);
    EXPECT_EQ(member, InodeOf(members[taker])) << "client " << c;
    ++hits[taker];
    // The client closes first, so that TIME_WAIT stays on its port, which no later bind()
    // takes: a 4-tuple in TIME_WAIT at the server would hide the listener from the next
    // lookup made from that port (docs/DESIGN.md, "Known limitations"), about once in 30 runs.
    close(tcp);
    close(conn);
  }
  // (The hash spreads them: a member that got none would make the test moot.)
  for (int i = 0; i < kMembers; ++i) EXPECT_GT(hits[i], 0) << "member " << i;
  rvs.clear();
  for (int fd : members) close(fd);
}

TEST(RendezvousFindTest, ARendezvousHeldByAnotherUidIsNeverUsed) {
  SKIP_UNLESS_ROOT();
  WarmUpNetlink();
  // The TCP listener is ours (root); the listener's rendezvous name is held by nobody.
  std::unique_ptr<Server> server;
  Squatter squatter;
  bool started = false;
  for (int attempt = 0; attempt < 20 && !started; ++attempt) {
    server = StartServer("127.0.0.1", nullptr);
    ASSERT_TRUE(server);
    sockaddr_un name;
    socklen_t len;
    RendezvousName(server->port, InodeOf(server->tcp), &name, &len);
    started = squatter.Start(name, len, kNobody);
  }
  ASSERT_TRUE(started);
  const int before = CountOpenFds();
  EXPECT_EQ(FindRendezvous(Sa(server->To("127.0.0.1"))), -EPERM);
  EXPECT_EQ(FindRendezvous(Sa(server->To("::ffff:127.0.0.1"))), -EPERM);
  EXPECT_EQ(CountOpenFds(), before);
  Squatter::Report report = squatter.Finish();
  EXPECT_GE(report.accepted, 1) << "the client never reached the squatter: the test is moot";
  EXPECT_EQ(report.bytes, 0);
  EXPECT_EQ(report.fds, 0);
}

// ---------------------------------------------------------------------------- registering

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

TEST_F(RendezvousRegistrationTest, KeptUnansweredThenTakenOnTheRingsAndCommitAnswersAccept) {
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  const int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
  rv_->Drain();
  ASSERT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));  // nobody accepted it yet

  Registration reg;
  EXPECT_FALSE(rv_->Take(NewClient(), server_ep_, &reg));  // a connection nobody registered
  EXPECT_FALSE(rv_->Take(client_ep_, Ep("127.0.0.1", uint16_t(server_ep_.port + 1)), &reg));
  EXPECT_FALSE(rv_->Take(server_ep_, client_ep_, &reg));  // the other way round
  EXPECT_FALSE(reg.stream);

  ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  EXPECT_TRUE(reg.msg.client == client_ep_);
  EXPECT_TRUE(reg.msg.server == server_ep_);
  EXPECT_EQ(reg.msg.nonce, offer.nonce);
  EXPECT_EQ(reg.msg.ring_size, kRing);
  EXPECT_EQ(reg.msg.fd_count, 4u);
  EXPECT_EQ(reg.msg.region_size, RegionSize(kRing));
  EXPECT_EQ(reg.uid, getuid());
  ASSERT_TRUE(reg.stream);
  EXPECT_GE(reg.anchor_slot, 0);
  EXPECT_TRUE(IsOpen(reg.anchor_slot));
  EXPECT_TRUE(fcntl(reg.anchor_slot, F_GETFD) & FD_CLOEXEC);
  EXPECT_GE(reg.answer, 0);
  EXPECT_EQ(reg.proxy_a, reg.stream->proxy_a());
  EXPECT_TRUE(IsSocket(reg.proxy_a));
  EXPECT_EQ(reg.ReadClaim(), Claim::kOpen);
  // The claim is the region's, shared with the client.
  ASSERT_NE(reg.claim, nullptr);
  ClaimOf(offer).store(uint32_t(Claim::kWithdrawn));
  EXPECT_EQ(reg.ReadClaim(), Claim::kWithdrawn);
  ClaimOf(offer).store(uint32_t(Claim::kOpen));
  // Its stream is on the rings from the start: no deadline, the whole ring free.
  Channel* channel = reg.stream->channel();
  EXPECT_EQ(channel->ring_size(), kRing);
  EXPECT_EQ(channel->control()->SettleDeadline(), 0u);
  EXPECT_EQ(channel->RxProduced(), 0u);
  EXPECT_EQ(channel->TxConsumed(), 0u);
  EXPECT_EQ(reg.stream->ReadableBytes(), 0u);

  // Taken out: not found twice.
  Registration again;
  EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &again));

  // The accepting process claims it, and only then says ACCEPT (once, then EOF).
  ASSERT_TRUE(reg.Commit());
  EXPECT_EQ(ClaimValue(offer), Claim::kTaken);
  EXPECT_EQ(reg.answer, -1);
  EXPECT_TRUE(IsAccept(ReadAnswer(sock), offer.nonce));
  EXPECT_EQ(reg.Abandon(), Claim::kTaken);  // taken: it may not be handed over as plain
  close(sock);
}

TEST_F(RendezvousRegistrationTest, RegistrationWrittenAfterAnEarlierDrainIsFound) {
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  int sock = Connect();
  ASSERT_GE(sock, 0);
  rv_->Drain();  // accepts the connection before anything was written on it
  ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
  pollfd pfd{rv_->fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 2000), 1) << "the waiting connection is not watched";
  Registration reg;
  EXPECT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  EXPECT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));
  close(sock);
}

TEST_F(RendezvousRegistrationTest, UnusableRegionOrProxiesAreDeclinedWithBadRegion) {
  WarmUpNetlink();
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  const std::vector<uint8_t> reg = [&] {
    wire::Message msg;
    msg.type = wire::Type::kRegister;
    msg.reg = RegisterFor(offer, client_ep_, server_ep_);
    return Encode(msg);
  }();
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  struct Case {
    const char* what;
    int fds[4];
  } cases[] = {
      {"A of one pair, B of another",
       {offer.memfd, offer.server_a, offer.client_b, offer.client_b}},
      {"a pipe for the region", {pipe_fds[0], offer.server_a, offer.server_b, offer.client_b}},
      {"a pipe for the client's B", {offer.memfd, offer.server_a, offer.server_b, pipe_fds[1]}},
      {"the region in a proxy slot", {offer.memfd, offer.memfd, offer.server_b, offer.client_b}},
  };
  const int before = CountOpenFds();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    int sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRaw(sock, reg.data(), reg.size(), c.fds, 4), ssize_t(reg.size()));
    rv_->Drain();
    EXPECT_TRUE(IsDecline(ReadAnswer(sock), offer.nonce, wire::DeclineReason::kBadRegion));
    close(sock);
    Registration taken;
    EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &taken));
    EXPECT_EQ(CountOpenFds(), before) << "descriptors leaked";
  }
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  // The offer itself is fine.
  int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
  rv_->Drain();
  EXPECT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));
  close(sock);
}

TEST_F(RendezvousRegistrationTest, ShortOfDescriptorsIsDeclinedWithDescriptors) {
  WarmUpNetlink();
  const int limit = SoftFdLimit();
  // Free slots above the floor: 3 (the rendezvous connection and two of the four
  // descriptors fit), then 5 (all of them, but not the anchor's slot).
  for (int free_slots : {3, 5}) {
    SCOPED_TRACE(free_slots);
    for (int fd = limit - free_slots; fd < limit; ++fd) ASSERT_FALSE(IsOpen(fd)) << fd;
    Offer offer;
    ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
    int sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
    const int before = CountOpenFds();
    {
      FloorGuard floor(limit - free_slots);
      rv_->Drain();
    }
    EXPECT_TRUE(IsDecline(ReadAnswer(sock), offer.nonce, wire::DeclineReason::kDescriptors));
    close(sock);
    EXPECT_EQ(CountOpenFds(), before - 1) << "descriptors leaked";
    Registration taken;
    EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &taken));
    // With the floor back where it was, the same offer goes through.
    sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
    rv_->Drain();
    EXPECT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));
    close(sock);
    EXPECT_TRUE(rv_->Take(client_ep_, server_ep_, &taken));
  }
}

int MaxOpenFd() {
  int max = -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  const int own = dirfd(dir);
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd != own) max = std::max(max, fd);
  }
  closedir(dir);
  return max;
}

TEST_F(RendezvousRegistrationTest, DescriptorsTheKernelCannotInstallAreDeclinedWithDescriptors) {
  WarmUpNetlink();
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
  const int before = CountOpenFds();
  {
    // Every number below the limit taken but three: the rendezvous connection's and two of
    // the four descriptors (the kernel truncates the control message: MSG_CTRUNC).
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(devnull, 0);
    const int top = MaxOpenFd() + 1 + 3;
    std::vector<int> fillers;
    for (int fd = 0; fd < top - 3; ++fd) {
      if (!IsOpen(fd)) {
        ASSERT_EQ(dup3(devnull, fd, O_CLOEXEC), fd);
        fillers.push_back(fd);
      }
    }
    rlimit saved{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
    rlimit low = saved;
    low.rlim_cur = rlim_t(top);
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
    rv_->Drain();
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
    for (int fd : fillers) close(fd);
    close(devnull);
  }
  EXPECT_TRUE(IsDecline(ReadAnswer(sock), offer.nonce, wire::DeclineReason::kDescriptors));
  close(sock);
  EXPECT_EQ(CountOpenFds(), before - 1) << "descriptors leaked";
  Registration taken;
  EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &taken));
  Answer again = RegisterVia(rv_, dest_, client_ep_, server_ep_, &offer);
  EXPECT_TRUE(IsKept(again));
}

// A TCP socket handed over in place of the region, lingering 30 s with bytes its peer does
// not take, and whose last reference the listener then holds: declining it must not wait.
TEST_F(RendezvousRegistrationTest, ALingeringSocketHandedOverNeverHoldsTheListener) {
  sockaddr_storage local{};
  int lingering = ConnectTcp(dest_, &local);  // queued, never accepted: nobody reads
  ASSERT_GE(lingering, 0);
  ASSERT_TRUE(MakeLingering(lingering));
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  wire::Message msg;
  msg.type = wire::Type::kRegister;
  msg.reg = RegisterFor(offer, client_ep_, server_ep_);
  const std::vector<uint8_t> bytes = Encode(msg);
  const int fds[4] = {lingering, offer.server_a, offer.server_b, offer.client_b};
  const int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRaw(sock, bytes.data(), bytes.size(), fds, 4), ssize_t(bytes.size()));
  CloseIf(&lingering);  // the listener's copy is the last
  const auto start = std::chrono::steady_clock::now();
  rv_->Drain();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  EXPECT_TRUE(IsDecline(ReadAnswer(sock), offer.nonce, wire::DeclineReason::kBadRegion));
  EXPECT_LT(took.count(), 2000) << "closing the handed-over socket waited for its linger";
  close(sock);
}

TEST_F(RendezvousRegistrationTest, MalformedMessagesAreDroppedWithoutLeaks) {
  WarmUpNetlink();
  Offer offer;
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  wire::Message reg_msg;
  reg_msg.type = wire::Type::kRegister;
  reg_msg.reg = RegisterFor(offer, client_ep_, server_ep_);
  const std::vector<uint8_t> good = Encode(reg_msg);
  wire::Message cancel_msg;
  cancel_msg.type = wire::Type::kCancel;
  cancel_msg.cancel = wire::Cancel();
  cancel_msg.cancel.client = client_ep_;
  cancel_msg.cancel.server = server_ep_;
  cancel_msg.cancel.nonce = offer.nonce;
  const std::vector<uint8_t> cancel = Encode(cancel_msg);
  std::vector<uint8_t> bad_crc = good;
  bad_crc[20] ^= 1;
  const std::vector<uint8_t> garbage = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P'};
  const std::vector<uint8_t> truncated(good.begin(), good.begin() + 20);
  std::vector<uint8_t> trailing = good;
  trailing.push_back(0);
  std::vector<uint8_t> two = good;  // two REGISTERs in one datagram
  two.insert(two.end(), good.begin(), good.end());

  const int fds[10] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b, offer.memfd,
                       offer.memfd, offer.memfd,    offer.memfd,    offer.memfd,    offer.memfd};
  enum class Want { kNothing, kBadRegion, kDeclined };
  struct Case {
    const char* what;
    const std::vector<uint8_t>* bytes;
    int nfds;
    Want want;
  };
  const Case cases[] = {
      {"garbage", &garbage, 0, Want::kNothing},
      {"garbage with descriptors", &garbage, 4, Want::kNothing},
      {"bad checksum with descriptors", &bad_crc, 4, Want::kNothing},
      {"truncated with descriptors", &truncated, 4, Want::kNothing},
      {"trailing byte with descriptors", &trailing, 4, Want::kNothing},
      {"two messages in one", &two, 4, Want::kNothing},
      {"CANCEL with descriptors", &cancel, 4, Want::kNothing},
      {"CANCEL (no longer used)", &cancel, 0, Want::kNothing},
      {"REGISTER without descriptors", &good, 0, Want::kBadRegion},
      {"REGISTER with 1 descriptor", &good, 1, Want::kBadRegion},
      {"REGISTER with 3 descriptors", &good, 3, Want::kBadRegion},
      {"REGISTER with 5 descriptors", &good, 5, Want::kBadRegion},
      {"REGISTER with 8 descriptors", &good, 8, Want::kBadRegion},
      // (More than the control buffer holds: the kernel truncates it, which reads as the
      // listener being short of descriptors. Declined either way.)
      {"REGISTER with 10 descriptors", &good, 10, Want::kDeclined},
  };
  // The first drop may log: let the log open whatever it opens before counting.
  {
    int sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRaw(sock, garbage.data(), garbage.size(), fds, 2), ssize_t(garbage.size()));
    close(sock);
    rv_->Drain();
  }
  const int before = CountOpenFds();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    int sock = Connect();
    ASSERT_GE(sock, 0);
    ASSERT_EQ(SendRaw(sock, c.bytes->data(), c.bytes->size(), fds, c.nfds),
              ssize_t(c.bytes->size()))
        << std::strerror(errno);
    rv_->Drain();
    const Answer a = ReadAnswer(sock);
    close(sock);
    switch (c.want) {
      case Want::kNothing:
        EXPECT_FALSE(a.message) << Describe(a);
        EXPECT_TRUE(a.eof_after) << "the connection was not closed";
        break;
      case Want::kBadRegion:
        EXPECT_TRUE(IsDecline(a, offer.nonce, wire::DeclineReason::kBadRegion));
        break;
      case Want::kDeclined:
        EXPECT_TRUE(a.parsed && a.type == wire::Type::kDecline) << Describe(a);
        break;
    }
    Registration reg;
    EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &reg));
    EXPECT_EQ(CountOpenFds(), before) << "descriptors leaked";
  }
  // A connection that closes without a word, and one that stays silent.
  int silent = Connect();
  ASSERT_GE(silent, 0);
  close(Connect());
  rv_->Drain();
  EXPECT_EQ(CountOpenFds(), before + 2);  // `silent` and the rendezvous' end of it
  close(silent);
  rv_->Drain();
  EXPECT_EQ(CountOpenFds(), before);
  // Still serving: a well-formed registration goes through.
  int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(SendRegister(sock, offer, client_ep_, server_ep_), 0);
  rv_->Drain();
  EXPECT_TRUE(IsKept(ReadAnswer(sock, kQuietMs)));
  close(sock);
  Registration reg;
  EXPECT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
}

TEST_F(RendezvousRegistrationTest, SilentConnectionsAreBoundedAndExpire) {
  WarmUpNetlink();
  const int before = CountOpenFds();
  // One uid may keep 8 connections waiting for their message; the 9th is closed at once.
  std::vector<int> socks;
  for (int i = 0; i < 9; ++i) {
    socks.push_back(Connect());
    ASSERT_GE(socks.back(), 0);
  }
  rv_->Drain();
  auto closed = [&socks] {
    int n = 0;
    for (int s : socks) {
      char c;
      n += recv(s, &c, 1, MSG_DONTWAIT) == 0;
    }
    return n;
  };
  EXPECT_EQ(closed(), 1);
  EXPECT_EQ(CountOpenFds(), before + 9 + 8);
  // They wait a second at most.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  rv_->Drain();
  EXPECT_EQ(closed(), 9);
  EXPECT_EQ(CountOpenFds(), before + 9);
  for (int s : socks) close(s);
}

// ---------------------------------------------------------------------------- per 4-tuple

TEST_F(RendezvousRegistrationTest, FourRegistrationsPerTupleAndThoseGoneMakeRoom) {
  std::vector<std::unique_ptr<Offer>> offers;
  auto register_one = [&] {
    offers.push_back(std::make_unique<Offer>());
    return Register(offers.back().get());
  };
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    {
      const Answer a = register_one();
      EXPECT_TRUE(IsKept(a));
    }
  }
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsDecline(a, offers.back()->nonce, wire::DeclineReason::kBusy));
  }
  // Another 4-tuple is not affected.
  Offer other;
  const wire::Endpoint other_ep = NewClient();
  EXPECT_TRUE(IsKept(Register(&other, other_ep)));

  // A withdrawn registration can no longer be confirmed: it makes room.
  ClaimWithdraw(offers[1].get());
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsKept(a));
  }  // [5]
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsDecline(a, offers.back()->nonce, wire::DeclineReason::kBusy));
  }
  // So does an abandoned one.
  ClaimOf(*offers[2]).store(uint32_t(Claim::kAbandoned));
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsKept(a));
  }  // [7]
  // A confirmed one does not.
  ClaimOf(*offers[3]).store(uint32_t(Claim::kTaken));
  {
    const Answer a = register_one();
    EXPECT_TRUE(IsDecline(a, offers.back()->nonce, wire::DeclineReason::kBusy));
  }

  // Take finds one of the live ones, and the rest go with it (abandoned, unless confirmed).
  Registration reg;
  ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  std::vector<size_t> live = {0, 3, 5, 7};
  EXPECT_NE(std::find_if(live.begin(), live.end(),
                         [&](size_t i) { return offers[i]->nonce == reg.msg.nonce; }),
            live.end());
  for (size_t i : live) {
    if (offers[i]->nonce == reg.msg.nonce) {
      EXPECT_EQ(ClaimValue(*offers[i]), i == 3 ? Claim::kTaken : Claim::kOpen);
    } else {
      EXPECT_EQ(ClaimValue(*offers[i]), i == 3 ? Claim::kTaken : Claim::kAbandoned) << i;
    }
  }
  Registration again;
  EXPECT_FALSE(rv_->Take(client_ep_, server_ep_, &again));
  EXPECT_TRUE(rv_->Take(other_ep, server_ep_, &again));
  EXPECT_EQ(again.msg.nonce, other.nonce);
}

void SleepMs(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

TEST_F(RendezvousRegistrationTest, TakePicksTheRegistrationOfTheClientSocketsOwner) {
  SKIP_UNLESS_ROOT();
  UidChild nobody(kNobody);
  ASSERT_TRUE(nobody.ok());
  {
    // Root's socket; root registered first, the forger (another uid) after it.
    const wire::Endpoint client = NewClient();
    Offer mine;
    ASSERT_TRUE(IsKept(RegisterVia(rv_, dest_, client, server_ep_, &mine)));
    SleepMs(3);
    uint64_t forged_nonce = 0;
    ASSERT_TRUE(IsKept(nobody.Register(rv_, dest_, client, server_ep_, &forged_nonce)));
    Registration reg;
    ASSERT_TRUE(rv_->Take(client, server_ep_, &reg));
    EXPECT_EQ(reg.uid, 0u);
    EXPECT_EQ(reg.msg.nonce, mine.nonce);
    EXPECT_EQ(reg.ReadClaim(), Claim::kOpen);
    EXPECT_EQ(nobody.ReadClaim(0), Claim::kAbandoned);
    Registration again;
    EXPECT_FALSE(rv_->Take(client, server_ep_, &again));
  }
  {
    // The other uid's socket; it registered first, root after it.
    wire::Endpoint client = nobody.Connect(dest_);
    ASSERT_NE(client.port, 0);
    uint64_t its_nonce = 0;
    ASSERT_TRUE(IsKept(nobody.Register(rv_, dest_, client, server_ep_, &its_nonce)));
    SleepMs(3);
    Offer forged;
    ASSERT_TRUE(IsKept(RegisterVia(rv_, dest_, client, server_ep_, &forged)));
    Registration reg;
    ASSERT_TRUE(rv_->Take(client, server_ep_, &reg));
    EXPECT_EQ(reg.uid, kNobody);
    EXPECT_EQ(reg.msg.nonce, its_nonce);
    EXPECT_EQ(ClaimValue(forged), Claim::kAbandoned);
    EXPECT_EQ(nobody.ReadClaim(1), Claim::kOpen);
  }
  {
    // Two of root's own for root's socket (not told apart): the newest.
    const wire::Endpoint client = NewClient();
    Offer older, newer;
    ASSERT_TRUE(IsKept(RegisterVia(rv_, dest_, client, server_ep_, &older)));
    SleepMs(3);
    ASSERT_TRUE(IsKept(RegisterVia(rv_, dest_, client, server_ep_, &newer)));
    Registration reg;
    ASSERT_TRUE(rv_->Take(client, server_ep_, &reg));
    EXPECT_EQ(reg.msg.nonce, newer.nonce);
    EXPECT_EQ(ClaimValue(older), Claim::kAbandoned);
  }
}

// A forger that predicts a plain client's 4-tuple and registers it: the connection's
// client socket is not the forger's, so nothing is held for it (the plain client is never
// answered through a channel the forger set up, and never reset by what it does next).
TEST_F(RendezvousRegistrationTest, ARegistrationOfAnotherUidThanTheClientSocketsIsNeverTaken) {
  SKIP_UNLESS_ROOT();
  UidChild nobody(kNobody);
  ASSERT_TRUE(nobody.ok());
  const wire::Endpoint client = NewClient();  // root's socket, registered by nobody alone
  uint64_t forged_nonce = 0;
  ASSERT_TRUE(IsKept(nobody.Register(rv_, dest_, client, server_ep_, &forged_nonce)));
  Registration reg;
  EXPECT_FALSE(rv_->Take(client, server_ep_, &reg));
  EXPECT_FALSE(reg.stream);
  EXPECT_EQ(nobody.ReadClaim(0), Claim::kAbandoned);  // its client goes plain too
  Registration again;
  EXPECT_FALSE(rv_->Take(client, server_ep_, &again));  // and it is gone from the table
}

// A registration for a 4-tuple no TCP connection has: the kernel names no owner, so it is
// not taken (and does not stay behind).
TEST_F(RendezvousRegistrationTest, ARegistrationWithoutAConnectionIsNeverTaken) {
  // A port of this process's, bound but never connected: no connection has this 4-tuple.
  sockaddr_storage local{};
  const int bound = BindLoopback(&local);
  ASSERT_GE(bound, 0) << std::strerror(-bound);
  const wire::Endpoint client = Ep(local);
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer, client)));
  Registration reg;
  EXPECT_FALSE(rv_->Take(client, server_ep_, &reg));
  EXPECT_EQ(ClaimValue(offer), Claim::kAbandoned);
  close(bound);
}

// ---------------------------------------------------------------------------- quotas

TEST(RendezvousQuotaTest, CapacityFollowsTheDescriptorsAboveTheFloor) {
  for (size_t capacity : {size_t(4), size_t(16), size_t(40)}) {
    SCOPED_TRACE(capacity);
    auto server = StartServer("127.0.0.1", "127.0.0.1", false, capacity);
    ASSERT_TRUE(server);
    EXPECT_EQ(server->rv->capacity(), capacity);
    EXPECT_EQ(server->rv->per_uid_limit(), std::max<size_t>(2, capacity - capacity / 4));
  }
  // Never below 4, whatever the space.
  auto tiny = StartServer("127.0.0.1", "127.0.0.1", false, 1);
  ASSERT_TRUE(tiny);
  EXPECT_EQ(tiny->rv->capacity(), 4u);
  EXPECT_EQ(tiny->rv->per_uid_limit(), 3u);
}

TEST(RendezvousQuotaTest, PerUidLimitCapacityAndEviction) {
  SKIP_UNLESS_ROOT();
  constexpr size_t kCapacity = 16;
  auto server = StartServer("127.0.0.1", "127.0.0.1", false, kCapacity);
  ASSERT_TRUE(server);
  Rendezvous* rv = server->rv.get();
  ASSERT_EQ(rv->capacity(), kCapacity);
  const size_t per_uid = rv->per_uid_limit();
  ASSERT_EQ(per_uid, 12u);
  const sockaddr_storage dest = server->To("127.0.0.1");
  const wire::Endpoint server_ep = server->Endpoint("127.0.0.1");
  // Every registration names a real connection of its uid (Take asks the kernel whose the
  // client socket is): root's are this process's, nobody's the child's.
  std::map<size_t, TcpClient> root_tcp;
  std::map<size_t, wire::Endpoint> nobody_tcp;
  auto root_client = [&](size_t i) {
    auto it = root_tcp.find(i);
    if (it == root_tcp.end()) it = root_tcp.emplace(i, TcpClient(dest)).first;
    return it->second.ep();
  };

  // Root fills its share (distinct 4-tuples, never taken), a few ms apart.
  std::vector<std::unique_ptr<Offer>> root;
  for (size_t i = 0; i < per_uid; ++i) {
    root.push_back(std::make_unique<Offer>());
    ASSERT_TRUE(IsKept(RegisterVia(rv, dest, root_client(i), server_ep, root.back().get()))) << i;
    SleepMs(2);
  }
  {
    Offer over;
    EXPECT_TRUE(IsDecline(RegisterVia(rv, dest, root_client(100), server_ep, &over), over.nonce,
                          wire::DeclineReason::kBusy));
  }
  // Another uid still gets the rest of the table.
  UidChild nobody(kNobody);
  ASSERT_TRUE(nobody.ok());
  auto nobody_client = [&](size_t i) {
    auto it = nobody_tcp.find(i);
    if (it == nobody_tcp.end()) it = nobody_tcp.emplace(i, nobody.Connect(dest)).first;
    return it->second;
  };
  int nobody_count = 0;
  for (size_t i = per_uid; i < kCapacity; ++i) {
    uint64_t nonce = 0;
    ASSERT_TRUE(IsKept(nobody.Register(rv, dest, nobody_client(nobody_count), server_ep, &nonce)))
        << i;
    ++nobody_count;
  }
  // The table is full. Root's two oldest are confirmed by their client.
  ClaimOf(*root[0]).store(uint32_t(Claim::kTaken));
  ClaimOf(*root[1]).store(uint32_t(Claim::kTaken));
  // The lighter uid makes root's oldest unconfirmed registration give way, one at a time.
  for (size_t victim : {size_t(2), size_t(3)}) {
    SCOPED_TRACE(victim);
    uint64_t nonce = 0;
    EXPECT_TRUE(IsKept(nobody.Register(rv, dest, nobody_client(nobody_count), server_ep, &nonce)));
    ++nobody_count;
    for (size_t i = 0; i < root.size(); ++i) {
      const Claim want = i < 2 ? Claim::kTaken : i <= victim ? Claim::kAbandoned : Claim::kOpen;
      EXPECT_EQ(ClaimValue(*root[i]), want) << i;
    }
  }
  // The heavier uid cannot push the lighter one out.
  {
    Offer more;
    EXPECT_TRUE(IsDecline(RegisterVia(rv, dest, root_client(101), server_ep, &more), more.nonce,
                          wire::DeclineReason::kBusy));
  }
  for (int i = 0; i < nobody_count; ++i) EXPECT_EQ(nobody.ReadClaim(i), Claim::kOpen) << i;
  // Confirmed registrations never give way: with all of root's confirmed, nothing can.
  for (size_t i = 4; i < root.size(); ++i) ClaimOf(*root[i]).store(uint32_t(Claim::kTaken));
  {
    uint64_t nonce = 0;
    EXPECT_TRUE(IsDecline(nobody.Register(rv, dest, nobody_client(nobody_count), server_ep, &nonce),
                          nonce, wire::DeclineReason::kBusy));
  }
  for (size_t i = 0; i < root.size(); ++i) {
    EXPECT_EQ(ClaimValue(*root[i]), i == 2 || i == 3 ? Claim::kAbandoned : Claim::kTaken) << i;
  }
  // What the table holds: the evicted are gone, the confirmed are there.
  Registration reg;
  EXPECT_FALSE(rv->Take(root_client(2), server_ep, &reg));
  EXPECT_FALSE(rv->Take(root_client(3), server_ep, &reg));
  EXPECT_TRUE(rv->Take(root_client(0), server_ep, &reg));
  EXPECT_EQ(reg.msg.nonce, root[0]->nonce);
  EXPECT_TRUE(rv->Take(nobody_client(nobody_count - 1), server_ep, &reg));
  EXPECT_EQ(reg.uid, kNobody);
  // One entry free again: root may register.
  Offer last;
  EXPECT_TRUE(IsKept(RegisterVia(rv, dest, root_client(102), server_ep, &last)));
}

// ---------------------------------------------------------------------------- Registration

TEST_F(RendezvousRegistrationTest, ClaimReadAndAbandonSemantics) {
  {
    Registration empty;
    EXPECT_EQ(empty.ReadClaim(), Claim::kAbandoned);
    EXPECT_EQ(empty.Abandon(), Claim::kAbandoned);
  }
  struct Case {
    const char* what;
    uint32_t before;
    Claim read;
    Claim abandon;
    uint32_t after;
  } cases[] = {
      {"open", 0, Claim::kOpen, Claim::kAbandoned, 3},
      // (taken as the client wrote it, not by this end's Commit: not the rings')
      {"taken by the client", 1, Claim::kTaken, Claim::kAbandoned, 1},
      {"withdrawn", 2, Claim::kWithdrawn, Claim::kWithdrawn, 2},
      {"abandoned", 3, Claim::kAbandoned, Claim::kAbandoned, 3},
      {"garbage", 77, Claim::kOpen, Claim::kAbandoned, 77},
      {"garbage, high", 0xffffffffu, Claim::kOpen, Claim::kAbandoned, 0xffffffffu},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Offer offer;
    ASSERT_TRUE(IsKept(Register(&offer)));
    Registration reg;
    ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
    ClaimOf(offer).store(c.before);
    EXPECT_EQ(reg.ReadClaim(), c.read);
    EXPECT_EQ(reg.Abandon(), c.abandon);
    EXPECT_EQ(ClaimOf(offer).load(), c.after);
    EXPECT_EQ(reg.Abandon(), c.abandon);  // and it stays so
  }
  // Abandoned first, the client can no longer withdraw or confirm.
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer)));
  Registration reg;
  ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  EXPECT_EQ(reg.Abandon(), Claim::kAbandoned);
  ClaimWithdraw(&offer);
  EXPECT_EQ(ClaimValue(offer), Claim::kAbandoned);
}

TEST_F(RendezvousRegistrationTest, MovingKeepsTheClaimAndTheStream) {
  WarmUpNetlink();
  Offer offer;
  ASSERT_TRUE(IsKept(Register(&offer)));
  Registration reg;
  ASSERT_TRUE(rv_->Take(client_ep_, server_ep_, &reg));
  std::atomic<uint32_t>* const claim = reg.claim;
  Stream* const stream = reg.stream.get();
  const int anchor = reg.anchor_slot, proxy_a = reg.proxy_a;
  ASSERT_NE(claim, nullptr);
  ASSERT_NE(stream, nullptr);

  const int answer = reg.answer;
  EXPECT_GE(answer, 0);
  Registration moved(std::move(reg));
  EXPECT_EQ(moved.answer, answer);
  EXPECT_EQ(reg.answer, -1);
  EXPECT_EQ(moved.claim, claim);
  EXPECT_EQ(moved.stream.get(), stream);
  EXPECT_EQ(moved.anchor_slot, anchor);
  EXPECT_EQ(moved.proxy_a, proxy_a);
  EXPECT_EQ(moved.msg.nonce, offer.nonce);
  EXPECT_EQ(reg.claim, nullptr);
  EXPECT_FALSE(reg.stream);
  EXPECT_EQ(reg.anchor_slot, -1);
  EXPECT_EQ(reg.proxy_a, -1);
  EXPECT_EQ(reg.ReadClaim(), Claim::kAbandoned);  // nothing to read: as if abandoned
  ASSERT_TRUE(moved.Commit());                    // (its own claim moves with it)
  EXPECT_EQ(moved.ReadClaim(), Claim::kTaken);

  Registration assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.claim, claim);
  EXPECT_EQ(assigned.stream.get(), stream);
  EXPECT_EQ(assigned.anchor_slot, anchor);
  EXPECT_EQ(moved.claim, nullptr);
  EXPECT_FALSE(moved.stream);
  EXPECT_EQ(assigned.Abandon(), Claim::kTaken);
  EXPECT_TRUE(IsOpen(anchor));

  // Assigning over a live registration lets go of what it held: the stream's proxy pair,
  // the client's B, the anchor's slot (its rendezvous connection went with its Commit).
  Offer other;
  const wire::Endpoint other_ep = NewClient();
  ASSERT_TRUE(IsKept(Register(&other, other_ep)));
  Registration second;
  ASSERT_TRUE(rv_->Take(other_ep, server_ep_, &second));
  const int before = CountOpenFds();
  EXPECT_GE(second.answer, 0);
  assigned = std::move(second);
  EXPECT_EQ(CountOpenFds(), before - 4);
  EXPECT_EQ(second.answer, -1);
  EXPECT_FALSE(IsOpen(anchor));
  EXPECT_EQ(assigned.msg.nonce, other.nonce);
  ClaimOf(other).store(uint32_t(Claim::kWithdrawn));
  EXPECT_EQ(assigned.ReadClaim(), Claim::kWithdrawn);
}

// ---------------------------------------------------------------------------- end to end

// Streams `size` random bytes each way through two Streams (non-blocking, interleaved).
::testing::AssertionResult ExchangeThrough(Stream* a, Stream* b, size_t size) {
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

TEST_F(RendezvousRegistrationTest, RegisteredConnectionSettlesEndToEnd) {
  // The client: a TCP socket (bound first: the 4-tuple is registered before the SYN), its
  // registration, then the connection and its channel awaiting the listener's answer.
  sockaddr_storage local{};
  int tcp = BindLoopback(&local);
  ASSERT_GE(tcp, 0) << std::strerror(-tcp);
  const wire::Endpoint client_ep = Ep(local);

  Offer offer;
  int sock = Connect();
  ASSERT_GE(sock, 0);
  ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
  ASSERT_EQ(SendRegister(sock, offer, client_ep, server_ep_), 0);
  ASSERT_EQ(connect(tcp, Sa(dest_), Len(dest_)), 0);
  ASSERT_EQ(fcntl(tcp, F_SETFL, O_NONBLOCK), 0);
  ASSERT_EQ(dup3(tcp, offer.anchor_slot, O_CLOEXEC), offer.anchor_slot);
  close(tcp);
  int client_a = -1, client_b = -1;
  std::unique_ptr<Channel> client_channel =
      MakeClientChannel(&offer, sock, client_ep, server_ep_, &client_a, &client_b);
  ASSERT_TRUE(client_channel);
  EXPECT_EQ(client_channel->control()->SettleFd(), sock);
  Reason why = Reason::kNone;
  EXPECT_EQ(client_channel->control()->Settle(sys::MonotonicMs(), &why),
            ChannelControl::Settlement::kPending);
  Channel* client_ch = client_channel.get();
  Stream client(std::move(client_channel), client_a, client_b, StreamOptions{});

  // The server: accept() takes the registration and claims it (answering ACCEPT), and the
  // TCP socket goes to the slot kept for it.
  // (The listener's backlog holds the fixture's own connection too: accept this one's.)
  int accepted = -1;
  for (;;) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    accepted = accept4(server_->tcp, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    ASSERT_GE(accepted, 0) << std::strerror(errno);
    if (Ep(peer) == client_ep) break;
    close(accepted);
  }
  Registration reg;
  ASSERT_TRUE(rv_->Take(client_ep, server_ep_, &reg));
  ASSERT_TRUE(reg.Commit());
  ASSERT_EQ(dup3(accepted, reg.anchor_slot, O_CLOEXEC), reg.anchor_slot);
  close(accepted);
  Channel* server_ch = reg.stream->channel();
  EXPECT_EQ(server_ch->control()->SettleDeadline(), 0u);  // on the rings from the start

  // The client has its ACCEPT, and the claim says taken: settled, with nothing in band.
  pollfd answered{sock, POLLIN, 0};
  EXPECT_EQ(poll(&answered, 1, 2000), 1);
  EXPECT_EQ(client_ch->control()->Settle(sys::MonotonicMs(), &why),
            ChannelControl::Settlement::kSettled);
  EXPECT_EQ(client_ch->control()->SettleDeadline(), 0u);
  EXPECT_EQ(reg.ReadClaim(), Claim::kTaken);
  EXPECT_EQ(server_ch->control()->SettleDeadline(), 0u);
  EXPECT_FALSE(server_ch->control()->AnchorCarriesStream());
  EXPECT_TRUE(ExchangeThrough(&client, reg.stream.get(), 100000));
  // Nothing of the stream went over TCP.
  char c;
  EXPECT_EQ(recv(reg.anchor_slot, &c, 1, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
}

// ---------------------------------------------------------------------------- AcceptRegistration

// What a REGISTER carries, as the listener receives it: duplicates of the offer's memfd,
// the server's proxy pair and the client's B.
class RendezvousAcceptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WarmUpNetlink();
    before_ = CountOpenFds();
    Fresh();
  }
  void TearDown() override {
    for (int& fd : fds_) CloseIf(&fd);
    offer_.reset();
    EXPECT_EQ(CountOpenFds(), before_) << "descriptors leaked";
  }

  // A new offer and what its REGISTER carries (after checking that the last left nothing).
  void Fresh() {
    for (int& fd : fds_) CloseIf(&fd);
    offer_.reset();
    EXPECT_EQ(CountOpenFds(), before_) << "descriptors leaked";
    offer_ = std::make_unique<Offer>();
    ASSERT_EQ(PrepareOffer(kRing, offer_.get()), 0);
    msg_ = RegisterFor(*offer_, Ep("127.0.0.1", 40000), Ep("127.0.0.1", 5201));
    const int carried[4] = {offer_->memfd, offer_->server_a, offer_->server_b, offer_->client_b};
    for (int i = 0; i < 4; ++i) {
      fds_[i] = fcntl(carried[i], F_DUPFD_CLOEXEC, 0);
      ASSERT_GE(fds_[i], 0);
    }
  }

  // Replaces slot `i` with `fd` (closing what was there).
  void Replace(int i, int fd) {
    ASSERT_GE(fd, 0);
    CloseIf(&fds_[i]);
    fds_[i] = fd;
  }

  // AcceptRegistration must refuse, closing everything it was given.
  void ExpectRejected(wire::DeclineReason want = wire::DeclineReason::kBadRegion) {
    int given[4];
    std::copy(fds_, fds_ + 4, given);
    const int count = CountOpenFds();
    int a = -1, b = -1;
    std::atomic<uint32_t>* claim = nullptr;
    wire::DeclineReason reason = wire::DeclineReason::kUnspecified;
    std::unique_ptr<Channel> channel = AcceptRegistration(msg_, fds_, -1, &a, &b, &claim, &reason);
    EXPECT_FALSE(channel) << "accepted";
    EXPECT_EQ(reason, want);
    EXPECT_EQ(a, -1);
    EXPECT_EQ(b, -1);
    EXPECT_EQ(claim, nullptr);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(fds_[i], -1) << i;
      EXPECT_FALSE(IsOpen(given[i])) << "slot " << i << " not closed";
    }
    EXPECT_EQ(CountOpenFds(), count - 4);
  }

  // A sealed memfd of `size` bytes, with the offer's header where it fits.
  int SealedCopy(off_t size, int seals = F_SEAL_SHRINK | F_SEAL_GROW) {
    int fd = memfd_create("copy", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, size), 0);
    const size_t n = std::min<size_t>(kControlPage, size_t(size));
    EXPECT_EQ(pwrite(fd, offer_->region, n, 0), ssize_t(n));
    if (seals) {
      EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
    }
    return fd;
  }

  RegionHeader& Header() { return static_cast<RegionControl*>(offer_->region)->header; }

  int before_ = 0;
  std::unique_ptr<Offer> offer_;
  wire::Register msg_;
  int fds_[4] = {-1, -1, -1, -1};
};

TEST_F(RendezvousAcceptTest, AcceptsWhatAClientBuilds) {
  const int given[4] = {fds_[0], fds_[1], fds_[2], fds_[3]};
  int a = -1, b = -1;
  std::atomic<uint32_t>* claim = nullptr;
  wire::DeclineReason reason = wire::DeclineReason::kUnspecified;
  std::unique_ptr<Channel> channel = AcceptRegistration(msg_, fds_, -1, &a, &b, &claim, &reason);
  ASSERT_TRUE(channel) << "reason " << int(reason);
  for (int fd : fds_) EXPECT_EQ(fd, -1);
  EXPECT_EQ(a, given[1]);
  EXPECT_EQ(b, given[2]);
  EXPECT_FALSE(IsOpen(given[0])) << "the memfd is kept open";
  EXPECT_TRUE(IsOpen(given[3]));  // the client's B: the channel's
  EXPECT_EQ(channel->ring_size(), kRing);
  EXPECT_EQ(channel->control()->SettleDeadline(), 0u);  // not held
  ASSERT_NE(claim, nullptr);
  EXPECT_EQ(claim->load(), 0u);
  ClaimOf(*offer_).store(uint32_t(Claim::kTaken));
  EXPECT_EQ(claim->load(), 1u);  // the same word, through the server's own mapping
  channel.reset();
  EXPECT_FALSE(IsOpen(given[3]));
  close(a);
  close(b);
}

TEST_F(RendezvousAcceptTest, RejectsRingSizesOutOfRange) {
  for (uint32_t ring : {0u, 2048u, 6000u, 4096u + 64u, 512u << 20, 0x80000000u}) {
    SCOPED_TRACE(ring);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    msg_.ring_size = ring;
    msg_.region_size = RegionSize(ring);
    ExpectRejected();
  }
}

TEST_F(RendezvousAcceptTest, RejectsARingSizeOtherThanTheRegions) {
  // Valid, and the memfd agrees with the message, but the region was built for another.
  msg_.ring_size = 2 * kRing;
  msg_.region_size = RegionSize(2 * kRing);
  Replace(0, SealedCopy(off_t(msg_.region_size)));
  ExpectRejected();
}

TEST_F(RendezvousAcceptTest, RejectsARegionSizeThatDoesNotFitTheRing) {
  for (uint64_t size : {RegionSize(kRing) + 4096, RegionSize(kRing) - 4096, uint64_t(0)}) {
    SCOPED_TRACE(size);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    msg_.region_size = size;
    Replace(0, SealedCopy(off_t(size)));  // the file agrees with the message
    ExpectRejected();
  }
}

TEST_F(RendezvousAcceptTest, RejectsAMemfdOfTheWrongSize) {
  for (off_t size : {off_t(RegionSize(kRing) - 4096), off_t(RegionSize(kRing) + 4096),
                     off_t(RegionSize(kRing) + 1), off_t(0)}) {
    SCOPED_TRACE(size);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    Replace(0, SealedCopy(size));
    ExpectRejected();
  }
}

TEST_F(RendezvousAcceptTest, RejectsARegionThatCanStillBeResized) {
  for (int seals : {0, int(F_SEAL_GROW), int(F_SEAL_SHRINK)}) {
    SCOPED_TRACE(seals);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    Replace(0, SealedCopy(off_t(RegionSize(kRing)), seals));
    ExpectRejected();
  }
  // An ordinary file of the right size cannot be sealed at all.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  char path[] = "/tmp/slip_region_XXXXXX";
  int file = mkostemp(path, O_CLOEXEC);
  ASSERT_GE(file, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(file, off_t(RegionSize(kRing))), 0);
  Replace(0, file);
  ExpectRejected();
}

TEST_F(RendezvousAcceptTest, RejectsANonRegularFileInTheRegionSlot) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  close(pipe_fds[1]);
  Replace(0, pipe_fds[0]);
  ExpectRejected();
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Replace(0, socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ExpectRejected();
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Replace(0, open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ExpectRejected();
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Replace(0, open("/dev/zero", O_RDWR | O_CLOEXEC));
  ExpectRejected();
}

TEST_F(RendezvousAcceptTest, RejectsANonSocketInEveryProxySlot) {
  for (int slot = 1; slot < 4; ++slot) {
    SCOPED_TRACE(slot);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    int pipe_fds[2];
    ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
    close(pipe_fds[1]);
    Replace(slot, pipe_fds[0]);
    ExpectRejected();
    ASSERT_NO_FATAL_FAILURE(Fresh());
    Replace(slot, SealedCopy(off_t(RegionSize(kRing))));  // a regular file
    ExpectRejected();
  }
}

TEST_F(RendezvousAcceptTest, RejectsOtherSocketKindsInEveryProxySlot) {
  for (int slot = 1; slot < 4; ++slot) {
    for (int kind = 0; kind < 4; ++kind) {
      SCOPED_TRACE("slot " + std::to_string(slot) + " kind " + std::to_string(kind));
      ASSERT_NO_FATAL_FAILURE(Fresh());
      int fd = -1;
      if (kind == 0) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (kind == 1) fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (kind >= 2) {
        int pair[2];
        ASSERT_EQ(
            socketpair(AF_UNIX, (kind == 2 ? SOCK_DGRAM : SOCK_SEQPACKET) | SOCK_CLOEXEC, 0, pair),
            0);
        close(pair[1]);
        fd = pair[0];
      }
      Replace(slot, fd);
      ExpectRejected();
    }
  }
}

TEST_F(RendezvousAcceptTest, RejectsProxyEndsThatAreNotOnePair) {
  // A of the server's pair, B of the client's (a pair of its own).
  Replace(2, fcntl(offer_->client_b, F_DUPFD_CLOEXEC, 0));
  ExpectRejected();
  // Two ends of two fresh pairs.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  int p[2], q[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, q), 0);
  Replace(1, p[0]);
  Replace(2, q[1]);
  close(p[1]);
  close(q[0]);
  ExpectRejected();
  // The same end twice.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Replace(2, fcntl(fds_[1], F_DUPFD_CLOEXEC, 0));
  ExpectRejected();
  // A whose peer is gone.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p), 0);
  Replace(1, p[0]);
  Replace(2, fcntl(p[0], F_DUPFD_CLOEXEC, 0));
  close(p[1]);
  ExpectRejected();
}

TEST_F(RendezvousAcceptTest, RejectsAHeaderThatDoesNotMatchTheMessage) {
  Header().magic ^= 1;
  ExpectRejected();
  Header().magic ^= 1;
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Header().nonce ^= 1;
  ExpectRejected();
  Header().nonce ^= 1;
  ASSERT_NO_FATAL_FAILURE(Fresh());
  Header().ring_size = 2 * kRing;
  ExpectRejected();
  Header().ring_size = kRing;
  // The message's nonce against the region's.
  ASSERT_NO_FATAL_FAILURE(Fresh());
  msg_.nonce ^= 0x100;
  ExpectRejected();
}

// (Five come with a registration without a port or through the directory: Rendezvous
// checks which, keyed_registration_test.cc and dir_rendezvous_test.cc.)
TEST_F(RendezvousAcceptTest, RejectsAnotherDescriptorCount) {
  for (uint32_t count : {0u, 3u, 6u}) {
    SCOPED_TRACE(count);
    ASSERT_NO_FATAL_FAILURE(Fresh());
    msg_.fd_count = count;
    ExpectRejected();
  }
}

// The region is a file the client also holds: if it could shrink the file after the server
// mapped it, the server's next access to the rings would die of SIGBUS. Run in a child.
TEST_F(RendezvousAcceptTest, ShrinkingTheRegionAfterAcceptCannotKillTheServer) {
  int a = -1, b = -1;
  wire::DeclineReason reason;
  std::unique_ptr<Channel> server = AcceptRegistration(msg_, fds_, -1, &a, &b, nullptr, &reason);
  ASSERT_TRUE(server) << "reason " << int(reason);
  EXPECT_NE(ftruncate(offer_->memfd, 0), 0);
  EXPECT_EQ(errno, EPERM);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = ftruncate(offer_->memfd, 0);  // the client's copy of the memfd; refused
    (void)rc;
    volatile uint64_t produced = server->RxProduced();     // the server reads its control page
    volatile uint8_t first = server->RxData()[kRing - 1];  // and its ring
    (void)produced;
    (void)first;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the server side died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  server.reset();
  close(a);
  close(b);
}

// The header is read once: what the client writes there afterwards changes nothing.
TEST_F(RendezvousAcceptTest, TheHeaderIsSnapshottedOnce) {
  int server_a = -1, server_b = -1;
  wire::DeclineReason reason;
  std::unique_ptr<Channel> server_ch =
      AcceptRegistration(msg_, fds_, -1, &server_a, &server_b, nullptr, &reason);
  ASSERT_TRUE(server_ch) << "reason " << int(reason);
  Header().ring_size = 1u << 30;
  Header().magic = 0;
  Header().nonce ^= 0xffff;
  EXPECT_EQ(server_ch->ring_size(), kRing);

  RegionHeader* header = &Header();
  int client_a = -1, client_b = -1;
  std::unique_ptr<Channel> client_ch =
      MakeClientChannel(offer_.get(), -1, {}, {}, &client_a, &client_b);
  ASSERT_TRUE(client_ch);
  Stream server(std::move(server_ch), server_a, server_b, StreamOptions{});
  Stream client(std::move(client_ch), client_a, client_b, StreamOptions{});
  // Both ways, many times round the ring: every access stays within the validated size
  // (AddressSanitizer would see one beyond the mapping).
  EXPECT_TRUE(ExchangeThrough(&client, &server, 20 * kRing + 123));
  header->ring_size = 0;
  EXPECT_TRUE(ExchangeThrough(&server, &client, 5 * kRing + 7));
  EXPECT_EQ(server.channel()->ring_size(), kRing);

  // And a cursor the client sets out of range resets the connection, nothing else.
  auto* control = reinterpret_cast<RegionControl*>(header);
  control->to_server.produced.store(control->to_server.produced.load() + (1ull << 40));
  uint8_t buf[64];
  iovec iov{buf, sizeof(buf)};
  EXPECT_EQ(server.Recv(&iov, 1, 0, true), -ECONNRESET);
}

}  // namespace
}  // namespace slip::shm
