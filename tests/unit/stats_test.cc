// Unit tests for core/stats: the shared-memory table, slot reuse, fork, the exit record.
#include "core/stats.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace slip {
namespace {

constexpr size_t kFileSize = sizeof(StatsHeader) + kStatsSlots * sizeof(ConnSlot);
constexpr const char* kPython = "/usr/bin/python3";

std::string ShmPath(pid_t pid) {
  return "/dev/shm/slipstream-stats." + std::to_string(pid);
}
bool Exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

sockaddr_storage Addr(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  if (strchr(ip, ':') != nullptr) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    EXPECT_EQ(inet_pton(AF_INET6, ip, &sin6->sin6_addr), 1);
  } else {
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    EXPECT_EQ(inet_pton(AF_INET, ip, &sin->sin_addr), 1);
  }
  return ss;
}
const sockaddr* Sa(const sockaddr_storage& ss) {
  return reinterpret_cast<const sockaddr*>(&ss);
}

std::string Format(const sockaddr_storage& ss, size_t len = 48) {
  char out[64];
  memset(out, '#', sizeof(out));
  FormatSockaddr(Sa(ss), out, len);
  return out;
}

ConnSlot* OpenConn(TransportKind t = TransportKind::kShm, Reason r = Reason::kNone, int role = 0,
                   const char* local = "127.0.0.1", uint16_t port = 5201) {
  auto l = Addr(local, 40000), rem = Addr(local, port);
  return StatsOpen(t, r, role, Sa(l), Sa(rem));
}

// Maps this process's stats file a second time, read-only, as slip-stat would.
class ReaderView {
 public:
  explicit ReaderView(pid_t pid = getpid(), bool writable = false) {
    int fd = open(ShmPath(pid).c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0) size_ = static_cast<size_t>(st.st_size);
    int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
    void* p = mmap(nullptr, kFileSize, prot, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) header_ = static_cast<StatsHeader*>(p);
  }
  ~ReaderView() {
    if (header_) munmap(header_, kFileSize);
  }
  StatsHeader* header() const { return header_; }
  const ConnSlot& slot(size_t i) const { return reinterpret_cast<const ConnSlot*>(header_ + 1)[i]; }
  size_t size() const { return size_; }

 private:
  StatsHeader* header_ = nullptr;
  size_t size_ = 0;
};

class StatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatsShutdown();
    StatsInit();
  }
  void TearDown() override {
    StatsShutdown();
    EXPECT_FALSE(Exists(ShmPath(getpid())));
    if (!record_.empty()) unlink(record_.c_str());
  }
  // A fresh path for an exit record, removed at TearDown.
  const std::string& RecordPath() {
    record_ = "/tmp/slip_stats_test_" + std::to_string(getpid()) + ".jsonl";
    unlink(record_.c_str());
    return record_;
  }
  std::string record_;
};

// Runs a Python snippet with the exit record at sys.argv[1]; an assert failure fails the test.
void CheckWithPython(const std::string& path, const std::string& script) {
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << "no python3 to validate JSON";
  pid_t pid;
  std::string code =
      "import json,sys\nlines=open(sys.argv[1],'rb').read().decode('utf-8').split('\\n')\n"
      "assert lines[-1]=='', 'record must end with a newline'\n"
      "recs=[json.loads(l) for l in lines[:-1]]\n" +
      script;
  const char* argv[] = {kPython, "-c", code.c_str(), path.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&pid, kPython, nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(path);
}

TEST(StatsNames, Reasons) {
  EXPECT_STREQ(ReasonName(Reason::kNone), "none");
  EXPECT_STREQ(ReasonName(Reason::kPeerNotSlipstream), "peer_not_slipstream");
  EXPECT_STREQ(ReasonName(Reason::kNotSameHost), "not_same_host");
  EXPECT_STREQ(ReasonName(Reason::kPolicy), "policy");
  EXPECT_STREQ(ReasonName(Reason::kDisabled), "disabled");
  EXPECT_STREQ(ReasonName(Reason::kDeclined), "declined");
  EXPECT_STREQ(ReasonName(Reason::kHandshakeTimeout), "handshake_timeout");
  EXPECT_STREQ(ReasonName(Reason::kResources), "resources");
  EXPECT_STREQ(ReasonName(Reason::kConnectSlow), "connect_slow");
  EXPECT_STREQ(ReasonName(Reason::kRendezvousBusy), "rendezvous_busy");
  EXPECT_STREQ(ReasonName(Reason::kNonceMismatch), "nonce_mismatch");
  EXPECT_STREQ(ReasonName(Reason::kFailover), "failover");
  EXPECT_STREQ(ReasonName(Reason::kUnsupported), "unsupported");
  EXPECT_STREQ(ReasonName(Reason::kCount), "unknown");
}

TEST(StatsFormat, Sockaddr) {
  EXPECT_EQ(Format(Addr("1.2.3.4", 80)), "1.2.3.4:80");
  EXPECT_EQ(Format(Addr("::1", 80)), "[::1]:80");
  EXPECT_EQ(Format(Addr("::ffff:127.0.0.1", 5201)), "127.0.0.1:5201");
  EXPECT_EQ(Format(Addr("255.255.255.255", 65535)), "255.255.255.255:65535");
  // The longest IPv6 text still fits a ConnSlot field.
  std::string longest = Format(Addr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", 65535));
  EXPECT_EQ(longest, "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe]:65535");
  EXPECT_LT(longest.size(), sizeof(ConnSlot::local));
  sockaddr_storage unix_addr{};
  unix_addr.ss_family = AF_UNIX;
  EXPECT_EQ(Format(unix_addr), "?");
  char out[8] = "xxxxxxx";
  FormatSockaddr(nullptr, out, sizeof(out));
  EXPECT_STREQ(out, "?");
  EXPECT_EQ(Format(Addr("1.2.3.4", 80), 6), "1.2.3");  // truncated, still terminated
}

TEST_F(StatsTest, FirstOpenCreatesFile) {
  EXPECT_FALSE(Exists(ShmPath(getpid())));  // no connection, no file
  ConnSlot* slot = OpenConn();
  ASSERT_NE(slot, nullptr);
  ReaderView view;
  ASSERT_NE(view.header(), nullptr);
  EXPECT_EQ(view.size(), kFileSize);
  EXPECT_EQ(view.header()->magic, kStatsMagic);
  EXPECT_EQ(view.header()->version, kStatsVersion);
  EXPECT_EQ(view.header()->pid, static_cast<uint32_t>(getpid()));
  EXPECT_EQ(view.header()->slot_count, kStatsSlots);
  EXPECT_EQ(std::string(view.header()->exe),
            std::filesystem::read_symlink("/proc/self/exe").string());
  struct stat st;
  ASSERT_EQ(stat(ShmPath(getpid()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A second init keeps the same table.
  StatsInit();
  OpenConn();
  EXPECT_EQ(view.header()->high_water.load(), 2u);
  StatsClose(slot);
}

TEST_F(StatsTest, OpenCountClose) {
  auto local = Addr("::1", 40000), remote = Addr("::1", 5201);
  ConnSlot* slot = StatsOpen(TransportKind::kShm, Reason::kNone, 1, Sa(local), Sa(remote));
  ASSERT_NE(slot, nullptr);
  StatsAddSent(slot, 100);
  StatsAddSent(slot, 20);
  StatsAddReceived(slot, 7);
  StatsAddSent(nullptr, 1);  // tolerated

  ReaderView view;  // what another process sees
  const ConnSlot& seen = view.slot(0);
  EXPECT_EQ(seen.state.load(), static_cast<uint32_t>(SlotState::kOpen));
  EXPECT_EQ(seen.transport, static_cast<uint8_t>(TransportKind::kShm));
  EXPECT_EQ(seen.reason, static_cast<uint8_t>(Reason::kNone));
  EXPECT_EQ(seen.role, 1);
  EXPECT_STREQ(seen.local, "[::1]:40000");
  EXPECT_STREQ(seen.remote, "[::1]:5201");
  EXPECT_EQ(seen.bytes_sent.load(), 120u);
  EXPECT_EQ(seen.msgs_sent.load(), 2u);
  EXPECT_EQ(seen.bytes_received.load(), 7u);
  EXPECT_EQ(seen.msgs_received.load(), 1u);
  EXPECT_GT(seen.opened_ns, 1600000000ull * 1000000000ull);
  EXPECT_EQ(seen.closed_ns.load(), 0u);
  EXPECT_EQ(view.header()->high_water.load(), 1u);

  StatsClose(slot);
  EXPECT_EQ(seen.state.load(), static_cast<uint32_t>(SlotState::kClosed));
  EXPECT_GE(seen.closed_ns.load(), seen.opened_ns);
  StatsClose(nullptr);
}

TEST_F(StatsTest, ReasonCounts) {
  ConnSlot* a = OpenConn(TransportKind::kShm, Reason::kNone);
  ConnSlot* b = OpenConn(TransportKind::kTcp, Reason::kPolicy);
  ReaderView view;
  auto count = [&](Reason r) { return view.header()->reason_counts[static_cast<int>(r)].load(); };
  OpenConn(TransportKind::kTcp, Reason::kPolicy);
  EXPECT_EQ(count(Reason::kNone), 1u);
  EXPECT_EQ(count(Reason::kPolicy), 2u);
  StatsSetTransport(a, TransportKind::kTcp, Reason::kFailover);
  StatsSetTransport(a, TransportKind::kTcp, Reason::kFailover);  // unchanged: not recounted
  StatsSetTransport(b, TransportKind::kTcp, Reason::kPolicy);
  EXPECT_EQ(count(Reason::kFailover), 1u);
  EXPECT_EQ(count(Reason::kPolicy), 2u);
  EXPECT_EQ(a->transport, static_cast<uint8_t>(TransportKind::kTcp));
  EXPECT_EQ(a->reason, static_cast<uint8_t>(Reason::kFailover));
  StatsSetTransport(nullptr, TransportKind::kTcp, Reason::kFailover);
}

TEST_F(StatsTest, FullTableReusesClosedSlots) {
  std::vector<ConnSlot*> slots;
  for (uint32_t i = 0; i < kStatsSlots; ++i) slots.push_back(OpenConn());
  ReaderView view;
  ASSERT_EQ(slots.back(), slots.front() + (kStatsSlots - 1));  // all distinct, in order
  EXPECT_EQ(OpenConn(), nullptr);                              // all open: not recorded
  EXPECT_EQ(view.header()->dropped.load(), 1u);

  StatsAddSent(slots[100], 999);
  StatsAddSent(slots[7], 99);
  StatsClose(slots[100]);
  StatsClose(slots[7]);
  ConnSlot* reused = OpenConn(TransportKind::kTcp, Reason::kDeclined);
  EXPECT_EQ(reused, slots[7]);
  EXPECT_EQ(view.header()->dropped.load(), 2u);  // the overwritten closed record
  EXPECT_EQ(reused->bytes_sent.load(), 0u);      // counters start from zero
  EXPECT_EQ(reused->state.load(), static_cast<uint32_t>(SlotState::kOpen));
  EXPECT_EQ(reused->reason, static_cast<uint8_t>(Reason::kDeclined));
  // Round-robin: slot 7, just closed again, is not overwritten before slot 100.
  StatsClose(reused);
  EXPECT_EQ(OpenConn(), slots[100]);
  EXPECT_EQ(OpenConn(), slots[7]);
  EXPECT_EQ(OpenConn(), nullptr);
  EXPECT_EQ(view.header()->dropped.load(), 5u);
  EXPECT_EQ(view.header()->high_water.load(), kStatsSlots);
}

TEST_F(StatsTest, ConcurrentOpensGetDistinctSlots) {
  constexpr int kThreads = 8, kPerThread = 500;
  std::vector<ConnSlot*> got(kThreads * kPerThread);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        ConnSlot* slot = OpenConn();
        StatsAddSent(slot, 1);
        got[t * kPerThread + i] = slot;
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<ConnSlot*> distinct(got.begin(), got.end());
  EXPECT_EQ(distinct.size(), got.size());
  EXPECT_EQ(distinct.count(nullptr), 0u);
  for (ConnSlot* slot : got) EXPECT_EQ(slot->bytes_sent.load(), 1u);
  ReaderView view;
  EXPECT_EQ(view.header()->high_water.load(), static_cast<uint32_t>(got.size()));
}

TEST_F(StatsTest, ExitRecordIsJson) {
  ConnSlot* open = OpenConn(TransportKind::kShm, Reason::kNone, 0, "127.0.0.1", 5201);
  StatsAddSent(open, 1000);
  StatsAddReceived(open, 10);
  ConnSlot* closed = OpenConn(TransportKind::kTcp, Reason::kPeerNotSlipstream, 1, "::1", 80);
  StatsAddReceived(closed, 5);
  StatsClose(closed);
  // A slot being rewritten for reuse is kFree inside high_water: it must be skipped.
  ConnSlot* reusing = OpenConn();
  reusing->state.store(static_cast<uint32_t>(SlotState::kFree));
  const std::string& path = RecordPath();
  StatsWriteExitRecord(path.c_str());
  StatsWriteExitRecord(path.c_str());  // appends a second line
  StatsWriteExitRecord(nullptr);
  StatsWriteExitRecord("");
  CheckWithPython(path,
                  "assert len(recs)==2 and recs[0]==recs[1]\n"
                  "r=recs[0]\n"
                  "assert r['pid']==" +
                      std::to_string(getpid()) +
                      "\n"
                      "assert r['exe']=='" +
                      std::filesystem::read_symlink("/proc/self/exe").string() +
                      "'\n"
                      "assert r['dropped']==0\n"
                      "c=r['connections']\n"
                      "assert c==[{'local':'127.0.0.1:40000','remote':'127.0.0.1:5201',"
                      "'transport':'shm','reason':'','bytes_sent':1000,'bytes_received':10},"
                      "{'local':'[::1]:40000','remote':'[::1]:80','transport':'tcp',"
                      "'reason':'peer_not_slipstream','bytes_sent':0,'bytes_received':5}], c\n");
}

// A process that never had a connection (a shell, a helper) writes no record at all.
TEST_F(StatsTest, ExitRecordWithoutStats) {
  StatsShutdown();
  EXPECT_EQ(OpenConn(), nullptr);  // disabled: no slot, no crash
  const std::string& path = RecordPath();
  StatsWriteExitRecord(path.c_str());
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "a record was written without any connection";
}

TEST_F(StatsTest, ExitRecordOfFullTableParses) {
  for (uint32_t i = 0; i < kStatsSlots; ++i) StatsClose(OpenConn());
  OpenConn();
  const std::string& path = RecordPath();
  StatsWriteExitRecord(path.c_str());
  CheckWithPython(path, "assert len(recs[0]['connections'])==" + std::to_string(kStatsSlots) +
                            " and recs[0]['dropped']==1\n");
}

// The exe path is arbitrary bytes: quotes, backslashes, control characters, invalid UTF-8.
// We plant such a name in the header (as a process started from that path would have).
TEST_F(StatsTest, ExitRecordEscapesStrangeExePath) {
  OpenConn();
  ReaderView view(getpid(), /*writable=*/true);
  ASSERT_NE(view.header(), nullptr);
  strcpy(view.header()->exe, "/we\"ird\\ na\tme\x01\xff\xc3\xa9\xed\xa0\x80\xf0\x9f\x98\x80");
  const std::string& path = RecordPath();
  StatsWriteExitRecord(path.c_str());
  EXPECT_NE(ReadFile(path).find(R"("exe":"/we\"ird\\ na\tme\u0001\ufffd)"), std::string::npos)
      << ReadFile(path);
  CheckWithPython(path,
                  "assert recs[0]['exe']=='/we\"ird\\\\ na\\tme\\x01\\ufffd\\xe9"
                  "\\ufffd\\ufffd\\ufffd\\U0001f600', ascii(recs[0]['exe'])\n"
                  "assert len(recs[0]['connections'])==1\n");
}

TEST_F(StatsTest, StaleFileFromDeadProcessIsReplaced) {
  StatsShutdown();
  std::string path = ShmPath(getpid());
  { std::ofstream(path) << "stale"; }
  StatsInit();
  EXPECT_NE(OpenConn(), nullptr);
  ReaderView view;
  ASSERT_NE(view.header(), nullptr);
  EXPECT_EQ(view.header()->magic, kStatsMagic);
}

TEST_F(StatsTest, CreateFailureDisablesUntilNextInit) {
  // No descriptor left: the soft limit at the lowest free number.
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest = dup(0);
  ASSERT_GE(lowest, 0);
  close(lowest);
  rlimit tight = saved;
  tight.rlim_cur = rlim_t(lowest);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  ConnSlot* refused = OpenConn();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(refused, nullptr);
  EXPECT_EQ(OpenConn(), nullptr);  // no retry on every connection
  EXPECT_FALSE(Exists(ShmPath(getpid())));
  StatsInit();
  EXPECT_NE(OpenConn(), nullptr);
}

// The pid's name taken by something that is not a file of ours (here a directory; another
// user's file or link alike): it is left alone, and the table goes under a name with a
// random suffix, which slip-stat reads too.
TEST_F(StatsTest, ANameTakenByAnythingElseGetsAnUnpredictableOne) {
  StatsShutdown();
  const std::string path = ShmPath(getpid());
  ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
  StatsInit();
  EXPECT_NE(OpenConn(), nullptr);
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode)) << "the directory was touched";
  std::vector<std::string> ours;
  for (const auto& entry : std::filesystem::directory_iterator(kStatsDir)) {
    const std::string name = entry.path().filename();
    if (name.starts_with(path.substr(path.rfind('/') + 1) + ".")) ours.push_back(entry.path());
  }
  ASSERT_EQ(ours.size(), 1u);
  EXPECT_EQ(ours[0].size(), path.size() + 17);  // "." and 16 hex digits
  StatsShutdown();
  EXPECT_FALSE(Exists(ours[0]));  // removed at shutdown like the usual name
  rmdir(path.c_str());
}

TEST_F(StatsTest, ShutdownLeavesOldSlotPointersHarmless) {
  ConnSlot* slot = OpenConn();
  StatsShutdown();
  EXPECT_FALSE(Exists(ShmPath(getpid())));
  StatsAddSent(slot, 5);  // a late data-path update must not fault
  StatsSetTransport(slot, TransportKind::kTcp, Reason::kFailover);
  StatsClose(slot);
  StatsInit();  // and stats can start again
  EXPECT_NE(OpenConn(), nullptr);
}

bool MapsMention(const std::string& needle) {
  return ReadFile("/proc/self/maps").find(needle) != std::string::npos;
}

// Exit codes tell the parent which check failed in the child.
int ChildAfterFork(pid_t parent, ConnSlot* inherited) {
  StatsReinitAfterFork();
  pid_t self = getpid();
  if (MapsMention(ShmPath(parent))) return 10;  // the parent's mapping is gone
  if (Exists(ShmPath(self))) return 11;         // not before the child's first connection
  StatsAddSent(inherited, 1);                   // lands nowhere, and never in the parent's file
  StatsSetTransport(inherited, TransportKind::kTcp, Reason::kFailover);
  ConnSlot* mine = OpenConn();
  ReaderView view(self);
  if (mine == nullptr || view.header() == nullptr) return 12;
  if (view.header()->pid != static_cast<uint32_t>(self)) return 13;
  if (view.header()->high_water.load() != 1) return 14;  // parent's slots not inherited
  if (view.header()->reason_counts[static_cast<int>(Reason::kFailover)].load() != 0) return 15;
  if (view.slot(0).state.load() != static_cast<uint32_t>(SlotState::kOpen)) return 16;
  StatsShutdown();
  if (Exists(ShmPath(self))) return 17;
  return 0;
}

TEST_F(StatsTest, ForkReinitCreatesOwnFile) {
  ConnSlot* slot = OpenConn();
  StatsAddSent(slot, 10);
  pid_t parent = getpid();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(ChildAfterFork(parent, slot));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see ChildAfterFork for the failing check";
  EXPECT_FALSE(Exists(ShmPath(child)));
  EXPECT_TRUE(Exists(ShmPath(parent)));
  EXPECT_EQ(slot->bytes_sent.load(), 10u);  // the child's write did not reach us
  EXPECT_EQ(slot->reason, static_cast<uint8_t>(Reason::kNone));
  EXPECT_NE(OpenConn(), nullptr);
}

// A child whose fork handler did not run still never writes into the parent's table.
int ChildWithoutReinit(pid_t parent) {
  const std::string record = "/tmp/slip_stats_child_" + std::to_string(getpid()) + ".jsonl";
  StatsWriteExitRecord(record.c_str());
  bool reported_parent = ReadFile(record).find("5201") != std::string::npos;
  unlink(record.c_str());
  if (reported_parent) return 10;  // the parent's connections are not ours to report
  if (OpenConn() == nullptr || !Exists(ShmPath(getpid()))) return 11;  // own file instead
  if (MapsMention(ShmPath(parent))) return 12;
  StatsShutdown();  // removes the child's file only
  return Exists(ShmPath(getpid())) ? 13 : 0;
}

TEST_F(StatsTest, ForkedChildWithoutReinit) {
  ConnSlot* slot = OpenConn();
  pid_t parent = getpid();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(ChildWithoutReinit(parent));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see ChildWithoutReinit for the failing check";
  EXPECT_TRUE(Exists(ShmPath(parent)));
  ReaderView view;
  EXPECT_EQ(view.header()->high_water.load(), 1u);
  EXPECT_EQ(slot->state.load(), static_cast<uint32_t>(SlotState::kOpen));
}

}  // namespace
}  // namespace slip
