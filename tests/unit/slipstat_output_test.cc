// Unit tests for what slip-stat and slip-run --summary print (tools/slip-stat/view.h,
// summary.h, format.h), and for reading JSON back (json_reader.h, exit_records.h): the
// JSON output parses and carries the exit record's fields, the tables align, and the exit
// records the core writes come back whole. Suites are lower case so that
// `ctest -R slipstat` selects them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/stats.h"
#include "tools/slip-stat/exit_records.h"
#include "tools/slip-stat/format.h"
#include "tools/slip-stat/json_reader.h"
#include "tools/slip-stat/summary.h"
#include "tools/slip-stat/view.h"

namespace slipstat {
namespace {

Connection Conn(bool open, const char* transport, const char* reason, const char* local,
                const char* remote, uint64_t sent, uint64_t received) {
  Connection c;
  c.open = open;
  c.transport = transport;
  c.reason = reason;
  c.local = local;
  c.remote = remote;
  c.role = 0;
  c.bytes_sent = sent;
  c.bytes_received = received;
  c.msgs_sent = 3;
  c.msgs_received = 4;
  return c;
}

// Two processes: an accelerated pair's client with one closed connection, and a process
// with a plain connection.
std::vector<Process> Sample() {
  Process a;
  a.pid = 101;
  a.exe = "/usr/bin/python3.11";
  a.reason_counts.assign(static_cast<size_t>(slip::Reason::kCount), 0);
  a.reason_counts[static_cast<int>(slip::Reason::kNone)] = 2;
  a.connections = {Conn(true, "shm", "", "127.0.0.1:40000", "127.0.0.1:5201", 5 << 20, 1024),
                   Conn(false, "shm", "", "127.0.0.1:40001", "127.0.0.1:5201", 1, 2)};
  Process b;
  b.pid = 20202;
  b.exe = "/opt/srv/server";
  b.dropped = 1;
  b.reason_counts.assign(static_cast<size_t>(slip::Reason::kCount), 0);
  b.reason_counts[static_cast<int>(slip::Reason::kPeerNotSlipstream)] = 1;
  b.connections = {Conn(true, "tcp", "peer_not_slipstream", "[::1]:80", "[::1]:51000", 7, 8)};
  return {a, b};
}

JsonValue MustParse(const std::string& text) {
  JsonValue v;
  std::string error;
  EXPECT_TRUE(ParseJson(text, &v, &error)) << error << " in " << text;
  return v;
}

std::string Str(const JsonValue& object, const char* key) {
  const JsonValue* v = object.Find(key);
  return v != nullptr && v->type == JsonValue::Type::kString ? v->text : "(missing)";
}

uint64_t Num(const JsonValue& object, const char* key) {
  uint64_t n = ~uint64_t{0};
  const JsonValue* v = object.Find(key);
  if (v != nullptr) v->AsUint(&n);
  return n;
}

TEST(slipstat_json, CarriesTheExitRecordFields) {
  std::string text = RenderJson(Sample(), {});
  ASSERT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1);  // one line
  JsonValue doc = MustParse(text);
  const JsonValue* connections = doc.Find("connections");
  ASSERT_NE(connections, nullptr);
  ASSERT_EQ(connections->items.size(), 2u);  // the closed one is left out
  const JsonValue& shm = connections->items[0];
  EXPECT_EQ(Num(shm, "pid"), 101u);
  EXPECT_EQ(Str(shm, "local"), "127.0.0.1:40000");
  EXPECT_EQ(Str(shm, "remote"), "127.0.0.1:5201");
  EXPECT_EQ(Str(shm, "transport"), "shm");
  EXPECT_EQ(Str(shm, "reason"), "");
  EXPECT_EQ(Num(shm, "bytes_sent"), 5u << 20);
  EXPECT_EQ(Num(shm, "bytes_received"), 1024u);
  EXPECT_EQ(Str(shm, "state"), "open");
  EXPECT_EQ(Str(shm, "program"), "python3.11");
  EXPECT_EQ(Num(shm, "msgs_received"), 4u);
  const JsonValue& tcp = connections->items[1];
  EXPECT_EQ(Num(tcp, "pid"), 20202u);
  EXPECT_EQ(Str(tcp, "reason"), "peer_not_slipstream");

  const JsonValue* reasons = doc.Find("reasons");
  ASSERT_NE(reasons, nullptr);
  ASSERT_EQ(reasons->members.size(), static_cast<size_t>(slip::Reason::kCount));
  EXPECT_EQ(Num(*reasons, "none"), 2u);
  EXPECT_EQ(Num(*reasons, "peer_not_slipstream"), 1u);
  const JsonValue* processes = doc.Find("processes");
  ASSERT_NE(processes, nullptr);
  ASSERT_EQ(processes->items.size(), 2u);
  EXPECT_EQ(Str(processes->items[1], "exe"), "/opt/srv/server");
  EXPECT_EQ(Num(processes->items[1], "dropped"), 1u);
  const JsonValue* transports = doc.Find("transports");
  ASSERT_NE(transports, nullptr);
  ASSERT_NE(transports->Find("shm"), nullptr);
  EXPECT_EQ(Num(*transports->Find("shm"), "open"), 1u);
  EXPECT_EQ(Num(*transports->Find("shm"), "closed"), 1u);

  ViewOptions all;
  all.all = true;
  EXPECT_EQ(MustParse(RenderJson(Sample(), all)).Find("connections")->items.size(), 3u);
  JsonValue empty = MustParse(RenderJson({}, {}));
  EXPECT_TRUE(empty.Find("connections")->items.empty());
  EXPECT_TRUE(empty.Find("processes")->items.empty());
}

TEST(slipstat_json, AnyBytesInAFileStayValidJson) {
  std::vector<Process> processes = Sample();
  processes[0].exe = std::string("/bin/\"odd\\\n\x01\x7f\xff\xc3(", 16);
  processes[0].connections[0].local = "\xed\xa0\x80";  // an encoded surrogate: not UTF-8
  JsonValue doc = MustParse(RenderJson(processes, {}));
  const JsonValue& process = doc.Find("processes")->items[0];
  EXPECT_EQ(Str(process, "exe"), "/bin/\"odd\\\n\x01\x7f\xef\xbf\xbd\xef\xbf\xbd(");
}

TEST(slipstat_table, ColumnsAlign) {
  std::string table = RenderConnections(Sample(), {});
  std::istringstream lines(table);
  std::string header, row1, row2;
  std::getline(lines, header);
  std::getline(lines, row1);
  std::getline(lines, row2);
  size_t local = header.find("LOCAL"), reason = header.find("REASON");
  ASSERT_NE(local, std::string::npos);
  EXPECT_EQ(row1.find("127.0.0.1:40000"), local);
  EXPECT_EQ(row2.find("[::1]:80"), local);
  EXPECT_EQ(row1.substr(reason), "-");
  EXPECT_EQ(row2.substr(reason), "peer_not_slipstream");
  // Numbers are right-aligned: PID ends where its title ends.
  EXPECT_EQ(row1.find("101"), header.find("PID"));
  EXPECT_NE(table.find("2 processes, 2 open connections: 1 shm, 1 tcp (1 peer_not_slipstream)"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("1 not recorded"), std::string::npos) << table;
  EXPECT_EQ(table.find("closed"), std::string::npos);

  ViewOptions options;
  options.all = options.human = true;
  table = RenderConnections(Sample(), options);
  EXPECT_NE(table.find("closed"), std::string::npos);
  EXPECT_NE(table.find("5.0 MiB"), std::string::npos) << table;
  EXPECT_NE(table.find("3 connections"), std::string::npos) << table;
}

TEST(slipstat_table, TerminalControlBytesAreNeutralised) {
  std::vector<Process> processes = Sample();
  processes[0].exe = "/x/\x1b[2Jevil";
  std::string table = RenderConnections(processes, {});
  EXPECT_EQ(table.find('\x1b'), std::string::npos);
  EXPECT_NE(table.find("?[2Jevil"), std::string::npos);
}

TEST(slipstat_table, ReasonsListEveryReasonWithTotals) {
  std::string text = RenderReasons(Sample());
  for (int i = 0; i < static_cast<int>(slip::Reason::kCount); ++i) {
    EXPECT_NE(text.find(slip::ReasonName(static_cast<slip::Reason>(i))), std::string::npos);
  }
  std::istringstream lines(text);
  std::string line;
  bool saw_none = false, saw_peer = false, saw_shm = false;
  while (std::getline(lines, line)) {
    saw_none |= line.starts_with("none (accelerated)") && line.ends_with(" 2");
    saw_peer |= line.starts_with("peer_not_slipstream ") && line.ends_with(" 1");
    saw_shm |= line.starts_with("shm ") && line.ends_with("1       1");
  }
  EXPECT_TRUE(saw_none && saw_peer && saw_shm) << text;
}

TEST(slipstat_format, Bytes) {
  EXPECT_EQ(FormatBytes(1536, false), "1536");
  EXPECT_EQ(FormatBytes(0, true), "0 B");
  EXPECT_EQ(FormatBytes(1023, true), "1023 B");
  EXPECT_EQ(FormatBytes(1536, true), "1.5 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 30, true), "3.0 GiB");
  EXPECT_EQ(FormatBytes(~uint64_t{0}, true), "16.0 EiB");
}

TEST(slipstat_json_reader, Values) {
  JsonValue v = MustParse(
      R"( {"a": [1, -2.5e3, true, false, null, "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"],
           "b": {}, "c": [], "n": 18446744073709551615} )");
  ASSERT_EQ(v.type, JsonValue::Type::kObject);
  const JsonValue& a = *v.Find("a");
  ASSERT_EQ(a.items.size(), 6u);
  EXPECT_EQ(a.items[1].text, "-2.5e3");
  EXPECT_TRUE(a.items[2].boolean);
  EXPECT_EQ(a.items[4].type, JsonValue::Type::kNull);
  EXPECT_EQ(a.items[5].text, "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  uint64_t n = 0;
  EXPECT_TRUE(v.Find("n")->AsUint(&n));
  EXPECT_EQ(n, ~uint64_t{0});
  EXPECT_FALSE(a.items[1].AsUint(&n));
  EXPECT_TRUE(a.items[0].AsUint(&n));
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(MustParse(R"("\ud800x")").text, "\xef\xbf\xbdx");  // a lone surrogate
}

TEST(slipstat_json_reader, RejectsWhatIsNotJson) {
  for (const char* bad :
       {"", "{", "[1,]", "{\"a\"}", "{\"a\":1,}", "01", "1.", "-", "1e", "tru", "\"\\x\"",
        "\"\x01\"", "\"open", "{} x", "[1 2]", "{1:2}", "\"\\u12g4\""}) {
    JsonValue v;
    std::string error;
    EXPECT_FALSE(ParseJson(bad, &v, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
  JsonValue v;
  std::string error;
  EXPECT_TRUE(ParseJson(std::string(60, '[') + std::string(60, ']'), &v, &error)) << error;
  EXPECT_FALSE(ParseJson(std::string(100000, '['), &v, &error));  // no stack overflow
  EXPECT_NE(error.find("deep"), std::string::npos) << error;
  uint64_t n;
  EXPECT_FALSE(MustParse("18446744073709551616").AsUint(&n));
}

class slipstat_exit_records : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/slipstat_exit_records_" + std::to_string(getpid()) + ".jsonl";
    unlink(path_.c_str());
    slip::StatsShutdown();
    slip::StatsInit();
  }
  void TearDown() override {
    slip::StatsShutdown();
    unlink(path_.c_str());
  }
  uint64_t Size() const {
    struct stat st;
    return stat(path_.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  std::string path_;
};

TEST_F(slipstat_exit_records, ReadsWhatTheCoreAppends) {
  sockaddr_in local{}, remote{};
  local.sin_family = remote.sin_family = AF_INET;
  local.sin_addr.s_addr = remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  local.sin_port = htons(40000);
  remote.sin_port = htons(5201);
  auto* l = reinterpret_cast<sockaddr*>(&local);
  auto* r = reinterpret_cast<sockaddr*>(&remote);
  slip::ConnSlot* shm = slip::StatsOpen(slip::TransportKind::kShm, slip::Reason::kNone, 0, l, r);
  slip::ConnSlot* tcp =
      slip::StatsOpen(slip::TransportKind::kTcp, slip::Reason::kPeerNotSlipstream, 0, l, r);
  slip::StatsAddSent(shm, 3 << 20);
  slip::StatsAddReceived(tcp, 10);
  slip::StatsWriteExitRecord(path_.c_str());
  std::ofstream(path_, std::ios::app) << "{\"cut short\n\n";
  uint64_t second = Size();
  slip::StatsWriteExitRecord(path_.c_str());

  ExitRecords records;
  std::string error;
  ASSERT_TRUE(ReadExitRecords(path_, 0, &records, &error)) << error;
  ASSERT_EQ(records.processes.size(), 2u);
  EXPECT_EQ(records.bad_lines, 1u);
  const Process& p = records.processes[0];
  EXPECT_EQ(p.pid, getpid());
  ASSERT_EQ(p.connections.size(), 2u);
  EXPECT_EQ(p.connections[0].transport, "shm");
  EXPECT_EQ(p.connections[0].reason, "");
  EXPECT_EQ(p.connections[0].local, "127.0.0.1:40000");
  EXPECT_EQ(p.connections[0].bytes_sent, 3u << 20);
  EXPECT_EQ(p.connections[1].reason, "peer_not_slipstream");
  EXPECT_EQ(p.connections[1].bytes_received, 10u);

  ExitRecords later;
  ASSERT_TRUE(ReadExitRecords(path_, second, &later, &error)) << error;
  EXPECT_EQ(later.processes.size(), 1u);
  EXPECT_EQ(later.bad_lines, 0u);

  std::string summary = RenderSummary(records, "slip-run: ");
  EXPECT_NE(summary.find("slip-run: 2 processes, 4 connections: 2 shm, 2 tcp "
                         "(2 peer_not_slipstream); 6.0 MiB sent, 20 B received\n"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("slip-run:   pid " + std::to_string(getpid())), std::string::npos);
  EXPECT_NE(summary.find("1 line of the stats file not understood"), std::string::npos);
}

TEST_F(slipstat_exit_records, MissingFileHoldsNone) {
  ExitRecords records;
  std::string error;
  ASSERT_TRUE(ReadExitRecords(path_, 0, &records, &error));
  EXPECT_TRUE(records.processes.empty());
  EXPECT_EQ(RenderSummary(records, "x: "),
            "x: no process opened a TCP connection under Slipstream\n");
}

// Only a file of ours, and at most kMaxExitRecordBytes of it: slip-run --summary read a
// link to /dev/zero until it died of std::bad_alloc.
TEST_F(slipstat_exit_records, ReadsOnlyItsOwnFileAndABoundedPart) {
  const std::string link = path_ + ".link";
  ASSERT_EQ(symlink("/dev/zero", link.c_str()), 0);
  ExitRecords records;
  std::string error;
  EXPECT_FALSE(ReadExitRecords(link, 0, &records, &error));
  EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
  unlink(link.c_str());
  EXPECT_FALSE(ReadExitRecords("/dev/zero", 0, &records, &error));
  EXPECT_NE(error.find("not a regular file"), std::string::npos) << error;

  sockaddr_in local{}, remote{};
  local.sin_family = remote.sin_family = AF_INET;
  slip::StatsOpen(slip::TransportKind::kShm, slip::Reason::kNone, 0,
                  reinterpret_cast<sockaddr*>(&local), reinterpret_cast<sockaddr*>(&remote));
  slip::StatsWriteExitRecord(path_.c_str());
  const uint64_t record = Size();
  ASSERT_GT(record, 0u);
  // Past the bound: zeros (a sparse file; no byte is written).
  ASSERT_EQ(truncate(path_.c_str(), off_t(kMaxExitRecordBytes + (1 << 20))), 0);
  ASSERT_TRUE(ReadExitRecords(path_, 0, &records, &error)) << error;
  EXPECT_EQ(records.processes.size(), 1u);
  EXPECT_EQ(records.unread_bytes, (1u << 20)) << "read " << record << " B of records";
  const std::string summary = RenderSummary(records, "x: ");
  EXPECT_NE(summary.find("only the first 64 MiB of the stats file read; 1048576 bytes more"),
            std::string::npos)
      << summary;
}

TEST_F(slipstat_exit_records, RejectsRecordsMissingFields) {
  Process p;
  std::string error;
  EXPECT_FALSE(ParseExitRecord(R"({"pid":1,"exe":"x","dropped":0})", &p, &error));
  EXPECT_FALSE(ParseExitRecord(R"({"pid":-1,"exe":"x","dropped":0,"connections":[]})", &p, &error));
  EXPECT_FALSE(ParseExitRecord(
      R"({"pid":1,"exe":"x","dropped":0,"connections":[{"local":"a","remote":"b"}]})", &p, &error));
  EXPECT_TRUE(ParseExitRecord(R"({"pid":1,"exe":"x","dropped":0,"connections":[]})", &p, &error))
      << error;
}

}  // namespace
}  // namespace slipstat
