// Unit tests for core/config (core's SLIP_* variables, policy) and core/log.
#include "core/config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "tests/unit/fake_env.h"

namespace slip {
namespace {

using testing_env::Env;
using testing_env::Lookup;

// Parses `env`; on failure returns false and leaves the message in *error.
bool Parse(Env env, Config* out, std::string* error = nullptr) {
  std::string local_error;
  return ParseConfig(Lookup, &env, out, error ? error : &local_error);
}

Config MustParse(Env env) {
  Config config;
  std::string error;
  EXPECT_TRUE(Parse(env, &config, &error)) << error;
  return config;
}

// A bad value fails, names the variable and its value, stays on one line, and leaves the
// output untouched.
std::string MustFail(const std::string& name, const std::string& value) {
  Config config;
  config.spin_us = 12345;  // sentinel
  std::string error;
  EXPECT_FALSE(Parse({{name, value}}, &config, &error)) << name << "=" << value;
  EXPECT_EQ(error.rfind(name + "=\"", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_EQ(config.spin_us, 12345u);
  return error;
}

TEST(Config, DefaultsWhenNothingSet) {
  Config c = MustParse({});
  EXPECT_TRUE(c.enabled);
  ASSERT_EQ(c.transports.size(), 3u);
  EXPECT_EQ(c.transports[0], TransportKind::kShm);
  EXPECT_EQ(c.transports[1], TransportKind::kVerbs);
  EXPECT_EQ(c.transports[2], TransportKind::kTcp);
  EXPECT_TRUE(c.failover);
  EXPECT_EQ(c.ring_size, 1u << 20);
  EXPECT_EQ(c.spin_us, 50u);
  EXPECT_EQ(c.handshake_timeout_ms, 2000u);
  EXPECT_EQ(c.log_level, LogLevel::kWarn);
  EXPECT_TRUE(c.log_file.empty());
  EXPECT_TRUE(c.stats_file.empty());
  EXPECT_TRUE(c.include_ports.empty() && c.exclude_ports.empty());
  EXPECT_TRUE(c.include_cidrs.empty() && c.exclude_cidrs.empty());
}

TEST(Config, Failover) {
  EXPECT_FALSE(MustParse({{"SLIP_FAILOVER", "0"}}).failover);
  EXPECT_FALSE(MustParse({{"SLIP_FAILOVER", "no"}}).failover);
  EXPECT_TRUE(MustParse({{"SLIP_FAILOVER", "TRUE"}}).failover);
  MustFail("SLIP_FAILOVER", "");
  MustFail("SLIP_FAILOVER", "2");
  MustFail("SLIP_FAILOVER", "off");
}

TEST(Config, RendezvousDir) {
  EXPECT_TRUE(MustParse({}).rendezvous_dir.empty());
  EXPECT_TRUE(MustParse({{"SLIP_RENDEZVOUS_DIR", ""}}).rendezvous_dir.empty());
  EXPECT_EQ(MustParse({{"SLIP_RENDEZVOUS_DIR", "/var/run/slip"}}).rendezvous_dir, "/var/run/slip");
  EXPECT_EQ(MustParse({{"SLIP_RENDEZVOUS_DIR", " /var/run/slip// "}}).rendezvous_dir,
            "/var/run/slip");
  EXPECT_EQ(MustParse({{"SLIP_RENDEZVOUS_DIR", "/"}}).rendezvous_dir, "/");
  const std::string longest = "/" + std::string(Config::kMaxRendezvousDirLength - 1, 'd');
  EXPECT_EQ(MustParse({{"SLIP_RENDEZVOUS_DIR", longest}}).rendezvous_dir, longest);
  MustFail("SLIP_RENDEZVOUS_DIR", "relative/dir");
  MustFail("SLIP_RENDEZVOUS_DIR", longest + "x");
}

TEST(Config, Enable) {
  for (const char* v : {"1", "true", "TRUE", "yes", "Yes"}) {
    EXPECT_TRUE(MustParse({{"SLIP_ENABLE", v}}).enabled) << v;
  }
  for (const char* v : {"0", "false", "False", "no", "NO"}) {
    EXPECT_FALSE(MustParse({{"SLIP_ENABLE", v}}).enabled) << v;
  }
  for (const char* v : {"", "2", "on", "1 ", "truex", "y"}) MustFail("SLIP_ENABLE", v);
}

TEST(Config, Transports) {
  Config c = MustParse({{"SLIP_TRANSPORTS", "verbs, SHM,tcp,fabric"}});
  TransportList want = {TransportKind::kVerbs, TransportKind::kShm, TransportKind::kTcp,
                        TransportKind::kFabric};
  EXPECT_TRUE(c.transports == want);
  c = MustParse({{"SLIP_TRANSPORTS", "shm"}});
  EXPECT_TRUE(c.Allows(TransportKind::kShm));
  EXPECT_FALSE(c.Allows(TransportKind::kTcp));
  EXPECT_FALSE(c.Allows(TransportKind::kVerbs));

  EXPECT_NE(MustFail("SLIP_TRANSPORTS", "shm,foo").find("unknown transport \"foo\""),
            std::string::npos);
  // A kind exists only with its transport.
  EXPECT_NE(MustFail("SLIP_TRANSPORTS", "dpdk").find("unknown transport \"dpdk\""),
            std::string::npos);
  EXPECT_NE(MustFail("SLIP_TRANSPORTS", "shm,tcp,SHM").find("duplicate \"SHM\""),
            std::string::npos);
  EXPECT_NE(MustFail("SLIP_TRANSPORTS", "").find("empty item"), std::string::npos);
  for (const char* v : {",", "shm,", ",shm", "shm,,tcp", " ", "shm tcp"}) {
    MustFail("SLIP_TRANSPORTS", v);
  }
}

TEST(Config, TransportNames) {
  EXPECT_STREQ(TransportName(TransportKind::kTcp), "tcp");
  EXPECT_STREQ(TransportName(TransportKind::kShm), "shm");
  EXPECT_STREQ(TransportName(TransportKind::kVerbs), "verbs");
  EXPECT_STREQ(TransportName(TransportKind::kFabric), "fabric");
  EXPECT_STREQ(TransportName(static_cast<TransportKind>(200)), "?");
}

TEST(Config, RingSizeAcceptsSuffixes) {
  const std::pair<const char*, uint32_t> good[] = {
      {"4096", 4096},           {"4K", 4096},      {"4k", 4096},         {"64K", 65536},
      {"64KiB", 65536},         {"64kb", 65536},   {"1M", 1u << 20},     {"1MiB", 1u << 20},
      {"1mib", 1u << 20},       {"1MB", 1u << 20}, {"256M", 256u << 20}, {"0000008K", 8192},
      {"268435456", 256u << 20}};
  for (const auto& [text, size] : good) {
    EXPECT_EQ(MustParse({{"SLIP_RING_SIZE", text}}).ring_size, size) << text;
  }
}

TEST(Config, RingSizeRejects) {
  EXPECT_EQ(MustFail("SLIP_RING_SIZE", "abc"),
            "SLIP_RING_SIZE=\"abc\": expected a power-of-two size between 4K and 256M (e.g. 1M)");
  for (const char* v : {"",
                        "2G",
                        "512M",
                        "2K",
                        "2048",
                        "0",
                        "3K",
                        "1000000",
                        "1.5M",
                        "1MX",
                        "1Mi",
                        "1MiBB",
                        "M",
                        "-1M",
                        "+1M",
                        " 1M",
                        "1M ",
                        "1T",
                        "0x1000",
                        "99999999999999999999K",
                        "17179869184G"}) {
    MustFail("SLIP_RING_SIZE", v);
  }
}

TEST(Config, Integers) {
  EXPECT_EQ(MustParse({{"SLIP_SPIN_US", "0"}}).spin_us, 0u);
  EXPECT_EQ(MustParse({{"SLIP_SPIN_US", "1000000"}}).spin_us, 1000000u);
  EXPECT_EQ(MustParse({{"SLIP_SPIN_US", "007"}}).spin_us, 7u);
  EXPECT_EQ(MustParse({{"SLIP_HANDSHAKE_TIMEOUT_MS", "1"}}).handshake_timeout_ms, 1u);
  EXPECT_EQ(MustParse({{"SLIP_HANDSHAKE_TIMEOUT_MS", "600000"}}).handshake_timeout_ms, 600000u);
  for (const char* v : {"", "1000001", "-1", "+5", "5x", " 5", "0x10", "1e3", "4294967296",
                        "18446744073709551616", "99999999999999999999999"}) {
    MustFail("SLIP_SPIN_US", v);
  }
  for (const char* v : {"0", "600001", "-5", "2s", ""}) MustFail("SLIP_HANDSHAKE_TIMEOUT_MS", v);
  EXPECT_NE(MustFail("SLIP_SPIN_US", "x").find("between 0 and 1000000"), std::string::npos);
}

TEST(Config, LogLevelAndFiles) {
  const std::pair<const char*, LogLevel> levels[] = {{"error", LogLevel::kError},
                                                     {"warn", LogLevel::kWarn},
                                                     {"INFO", LogLevel::kInfo},
                                                     {"Debug", LogLevel::kDebug},
                                                     {"trace", LogLevel::kTrace}};
  for (const auto& [text, level] : levels) {
    EXPECT_EQ(MustParse({{"SLIP_LOG", text}}).log_level, level) << text;
  }
  for (const char* v : {"", "warning", "verbose", "3", "warn "}) MustFail("SLIP_LOG", v);

  Config c = MustParse({{"SLIP_LOG_FILE", "/tmp/a log"}, {"SLIP_STATS_FILE", "/tmp/s.json"}});
  EXPECT_EQ(c.log_file, "/tmp/a log");
  EXPECT_EQ(c.stats_file, "/tmp/s.json");
}

TEST(Config, Ports) {
  Config c =
      MustParse({{"SLIP_INCLUDE_PORTS", "80, 8000-9000,65535"}, {"SLIP_EXCLUDE_PORTS", "1,5-5"}});
  ASSERT_EQ(c.include_ports.size(), 3u);
  EXPECT_EQ(c.include_ports[0].first, 80);
  EXPECT_EQ(c.include_ports[0].last, 80);
  EXPECT_EQ(c.include_ports[1].first, 8000);
  EXPECT_EQ(c.include_ports[1].last, 9000);
  EXPECT_EQ(c.include_ports[2].first, 65535);
  ASSERT_EQ(c.exclude_ports.size(), 2u);
  EXPECT_EQ(c.exclude_ports[1].first, 5);
  EXPECT_EQ(c.exclude_ports[1].last, 5);
  EXPECT_TRUE(MustParse({{"SLIP_EXCLUDE_PORTS", ""}}).exclude_ports.empty());

  for (const char* name : {"SLIP_INCLUDE_PORTS", "SLIP_EXCLUDE_PORTS"}) {
    for (const char* v : {"0", "65536", "9000-8000", "80-", "-80", "a", "80,,90", "80,",
                          "80-90-100", "0-10", "1-65536", "+80", "8 0"}) {
      MustFail(name, v);
    }
  }
  EXPECT_NE(MustFail("SLIP_EXCLUDE_PORTS", "80,abc").find("bad item \"abc\""), std::string::npos);
}

TEST(Config, Cidrs) {
  Config c = MustParse({{"SLIP_INCLUDE_CIDR", "127.0.0.0/8,::1/128, 10.1.2.3,::ffff:10.0.0.0/104"},
                        {"SLIP_EXCLUDE_CIDR", "0.0.0.0/0,::/0"}});
  ASSERT_EQ(c.include_cidrs.size(), 4u);
  EXPECT_EQ(c.include_cidrs[0].family, AF_INET);
  EXPECT_EQ(c.include_cidrs[0].prefix_len, 8);
  EXPECT_EQ(c.include_cidrs[0].addr[0], 127);
  EXPECT_EQ(c.include_cidrs[1].family, AF_INET6);
  EXPECT_EQ(c.include_cidrs[1].prefix_len, 128);
  EXPECT_EQ(c.include_cidrs[1].addr[15], 1);
  EXPECT_EQ(c.include_cidrs[2].family, AF_INET);
  EXPECT_EQ(c.include_cidrs[2].prefix_len, 32);
  EXPECT_EQ(c.include_cidrs[2].addr[3], 3);
  // A v4-mapped prefix is stored as the IPv4 prefix it denotes.
  EXPECT_EQ(c.include_cidrs[3].family, AF_INET);
  EXPECT_EQ(c.include_cidrs[3].prefix_len, 8);
  EXPECT_EQ(c.include_cidrs[3].addr[0], 10);
  ASSERT_EQ(c.exclude_cidrs.size(), 2u);
  EXPECT_EQ(c.exclude_cidrs[0].prefix_len, 0);
  EXPECT_EQ(c.exclude_cidrs[1].family, AF_INET6);

  for (const char* name : {"SLIP_INCLUDE_CIDR", "SLIP_EXCLUDE_CIDR"}) {
    for (const char* v :
         {"10.0.0.0/33", "::1/129", "300.1.1.1", "10.0.0.0/", "10.0.0.0/8x", "10.0.0.0/-1",
          "10.0.0/8", "fe80::1%eth0", "/8", "host", "10.0.0.1,,", "::1/+1", "1.2.3.4/ 8"}) {
      MustFail(name, v);
    }
  }
}

TEST(Config, ErrorMessageQuotesSafely) {
  std::string error = MustFail("SLIP_LOG", "a\nb\tc");
  EXPECT_EQ(error.rfind("SLIP_LOG=\"a?b?c\": ", 0), 0u) << error;
  error = MustFail("SLIP_LOG", std::string(500, 'x'));
  EXPECT_LT(error.size(), 200u);
  EXPECT_NE(error.find("...\""), std::string::npos);
}

TEST(Config, FirstBadVariableWins) {
  Config c;
  std::string error;
  EXPECT_FALSE(Parse({{"SLIP_ENABLE", "1"}, {"SLIP_SPIN_US", "x"}}, &c, &error));
  EXPECT_EQ(error.rfind("SLIP_SPIN_US=", 0), 0u) << error;
  EXPECT_FALSE(ParseConfig(nullptr, nullptr, &c, &error));
}

TEST(Config, FromProcessEnvironment) {
  setenv("SLIP_SPIN_US", "77", 1);
  setenv("SLIP_LOG", "debug", 1);
  Config c;
  std::string error;
  EXPECT_TRUE(ParseConfigFromEnv(&c, &error)) << error;
  EXPECT_EQ(c.spin_us, 77u);
  EXPECT_EQ(c.log_level, LogLevel::kDebug);
  setenv("SLIP_RING_SIZE", "5K", 1);
  EXPECT_FALSE(ParseConfigFromEnv(&c, &error));
  EXPECT_EQ(error.rfind("SLIP_RING_SIZE=\"5K\"", 0), 0u) << error;
  unsetenv("SLIP_SPIN_US");
  unsetenv("SLIP_LOG");
  unsetenv("SLIP_RING_SIZE");
}

TEST(Config, UnknownSlipVariables) {
  std::string entries[] = {"SLIP_ENABLE=1",
                           "SLIP_TRANSPORTS=shm",
                           "SLIP_RING_SIZE=1M",
                           "SLIP_SPIN_US=1",
                           "SLIP_HANDSHAKE_TIMEOUT_MS=1",
                           "SLIP_LOG=warn",
                           "SLIP_LOG_FILE=x",
                           "SLIP_STATS_FILE=y",
                           "SLIP_INCLUDE_PORTS=",
                           "SLIP_EXCLUDE_PORTS=",
                           "SLIP_INCLUDE_CIDR=",
                           "SLIP_EXCLUDE_CIDR=",
                           "SLIP_DEVICE=rxe0",
                           "SLIP_GID_INDEX=1",
                           "SLIP_VERBS_NOTIFY=imm",
                           "SLIP_NEGATIVE_TTL_MS=5",
                           "SLIP_VERBS_REUSE=4",
                           "SLIP_FAILOVER=1",
                           "SLIP_VM_NODE=1",
                           "SLIP_TEST_PLAIN=1",
                           "SLIP_NCCL_QPS=2",  // the NCCL plugin's
                           "SLIP_RINGSIZE=1M",
                           "SLIP_log=info",
                           "PATH=/bin",
                           "XSLIP_FOO=1",
                           "SLIP_NOVALUE",
                           "SLIP_=1"};
  std::vector<char*> envp;
  for (auto& e : entries) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> want = {"SLIP_RINGSIZE", "SLIP_log", "SLIP_NOVALUE", "SLIP_"};
  const char* const verbs_names[] = {"SLIP_DEVICE", "SLIP_GID_INDEX", "SLIP_VERBS_NOTIFY",
                                     "SLIP_NEGATIVE_TTL_MS", "SLIP_VERBS_REUSE"};
  EXPECT_EQ(UnknownSlipVariables(envp.data(), verbs_names), want);
  // Without the transports' names, theirs are unknown to core.
  std::vector<std::string> core_only = UnknownSlipVariables(envp.data());
  EXPECT_EQ(core_only.size(), want.size() + std::size(verbs_names));
  EXPECT_TRUE(UnknownSlipVariables(nullptr).empty());
}

// ---- Policy ----

sockaddr_storage V4(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
  sin->sin_family = AF_INET;
  sin->sin_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET, ip, &sin->sin_addr), 1) << ip;
  return ss;
}

sockaddr_storage V6(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
  sin6->sin6_family = AF_INET6;
  sin6->sin6_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET6, ip, &sin6->sin6_addr), 1) << ip;
  return ss;
}

bool Allows(const Config& c, const sockaddr_storage& local, const sockaddr_storage& remote) {
  return PolicyAllows(c, reinterpret_cast<const sockaddr*>(&local),
                      reinterpret_cast<const sockaddr*>(&remote));
}

TEST(Policy, EmptyConfigAllowsIpOnly) {
  Config c = MustParse({});
  EXPECT_TRUE(Allows(c, V4("127.0.0.1", 40000), V4("127.0.0.1", 80)));
  EXPECT_TRUE(Allows(c, V6("::1", 40000), V6("::1", 80)));
  sockaddr_storage unix_addr{};
  unix_addr.ss_family = AF_UNIX;
  EXPECT_FALSE(Allows(c, V4("127.0.0.1", 1), unix_addr));
  EXPECT_FALSE(PolicyAllows(c, nullptr, nullptr));
  auto remote = V4("127.0.0.1", 80);
  EXPECT_TRUE(PolicyAllows(c, nullptr, reinterpret_cast<const sockaddr*>(&remote)));
}

TEST(Policy, Ports) {
  Config c = MustParse({{"SLIP_INCLUDE_PORTS", "80,8000-9000"}, {"SLIP_EXCLUDE_PORTS", "8500"}});
  auto local = V4("127.0.0.1", 40000);
  EXPECT_TRUE(Allows(c, local, V4("127.0.0.1", 80)));
  EXPECT_TRUE(Allows(c, local, V4("127.0.0.1", 8000)));
  EXPECT_TRUE(Allows(c, local, V4("127.0.0.1", 9000)));
  EXPECT_FALSE(Allows(c, local, V4("127.0.0.1", 8500)));  // excluded inside an include range
  EXPECT_FALSE(Allows(c, local, V4("127.0.0.1", 9001)));
  EXPECT_FALSE(Allows(c, local, V4("127.0.0.1", 81)));
  // Server side: the local port is the service port and matches the include list.
  EXPECT_TRUE(Allows(c, V4("127.0.0.1", 80), V4("127.0.0.1", 40000)));
  // An excluded local port vetoes too.
  EXPECT_FALSE(Allows(c, V4("127.0.0.1", 8500), V4("127.0.0.1", 80)));
  // Without a local address only the remote port counts.
  auto remote = V4("127.0.0.1", 81);
  EXPECT_FALSE(PolicyAllows(c, nullptr, reinterpret_cast<const sockaddr*>(&remote)));
}

TEST(Policy, CidrsV4V6AndMapped) {
  Config c = MustParse({{"SLIP_INCLUDE_CIDR", "127.0.0.0/8,fd00::/8,10.1.2.3"},
                        {"SLIP_EXCLUDE_CIDR", "127.0.0.99,fd00:1::/32"}});
  auto local = V4("127.0.0.1", 1);
  EXPECT_TRUE(Allows(c, local, V4("127.1.2.3", 80)));
  EXPECT_FALSE(Allows(c, local, V4("128.0.0.1", 80)));
  EXPECT_TRUE(Allows(c, local, V4("10.1.2.3", 80)));
  EXPECT_FALSE(Allows(c, local, V4("10.1.2.4", 80)));
  EXPECT_FALSE(Allows(c, local, V4("127.0.0.99", 80)));
  EXPECT_TRUE(Allows(c, local, V6("fd12::5", 80)));
  EXPECT_FALSE(Allows(c, local, V6("fe00::5", 80)));
  EXPECT_FALSE(Allows(c, local, V6("fd00:1::7", 80)));
  EXPECT_FALSE(Allows(c, local, V6("::1", 80)));
  // v4-mapped addresses match IPv4 rules, include and exclude.
  EXPECT_TRUE(Allows(c, local, V6("::ffff:127.0.0.1", 80)));
  EXPECT_TRUE(Allows(c, local, V6("::ffff:10.1.2.3", 80)));
  EXPECT_FALSE(Allows(c, local, V6("::ffff:127.0.0.99", 80)));
  EXPECT_FALSE(Allows(c, local, V6("::ffff:128.0.0.1", 80)));
  // Only the remote address is matched against CIDRs.
  EXPECT_FALSE(Allows(c, V4("127.0.0.1", 1), V4("192.168.0.1", 80)));
}

TEST(Policy, PrefixBoundaries) {
  Config c = MustParse({{"SLIP_INCLUDE_CIDR", "192.168.4.0/22,2001:db8:8000::/33"}});
  auto local = V4("127.0.0.1", 1);
  EXPECT_FALSE(Allows(c, local, V4("192.168.3.255", 80)));
  EXPECT_TRUE(Allows(c, local, V4("192.168.4.0", 80)));
  EXPECT_TRUE(Allows(c, local, V4("192.168.7.255", 80)));
  EXPECT_FALSE(Allows(c, local, V4("192.168.8.0", 80)));
  EXPECT_TRUE(Allows(c, local, V6("2001:db8:ffff::1", 80)));
  EXPECT_FALSE(Allows(c, local, V6("2001:db8:7fff::1", 80)));
  // ::/0 covers IPv6 only; IPv4 has 0.0.0.0/0.
  c = MustParse({{"SLIP_EXCLUDE_CIDR", "::/0"}});
  EXPECT_TRUE(Allows(c, local, V4("1.2.3.4", 80)));
  EXPECT_FALSE(Allows(c, local, V6("2001:db8::1", 80)));
  c = MustParse({{"SLIP_EXCLUDE_CIDR", "0.0.0.0/0"}});
  EXPECT_FALSE(Allows(c, local, V6("::ffff:1.2.3.4", 80)));
  EXPECT_TRUE(Allows(c, local, V6("::1", 80)));
}

TEST(Policy, DecodeSockaddr) {
  IpEndpoint ep;
  auto a = V6("::ffff:1.2.3.4", 443);
  ASSERT_TRUE(DecodeSockaddr(reinterpret_cast<sockaddr*>(&a), &ep));
  EXPECT_EQ(ep.family, AF_INET);
  EXPECT_EQ(ep.port, 443);
  EXPECT_EQ(ep.addr[0], 1);
  EXPECT_EQ(ep.addr[3], 4);
  a = V6("2001:db8::1", 80);
  ASSERT_TRUE(DecodeSockaddr(reinterpret_cast<sockaddr*>(&a), &ep));
  EXPECT_EQ(ep.family, AF_INET6);
  EXPECT_EQ(ep.addr[15], 1);
  EXPECT_FALSE(DecodeSockaddr(nullptr, &ep));
}

// ---- Log ----

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs fn with stderr redirected to a file; returns what was written.
template <typename F>
std::string CaptureStderr(F fn) {
  char path[] = "/tmp/slip_log_test_XXXXXX";
  int fd = mkstemp(path);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  fn();
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fd);
  std::string text = ReadFile(path);
  unlink(path);
  return text;
}

// The rate limit's clock for these tests: a day on per test, so that every call site
// starts with its whole burst, also when the tests repeat (--gtest_repeat) within a second.
std::atomic<uint64_t> g_log_clock_ms{0};
uint64_t LogClock() {
  return g_log_clock_ms.load();
}

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/slip_log_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/log";
    prefix_ = "slipstream[" + std::to_string(getpid()) + "]: ";
    g_log_clock_ms += 86'400'000;
    LogSetClockForTest(LogClock);
  }
  void TearDown() override {
    LogSetClockForTest(nullptr);
    LogInit(LogLevel::kWarn, nullptr);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::string dir_, path_, prefix_;
};

TEST_F(LogTest, LevelsAndFormat) {
  LogInit(LogLevel::kInfo, path_.c_str());
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  EXPECT_TRUE(LogEnabled(LogLevel::kInfo));
  EXPECT_FALSE(LogEnabled(LogLevel::kDebug));
  errno = EAGAIN;
  SLIP_LOG(kWarn, "hello %d %s", 42, "world");
  SLIP_LOG(kDebug, "hidden");
  LogWrite(LogLevel::kTrace, "hidden too");
  LogWrite(LogLevel::kInfo, "with newline\n");
  EXPECT_EQ(errno, EAGAIN);  // logging must not clobber errno
  EXPECT_EQ(ReadFile(path_), prefix_ + "warn: hello 42 world\n" + prefix_ + "info: with newline\n");
}

TEST_F(LogTest, AppendsAndReinitKeepsWorking) {
  { std::ofstream(path_) << "existing\n"; }
  LogInit(LogLevel::kError, path_.c_str());
  SLIP_LOG(kError, "one");
  std::string second = dir_ + "/second";
  LogInit(LogLevel::kError, second.c_str());
  SLIP_LOG(kError, "two");
  EXPECT_EQ(ReadFile(path_), "existing\n" + prefix_ + "error: one\n");
  EXPECT_EQ(ReadFile(second), prefix_ + "error: two\n");
  unlink(second.c_str());
}

TEST_F(LogTest, FailedWriteKeepsErrno) {
  LogInit(LogLevel::kWarn, "/dev/full");  // every write fails with ENOSPC
  errno = EAGAIN;
  SLIP_LOG(kWarn, "lost");
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(LogTest, ReinitDoesNotLeakDescriptors) {
  auto count_fds = [] {
    int n = 0;
    for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += !e.is_directory();
    return n;
  };
  LogInit(LogLevel::kWarn, path_.c_str());
  int before = count_fds();
  for (int i = 0; i < 10; ++i) LogInit(LogLevel::kWarn, path_.c_str());
  LogInit(LogLevel::kWarn, nullptr);  // back to stderr: our descriptor may stay, no new ones
  EXPECT_EQ(count_fds(), before);
  std::string err = CaptureStderr([] { SLIP_LOG(kWarn, "after"); });
  EXPECT_NE(err.find("warn: after"), std::string::npos) << err;
}

// At info level: warn lines from one site are rate-limited (log_test.cc).
TEST_F(LogTest, ConcurrentLinesStayWhole) {
  LogInit(LogLevel::kInfo, path_.c_str());
  constexpr int kThreads = 8, kLines = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i) SLIP_LOG(kInfo, "thread %d line %d %s", t, i, "payload");
    });
  }
  for (auto& th : threads) th.join();
  std::istringstream lines(ReadFile(path_));
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    int t, i;
    char tail[16];
    std::string body = line.substr(prefix_.size());
    ASSERT_EQ(line.rfind(prefix_, 0), 0u) << line;
    ASSERT_EQ(sscanf(body.c_str(), "info: thread %d line %d %15s", &t, &i, tail), 3) << line;
    ASSERT_STREQ(tail, "payload");
  }
  EXPECT_EQ(count, kThreads * kLines);
}

TEST_F(LogTest, LongLinesAreTruncatedToOneLine) {
  LogInit(LogLevel::kWarn, path_.c_str());
  std::string big(5000, 'x');
  SLIP_LOG(kWarn, "%s", big.c_str());
  std::string text = ReadFile(path_);
  EXPECT_EQ(text.size(), 1024u);  // the ~1 KiB line limit, newline included
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1);
}

TEST_F(LogTest, BadPathFallsBackToStderr) {
  std::string bad = dir_ + "/missing/dir/log";
  std::string err = CaptureStderr([&] {
    LogInit(LogLevel::kWarn, bad.c_str());
    SLIP_LOG(kWarn, "to stderr");
    LogAlways("always %d", 7);
  });
  EXPECT_NE(err.find("SLIP_LOG_FILE \"" + bad + "\" not used"), std::string::npos) << err;
  EXPECT_NE(err.find(prefix_ + "warn: to stderr\n"), std::string::npos) << err;
  EXPECT_NE(err.find(prefix_ + "always 7\n"), std::string::npos) << err;
}

TEST_F(LogTest, LogAlwaysIgnoresLevelAndFile) {
  LogInit(LogLevel::kError, path_.c_str());
  std::string err = CaptureStderr([] { LogAlways("config says %s", "no"); });
  EXPECT_EQ(err, prefix_ + "config says no\n");
  EXPECT_EQ(ReadFile(path_), "");
}

}  // namespace
}  // namespace slip
