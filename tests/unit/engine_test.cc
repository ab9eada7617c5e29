// The connection engine (core/transport.h, core/client_setup.h) driven by transports
// written here, over real loopback TCP: the order and reasons of the probe, the SYN
// leaving only once the offer is ready, every way a setup ends, the waits between steps,
// and the choice among a listener's offers. The offers' own exchanges are stand-ins (an
// eventfd the test signals); the sockets, the SYN and the TCP handshake are the kernel's.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/client_setup.h"
#include "core/server_setup.h"
#include "core/sys.h"
#include "core/transport.h"

namespace slip {
namespace {

using Stage = ClientSetup::Stage;

// What a test offer does, and what happened to it.
struct Script {
  Reason probe = Reason::kNone;  // kNone: the transport can reach the peer
  ClientOffer::Step ready_step = ClientOffer::Step::kReady;  // once the news came
  Reason fail_why = Reason::kRendezvousBusy;
  bool wait_for_news = false;  // Advance waits for `news` to turn readable
  int budget_ms = 1000;        // its TCP handshake budget
  uint64_t deadline_ms = 0;    // Advance fails at this deadline (0: none)
  ClientOffer::Outcome outcome = ClientOffer::Outcome::kCarried;
  int news = -1;  // eventfd

  // Observed.
  std::vector<int>* probes = nullptr;  // kinds probed, in order
  int advances = 0;
  bool listener_had_syn_at_ready = false;
  int listen_fd = -1;
  int established_with = -1;
  bool peer_connected_at_establish = false;
  bool destroyed = false;
  bool destroyed_after_establish = false;
};

bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

class TestOffer final : public ClientOffer {
 public:
  explicit TestOffer(Script* s) : s_(s) {}
  ~TestOffer() override {
    s_->destroyed = true;
    s_->destroyed_after_establish = established_;
    if (a_ >= 0) close(a_);
    if (b_ >= 0) close(b_);
  }
  Step Advance(int tcp, Reason* why) noexcept override {
    (void)tcp;
    ++s_->advances;
    if (s_->wait_for_news && !Readable(s_->news, 0)) {
      if (s_->deadline_ms && sys::MonotonicMs() >= s_->deadline_ms) {
        *why = Reason::kHandshakeTimeout;
        return Step::kFailed;
      }
      return Step::kWaiting;
    }
    if (s_->ready_step == Step::kFailed) {
      *why = s_->fail_why;
      return Step::kFailed;
    }
    // The SYN must not have left yet: the listener has nothing to accept.
    if (s_->listen_fd >= 0) s_->listener_had_syn_at_ready = Readable(s_->listen_fd, 0);
    return Step::kReady;
  }
  int WaitFd() const noexcept override { return s_->wait_for_news ? s_->news : -1; }
  uint64_t DeadlineMs() const noexcept override {
    return s_->deadline_ms ? s_->deadline_ms : sys::MonotonicMs() + 60000;
  }
  int TcpHandshakeBudgetMs() const noexcept override { return s_->budget_ms; }
  bool Proxies(int* a, int* b) noexcept override {
    if (a_ < 0) {
      int pair[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return false;
      a_ = pair[0];
      b_ = pair[1];
    }
    *a = a_;
    *b = b_;
    return true;
  }
  Outcome Establish(int tcp, Carrier* out, Reason* why) noexcept override {
    established_ = true;
    s_->established_with = tcp;
    sockaddr_storage peer;
    socklen_t len = sizeof(peer);
    s_->peer_connected_at_establish =
        getpeername(tcp, reinterpret_cast<sockaddr*>(&peer), &len) == 0;
    if (s_->outcome == Outcome::kPlain) *why = Reason::kResources;
    if (s_->outcome == Outcome::kReset) out->confirmed = true;
    if (s_->outcome == Outcome::kCarried) {
      // A real stream over a channel-less pair is not needed here: the carrier's
      // anchor slot stands for what the face would install.
      int a = -1, b = -1;
      if (!Proxies(&a, &b)) return Outcome::kPlain;
      out->anchor_slot = dup(a);
    }
    return s_->outcome;
  }

 private:
  Script* s_;
  int a_ = -1, b_ = -1;
  bool established_ = false;
};

class TestTransport final : public Transport {
 public:
  TestTransport(TransportKind kind, Script* s, bool vouched = false)
      : kind_(kind), s_(s), vouched_(vouched) {}
  TransportKind kind() const noexcept override { return kind_; }
  bool OffersVouchedByKernel() const noexcept override { return vouched_; }
  std::unique_ptr<ClientOffer> Offer(const ConnectRequest& req, Reason* why) noexcept override {
    (void)req;
    if (s_->probes) s_->probes->push_back(int(kind_));
    if (s_->probe != Reason::kNone) {
      *why = s_->probe;
      return nullptr;
    }
    return std::make_unique<TestOffer>(s_);
  }
  std::unique_ptr<ListenerTwin> Listen(const ListenRequest&, Reason* why) noexcept override {
    *why = Reason::kUnsupported;
    return nullptr;
  }

 private:
  TransportKind kind_;
  Script* s_;
  bool vouched_;
};

// A loopback listener and an unconnected client socket.
class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(listen_fd_, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(a);
    ASSERT_EQ(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    req_.family = AF_INET;
    std::memcpy(&req_.dest_storage, &a, sizeof(a));
    req_.dest_len = sizeof(a);
    req_.config = &config_;
    client_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(client_, 0);
    req_.fd = client_;
    news_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ASSERT_GE(news_, 0);
  }
  void TearDown() override {
    close(listen_fd_);
    close(client_);
    close(news_);
  }
  void Signal() {
    uint64_t one = 1;
    ASSERT_EQ(write(news_, &one, sizeof(one)), ssize_t(sizeof(one)));
  }
  bool Connected() {
    sockaddr_storage peer;
    socklen_t len = sizeof(peer);
    return getpeername(client_, reinterpret_cast<sockaddr*>(&peer), &len) == 0;
  }
  // A setup whose one transport, of `kind`, made its offer with script `s`.
  ClientSetup Offered(Script* s, TransportKind kind) {
    transport_ = std::make_unique<TestTransport>(kind, s);
    registry_ = TransportRegistry();
    registry_.Add(transport_.get());
    registry_.Choose(TransportList{kind});
    ClientSetup setup(req_, sys::connect);
    setup.Probe(registry_);
    return setup;
  }
  Script MakeScript() {
    Script s;
    s.news = news_;
    s.listen_fd = listen_fd_;
    return s;
  }

  Config config_;
  ConnectRequest req_;
  std::unique_ptr<TestTransport> transport_;
  TransportRegistry registry_;
  int listen_fd_ = -1;
  int client_ = -1;
  int news_ = -1;
};

TEST(TransportRegistryTest, ChoosesTheUsersOrderAndOnlyListedTransports) {
  Script s;
  TestTransport shm(TransportKind::kShm, &s), verbs(TransportKind::kVerbs, &s);
  TransportRegistry r;
  r.Add(&shm);
  r.Add(&verbs);
  r.Choose(TransportList{TransportKind::kVerbs, TransportKind::kFabric, TransportKind::kShm,
                         TransportKind::kTcp});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], &verbs);
  EXPECT_EQ(r[1], &shm);
  r.Choose(TransportList{TransportKind::kTcp});
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.known_size(), 2u);
}

TEST(TransportRegistryTest, CloserReasonSpeaksForTheTransportThatTried) {
  EXPECT_EQ(CloserReason(Reason::kPolicy, Reason::kNoRdmaDevice), Reason::kNoRdmaDevice);
  EXPECT_EQ(CloserReason(Reason::kNotSameHost, Reason::kNoRdmaPath), Reason::kNoRdmaPath);
  EXPECT_EQ(CloserReason(Reason::kNotSameHost, Reason::kPolicy), Reason::kNotSameHost);
  EXPECT_EQ(CloserReason(Reason::kPeerNotSlipstream, Reason::kNoRdmaPath),
            Reason::kPeerNotSlipstream);
  EXPECT_EQ(CloserReason(Reason::kPolicy, Reason::kNotSameHost), Reason::kNotSameHost);
}

class NullServerOffer final : public ServerOffer {
 public:
  bool Open(Carrier*, Reason*) noexcept override { return false; }
  bool Abandon() noexcept override { return true; }
};

TEST(TransportRegistryTest, AnOfferTheKernelVouchedForCarriesTheConnection) {
  Script s;
  TestTransport fabric(TransportKind::kFabric, &s), shm(TransportKind::kShm, &s, true),
      verbs(TransportKind::kVerbs, &s);
  TransportRegistry r;
  r.Add(&fabric);
  r.Add(&shm);
  r.Add(&verbs);
  r.Choose(TransportList{TransportKind::kVerbs, TransportKind::kFabric, TransportKind::kShm});
  ServerOfferRoom rooms[3];
  ServerOfferPtr offers[TransportRegistry::kMax];
  EXPECT_EQ(ChooseOffer(r, offers), 3u);                  // none
  offers[1].reset(new (rooms[1].bytes) NullServerOffer);  // fabric's
  EXPECT_EQ(ChooseOffer(r, offers), 1u);
  offers[0].reset(new (rooms[0].bytes) NullServerOffer);  // verbs' (first in order)
  EXPECT_EQ(ChooseOffer(r, offers), 0u);
  offers[2].reset(new (rooms[2].bytes) NullServerOffer);  // shm's: vouched for
  EXPECT_EQ(ChooseOffer(r, offers), 2u);
}

TEST_F(EngineTest, ProbesInOrderAndKeepsTheReasonOfTheClosestTransport) {
  std::vector<int> probes;
  Script a = MakeScript(), b = MakeScript();
  a.probes = b.probes = &probes;
  a.probe = Reason::kNotSameHost;
  b.probe = Reason::kNoRdmaDevice;
  TestTransport ta(TransportKind::kShm, &a), tb(TransportKind::kVerbs, &b);
  TransportRegistry r;
  r.Add(&ta);
  r.Add(&tb);
  r.Choose(TransportList{TransportKind::kShm, TransportKind::kVerbs});
  ClientSetup setup(req_, sys::connect);
  EXPECT_FALSE(setup.Probe(r));
  EXPECT_EQ(setup.stage(), Stage::kPlain);
  EXPECT_EQ(setup.reason(), Reason::kNoRdmaDevice);
  EXPECT_FALSE(setup.syn_sent());
  EXPECT_EQ(probes, (std::vector<int>{int(TransportKind::kShm), int(TransportKind::kVerbs)}));
  EXPECT_FALSE(Connected());  // nothing touched the socket
}

TEST_F(EngineTest, NoTransportChosenIsPolicy) {
  TransportRegistry r;
  ClientSetup setup(req_, sys::connect);
  EXPECT_FALSE(setup.Probe(r));
  EXPECT_EQ(setup.reason(), Reason::kPolicy);
}

TEST_F(EngineTest, TheFirstTransportThatReachesThePeerMakesTheOffer) {
  std::vector<int> probes;
  Script a = MakeScript(), b = MakeScript();
  a.probes = b.probes = &probes;
  a.probe = Reason::kPeerNotSlipstream;
  TestTransport ta(TransportKind::kShm, &a), tb(TransportKind::kVerbs, &b),
      tc(TransportKind::kFabric, &b);
  TransportRegistry r;
  r.Add(&ta);
  r.Add(&tb);
  r.Add(&tc);
  r.Choose(TransportList{TransportKind::kShm, TransportKind::kVerbs, TransportKind::kFabric});
  ClientSetup setup(req_, sys::connect);
  ASSERT_TRUE(setup.Probe(r));
  EXPECT_EQ(setup.transport(), TransportKind::kVerbs);
  EXPECT_EQ(setup.stage(), Stage::kOffer);
  EXPECT_EQ(probes.size(), 2u);  // fabric was not asked
}

TEST_F(EngineTest, TheSynLeavesOnlyOnceTheOfferIsReady) {
  Script s = MakeScript();
  s.wait_for_news = true;
  ClientSetup setup = Offered(&s, TransportKind::kVerbs);
  ASSERT_EQ(setup.stage(), Stage::kOffer);
  EXPECT_EQ(setup.Step(client_), Stage::kOffer);
  EXPECT_EQ(setup.Step(client_), Stage::kOffer);
  ClientSetup::Wait w = setup.NextWait(client_);
  EXPECT_EQ(w.fd, news_);
  EXPECT_EQ(w.events, POLLIN);
  EXPECT_FALSE(setup.syn_sent());
  EXPECT_FALSE(Readable(listen_fd_, 50));  // no SYN yet
  Signal();
  EXPECT_EQ(setup.Step(client_), Stage::kCarried);
  EXPECT_FALSE(s.listener_had_syn_at_ready);
  EXPECT_TRUE(setup.syn_sent());
  EXPECT_TRUE(setup.connected());
  EXPECT_EQ(setup.syn_rc(), 0);
  EXPECT_EQ(s.established_with, client_);
  EXPECT_TRUE(s.peer_connected_at_establish);
  EXPECT_TRUE(s.destroyed && s.destroyed_after_establish);  // the offer is done with
  EXPECT_GE(setup.carrier()->anchor_slot, 0);
  EXPECT_TRUE(Readable(listen_fd_, 1000));  // the SYN came
}

TEST_F(EngineTest, AnOfferThatFailsBeforeTheSynLeavesTheSocketUntouched) {
  Script s = MakeScript();
  s.ready_step = ClientOffer::Step::kFailed;
  s.fail_why = Reason::kRendezvousBusy;
  ClientSetup setup = Offered(&s, TransportKind::kShm);
  ASSERT_EQ(setup.stage(), Stage::kOffer);
  EXPECT_EQ(setup.Run(client_), Stage::kPlain);
  EXPECT_EQ(setup.reason(), Reason::kRendezvousBusy);
  EXPECT_FALSE(setup.syn_sent());
  EXPECT_TRUE(s.destroyed);  // withdrawn at once, before the face's plain connect
  EXPECT_FALSE(s.destroyed_after_establish);
  EXPECT_FALSE(Connected());
  EXPECT_FALSE(Readable(listen_fd_, 20));
}

TEST_F(EngineTest, EstablishDecidesPlainOrReset) {
  for (auto outcome : {ClientOffer::Outcome::kPlain, ClientOffer::Outcome::kReset}) {
    SCOPED_TRACE(int(outcome));
    close(client_);
    client_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    req_.fd = client_;
    Script s = MakeScript();
    s.outcome = outcome;
    ClientSetup setup = Offered(&s, TransportKind::kShm);
    ASSERT_EQ(setup.stage(), Stage::kOffer);
    const Stage end = setup.Run(client_);
    EXPECT_EQ(end, outcome == ClientOffer::Outcome::kPlain ? Stage::kPlain : Stage::kReset);
    EXPECT_EQ(setup.reason(), Reason::kResources);
    EXPECT_TRUE(setup.syn_sent());
    EXPECT_TRUE(setup.connected());
    EXPECT_TRUE(Connected());  // the connection is the application's as it stands
    EXPECT_TRUE(s.destroyed);
    int conn = accept(listen_fd_, nullptr, nullptr);
    ASSERT_GE(conn, 0);
    close(conn);
  }
}

TEST_F(EngineTest, RunWaitsForTheOffersNews) {
  Script s = MakeScript();
  s.wait_for_news = true;
  ClientSetup setup = Offered(&s, TransportKind::kVerbs);
  ASSERT_EQ(setup.stage(), Stage::kOffer);
  const auto start = std::chrono::steady_clock::now();
  std::thread signaller([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    Signal();
  });
  EXPECT_EQ(setup.Run(client_), Stage::kCarried);
  signaller.join();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(140));
  // It slept in poll, not spinning: a handful of steps, not thousands.
  EXPECT_LE(s.advances, 5);
}

TEST_F(EngineTest, RunEndsAtTheOffersDeadline) {
  Script s = MakeScript();
  s.wait_for_news = true;
  s.deadline_ms = sys::MonotonicMs() + 100;
  ClientSetup setup = Offered(&s, TransportKind::kVerbs);
  ASSERT_EQ(setup.stage(), Stage::kOffer);
  EXPECT_EQ(setup.Run(client_), Stage::kPlain);
  EXPECT_EQ(setup.reason(), Reason::kHandshakeTimeout);
  EXPECT_FALSE(setup.syn_sent());
  EXPECT_GE(sys::MonotonicMs(), s.deadline_ms);
}

TEST_F(EngineTest, ATcpHandshakeSlowerThanTheBudgetGoesPlain) {
  // A listener whose accept queue is full drops the SYN: the handshake hangs.
  close(listen_fd_);
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(listen_fd_, 0), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::memcpy(&req_.dest_storage, &a, sizeof(a));
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {
    int f = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    connect(f, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    fillers.push_back(f);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(fcntl(client_, F_SETFL, O_NONBLOCK), 0);
  Script s = MakeScript();
  s.listen_fd = -1;
  s.budget_ms = 100;
  ClientSetup setup = Offered(&s, TransportKind::kShm);
  ASSERT_EQ(setup.stage(), Stage::kOffer);
  const uint64_t start = sys::MonotonicMs();
  EXPECT_EQ(setup.Run(client_), Stage::kPlain);
  EXPECT_GE(sys::MonotonicMs() - start, 100u);
  EXPECT_EQ(setup.reason(), Reason::kConnectSlow);
  EXPECT_TRUE(setup.syn_sent());
  EXPECT_FALSE(setup.connected());
  EXPECT_EQ(setup.syn_errno(), EINPROGRESS);  // what the application's connect reports
  EXPECT_TRUE(s.destroyed);
  EXPECT_FALSE(s.destroyed_after_establish);
  for (int f : fillers) close(f);
}

TEST_F(EngineTest, ARefusedSynIsTheApplicationsToSee) {
  // A port nobody listens on: the kernel refuses the SYN.
  close(listen_fd_);
  listen_fd_ = -1;
  Script s = MakeScript();
  s.listen_fd = -1;
  ClientSetup setup = Offered(&s, TransportKind::kShm);
  ASSERT_EQ(setup.stage(), Stage::kOffer);
  EXPECT_EQ(setup.Run(client_), Stage::kPlain);
  EXPECT_TRUE(setup.syn_sent());
  EXPECT_FALSE(setup.connected());
  EXPECT_EQ(setup.syn_rc(), -1);
  EXPECT_EQ(setup.syn_errno(), ECONNREFUSED);
  EXPECT_FALSE(s.destroyed_after_establish);
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);  // for TearDown
}

TEST_F(EngineTest, GiveUpWithdrawsTheOffer) {
  Script s = MakeScript();
  s.wait_for_news = true;
  ClientSetup setup = Offered(&s, TransportKind::kVerbs);
  ASSERT_EQ(setup.stage(), Stage::kOffer);
  EXPECT_EQ(setup.Step(client_), Stage::kOffer);
  setup.GiveUp(Reason::kResources);
  EXPECT_TRUE(s.destroyed);
  EXPECT_EQ(setup.stage(), Stage::kPlain);
  EXPECT_EQ(setup.reason(), Reason::kResources);
  EXPECT_FALSE(setup.syn_sent());
}

TEST_F(EngineTest, ASetupMovesWithItsOffer) {
  // The connector takes a setup that waits in kOffer from connect()'s stack.
  Script s = MakeScript();
  s.wait_for_news = true;
  ClientSetup first = Offered(&s, TransportKind::kVerbs);
  ASSERT_EQ(first.stage(), Stage::kOffer);
  EXPECT_EQ(first.Step(client_), Stage::kOffer);
  int a = -1, b = -1;
  ASSERT_TRUE(first.offer()->Proxies(&a, &b));
  auto moved = std::make_unique<ClientSetup>(std::move(first));
  EXPECT_FALSE(s.destroyed);
  Signal();
  EXPECT_EQ(moved->Step(client_), Stage::kCarried);
  EXPECT_EQ(moved->request().dest_len, req_.dest_len);
}

// The server side: twins written here, each holding at most one offer.
struct ServerScript {
  bool offered = false;
  bool open_ok = true;
  Reason open_why = Reason::kConnectSlow;
  bool committed = false;
  // Observed.
  int takes = 0, drops = 0, opens = 0, abandons = 0;
  bool carrier_alive_at_abandon = false;
  Carrier* carrier = nullptr;
};

class ScriptServerOffer final : public ServerOffer {
 public:
  explicit ScriptServerOffer(ServerScript* s) : s_(s) {}
  bool Open(Carrier* out, Reason* why) noexcept override {
    ++s_->opens;
    s_->carrier = out;
    if (!s_->open_ok) {
      *why = s_->open_why;
      return false;
    }
    out->anchor_slot = dup(0);  // stands for what the face would install
    return true;
  }
  bool Abandon() noexcept override {
    ++s_->abandons;
    s_->carrier_alive_at_abandon = s_->carrier && s_->carrier->anchor_slot >= 0;
    return !s_->committed;
  }

 private:
  ServerScript* s_;
};

class ScriptTwin final : public ListenerTwin {
 public:
  explicit ScriptTwin(ServerScript* s) : s_(s) {}
  ServerOfferPtr Take(const wire::Endpoint&, const wire::Endpoint&,
                      ServerOfferRoom* room) noexcept override {
    ++s_->takes;
    if (!s_->offered) return nullptr;
    return ServerOfferPtr(new (room->bytes) ScriptServerOffer(s_));
  }
  void Drop(const wire::Endpoint&, const wire::Endpoint&) noexcept override { ++s_->drops; }

 private:
  ServerScript* s_;
};

// A listener with a verbs twin and an shm twin (whose offers the kernel vouches for), in
// that order.
class ServerSetupTest : public ::testing::Test {
 protected:
  ServerSetupTest()
      : verbs_(TransportKind::kVerbs, &unused_),
        shm_(TransportKind::kShm, &unused_, true),
        verbs_twin_(&verbs_script_),
        shm_twin_(&shm_script_) {
    registry_.Add(&shm_);
    registry_.Add(&verbs_);
    registry_.Choose(TransportList{TransportKind::kVerbs, TransportKind::kShm});
    twins_[0] = &verbs_twin_;
    twins_[1] = &shm_twin_;
  }
  ServerSetup::Stage Run(ServerSetup* setup) {
    return setup->Run(registry_, twins_, client_, server_);
  }

  Script unused_;
  TestTransport verbs_, shm_;
  ServerScript verbs_script_, shm_script_;
  ScriptTwin verbs_twin_, shm_twin_;
  TransportRegistry registry_;
  ListenerTwin* twins_[TransportRegistry::kMax] = {};
  wire::Endpoint client_, server_;
};

TEST_F(ServerSetupTest, NothingOfferedIsPlainAndUntouched) {
  ServerSetup setup;
  EXPECT_EQ(Run(&setup), ServerSetup::Stage::kNothing);
  EXPECT_EQ(verbs_script_.takes + shm_script_.takes, 2);
  EXPECT_EQ(verbs_script_.drops + shm_script_.drops, 0);
}

TEST_F(ServerSetupTest, TheOfferTheKernelVouchedForCarriesItAndTheOtherIsDropped) {
  verbs_script_.offered = shm_script_.offered = true;
  ServerSetup setup;
  EXPECT_EQ(Run(&setup), ServerSetup::Stage::kOpened);
  EXPECT_EQ(setup.transport(), TransportKind::kShm);
  EXPECT_EQ(shm_script_.opens, 1);
  EXPECT_EQ(verbs_script_.opens, 0);
  EXPECT_EQ(verbs_script_.abandons, 1);  // forged or stale
  EXPECT_EQ(verbs_script_.drops, 1);
  EXPECT_EQ(shm_script_.drops, 0);
  EXPECT_GE(setup.carrier()->anchor_slot, 0);
}

TEST_F(ServerSetupTest, WithoutAVouchedOfferTheUsersOrderDecides) {
  verbs_script_.offered = true;
  ServerSetup setup;
  EXPECT_EQ(Run(&setup), ServerSetup::Stage::kOpened);
  EXPECT_EQ(setup.transport(), TransportKind::kVerbs);
  EXPECT_EQ(verbs_script_.abandons, 0);
}

TEST_F(ServerSetupTest, AnOfferThatCannotOpenGoesPlainUnlessItsClientCommitted) {
  for (bool committed : {false, true}) {
    SCOPED_TRACE(committed);
    ServerScript script;
    script.offered = true;
    script.open_ok = false;
    script.committed = committed;
    ScriptTwin twin(&script);
    twins_[0] = nullptr;
    twins_[1] = &twin;
    ServerSetup setup;
    EXPECT_EQ(Run(&setup), committed ? ServerSetup::Stage::kDrop : ServerSetup::Stage::kPlain);
    EXPECT_EQ(setup.reason(), Reason::kConnectSlow);
    EXPECT_EQ(script.abandons, 1);
  }
}

TEST_F(ServerSetupTest, AStreamTheFaceCannotInstallIsAbandonedWhileItLives) {
  for (bool committed : {false, true}) {
    SCOPED_TRACE(committed);
    ServerScript script;
    script.offered = true;
    script.committed = committed;
    ScriptTwin twin(&script);
    twins_[1] = &twin;
    ServerSetup setup;
    ASSERT_EQ(Run(&setup), ServerSetup::Stage::kOpened);
    EXPECT_EQ(setup.Fail(Reason::kFdLimit),
              committed ? ServerSetup::Stage::kDrop : ServerSetup::Stage::kPlain);
    EXPECT_EQ(setup.reason(), Reason::kFdLimit);
    EXPECT_TRUE(script.carrier_alive_at_abandon);  // (shm's claim word lives in it)
  }
}

TEST_F(ServerSetupTest, AnUntrackedConnectionAbandonsEverythingOfferedForIt) {
  verbs_script_.offered = shm_script_.offered = true;
  EXPECT_TRUE(ServerSetup::AbandonAll(registry_, twins_, client_, server_));
  EXPECT_EQ(verbs_script_.abandons + shm_script_.abandons, 2);
  EXPECT_EQ(verbs_script_.drops + shm_script_.drops, 2);
  shm_script_.committed = true;
  EXPECT_FALSE(ServerSetup::AbandonAll(registry_, twins_, client_, server_));
}

}  // namespace
}  // namespace slip
