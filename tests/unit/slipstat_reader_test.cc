// Unit tests for slip-stat's reading of live stats files (tools/slip-stat/stats_file.h,
// scan.h): files made by the real core, files written in the real layout, and the
// untrusted rest: garbage, truncation (also while mapped), wrong magic or version, stale
// files of exited or replaced processes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "core/stats.h"
#include "tools/slip-stat/scan.h"
#include "tools/slip-stat/stats_file.h"

namespace slipstat {
namespace {

using slip::ConnSlot;
using slip::Reason;
using slip::SlotState;
using slip::StatsHeader;
using slip::TransportKind;

constexpr size_t kHeader = sizeof(StatsHeader);

std::string SelfExe() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

std::string StatsName(pid_t pid) {
  return std::string(kStatsPrefix) + std::to_string(pid);
}

// A file in the real layout (core/stats.h), `file_slots` slots long (slot_count by
// default), mapped writable so that a test can set any field.
class LayoutFile {
 public:
  LayoutFile(const std::string& path, pid_t pid, uint32_t slot_count = 16, int file_slots = -1)
      : size_(kHeader + (file_slots < 0 ? slot_count : file_slots) * sizeof(ConnSlot)) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << path;
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size_)), 0);
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(p, MAP_FAILED);
    header_ = new (p) StatsHeader();
    header_->magic = slip::kStatsMagic;
    header_->version = slip::kStatsVersion;
    header_->pid = static_cast<uint32_t>(pid);
    header_->slot_count = slot_count;
    snprintf(header_->exe, sizeof(header_->exe), "%s", SelfExe().c_str());
    for (size_t i = 0; kHeader + (i + 1) * sizeof(ConnSlot) <= size_; ++i) {
      new (&slot(i)) ConnSlot();
    }
  }
  ~LayoutFile() { munmap(header_, size_); }

  StatsHeader* header() { return header_; }
  ConnSlot& slot(size_t i) { return reinterpret_cast<ConnSlot*>(header_ + 1)[i]; }

  // Fills the next slot as the core would.
  ConnSlot& Add(SlotState state, TransportKind transport, Reason reason, const char* local,
                const char* remote, uint64_t sent = 0, uint64_t received = 0) {
    uint32_t i = header_->high_water.load();
    ConnSlot& s = slot(i);
    s.transport = static_cast<uint8_t>(transport);
    s.reason = static_cast<uint8_t>(reason);
    snprintf(s.local, sizeof(s.local), "%s", local);
    snprintf(s.remote, sizeof(s.remote), "%s", remote);
    s.bytes_sent = sent;
    s.bytes_received = received;
    s.opened_ns = 1000 + i;
    s.state = static_cast<uint32_t>(state);
    header_->reason_counts[static_cast<int>(reason)]++;
    header_->high_water = i + 1;
    return s;
  }

 private:
  size_t size_;
  StatsHeader* header_;
};

// Lower case, like the other slipstat suites: `ctest -R slipstat` selects them.
class slipstat_reader : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("slipstat_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string PathFor(pid_t pid) const { return (dir_ / StatsName(pid)).string(); }
  std::string PathOf(const char* name) const { return (dir_ / name).string(); }

  void WriteBytes(const std::string& path, const std::vector<unsigned char>& bytes) {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    close(fd);
  }

  FileResult Read(const std::string& path, Process* out = nullptr) {
    Process ignored;
    return ReadStatsFile(path, getpid(), out != nullptr ? out : &ignored);
  }

  ScanOptions Options(bool clean = false) const {
    ScanOptions o;
    o.dir = dir_.string();
    o.clean = clean;
    return o;
  }

  std::filesystem::path dir_;
};

// A child that has exited and been reaped: its pid names no process.
pid_t DeadPid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status;
  waitpid(pid, &status, 0);
  return pid;
}

TEST_F(slipstat_reader, ReadsWhatTheCoreWrites) {
  slip::StatsShutdown();
  slip::StatsInit();
  sockaddr_in local{}, remote{};
  local.sin_family = remote.sin_family = AF_INET;
  local.sin_addr.s_addr = remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  local.sin_port = htons(40000);
  remote.sin_port = htons(5201);
  auto* l = reinterpret_cast<sockaddr*>(&local);
  auto* r = reinterpret_cast<sockaddr*>(&remote);
  ConnSlot* shm = slip::StatsOpen(TransportKind::kShm, Reason::kNone, 0, l, r);
  ConnSlot* tcp = slip::StatsOpen(TransportKind::kTcp, Reason::kPeerNotSlipstream, 1, r, l);
  ASSERT_NE(shm, nullptr);
  slip::StatsAddSent(shm, 1000);
  slip::StatsAddReceived(shm, 24);
  slip::StatsAddReceived(tcp, 7);
  slip::StatsClose(tcp);

  const std::string path = "/dev/shm/" + StatsName(getpid());
  Process p;
  FileResult result = Read(path, &p);
  ASSERT_EQ(result.status, FileStatus::kOk) << result.message;
  EXPECT_EQ(p.pid, getpid());
  EXPECT_EQ(p.exe, SelfExe());
  ASSERT_EQ(p.connections.size(), 2u);
  const Connection& a = p.connections[0];
  EXPECT_TRUE(a.open);
  EXPECT_EQ(a.transport, "shm");
  EXPECT_EQ(a.reason, "");
  EXPECT_EQ(a.local, "127.0.0.1:40000");
  EXPECT_EQ(a.remote, "127.0.0.1:5201");
  EXPECT_EQ(a.role, 0);
  EXPECT_EQ(a.bytes_sent, 1000u);
  EXPECT_EQ(a.bytes_received, 24u);
  EXPECT_EQ(a.msgs_sent, 1u);
  const Connection& b = p.connections[1];
  EXPECT_FALSE(b.open);
  EXPECT_EQ(b.transport, "tcp");
  EXPECT_EQ(b.reason, "peer_not_slipstream");
  EXPECT_EQ(b.role, 1);
  EXPECT_EQ(b.bytes_received, 7u);
  EXPECT_NE(b.closed_ns, 0u);
  ASSERT_EQ(p.reason_counts.size(), static_cast<size_t>(Reason::kCount));
  EXPECT_EQ(p.reason_counts[static_cast<int>(Reason::kNone)], 1u);
  EXPECT_EQ(p.reason_counts[static_cast<int>(Reason::kPeerNotSlipstream)], 1u);

  // The scan of /dev/shm finds this live process and keeps its file.
  ScanOptions o;
  o.pids = {getpid()};
  ScanResult scan = Scan(o);
  ASSERT_EQ(scan.processes.size(), 1u);
  EXPECT_EQ(scan.processes[0].connections.size(), 2u);
  EXPECT_TRUE(std::filesystem::exists(path));
  slip::StatsShutdown();
}

TEST_F(slipstat_reader, ReadsTheLayout) {
  LayoutFile f(PathFor(getpid()), getpid());
  f.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "127.0.0.1:1", "127.0.0.1:2", 5, 6);
  f.Add(SlotState::kClosed, TransportKind::kTcp, Reason::kPolicy, "[::1]:3", "[::1]:4");
  f.Add(SlotState::kFree, TransportKind::kTcp, Reason::kPolicy, "x", "y");  // being claimed
  f.header()->dropped = 3;
  Process p;
  ASSERT_EQ(Read(PathFor(getpid()), &p).status, FileStatus::kOk);
  ASSERT_EQ(p.connections.size(), 2u);
  EXPECT_EQ(p.connections[0].bytes_sent, 5u);
  EXPECT_EQ(p.connections[1].reason, "policy");
  EXPECT_EQ(p.connections[1].local, "[::1]:3");
  EXPECT_EQ(p.dropped, 3u);
}

TEST_F(slipstat_reader, BoundsStringsAndNamesUnknownValues) {
  LayoutFile f(PathFor(getpid()), getpid());
  ConnSlot& s = f.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "", "");
  memset(s.local, 'L', sizeof(s.local));  // no terminating NUL
  memset(s.remote, 'R', sizeof(s.remote));
  s.transport = 200;
  s.reason = 201;
  s.role = 7;
  memset(f.header()->exe, 'E', sizeof(f.header()->exe));
  Process p;
  ASSERT_EQ(Read(PathFor(getpid()), &p).status, FileStatus::kOk);
  ASSERT_EQ(p.connections.size(), 1u);
  EXPECT_EQ(p.connections[0].local, std::string(sizeof(s.local), 'L'));
  EXPECT_EQ(p.connections[0].remote, std::string(sizeof(s.remote), 'R'));
  EXPECT_EQ(p.connections[0].transport, "?");
  EXPECT_EQ(p.connections[0].reason, "unknown");
  EXPECT_EQ(p.connections[0].role, -1);
  EXPECT_EQ(p.exe, std::string(sizeof(f.header()->exe), 'E'));
}

TEST_F(slipstat_reader, HighWaterBeyondSlotCountIsBounded) {
  LayoutFile f(PathFor(getpid()), getpid(), 4);
  for (int i = 0; i < 4; ++i) {
    f.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "a", "b");
  }
  f.header()->high_water = 0xffffffff;
  Process p;
  ASSERT_EQ(Read(PathFor(getpid()), &p).status, FileStatus::kOk);
  EXPECT_EQ(p.connections.size(), 4u);
}

TEST_F(slipstat_reader, RejectsBadHeaders) {
  struct Case {
    const char* name;
    void (*spoil)(StatsHeader*);
    const char* message;
  };
  const Case cases[] = {
      {"magic", [](StatsHeader* h) { h->magic = 0x12345678; }, "bad magic"},
      {"version", [](StatsHeader* h) { h->version = slip::kStatsVersion + 1; }, "version"},
      {"pid", [](StatsHeader* h) { h->pid += 1; }, "pid"},
      {"no slots", [](StatsHeader* h) { h->slot_count = 0; }, "slot count"},
      {"too many slots", [](StatsHeader* h) { h->slot_count = slip::kStatsSlots + 1; },
       "slot count"},
  };
  for (const Case& c : cases) {
    LayoutFile f(PathFor(getpid()), getpid());
    c.spoil(f.header());
    FileResult result = Read(PathFor(getpid()));
    EXPECT_EQ(result.status, FileStatus::kInvalid) << c.name;
    EXPECT_NE(result.message.find(c.message), std::string::npos)
        << c.name << ": " << result.message;
  }
}

TEST_F(slipstat_reader, UnpublishedOrEmptyIsNotReady) {
  {
    LayoutFile f(PathFor(getpid()), getpid());
    f.header()->magic = 0;  // the core publishes magic last
    EXPECT_EQ(Read(PathFor(getpid())).status, FileStatus::kNotReady);
  }
  WriteBytes(PathFor(getpid()), {});
  EXPECT_EQ(Read(PathFor(getpid())).status, FileStatus::kNotReady);
}

TEST_F(slipstat_reader, RejectsTruncatedFiles) {
  // Shorter than the header.
  WriteBytes(PathFor(getpid()), std::vector<unsigned char>(kHeader - 1, 0x55));
  FileResult result = Read(PathFor(getpid()));
  EXPECT_EQ(result.status, FileStatus::kInvalid);
  EXPECT_NE(result.message.find("truncated"), std::string::npos) << result.message;
  // A header promising more slots than the file holds.
  LayoutFile f(PathFor(getpid()), getpid(), slip::kStatsSlots, 2);
  result = Read(PathFor(getpid()));
  EXPECT_EQ(result.status, FileStatus::kInvalid);
  EXPECT_NE(result.message.find("truncated"), std::string::npos) << result.message;
}

TEST_F(slipstat_reader, SurvivesTruncationWhileMapped) {
  const std::string path = PathFor(getpid());
  LayoutFile f(path, getpid(), 64);
  for (int i = 0; i < 64; ++i) {
    f.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "a", "b");
  }
  StatsFile file;
  ASSERT_EQ(file.Open(path, getpid()).status, FileStatus::kOk);
  Process p;
  ASSERT_EQ(file.Read(&p).status, FileStatus::kOk);
  EXPECT_EQ(p.connections.size(), 64u);
  // Past the header and a few slots: the reader touches pages beyond the end (SIGBUS).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(page)), 0);
  FileResult result = file.Read(&p);
  EXPECT_EQ(result.status, FileStatus::kInvalid);
  EXPECT_NE(result.message.find("truncated"), std::string::npos) << result.message;
  // Within the header's first page too.
  ASSERT_EQ(truncate(path.c_str(), 0), 0);
  EXPECT_EQ(file.Read(&p).status, FileStatus::kInvalid);
}

TEST_F(slipstat_reader, SurvivesGarbage) {
  std::mt19937 rng(12345);
  const size_t sizes[] = {1,
                          7,
                          kHeader - 1,
                          kHeader,
                          kHeader + 1,
                          kHeader + sizeof(ConnSlot),
                          kHeader + 100 * sizeof(ConnSlot) + 3};
  for (size_t size : sizes) {
    for (int round = 0; round < 20; ++round) {
      std::vector<unsigned char> bytes(size);
      for (auto& b : bytes) b = static_cast<unsigned char>(rng());
      WriteBytes(PathFor(getpid()), bytes);
      EXPECT_EQ(Read(PathFor(getpid())).status, FileStatus::kInvalid) << size;
    }
  }
  // A valid header over garbage slots and counters: read, with every string bounded.
  for (int round = 0; round < 50; ++round) {
    LayoutFile f(PathFor(getpid()), getpid(), 100);
    auto* raw = reinterpret_cast<unsigned char*>(&f.slot(0));
    for (size_t i = 0; i < 100 * sizeof(ConnSlot); ++i) raw[i] = static_cast<unsigned char>(rng());
    f.header()->high_water = static_cast<uint32_t>(rng());
    Process p;
    ASSERT_EQ(Read(PathFor(getpid()), &p).status, FileStatus::kOk);
    EXPECT_LE(p.connections.size(), 100u);
    for (const Connection& c : p.connections) {
      EXPECT_LE(c.local.size(), sizeof(ConnSlot::local));
      EXPECT_LE(c.remote.size(), sizeof(ConnSlot::remote));
    }
  }
}

TEST_F(slipstat_reader, RefusesWhatIsNotARegularFile) {
  ASSERT_EQ(mkfifo(PathOf("fifo").c_str(), 0600), 0);
  EXPECT_EQ(Read(PathOf("fifo")).status, FileStatus::kInvalid);  // and does not block
  LayoutFile f(PathOf("target"), getpid());
  std::filesystem::create_symlink(PathOf("target"), PathFor(getpid()));
  FileResult result = Read(PathFor(getpid()));
  EXPECT_EQ(result.status, FileStatus::kInvalid);
  EXPECT_NE(result.message.find("symbolic link"), std::string::npos) << result.message;
  EXPECT_EQ(Read(PathOf("missing")).status, FileStatus::kGone);
}

TEST_F(slipstat_reader, ScanListsLiveProcessesAndIgnoresOtherNames) {
  LayoutFile f(PathFor(getpid()), getpid());
  f.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "a", "b");
  for (const char* name : {"slipstream-stats.abc", "slipstream-stats.0123", "other.1"}) {
    WriteBytes(PathOf(name), {1, 2, 3});
  }
  ScanResult scan = Scan(Options(true));
  ASSERT_EQ(scan.processes.size(), 1u);
  EXPECT_EQ(scan.processes[0].pid, getpid());
  EXPECT_TRUE(scan.notes.empty());
  for (const char* name : {"slipstream-stats.abc", "slipstream-stats.0123", "other.1"}) {
    EXPECT_TRUE(std::filesystem::exists(PathOf(name))) << name;
  }
}

// The name the core takes when another user holds the pid's own: ".<16 hex digits>" more.
TEST_F(slipstat_reader, ScanReadsTheSuffixedNameAndNoLookalike) {
  const std::string plain = std::string(kStatsPrefix) + std::to_string(getpid());
  LayoutFile f(PathOf((plain + ".0123456789abcdef").c_str()), getpid());
  f.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "a", "b");
  for (const std::string& name :
       {plain + ".0123456789ABCDEF", plain + ".0123456789abcde", plain + ".0123456789abcdef0",
        plain + "-0123456789abcdef", plain + ".0123456789abcdeg"}) {
    LayoutFile lookalike(PathOf(name.c_str()), getpid());
    lookalike.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "c", "d");
  }
  ScanResult scan = Scan(Options());
  ASSERT_EQ(scan.processes.size(), 1u);
  ASSERT_EQ(scan.processes[0].connections.size(), 1u);
  EXPECT_EQ(scan.processes[0].connections[0].local, "a");
}

// Anybody may write /dev/shm: a file of another uid than the process's is not its.
TEST_F(slipstat_reader, ScanSkipsAFileOfAnotherUid) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a file of another uid)";
  {
    LayoutFile forged(PathFor(getpid()), getpid());
    forged.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "forged", "x");
  }
  ASSERT_EQ(chown(PathFor(getpid()).c_str(), 65534, 65534), 0);
  ScanResult scan = Scan(Options());
  EXPECT_TRUE(scan.processes.empty());
  ASSERT_EQ(scan.notes.size(), 1u);
  EXPECT_NE(scan.notes[0].find("made by uid 65534"), std::string::npos) << scan.notes[0];
  // The process's own file beside it (under the suffixed name) is the one listed.
  const std::string own = PathFor(getpid()) + ".00000000000000ff";
  LayoutFile real(own, getpid());
  real.Add(SlotState::kOpen, TransportKind::kShm, Reason::kNone, "real", "y");
  scan = Scan(Options());
  ASSERT_EQ(scan.processes.size(), 1u);
  ASSERT_EQ(scan.processes[0].connections.size(), 1u);
  EXPECT_EQ(scan.processes[0].connections[0].local, "real");
}

TEST_F(slipstat_reader, ScanRemovesFilesOfExitedProcesses) {
  pid_t dead = DeadPid();
  { LayoutFile f(PathFor(dead), dead); }
  EXPECT_TRUE(Scan(Options()).processes.empty());
  EXPECT_FALSE(std::filesystem::exists(PathFor(dead)));

  { LayoutFile f(PathFor(dead), dead); }
  ScanResult scan = Scan(Options(true));
  EXPECT_FALSE(std::filesystem::exists(PathFor(dead)));
  ASSERT_EQ(scan.notes.size(), 1u);
  EXPECT_NE(scan.notes[0].find("has exited"), std::string::npos) << scan.notes[0];
}

TEST_F(slipstat_reader, ScanTreatsAnUnreapedZombieAsExited) {
  pid_t zombie = fork();
  if (zombie == 0) _exit(0);
  usleep(100 * 1000);  // let it exit; it stays a zombie until waitpid below
  { LayoutFile f(PathFor(zombie), zombie); }
  EXPECT_TRUE(Scan(Options()).processes.empty());
  EXPECT_FALSE(std::filesystem::exists(PathFor(zombie)));
  int status;
  waitpid(zombie, &status, 0);
}

TEST_F(slipstat_reader, ScanSkipsFilesOfAReusedPid) {
  {
    LayoutFile f(PathFor(getpid()), getpid());
    snprintf(f.header()->exe, sizeof(f.header()->exe), "/some/earlier/program");
  }
  ScanResult scan = Scan(Options());
  EXPECT_TRUE(scan.processes.empty());
  ASSERT_EQ(scan.notes.size(), 1u);
  EXPECT_NE(scan.notes[0].find("stale"), std::string::npos) << scan.notes[0];
  EXPECT_TRUE(std::filesystem::exists(PathFor(getpid())));  // removed only with --clean

  scan = Scan(Options(true));
  EXPECT_TRUE(scan.processes.empty());
  ASSERT_EQ(scan.notes.size(), 1u);
  EXPECT_EQ(scan.notes[0].rfind("removed", 0), 0u) << scan.notes[0];
  EXPECT_FALSE(std::filesystem::exists(PathFor(getpid())));
}

TEST_F(slipstat_reader, ScanNotesGarbageAndKeepsIt) {
  WriteBytes(PathFor(getpid()), std::vector<unsigned char>(kHeader, 0xab));
  ScanResult scan = Scan(Options(true));
  EXPECT_TRUE(scan.processes.empty());
  ASSERT_EQ(scan.notes.size(), 1u);
  EXPECT_NE(scan.notes[0].find("bad magic"), std::string::npos) << scan.notes[0];
  EXPECT_TRUE(std::filesystem::exists(PathFor(getpid())));  // a live process's file
}

TEST_F(slipstat_reader, ScanFiltersByPid) {
  pid_t parent = getppid();  // alive, but not the writer of a file in our layout
  { LayoutFile f(PathFor(parent), parent); }
  LayoutFile mine(PathFor(getpid()), getpid());
  ScanOptions o = Options();
  o.pids = {getpid()};
  ScanResult scan = Scan(o);
  ASSERT_EQ(scan.processes.size(), 1u);
  EXPECT_EQ(scan.processes[0].pid, getpid());
  EXPECT_TRUE(scan.notes.empty());  // the parent's file was not even read
}

TEST_F(slipstat_reader, ScanOfAMissingDirectoryIsEmpty) {
  ScanOptions o;
  o.dir = PathOf("does-not-exist");
  ScanResult scan = Scan(o);
  EXPECT_TRUE(scan.processes.empty());
  EXPECT_TRUE(scan.notes.empty());
}

}  // namespace
}  // namespace slipstat
